// Refusing a run too big for its hosts' memory (memory_check.hpp): the collective comparison,
// the search for what would fit, and the message.
#include "attention2d/memory_check.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"

namespace a2d {
namespace {

std::string bytes_text(int64_t bytes) {
  return format_bytes(static_cast<double>(bytes));
}

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ULL;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  return hash;
}

// What each rank tells the others: fixed size, so one all-gather carries it.
struct Record {
  uint64_t kernel = 0;  // the host's kernel (boot id): ranks sharing MemAvailable
  uint64_t cgroup = 0;  // the binding cgroup on that kernel (0: none)
  int64_t need = 0;
  int64_t mem_available = -1;
  int64_t cgroup_available = -1;
  int64_t disabled = 0;
  char host[64] = {};
  char cgroup_name[128] = {};
};

Record own_record(const MemoryCheck& check, int rank) {
  Record r;
  HostMemory memory = read_host_memory();
  if (const char* fake = std::getenv("A2D_FAULT_MEMORY_AVAILABLE"); fake && *fake) {
    memory = HostMemory{};
    memory.available = memory.mem_available = std::strtoll(fake, nullptr, 10);
  }
  const std::string key = host_memory_key();
  r.kernel = fnv1a(key);
  if (memory.cgroup_limit >= 0) r.cgroup = fnv1a(key + "\n" + memory.cgroup);
  r.need = check.model(check.request).rank_bytes(rank);
  r.mem_available = memory.mem_available;
  r.cgroup_available = memory.cgroup_limit >= 0
                           ? std::max<int64_t>(0, memory.cgroup_limit - memory.cgroup_usage)
                           : -1;
  r.disabled = !check.enabled || memory_check_disabled_by_environment() ? 1 : 0;
  std::strncpy(r.host, host_name().c_str(), sizeof r.host - 1);
  std::strncpy(r.cgroup_name, memory.cgroup.c_str(), sizeof r.cgroup_name - 1);
  return r;
}

// A group of ranks sharing one limit: a host's MemAvailable or a cgroup's.
struct Group {
  std::vector<int> ranks;
  int64_t need = 0;
  int64_t available = -1;
  std::string where;  // "host node0", "host node0's memory cgroup /sys/fs/cgroup/job"
  std::string has;    // what it has, in words
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 4 && ranks.size() > 5) return text + ", ... (" + std::to_string(ranks.size()) + ")";
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

std::string parts_text(const std::vector<MemoryPart>& parts) {
  std::string text;
  for (const MemoryPart& p : parts) {
    if (p.bytes <= 0) continue;
    text += (text.empty() ? "" : ", ") + p.what + " " + bytes_text(p.bytes);
  }
  return text.empty() ? "nothing" : text;
}

// Suggestions: what the same estimate says would fit on hosts like the short one (its ranks per
// host, its memory).
class Suggestions {
 public:
  Suggestions(const MemoryCheck& check, int ranks_per_host, int64_t available)
      : check_(check), per_host_(std::max(1, ranks_per_host)), available_(available) {}

  std::string text() const {
    std::vector<std::string> clauses;
    const MemoryRequest& r = check_.request;
    if (check_.ranks_may_change) clauses.push_back(more_ranks());
    if (check_.seq_may_change && r.seq > 1) clauses.push_back(shorter());
    if (check_.dtype_may_change && r.dtype == DType::f32) clauses.push_back(narrower());
    for (const MemoryCheck::Alternative& a : check_.alternatives) {
      MemoryNeed need;
      bool ok = false;
      try {
        need = a.model(r);
        ok = host_bytes(need, r.ranks) <= available_;
      } catch (const Error&) {
        continue;
      }
      clauses.push_back(a.option + ": " + (ok ? "fits" : "does not fit either") + " (" +
                        bytes_text(host_bytes(need, r.ranks)) + " on this host)");
    }
    std::string text;
    for (const std::string& c : clauses)
      if (!c.empty()) text += "\n  " + c;
    return text;
  }

 private:
  // What a host like this one holds of `need` (its ranks, rank 0's parts on it).
  int64_t host_bytes(const MemoryNeed& need, int ranks) const {
    return std::min<int64_t>(per_host_, ranks) * need.every_rank_bytes() + need.rank0_bytes();
  }

  bool fits(const MemoryRequest& request, MemoryNeed* need = nullptr) const {
    try {
      const MemoryNeed n = check_.model(request);
      if (need) *need = n;
      return host_bytes(n, request.ranks) <= available_;
    } catch (const Error&) {
      return false;
    }
  }

