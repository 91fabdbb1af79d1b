// The communicator interface over a caller's process group (group_comm.hpp): the direct
// collectives of direct_collectives.hpp over the group's point-to-point operations, and the group's
// own collectives where a communicator spans the whole group.
#include "attention2d/group_comm.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/watchdog.hpp"
#include "comm_choice.hpp"
#include "direct_collectives.hpp"
#include "io_threads.hpp"
#if defined(A2D_WITH_CUDA) && defined(A2D_WITH_MPI)
#include <cstdlib>

#include "nccl_comm.hpp"
#endif

namespace a2d {
namespace {

using comm_detail::DirectCollectives;
using comm_detail::DirectRequest;
using comm_detail::kTagBits;
using comm_detail::rank_among;
constexpr int64_t kIds = 1 << 15;  // view ids: 15 bits, so that a tag stays below 2^31
constexpr int64_t kErrorBytes = 1024;

// The table and the group it holds; released when the last view is gone.
struct Group {
  explicit Group(const A2dGroupOps& table) : ops(table) {}
  ~Group() {
    if (ops.release) ops.release(ops.group);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  A2dGroupOps ops;
  // The I/O threads of a gloo group's device (null: none found, or not gloo).
  std::unique_ptr<comm_detail::IoThreads> io_threads;
  // The next view id this rank may take (every view this rank belongs to has a smaller one,
  // modulo 2^15); id 0 is the whole group's.
  int64_t next_id = 1;
};

// A failed operation: with an active watchdog, it reports the failure (the rank that is gone,
// which its own link sees) and ends the job; otherwise every rank that waited throws.
// peer: the group rank the operation was with (-1: a collective).
[[noreturn]] void group_failed(const Group& group, const char* what, const char* text,
                               int peer = -1) {
  const std::string said = text;
  const bool closed = said.find("closed by peer") != std::string::npos ||
                      said.find("reset by peer") != std::string::npos ||
                      said.find("Connection closed") != std::string::npos;
  std::ostringstream message;
  if (closed && peer >= 0) {
    message << "rank " << peer << " closed its connection (exited or killed?) while this rank "
            << "waited in phase " << Watchdog::current_phase() << " (the " << group.ops.backend
            << " process group: " << text << ")";
  } else {
    message << "the " << group.ops.backend << " process group failed " << what
            << " while this rank was in phase " << Watchdog::current_phase() << ": " << text;
  }
  Watchdog::transport_failed(nullptr, message.str());
  A2D_FAIL(message.str());
}

// The works of one request; wait() completes every one (and frees it), then runs on_complete.
class GroupRequest final : public DirectRequest {
 public:
  explicit GroupRequest(std::shared_ptr<Group> group) : group_(std::move(group)) {}
  ~GroupRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (...) {
      // A destructor must not throw; the owner's wait() reports errors.
    }
  }

  // Posts through `post` (one of the table's operations, bound to its arguments); peer: the
  // group rank of a send or receive (-1: a collective).
  void add(const std::function<void*(char*, int64_t)>& post, const char* what, int peer = -1) {
    if (group_->io_threads) group_->io_threads->posting();
    char error[kErrorBytes] = {};
    void* work = post(error, kErrorBytes);
    if (work == nullptr) {
      finish_quietly();
      group_failed(*group_, what, error, peer);
    }
    works_.push_back(work);
    peers_.push_back(peer);
  }

  void wait() override {
    if (done_) return;
    done_ = true;
    // The group's I/O threads may preempt this thread from now on (comm/io_threads.hpp).
    const comm_detail::IoThreads::Waiting waiting(works_.empty() ? nullptr
                                                                 : group_->io_threads.get());
    std::string failure;
    int failed_peer = -1;
    for (size_t i = 0; i < works_.size(); ++i) {
      char error[kErrorBytes] = {};
      if (group_->ops.wait(works_[i], error, kErrorBytes) != 0 && failure.empty()) {
        failure = error;
        failed_peer = peers_[i];
      }
    }
    works_.clear();
    peers_.clear();
    if (!failure.empty()) group_failed(*group_, "a transfer", failure.c_str(), failed_peer);
    complete();
  }

 private:
  // Completes what was posted before a post failed (ignoring their errors).
  void finish_quietly() {
    done_ = true;
    for (void* work : works_) {
      char error[kErrorBytes] = {};
      group_->ops.wait(work, error, kErrorBytes);
    }
    works_.clear();
  }

