// The communicator interface over a caller's process group (group_comm.hpp): the direct
// collectives of gloo_comm.cpp over the group's point-to-point operations, and the group's own
// collectives where a communicator spans the whole group.
#include "attention2d/group_comm.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
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
#include "self_mail.hpp"
#if defined(A2D_WITH_CUDA) && defined(A2D_WITH_MPI)
#include <cstdlib>

#include "nccl_comm.hpp"
#endif

namespace a2d {
namespace {

using comm_detail::SelfMail;
using comm_detail::SelfReceive;

constexpr int kTagBits = 16;
constexpr uint32_t kUserTags = 0x8000;  // send_recv's tags; collectives use 0x8000 | n
constexpr int64_t kIds = 1 << 15;       // view ids: 15 bits, so that a tag stays below 2^31
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
class GroupRequest final : public Request {
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
    char error[kErrorBytes] = {};
    void* work = post(error, kErrorBytes);
    if (work == nullptr) {
      finish_quietly();
      group_failed(*group_, what, error, peer);
    }
    works_.push_back(work);
    peers_.push_back(peer);
  }

  std::function<void()> on_complete;
  std::vector<float> floats;  // received blocks of a reduce-scatter
  std::vector<std::shared_ptr<SelfReceive>> self_receives;

  void wait() override {
    if (done_) return;
    done_ = true;
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
    for (const auto& receive : self_receives) {
      if (receive->arrived) continue;
      for (const auto& other : self_receives)
        other->cancelled = !other->arrived;
      A2D_FAIL("a receive from this rank itself (tag ", receive->tag,
               ") was waited for, but no send to itself was posted for it");
    }
    if (on_complete) on_complete();
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

std::vector<int64_t> prefix_sums(std::span<const int64_t> counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i)
    offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

template <typename T>
void combine(T* into, const T* from, int64_t count, Reduction reduction) {
  if (reduction == Reduction::max) {
    for (int64_t i = 0; i < count; ++i)
      into[i] = std::max(into[i], from[i]);
  } else {
    for (int64_t i = 0; i < count; ++i)
      into[i] += from[i];
  }
}

bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + static_cast<uintptr_t>(b_bytes) && y < x + static_cast<uintptr_t>(a_bytes);
}

template <typename T>
int32_t element_code() {
  if constexpr (std::is_same_v<T, float>) return 0;
  if constexpr (std::is_same_v<T, double>) return 1;
  return 2;
}

class GroupCommunicator final : public Communicator {
 public:
  GroupCommunicator(std::shared_ptr<Group> group, std::vector<int> members, int64_t id)
      : group_(std::move(group)), members_(std::move(members)), id_(id) {
    const auto at = std::find(members_.begin(), members_.end(), group_->ops.rank);
    A2D_REQUIRE(at != members_.end(), "a group communicator must hold its own rank");
    rank_ = static_cast<int>(at - members_.begin());
    // A gloo group's collectives are matched by the group's own sequence number: a rank out of
    // step (one that skipped a backward and calls the next forward) meets the others' collective
    // of another size, and gloo aborts the process that receives it ("collective mismatch",
    // SIGABRT) before the watchdog can name the phases. The direct collectives below carry this
    // view's tags, which ranks in different operations never share: they wait, and the watchdog
    // reports both phases (tests/python/watchdog_torch.sh, skip). Timed alike here: forward +
    // backward of 4096 tokens x 8 heads x 64 over 4 ranks, 0.39 s either way.
    whole_ = std::strcmp(group_->ops.backend, "gloo") != 0 &&
             static_cast<int>(members_.size()) == group_->ops.size;
    for (int r = 0; whole_ && r < size(); ++r)
      whole_ = members_[static_cast<size_t>(r)] == r;
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

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
      members.push_back(members_[static_cast<size_t>(r)]);
    group_->next_id = id + 1 >= kIds ? 1 : id + 1;
    return std::make_unique<GroupCommunicator>(group_, std::move(members), id);
  }

  RequestPtr all_gather_async(Place send_at, Place recv_at,
                              std::span<const int64_t> bytes) override {
    check_counts(bytes);
    const std::vector<int64_t> offsets = prefix_sums(bytes);
    const int64_t own = bytes[static_cast<size_t>(rank_)];
    std::byte* recv = offsets.back() > 0 ? host_address(recv_at) : nullptr;
    const std::byte* send = own > 0 ? host_address(send_at) : nullptr;
    auto request = std::make_unique<GroupRequest>(group_);
    const bool equal = std::all_of(bytes.begin(), bytes.end(), [&](int64_t b) { return b == own; });
    if (whole_ && equal && size() > 1 && own > 0) {
      const Group& g = *group_;
      request->add(
          [&](char* e, int64_t n) { return g.ops.all_gather(g.ops.group, send, recv, own, e, n); },
          "an all_gather");
      return request;
    }
    const uint32_t tag = collective_tag();
    for (int step = 1; step < size(); ++step) {
      const int from = (rank_ - step + size()) % size();
      const int64_t n = bytes[static_cast<size_t>(from)];
      if (n > 0) post_recv(*request, recv + offsets[static_cast<size_t>(from)], n, from, tag);
    }
    if (own > 0) {
      for (int step = 1; step < size(); ++step)
        post_send(*request, send, own, (rank_ + step) % size(), tag);
      std::byte* own_slot = recv + offsets[static_cast<size_t>(rank_)];
      if (own_slot != send) std::memmove(own_slot, send, static_cast<size_t>(own));
    }
    return request;
  }