  std::string more_ranks() const {
    const MemoryRequest& r = check_.request;
    constexpr int64_t kMost = int64_t{1} << 20;
    MemoryRequest more = r;
    int64_t failing = r.ranks, fitting = -1;
    for (int64_t p = std::max<int64_t>(2, 2 * int64_t{r.ranks}); p <= kMost; p *= 2) {
      more.ranks = static_cast<int>(p);
      if (fits(more)) {
        fitting = p;
        break;
      }
      failing = p;
    }
    if (fitting < 0) {
      // Rank 0's own arrays do not shrink with more ranks.
      MemoryNeed need;
      more.ranks = static_cast<int>(kMost);
      try {
        need = check_.model(more);
      } catch (const Error&) {
      }
      if (need.rank0_bytes() > available_) {
        return "more ranks: none fit while rank 0 holds " + parts_text(need.rank0) +
               " (these do not shrink with more ranks)";
      }
      return "more ranks: none up to 2^20 fit";
    }
    while (fitting - failing > 1) {
      const int64_t mid = failing + (fitting - failing) / 2;
      more.ranks = static_cast<int>(mid);
      (fits(more) ? fitting : failing) = mid;
    }
    const int64_t hosts = (fitting + per_host_ - 1) / per_host_;
    return "more ranks on more hosts: " + std::to_string(fitting) + " ranks at " +
           std::to_string(per_host_) + " per host (" + std::to_string(hosts) +
           (hosts == 1 ? " host" : " hosts") + " with this host's memory)";
  }

  std::string shorter() const {
    const MemoryRequest& r = check_.request;
    MemoryRequest less = r;
    int64_t low = 0, high = r.seq;
    while (high - low > 1) {
      const int64_t mid = low + (high - low) / 2;
      less.seq = mid;
      (fits(less) ? low : high) = mid;
    }
    if (low < 1) return "a shorter sequence: none fits, not even 1 token";
    return "a shorter sequence: " + check_.seq_option + " " + std::to_string(low) + " or less" +
           (check_.ranks_may_change
                ? " on " + std::to_string(r.ranks) + (r.ranks == 1 ? " rank" : " ranks")
                : std::string());
  }

  std::string narrower() const {
    MemoryRequest narrow = check_.request;
    narrow.dtype = DType::bf16;
    MemoryNeed need;
    const bool ok = fits(narrow, &need);
    return std::string("--dtype bf16: ") + (ok ? "fits" : "does not fit either") + " (" +
           bytes_text(host_bytes(need, narrow.ranks)) + " on this host)";
  }

  const MemoryCheck& check_;
  int per_host_;
  int64_t available_;
};

[[noreturn]] void refuse(const MemoryCheck& check, const Group& group, bool collective) {
  const MemoryNeed need = check.model(check.request);
  std::ostringstream text;
  const size_t count = group.ranks.size();
  text << check.command << " needs more memory than " << group.where << " has: ";
  if (count == 1) {
    text << (collective ? "rank " + rank_list(group.ranks) + " needs " : "it needs ");
  } else {
    text << "its " << count << " ranks (" << rank_list(group.ranks) << ") need ";
  }
  text << bytes_text(group.need) << ", it has " << group.has;
  text << "\n  " << (collective ? "each rank: " : "made of: ") << parts_text(need.every_rank);
  if (need.rank0_bytes() > 0) text << "\n  rank 0 also: " << parts_text(need.rank0);
  const std::string suggestions =
      Suggestions(check, static_cast<int>(count), group.available).text();
  if (!suggestions.empty()) {
    text << "\nwhat would fit (by the same estimate, on hosts like this one):" << suggestions;
  }
  text << "\n(" << check.override_hint << " runs it anyway)";
  if (!collective) A2D_FAIL(text.str());
  // The same on every rank: each computed it from the same records and the same model.
  throw CollectiveError(text.str(), text.str(), __FILE__, __LINE__);
}

void compare(const MemoryCheck& check, const std::vector<Record>& records, bool collective) {
  for (const Record& r : records)
    if (r.disabled) return;
  // The groups: the ranks on one kernel share MemAvailable, those in one cgroup its limit.
  std::map<uint64_t, Group> hosts, cgroups;
  for (size_t rank = 0; rank < records.size(); ++rank) {
    const Record& r = records[rank];
    Group& host = hosts[r.kernel];
    if (host.ranks.empty()) {
      host.available = r.mem_available;
      host.where = std::string("host ") + r.host;
      host.has = bytes_text(r.mem_available) + " available (MemAvailable)";
    }
    host.ranks.push_back(static_cast<int>(rank));
    host.need += r.need;
    if (r.cgroup == 0) continue;
    Group& cgroup = cgroups[r.cgroup];
    if (cgroup.ranks.empty()) {
      cgroup.available = r.cgroup_available;
      cgroup.where = std::string("host ") + r.host + "'s memory cgroup " + r.cgroup_name;
      cgroup.has = bytes_text(r.cgroup_available) + " available (its limit less its usage)";
    }
    cgroup.ranks.push_back(static_cast<int>(rank));
    cgroup.need += r.need;
  }
  // The group short of the most, if any (unknown memory never refuses).
  const Group* worst = nullptr;
  for (const auto* groups : {&hosts, &cgroups}) {
    for (const auto& [key, g] : *groups) {
      if (g.available < 0 || g.need <= g.available) continue;
      if (!worst || g.need - g.available > worst->need - worst->available) worst = &g;
    }
  }
  if (worst) refuse(check, *worst, collective);
}

}  // namespace