  std::shared_ptr<Group> group_;
  std::vector<void*> works_;
  std::vector<int> peers_;  // by work
  bool done_ = false;
};

template <typename T>
int32_t element_code() {
  if constexpr (std::is_same_v<T, float>) return 0;
  if constexpr (std::is_same_v<T, double>) return 1;
  return 2;
}

class GroupCommunicator final : public DirectCollectives<GroupCommunicator, GroupRequest> {
 public:
  GroupCommunicator(std::shared_ptr<Group> group, std::vector<int> members, int64_t id)
      : DirectCollectives(members, rank_among(members, group->ops.rank, "group"), "process-group"),
        group_(std::move(group)),
        id_(id) {
    // A gloo group's collectives are matched by the group's own sequence number: a rank out of
    // step (one that skipped a backward and calls the next forward) meets the others' collective
    // of another size, and gloo aborts the process that receives it ("collective mismatch",
    // SIGABRT) before the watchdog can name the phases. The direct collectives below carry this
    // view's tags, which ranks in different operations never share: they wait, and the watchdog
    // reports both phases (tests/python/watchdog_torch.sh, skip). Timed alike here: forward +
    // backward of 4096 tokens x 8 heads x 64 over 4 ranks, 0.39 s either way.
    whole_ = std::strcmp(group_->ops.backend, "gloo") != 0 && size() == group_->ops.size;
    for (int r = 0; whole_ && r < size(); ++r)
      whole_ = member(r) == r;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    A2D_REQUIRE(color >= 0, "split: the color must not be negative (got ", color, ")");
    const int64_t mine[3] = {color, key, group_->next_id};
    std::vector<int64_t> all(3 * static_cast<size_t>(size()));
    const std::vector<int64_t> bytes(static_cast<size_t>(size()), sizeof mine);
    all_gather(Place::at_host(mine), Place::at_host(all.data()), bytes);
    std::vector<std::pair<int64_t, int>> chosen;  // (key, rank here) of this color
    int64_t id = 1;
    for (int r = 0; r < size(); ++r) {
      const size_t at = 3 * static_cast<size_t>(r);
      if (all[at] != color) continue;
      chosen.emplace_back(all[at + 1], r);
      id = std::max(id, all[at + 2]);
    }
    std::sort(chosen.begin(), chosen.end());
    std::vector<int> members;
    for (const auto& [k, r] : chosen)
      members.push_back(member(r));
    group_->next_id = id + 1 >= kIds ? 1 : id + 1;
    return std::make_unique<GroupCommunicator>(group_, std::move(members), id);
  }

 private:
  friend DirectCollectives;

  std::unique_ptr<GroupRequest> new_request() { return std::make_unique<GroupRequest>(group_); }

  int32_t wire_tag(uint32_t tag) const {
    return static_cast<int32_t>((static_cast<uint32_t>(id_) << kTagBits) | tag);
  }

  void post_send(GroupRequest& request, const void* data, int64_t bytes, int to, uint32_t tag) {
    const Group& g = *group_;
    const int32_t peer = member(to), wire = wire_tag(tag);
    request.add(
        [&](char* e, int64_t n) { return g.ops.send(g.ops.group, data, bytes, peer, wire, e, n); },
        "a send", peer);
  }
  void post_recv(GroupRequest& request, void* data, int64_t bytes, int from, uint32_t tag) {
    const Group& g = *group_;
    const int32_t peer = member(from), wire = wire_tag(tag);
    request.add(
        [&](char* e, int64_t n) { return g.ops.recv(g.ops.group, data, bytes, peer, wire, e, n); },
        "a receive", peer);
  }

  // The group's own collectives where this view is the whole group (whole_).
  bool native_all_gather(GroupRequest& request, const std::byte* send, std::byte* recv,
                         std::span<const int64_t> bytes) {
    const int64_t own = bytes[static_cast<size_t>(rank())];
    const bool equal = std::all_of(bytes.begin(), bytes.end(), [&](int64_t b) { return b == own; });
    if (!(whole_ && equal && size() > 1 && own > 0)) return false;
    const Group& g = *group_;
    request.add(
        [&](char* e, int64_t n) { return g.ops.all_gather(g.ops.group, send, recv, own, e, n); },
        "an all_gather");
    return true;
  }

  bool native_all_to_all(GroupRequest& request, const std::byte* send,
                         std::span<const int64_t> send_bytes, std::byte* recv,
                         std::span<const int64_t> recv_bytes) {
    if (!(whole_ && size() > 1)) return false;
    const Group& g = *group_;
    request.add(
        [&](char* e, int64_t n) {
          return g.ops.all_to_all(g.ops.group, send, send_bytes.data(), recv, recv_bytes.data(), e,
                                  n);
        },
        "an all_to_all");
    return true;
  }

  bool native_broadcast(void* data, int64_t bytes, int root) {
    if (!whole_) return false;
    GroupRequest request(group_);
    const Group& g = *group_;
    request.add(
        [&](char* e, int64_t n) { return g.ops.broadcast(g.ops.group, data, bytes, root, e, n); },
        "a broadcast");
    request.wait();
    return true;
  }

  bool native_barrier() {
    if (!whole_) return false;
    GroupRequest request(group_);
    const Group& g = *group_;
    request.add([&](char* e, int64_t n) { return g.ops.barrier(g.ops.group, e, n); }, "a barrier");
    request.wait();
    return true;
  }