  RequestPtr reduce_scatter_async(Place send_at, Place recv_at, std::span<const int64_t> counts,
                                  int64_t record, Reduction reduction) override {
    check_counts(counts);
    A2D_REQUIRE(record >= 1, "reduce_scatter needs a record size of at least 1");
    std::vector<int64_t> floats(counts.begin(), counts.end());
    for (int64_t& f : floats)
      f *= record;
    const std::vector<int64_t> offsets = prefix_sums(floats);
    const int64_t own = floats[static_cast<size_t>(rank_)];
    const auto* send =
        reinterpret_cast<const float*>(offsets.back() > 0 ? host_address(send_at) : nullptr);
    auto* recv = reinterpret_cast<float*>(own > 0 ? host_address(recv_at) : nullptr);
    auto request = std::make_unique<GroupRequest>(group_);
    if (size() == 1) {
      if (own > 0 && send != recv)
        std::memmove(recv, send, sizeof(float) * static_cast<size_t>(own));
      return request;
    }
    const uint32_t tag = collective_tag();
    // Block j of rank r arrives at floats[(r < rank ? r : r - 1) * own].
    request->floats.resize(static_cast<size_t>((size() - 1) * own));
    float* received = request->floats.data();
    const auto arrived = [rank = rank_, own, received](int r) {
      return received + (r < rank ? r : r - 1) * own;
    };
    if (own > 0) {
      for (int step = 1; step < size(); ++step) {
        const int from = (rank_ - step + size()) % size();
        post_recv(*request, arrived(from), own * int64_t{sizeof(float)}, from, tag);
      }
    }
    for (int step = 1; step < size(); ++step) {
      const int to = (rank_ + step) % size();
      const int64_t n = floats[static_cast<size_t>(to)];
      if (n > 0)
        post_send(*request, send + offsets[static_cast<size_t>(to)], n * int64_t{sizeof(float)}, to,
                  tag);
    }
    if (own > 0) {
      const float* mine = send + offsets[static_cast<size_t>(rank_)];
      const int ranks = size(), rank = rank_;
      request->on_complete = [=] {
        // In rank order, whatever order the blocks arrived in: the same bits every run.
        const auto block = [&](int r) { return r == rank ? mine : arrived(r); };
        std::vector<float> scratch;
        float* out = recv;
        if (overlaps(recv, own * 4, send, offsets.back() * 4)) {
          scratch.resize(static_cast<size_t>(own));
          out = scratch.data();
        }
        std::copy_n(block(0), own, out);
        for (int r = 1; r < ranks; ++r)
          combine(out, block(r), own, reduction);
        if (out != recv) std::copy_n(out, own, recv);
      };
    }
    return request;
  }

  RequestPtr send_recv_async(Place send_at, int64_t send_bytes, int dest, Place recv_at,
                             int64_t recv_bytes, int source, int tag) override {
    A2D_REQUIRE(dest >= 0 && dest < size() && source >= 0 && source < size(), "send_recv peers ",
                dest, " and ", source, " must be ranks of a communicator of ", size());
    A2D_REQUIRE(send_bytes >= 0 && recv_bytes >= 0, "send_recv sizes must not be negative");
    A2D_REQUIRE(tag >= 0 && tag < static_cast<int>(kUserTags), "send_recv tags must be in [0, ",
                kUserTags, "), got ", tag);
    const std::byte* send = send_bytes > 0 ? host_address(send_at) : nullptr;
    std::byte* recv = recv_bytes > 0 ? host_address(recv_at) : nullptr;
    auto request = std::make_unique<GroupRequest>(group_);
    const bool to_self = send_bytes > 0 && dest == rank_;
    const bool from_self = recv_bytes > 0 && source == rank_;
    if (to_self && from_self && send_bytes == recv_bytes && !self_mail_.pending(tag)) {
      if (send != recv) std::memmove(recv, send, static_cast<size_t>(send_bytes));
      return request;  // the common exchange with oneself: no copy kept
    }
    const auto at = static_cast<uint32_t>(tag);
    if (recv_bytes > 0 && !from_self) post_recv(*request, recv, recv_bytes, source, at);
    if (to_self) self_mail_.send(tag, send, send_bytes);
    if (from_self) request->self_receives.push_back(self_mail_.receive(tag, recv, recv_bytes));
    if (send_bytes > 0 && !to_self) post_send(*request, send, send_bytes, dest, at);
    return request;
  }