std::string HostMemory::describe() const {
  if (available < 0) return "unknown (no /proc/meminfo)";
  if (cgroup_limit >= 0 && available < mem_available) {
    return bytes_text(available) + " available (its memory cgroup's limit " +
           bytes_text(cgroup_limit) + " less " + bytes_text(cgroup_usage) + " in use: " + cgroup +
           "; MemAvailable " + bytes_text(mem_available) + ")";
  }
  return bytes_text(available) + " available (MemAvailable)";
}

int64_t MemoryNeed::every_rank_bytes() const {
  int64_t sum = 0;
  for (const MemoryPart& p : every_rank)
    sum += p.bytes;
  return sum;
}

int64_t MemoryNeed::rank0_bytes() const {
  int64_t sum = 0;
  for (const MemoryPart& p : rank0)
    sum += p.bytes;
  return sum;
}

int64_t MemoryNeed::rank_bytes(int rank) const {
  return every_rank_bytes() + (rank == 0 ? rank0_bytes() : 0);
}

namespace {

// The problem and plan a suggestion's request runs: its sequence (documents dropped: their lengths
// no longer add up) and dtype; at another rank count the algorithm's default plan there.
std::pair<Problem, Plan> requested(const Problem& problem, const Plan& plan,
                                   const MemoryRequest& r) {
  Problem p = problem;
  p.dtype = r.dtype;
  if (r.seq != p.seq) {
    p.seq = r.seq;
    p.mask.doc_offsets = nullptr;
  }
  Plan varied = plan;
  if (r.ranks != plan.ranks()) {
    varied = default_plan(plan.algorithm, p, r.ranks);
    varied.threads = plan.threads;
  }
  return {p, varied};
}

}  // namespace

MemoryCheck attention_memory_check(const Problem& problem, const Plan& plan, bool with_backward) {
  MemoryCheck check;
  check.command = "this attention";
  check.request = {plan.ranks(), problem.seq, problem.dtype};
  check.override_hint = "A2D_NO_MEMORY_CHECK=1";
  check.model = [problem, plan, with_backward](const MemoryRequest& r) {
    const auto [p, varied] = requested(problem, plan, r);
    const RankMemory memory = memory_parts(p, varied, nullptr, with_backward);
    // The shards less the inputs the caller holds (Q, K, V; with the backward also O and dO).
    const int64_t tokens = plan_layout(p, varied).max_count();
    const int64_t e = dtype_bytes(p.dtype);
    const int64_t q = p.batch * tokens * p.heads * p.head_dim;
    const int64_t kv = p.batch * tokens * p.kv_heads * p.head_dim;
    const int64_t inputs = e * (q + 2 * kv + (with_backward ? 2 * q : 0));
    MemoryNeed need;
    need.every_rank.push_back({"the algorithm's buffers", memory.buffers});
    need.every_rank.push_back({with_backward ? "the gradients" : "the outputs",
                               std::max<int64_t>(0, memory.shards - inputs)});
    return need;
  };
  return check;
}

MemoryCheck decoder_memory_check(const Problem& problem, const Plan& plan, int64_t capacity) {
  MemoryCheck check = attention_memory_check(problem, plan, false);
  check.model = [prefill = check.model, problem, plan, capacity](const MemoryRequest& r) {
    MemoryNeed need = prefill(r);
    const auto [p, varied] = requested(problem, plan, r);
    // A cached token: its K and V rows of every K/V head, and its position (inference.hpp).
    const int64_t record = p.batch * p.kv_heads * 2 * p.head_dim * dtype_bytes(p.dtype) + 8;
    const int64_t tokens = std::max(capacity, plan_layout(p, varied).max_count());
    need.every_rank.push_back({"the KV cache (capacity, or the prompt's shard)", record * tokens});
    return need;
  };
  return check;
}

bool memory_check_disabled_by_environment() {
  const char* value = std::getenv("A2D_NO_MEMORY_CHECK");
  return value && *value && std::strcmp(value, "0") != 0;
}

void check_memory(Communicator& world, const MemoryCheck& check) {
  std::vector<Record> records(static_cast<size_t>(world.size()));
  Record mine;
  std::string failure;
  try {
    mine = own_record(check, world.rank());
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // A rank whose own need cannot be computed fails every rank (collective_check), after the
  // others have joined.
  collective_check(world, [&] {
    if (!failure.empty()) A2D_FAIL(failure);
  });
  world.set_phase("control");
  world.all_gather(Place::at_host(&mine), Place::at_host(records.data()),
                   std::vector<int64_t>(records.size(), sizeof(Record)));
  compare(check, records, true);
}

void check_memory(const MemoryCheck& check) {
  compare(check, {own_record(check, 0)}, false);
}

}  // namespace a2d