  // The group's all_reduce over the whole group; a split reduces directly (a reduce-scatter in
  // rank order and an all-gather of the parts: the same bits on every rank).
  template <typename T>
  bool native_all_reduce(T* data, int64_t count, Reduction reduction) {
    if (!whole_) return false;
    GroupRequest request(group_);
    const Group& g = *group_;
    const int32_t maximum = reduction == Reduction::max ? 1 : 0;
    request.add(
        [&](char* e, int64_t n) {
          return g.ops.all_reduce(g.ops.group, data, count, element_code<T>(), maximum, e, n);
        },
        "an all_reduce");
    request.wait();
    return true;
  }

  std::shared_ptr<Group> group_;
  int64_t id_;
  bool whole_ = false;  // the whole group, in its rank order, and not gloo's: its collectives apply
};

// The table of a group of one rank: a communicator of one rank copies locally and never posts.
void* no_peer(char* error, int64_t error_bytes) {
  std::snprintf(error, static_cast<size_t>(error_bytes), "a process alone has no peer");
  return nullptr;
}

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() {
  A2dGroupOps ops{};
  ops.abi = A2D_GROUP_OPS_ABI;
  ops.rank = 0;
  ops.size = 1;
  std::snprintf(ops.backend, sizeof ops.backend, "self");
  ops.send = [](void*, const void*, int64_t, int32_t, int32_t, char* e, int64_t n) {
    return no_peer(e, n);
  };
  ops.recv = [](void*, void*, int64_t, int32_t, int32_t, char* e, int64_t n) {
    return no_peer(e, n);
  };
  ops.all_to_all = [](void*, const void*, const int64_t*, void*, const int64_t*, char* e,
                      int64_t n) { return no_peer(e, n); };
  ops.all_gather = [](void*, const void*, void*, int64_t, char* e, int64_t n) {
    return no_peer(e, n);
  };
  ops.all_reduce = [](void*, void*, int64_t, int32_t, int32_t, char* e, int64_t n) {
    return no_peer(e, n);
  };
  ops.broadcast = [](void*, void*, int64_t, int32_t, char* e, int64_t n) { return no_peer(e, n); };
  ops.barrier = [](void*, char* e, int64_t n) { return no_peer(e, n); };
  ops.wait = [](void*, char*, int64_t) { return int32_t{0}; };
  return make_group_communicator(ops);
}

std::unique_ptr<Communicator> make_group_communicator(const A2dGroupOps& ops) {
  auto group = std::make_shared<Group>(ops);  // owns ops from here (releases it on any throw)
  A2D_REQUIRE(ops.abi == A2D_GROUP_OPS_ABI, "the process-group operations were built for version ",
              ops.abi, " of their table, this module reads version ", A2D_GROUP_OPS_ABI,
              ": rebuild attention2d");
  A2D_REQUIRE(ops.size >= 1 && ops.rank >= 0 && ops.rank < ops.size, "a process group of ",
              ops.size, " ranks cannot hold rank ", ops.rank);
  A2D_REQUIRE(ops.send && ops.recv && ops.all_to_all && ops.all_gather && ops.all_reduce &&
                  ops.broadcast && ops.barrier && ops.wait,
              "the process-group operations table is incomplete");
  // A gloo group's messages cross its Gloo device's I/O thread, made by its library: its policy
  // follows this process's waits, as the engine's own mesh's does (comm/io_threads.hpp).
  if (std::strcmp(ops.backend, "gloo") == 0 && ops.size > 1 && comm_detail::batch_io_threads(true))
    group->io_threads = std::make_unique<comm_detail::IoThreads>(comm_detail::find_gloo_io_loops());
  std::vector<int> members(static_cast<size_t>(ops.size));
  std::iota(members.begin(), members.end(), 0);
  return std::make_unique<GroupCommunicator>(std::move(group), std::move(members), 0);
}

namespace {
// Throws on every rank of `host` when any rank's `refusal` is not empty: the lowest such rank's
// message, so that every rank reports the same cause.
void refuse_together(Communicator& host, const std::string& refusal) {
  const std::vector<std::string> all = all_gather_bytes(host, refusal);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank].empty()) continue;
    if (static_cast<int>(rank) == host.rank()) A2D_FAIL(all[rank]);
    A2D_FAIL(all[rank], " (rank ", rank, ")");
  }
}
}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     Backend& backend) {
  A2D_REQUIRE(host, "the NCCL communicator needs a host communicator");
#if defined(A2D_WITH_CUDA) && defined(A2D_WITH_MPI)
  std::string identity, refusal;
  try {
    identity = nccl::gpu_identity(backend);
  } catch (const Error& e) {
    refusal = e.what();
  }
  refuse_together(*host, refusal);
  const char* flag = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  refuse_together(*host,
                  comm_choice::sharing_refusal(all_gather_bytes(*host, identity), nccl::version(),
                                               flag && std::strcmp(flag, "1") == 0));
  return nccl::make_communicator(std::move(host), backend);
#else
  (void)backend;
  refuse_together(*host,
                  "NCCL through the caller's process group needs a build with the CUDA backend "
                  "and NCCL (-DA2D_WITH_CUDA=ON, with MPI found: the NCCL communicator is built "
                  "with it); this build has neither");
  return nullptr;  // not reached
#endif
}

}  // namespace a2d