  RequestPtr all_to_all_async(Place send_at, std::span<const int64_t> send_bytes, Place recv_at,
                              std::span<const int64_t> recv_bytes) override {
    check_counts(send_bytes);
    check_counts(recv_bytes);
    const std::vector<int64_t> send_offsets = prefix_sums(send_bytes);
    const std::vector<int64_t> recv_offsets = prefix_sums(recv_bytes);
    const auto me = static_cast<size_t>(rank_);
    A2D_REQUIRE(send_bytes[me] == recv_bytes[me], "all_to_all: the block a rank sends itself (",
                send_bytes[me], " bytes) must be the block it receives from itself (",
                recv_bytes[me], ")");
    const std::byte* send = send_offsets.back() > 0 ? host_address(send_at) : nullptr;
    std::byte* recv = recv_offsets.back() > 0 ? host_address(recv_at) : nullptr;
    auto request = std::make_unique<GroupRequest>(group_);
    if (whole_ && size() > 1) {
      const Group& g = *group_;
      request->add(
          [&](char* e, int64_t n) {
            return g.ops.all_to_all(g.ops.group, send, send_bytes.data(), recv, recv_bytes.data(),
                                    e, n);
          },
          "an all_to_all");
      return request;
    }
    const uint32_t tag = collective_tag();
    for (int step = 1; step < size(); ++step) {
      const auto from = static_cast<size_t>((rank_ - step + size()) % size());
      if (recv_bytes[from] > 0)
        post_recv(*request, recv + recv_offsets[from], recv_bytes[from], static_cast<int>(from),
                  tag);
    }
    for (int step = 1; step < size(); ++step) {
      const auto to = static_cast<size_t>((rank_ + step) % size());
      if (send_bytes[to] > 0)
        post_send(*request, send + send_offsets[to], send_bytes[to], static_cast<int>(to), tag);
    }
    if (send_bytes[me] > 0 && recv + recv_offsets[me] != send + send_offsets[me])
      std::memmove(recv + recv_offsets[me], send + send_offsets[me],
                   static_cast<size_t>(send_bytes[me]));
    return request;
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    A2D_REQUIRE(root >= 0 && root < size(), "broadcast root ", root,
                " is not a rank of a communicator of ", size());
    A2D_REQUIRE(bytes >= 0, "broadcast size must not be negative");
    if (size() == 1 || bytes == 0) return;
    GroupRequest request(group_);
    if (whole_) {
      const Group& g = *group_;
      request.add(
          [&](char* e, int64_t n) { return g.ops.broadcast(g.ops.group, data, bytes, root, e, n); },
          "a broadcast");
      request.wait();
      return;
    }
    const uint32_t tag = collective_tag();
    if (rank_ == root) {
      for (int step = 1; step < size(); ++step)
        post_send(request, data, bytes, (rank_ + step) % size(), tag);
    } else {
      post_recv(request, data, bytes, root, tag);
    }
    request.wait();
  }

  void all_reduce(float* data, int64_t count, Reduction reduction) override {
    reduce_all(data, count, reduction);
  }
  void all_reduce(double* data, int64_t count, Reduction reduction) override {
    reduce_all(data, count, reduction);
  }
  void all_reduce(int64_t* data, int64_t count, Reduction reduction) override {
    reduce_all(data, count, reduction);
  }

  void barrier() override {
    if (size() == 1) return;
    GroupRequest request(group_);
    if (whole_) {
      const Group& g = *group_;
      request.add([&](char* e, int64_t n) { return g.ops.barrier(g.ops.group, e, n); },
                  "a barrier");
      request.wait();
      return;
    }
    std::vector<char> tokens(static_cast<size_t>(size()), 0);
    const uint32_t tag = collective_tag();
    for (int step = 1; step < size(); ++step) {
      const int from = (rank_ - step + size()) % size();
      post_recv(request, &tokens[static_cast<size_t>(from)], 1, from, tag);
    }
    for (int step = 1; step < size(); ++step)
      post_send(request, &tokens[static_cast<size_t>(rank_)], 1, (rank_ + step) % size(), tag);
    request.wait();
  }

  void progress() override { Watchdog::heartbeat(); }
  void set_phase(const std::string& phase) override { Watchdog::note_phase(phase); }

