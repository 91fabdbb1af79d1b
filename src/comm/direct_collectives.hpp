// Internal: the direct collectives over tagged point-to-point transfers, written once for the
// communicators whose transport has only sends and receives: the Gloo mesh's
// (gloo/communicator.hpp) and the caller's process group's (group_comm.cpp).
//
// A collective is direct: all_gather sends the own block to every rank, reduce_scatter sends
// block i to rank i and reduces the blocks it receives at wait(), in rank order, so results do
// not depend on arrival order; all_reduce is that reduce-scatter and an all-gather of the reduced
// parts, the same bits on every rank. Receives are posted before sends (Gloo sends only once the
// receiver has posted its receive). Tags: below 0x8000 send_recv's, 0x8000 | n the view's n-th
// collective (mod 2^15); each transport puts the view's id above them (kTagBits).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/error.hpp"
#include "attention2d/watchdog.hpp"
#include "self_mail.hpp"

namespace a2d::comm_detail {

constexpr int kTagBits = 16;
constexpr uint32_t kUserTags = 0x8000;  // send_recv's tags; collectives use 0x8000 | n

inline std::vector<int64_t> prefix_sums(std::span<const int64_t> counts) {
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

inline bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + static_cast<uintptr_t>(b_bytes) && y < x + static_cast<uintptr_t>(a_bytes);
}

// The position of `own` (a transport rank) in `members` (transport ranks, by rank here).
inline int rank_among(const std::vector<int>& members, int own, const char* kind) {
  const auto at = std::find(members.begin(), members.end(), own);
  A2D_REQUIRE(at != members.end(), "a ", kind, " communicator must hold its own rank");
  return static_cast<int>(at - members.begin());
}

// What a request of direct collectives carries besides its transfers; a transport's wait()
// completes its transfers, then calls complete().
class DirectRequest : public Request {
 public:
  // Runs after every transfer completed (a reduction of the received blocks).
  std::function<void()> on_complete;
  std::vector<float> floats;  // received blocks of a reduce-scatter
  // Receives from this rank itself: complete once the matching send was posted.
  std::vector<std::shared_ptr<SelfReceive>> self_receives;

 protected:
  void complete() {
    for (const auto& receive : self_receives) {
      if (receive->arrived) continue;
      for (const auto& other : self_receives)
        other->cancelled = !other->arrived;
      A2D_FAIL("a receive from this rank itself (tag ", receive->tag,
               ") was waited for, but no send to itself was posted for it");
    }
    if (on_complete) on_complete();
  }
};

// The communicator's collectives over the transport of `Derived`, whose requests are `Req` (a
// DirectRequest). Derived provides, for the base (a friend):
//   std::unique_ptr<Req> new_request();
//   void post_send(Req&, const void* data, int64_t bytes, int to, uint32_t tag);
//   void post_recv(Req&, void* data, int64_t bytes, int from, uint32_t tag);
// (to, from: ranks here; tag < 2^16), and may shadow the native_* hooks below with a
// transport's own collective (they return false where it has none, or declines).
template <class Derived, class Req>
class DirectCollectives : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

  RequestPtr all_gather_async(Place send_at, Place recv_at,
                              std::span<const int64_t> bytes) override {
    check_counts(bytes);
    const std::vector<int64_t> offsets = prefix_sums(bytes);
    const int64_t own = bytes[static_cast<size_t>(rank_)];
    std::byte* recv = offsets.back() > 0 ? host_address(recv_at) : nullptr;
    const std::byte* send = own > 0 ? host_address(send_at) : nullptr;
    std::unique_ptr<Req> request = self().new_request();
    if (self().native_all_gather(*request, send, recv, bytes)) return request;
    const uint32_t tag = collective_tag();
    for (int step = 1; step < size(); ++step) {
      const int from = (rank_ - step + size()) % size();
      const int64_t n = bytes[static_cast<size_t>(from)];
      if (n > 0)
        self().post_recv(*request, recv + offsets[static_cast<size_t>(from)], n, from, tag);
    }
    if (own > 0) {
      for (int step = 1; step < size(); ++step)
        self().post_send(*request, send, own, (rank_ + step) % size(), tag);
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
    std::unique_ptr<Req> request = self().new_request();
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
        self().post_recv(*request, arrived(from), own * int64_t{sizeof(float)}, from, tag);
      }
    }
    for (int step = 1; step < size(); ++step) {
      const int to = (rank_ + step) % size();
      const int64_t n = floats[static_cast<size_t>(to)];
      if (n > 0)
        self().post_send(*request, send + offsets[static_cast<size_t>(to)],
                         n * int64_t{sizeof(float)}, to, tag);
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
    std::unique_ptr<Req> request = self().new_request();
    const bool to_self = send_bytes > 0 && dest == rank_;
    const bool from_self = recv_bytes > 0 && source == rank_;
    if (to_self && from_self && send_bytes == recv_bytes && !self_mail_.pending(tag)) {
      if (send != recv) std::memmove(recv, send, static_cast<size_t>(send_bytes));
      return request;  // the common exchange with oneself: no copy kept
    }
    const auto at = static_cast<uint32_t>(tag);
    if (recv_bytes > 0 && !from_self) self().post_recv(*request, recv, recv_bytes, source, at);
    if (to_self) self_mail_.send(tag, send, send_bytes);
    if (from_self) request->self_receives.push_back(self_mail_.receive(tag, recv, recv_bytes));
    if (send_bytes > 0 && !to_self) self().post_send(*request, send, send_bytes, dest, at);
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
    std::unique_ptr<Req> request = self().new_request();
    if (self().native_all_to_all(*request, send, send_bytes, recv, recv_bytes)) return request;
    const uint32_t tag = collective_tag();
    for (int step = 1; step < size(); ++step) {
      const auto from = static_cast<size_t>((rank_ - step + size()) % size());
      if (recv_bytes[from] > 0)
        self().post_recv(*request, recv + recv_offsets[from], recv_bytes[from],
                         static_cast<int>(from), tag);
    }
    for (int step = 1; step < size(); ++step) {
      const auto to = static_cast<size_t>((rank_ + step) % size());
      if (send_bytes[to] > 0)
        self().post_send(*request, send + send_offsets[to], send_bytes[to], static_cast<int>(to),
                         tag);
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
    if (self().native_broadcast(data, bytes, root)) return;
    std::unique_ptr<Req> request = self().new_request();
    const uint32_t tag = collective_tag();
    if (rank_ == root) {
      for (int step = 1; step < size(); ++step)
        self().post_send(*request, data, bytes, (rank_ + step) % size(), tag);
    } else {
      self().post_recv(*request, data, bytes, root, tag);
    }
    request->wait();
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
    if (self().native_barrier()) return;
    std::vector<char> tokens(static_cast<size_t>(size()), 0);
    std::unique_ptr<Req> request = self().new_request();
    const uint32_t tag = collective_tag();
    for (int step = 1; step < size(); ++step) {
      const int from = (rank_ - step + size()) % size();
      self().post_recv(*request, &tokens[static_cast<size_t>(from)], 1, from, tag);
    }
    for (int step = 1; step < size(); ++step)
      self().post_send(*request, &tokens[static_cast<size_t>(rank_)], 1, (rank_ + step) % size(),
                       tag);
    request->wait();
  }

  // The transport's own thread moves the data; progress only tells the watchdog this rank is
  // alive.
  void progress() override { Watchdog::heartbeat(); }
  void set_phase(const std::string& phase) override { Watchdog::note_phase(phase); }

  // The transport rank of rank `r` here.
  int member(int r) const { return members_[static_cast<size_t>(r)]; }

 protected:
  // members: transport ranks, by rank here; rank: this rank's place among them; name: the
  // communicator's name in errors ("Gloo": "the Gloo communicator moves host memory only").
  DirectCollectives(std::vector<int> members, int rank, const char* name)
      : members_(std::move(members)), rank_(rank), name_(name) {}

  // The transport's own collectives, where it has them (false: the direct one runs).
  bool native_all_gather(Req& /*request*/, const std::byte* /*send*/, std::byte* /*recv*/,
                         std::span<const int64_t> /*bytes*/) {
    return false;
  }
  bool native_all_to_all(Req& /*request*/, const std::byte* /*send*/,
                         std::span<const int64_t> /*send_bytes*/, std::byte* /*recv*/,
                         std::span<const int64_t> /*recv_bytes*/) {
    return false;
  }
  bool native_broadcast(void* /*data*/, int64_t /*bytes*/, int /*root*/) { return false; }
  bool native_barrier() { return false; }
  template <typename T>
  bool native_all_reduce(T* /*data*/, int64_t /*count*/, Reduction /*reduction*/) {
    return false;
  }

  const std::vector<int>& members() const { return members_; }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }

  uint32_t collective_tag() {
    collectives_ = (collectives_ + 1) % kUserTags;
    return kUserTags | collectives_;
  }

  void check_counts(std::span<const int64_t> counts) const {
    A2D_REQUIRE(static_cast<int>(counts.size()) == size(),
                "a collective needs one count per rank (", size(), "), got ", counts.size());
    for (const int64_t c : counts)
      A2D_REQUIRE(c >= 0, "a collective's block size must not be negative");
  }

  // The host address of a place; buffers the host must not touch need a staged communicator.
  std::byte* host_address(const Place& place) const {
    if (!place.buffer) return place.host ? place.host + place.offset : nullptr;
    auto* memory = static_cast<std::byte*>(place.buffer->host_data());
    A2D_REQUIRE(memory, "the ", name_, " communicator moves host memory only, and a ",
                place.buffer->backend().name(),
                " buffer is not host-accessible: wrap the communicator with "
                "make_staged_communicator");
    return memory + place.offset;
  }

  // All-reduce: the transport's own, or a direct reduce-scatter of `count` elements in `size()`
  // nearly equal parts (each part reduced by its rank, in rank order), then an all-gather of the
  // reduced parts.
  template <typename T>
  void reduce_all(T* data, int64_t count, Reduction reduction) {
    A2D_REQUIRE(count >= 0, "all_reduce count must not be negative");
    if (size() == 1 || count == 0) return;
    if (self().native_all_reduce(data, count, reduction)) return;
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
      std::unique_ptr<Req> request = self().new_request();
      const uint32_t tag = collective_tag();
      for (int step = 1; step < ranks && own > 0; ++step) {
        const int from = (rank_ - step + ranks) % ranks;
        self().post_recv(*request, arrived(from), own * element, from, tag);
      }
      for (int step = 1; step < ranks; ++step) {
        const int to = (rank_ + step) % ranks;
        const int64_t n = parts[static_cast<size_t>(to)];
        if (n > 0)
          self().post_send(*request, data + offsets[static_cast<size_t>(to)], n * element, to, tag);
      }
      request->wait();
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

  std::vector<int> members_;  // transport ranks, by rank here
  SelfMail self_mail_;
  int rank_ = 0;
  const char* name_;
  uint32_t collectives_ = 0;
};

}  // namespace a2d::comm_detail