 private:
  int32_t wire_tag(uint32_t tag) const {
    return static_cast<int32_t>((static_cast<uint32_t>(id_) << kTagBits) | tag);
  }
  uint32_t collective_tag() {
    collectives_ = (collectives_ + 1) % kUserTags;
    return kUserTags | collectives_;
  }

  void post_send(GroupRequest& request, const void* data, int64_t bytes, int to, uint32_t tag) {
    const Group& g = *group_;
    const int32_t peer = members_[static_cast<size_t>(to)], wire = wire_tag(tag);
    request.add(
        [&](char* e, int64_t n) { return g.ops.send(g.ops.group, data, bytes, peer, wire, e, n); },
        "a send", peer);
  }
  void post_recv(GroupRequest& request, void* data, int64_t bytes, int from, uint32_t tag) {
    const Group& g = *group_;
    const int32_t peer = members_[static_cast<size_t>(from)], wire = wire_tag(tag);
    request.add(
        [&](char* e, int64_t n) { return g.ops.recv(g.ops.group, data, bytes, peer, wire, e, n); },
        "a receive", peer);
  }

  void check_counts(std::span<const int64_t> counts) const {
    A2D_REQUIRE(static_cast<int>(counts.size()) == size(),
                "a collective needs one count per rank (", size(), "), got ", counts.size());
    for (const int64_t c : counts)
      A2D_REQUIRE(c >= 0, "a collective's block size must not be negative");
  }

  static std::byte* host_address(const Place& place) {
    if (!place.buffer) return place.host ? place.host + place.offset : nullptr;
    auto* memory = static_cast<std::byte*>(place.buffer->host_data());
    A2D_REQUIRE(memory, "the process-group communicator moves host memory only, and a ",
                place.buffer->backend().name(),
                " buffer is not host-accessible: wrap the communicator with "
                "make_staged_communicator");
    return memory + place.offset;
  }

  // The group's all_reduce over the whole group; a split reduces directly (a reduce-scatter in
  // rank order and an all-gather of the parts: the same bits on every rank).
  template <typename T>
  void reduce_all(T* data, int64_t count, Reduction reduction) {
    A2D_REQUIRE(count >= 0, "all_reduce count must not be negative");
    if (size() == 1 || count == 0) return;
    if (whole_) {
      GroupRequest request(group_);
      const Group& g = *group_;
      const int32_t maximum = reduction == Reduction::max ? 1 : 0;
      request.add(
          [&](char* e, int64_t n) {
            return g.ops.all_reduce(g.ops.group, data, count, element_code<T>(), maximum, e, n);
          },
          "an all_reduce");
      request.wait();
      return;
    }
    const int ranks = size();
    std::vector<int64_t> parts(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      parts[static_cast<size_t>(r)] = count / ranks + (r < count % ranks ? 1 : 0);
    const std::vector<int64_t> offsets = prefix_sums(parts);
    const int64_t own = parts[static_cast<size_t>(rank_)];
    const auto element = static_cast<int64_t>(sizeof(T));
    std::vector<T> received(static_cast<size_t>((ranks - 1) * own));
    const auto arrived = [&](int r) { return received.data() + (r < rank_ ? r : r - 1) * own; };
    {
      GroupRequest request(group_);
      const uint32_t tag = collective_tag();
      for (int step = 1; step < ranks && own > 0; ++step) {
        const int from = (rank_ - step + ranks) % ranks;
        post_recv(request, arrived(from), own * element, from, tag);
      }
      for (int step = 1; step < ranks; ++step) {
        const int to = (rank_ + step) % ranks;
        const int64_t n = parts[static_cast<size_t>(to)];
        if (n > 0)
          post_send(request, data + offsets[static_cast<size_t>(to)], n * element, to, tag);
      }
      request.wait();
    }
    if (own > 0) {
      T* mine = data + offsets[static_cast<size_t>(rank_)];
      std::vector<T> reduced(static_cast<size_t>(own));
      const auto block = [&](int r) { return r == rank_ ? mine : arrived(r); };
      std::copy_n(block(0), own, reduced.data());
      for (int r = 1; r < ranks; ++r)
        combine(reduced.data(), block(r), own, reduction);
      std::copy_n(reduced.data(), own, mine);
    }
    std::vector<int64_t> bytes(parts);
    for (int64_t& b : bytes)
      b *= element;
    all_gather_async(Place::at_host(data + offsets[static_cast<size_t>(rank_)]),
                     Place::at_host(data), bytes)
        ->wait();
  }

  std::shared_ptr<Group> group_;
  std::vector<int> members_;  // group ranks, by rank here
  SelfMail self_mail_;
  int64_t id_;
  int rank_ = 0;
  bool whole_ = false;  // the whole group, in its rank order, and not gloo's: its collectives apply
  uint32_t collectives_ = 0;
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
