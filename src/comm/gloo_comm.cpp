// The communicator interface over Gloo's TCP transport (gloo_comm.hpp), and the watchdog's link
// over it (watchdog_link.hpp).
//
// A Mesh is one Gloo context: a TCP connection to every other rank, served by the device's I/O
// thread. Communicators are views of a mesh: a list of its ranks and a 48-bit id. A message's Gloo
// slot is (id << 16) | tag, tag < 0x8000 for send_recv's tags and 0x8000 | n for the view's n-th
// collective (mod 2^15), so views, their point-to-point tags and their collectives never match
// each other's messages. A child's id is a hash of (parent id, the parent's split count, color):
// every member computes the same one, and two views that share ranks collide with probability
// 2^-48 per pair of views (about n^2 / 2^49 for n views made in a job: 5e-7 for 16,000).
//
// Transfers are unbound buffers, one per transfer (Gloo allows one pending operation per buffer).
// Gloo sends only once the receiver has posted its receive (it announces each with a message), so
// collectives post their receives first. A collective is direct: all_gather sends the own block
// to every rank, reduce_scatter sends block i to rank i and reduces the blocks it receives at
// wait(), in rank order, so results do not depend on arrival order; all_reduce is that
// reduce-scatter and an all-gather of the reduced parts, the same bits on every rank.
#include "attention2d/gloo_comm.hpp"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/watchdog.hpp"
#include "self_mail.hpp"
#include "watchdog_link.hpp"

namespace a2d {
namespace {

using comm_detail::SelfMail;
using comm_detail::SelfReceive;

using Milliseconds = std::chrono::milliseconds;
using UnboundBuffer = gloo::transport::UnboundBuffer;

// Gloo's waits take a limit, and a limit of zero times out at once: "no limit" is 2^40 ms (35
// years), which steady_clock::now() plus it in nanoseconds does not overflow.
constexpr Milliseconds kNoLimit{int64_t{1} << 40};

constexpr int kTagBits = 16;
constexpr uint64_t kIdMask = (uint64_t{1} << 48) - 1;
constexpr uint32_t kUserTags = 0x8000;  // send_recv's tags; collectives use 0x8000 | n
constexpr uint64_t kWorldId = 0xA2D6100;
// The mesh's own slot (id 0, which no view has): a failing rank tells the others which rank
// failed first (see Mesh::fail).
constexpr uint64_t kNoticeSlot = 1;
// Slots 2 + 16 g of id 0: the monitor's receives of generation g (see Mesh::monitor).
constexpr uint64_t kSentinelSlot = 2;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t child_id(uint64_t parent, uint64_t split_count, int color) {
  const uint64_t id =
      mix(mix(mix(parent) ^ split_count) ^ static_cast<uint64_t>(static_cast<uint32_t>(color))) &
      kIdMask;
  return id == 0 ? 1 : id;
}

// Memory and the unbound buffer over it, kept alive together.
struct Parked {
  std::vector<std::byte> memory;
  std::unique_ptr<UnboundBuffer> buffer;
};

bool mentions(const std::string& text, const char* what) {
  return text.find(what) != std::string::npos;
}

class Mesh {
 public:
  Mesh(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
       std::shared_ptr<gloo::transport::Context> context, Milliseconds wait_limit)
      : rank_(rank),
        size_(size),
        wait_limit_(wait_limit),
        device_(std::move(device)),
        context_(std::move(context)) {}
  // The monitor first, then the buffers (an operation still pending on one is dropped by Gloo
  // when it is gone), then the connections (closed with the context), then the I/O thread (with
  // the device).
  ~Mesh() {
    if (monitor_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(waits_mutex_);
        stopping_ = true;
        if (sentinels_) sentinels_->buffer->abortWaitRecv();
      }
      monitor_.join();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      parked_.clear();
      notices_.clear();
    }
    sentinels_.reset();
    context_.reset();
    device_.reset();
  }
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Milliseconds wait_limit() const { return wait_limit_; }

  std::unique_ptr<UnboundBuffer> buffer(void* data, int64_t bytes) {
    return context_->createUnboundBuffer(data, static_cast<size_t>(bytes));
  }

  // Keeps `parked` until the mesh ends: a buffer a peer may still send into, or send out of.
  void park(std::unique_ptr<Parked> parked) {
    if (!parked) return;
    std::lock_guard<std::mutex> lock(mutex_);
    parked_.push_back(std::move(parked));
  }

  // Posts a receive of a notice from every other rank (at creation, before any transfer).
  void post_notices() {
    notices_.resize(static_cast<size_t>(size_));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      auto notice = std::make_unique<Parked>();
      notice->memory.resize(sizeof(int32_t));
      notice->buffer = buffer(notice->memory.data(), sizeof(int32_t));
      notice->buffer->recv(peer, kNoticeSlot, 0, sizeof(int32_t));
      notices_[static_cast<size_t>(peer)] = std::move(notice);
    }
  }

  // Gloo signals a failed connection to the operations queued on it, but not to a send it is
  // still writing or a receive it is reading (their waits would never end): every wait is
  // registered here, and the monitor ends the waits on a connection that closed.
  void start_monitor() {
    if (size_ > 1) monitor_ = std::thread([this] { monitor(); });
  }

  // Waits for the transfer on `buffer` with `peer`: true once complete, false if the connection
  // to `peer` closed meanwhile (or the mesh was closed); Gloo's errors are thrown.
  bool wait(UnboundBuffer& buffer, int peer, bool send) {
    Wait registered{&buffer, peer, send};
    for (;;) {
      bool closed = false;
      {
        std::lock_guard<std::mutex> lock(waits_mutex_);
        if (broken_) return false;
        closed = closed_.count(peer) > 0;
        if (!closed) waits_.push_back(&registered);
      }
      if (closed) return wait_closed(registered);
      bool done = false;
      try {
        done = send ? buffer.waitSend(nullptr, wait_limit_) : buffer.waitRecv(nullptr, wait_limit_);
      } catch (...) {
        unregister(&registered);
        throw;
      }
      unregister(&registered);
      if (done) return true;
      // Ended by the monitor: look again (it ends every wait when the mesh is closed).
    }
  }

  // A transfer with `peer` failed with Gloo's `text`: the a2d::Error to throw, or (with a watchdog
  // over this mesh) the watchdog's report. Tells the other ranks which rank failed first, closes
  // every connection (so no rank waits for this one, and nothing arrives any more into memory
  // that pending receives pointed to), and throws.
  [[noreturn]] void fail(const std::string& text, int peer) {
    std::string message;
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_.empty()) {
        failure_ = describe(text, peer);
        first = true;
      }
      message = first ? failure_
                      : "this rank's Gloo connections were closed after an earlier "
                        "failure: " +
                            failure_;
    }
    if (first) {
      Watchdog::transport_failed(this, failure_);  // returns unless a watchdog ends the job
      tell_the_others(origin_);
      break_connections();
    }
    A2D_FAIL(message);
  }

  // Closes every connection, as Gloo itself does when an operation times out (it is the way to
  // make every pending operation of every thread fail at once): a receive that waits past its
  // limit signals every pair. The waits it does not reach end here.
  void break_connections() {
    {
      std::lock_guard<std::mutex> lock(waits_mutex_);
      if (broken_) return;
      broken_ = true;
      for (Wait* w : waits_)
        w->end();
    }
    char byte = 0;
    std::unique_ptr<UnboundBuffer> nothing = buffer(&byte, 1);
    try {
      nothing->waitRecv(nullptr, Milliseconds(1));
    } catch (const gloo::Exception&) {
      // Expected: the timeout closed every pair.
    }
  }

 private:
  struct Wait {
    UnboundBuffer* buffer;
    int peer;
    bool send;
    void end() const {
      if (send) {
        buffer->abortWaitSend();
      } else {
        buffer->abortWaitRecv();
      }
    }
  };

  void unregister(Wait* w) {
    std::lock_guard<std::mutex> lock(waits_mutex_);
    std::erase(waits_, w);
  }

  // A wait on a connection that closed: a transfer that completed before returns at once and one
  // that Gloo failed throws at once, but one it was in the middle of would wait forever, so it is
  // ended after a moment.
  static bool wait_closed(const Wait& w) {
    std::mutex mutex;
    std::condition_variable finished_cv;
    bool finished = false;
    std::thread ender([&] {
      std::unique_lock<std::mutex> lock(mutex);
      if (!finished_cv.wait_for(lock, Milliseconds(100), [&] { return finished; })) w.end();
    });
    const auto finish = [&] {
      {
        std::lock_guard<std::mutex> lock(mutex);
        finished = true;
      }
      finished_cv.notify_one();
      ender.join();
    };
    bool done = false;
    try {
      done = w.send ? w.buffer->waitSend(nullptr, kNoLimit) : w.buffer->waitRecv(nullptr, kNoLimit);
    } catch (...) {
      finish();
      throw;
    }
    finish();
    return done;
  }

  // Keeps a receive pending on every open connection, on a slot no rank sends to: Gloo fails it
  // when the connection closes. Then the monitor finds which connections closed (posting on a
  // closed one throws), ends the waits on them, and arms a new set on the others.
  void monitor() {
    uint64_t generation = 0;
    for (;;) {
      auto armed = std::make_unique<Parked>();
      armed->memory.resize(static_cast<size_t>(size_));
      armed->buffer = buffer(armed->memory.data(), size_);
      int open = 0;
      std::vector<int> closed;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        try {
          armed->buffer->recv(peer, kSentinelSlot + (generation << 4), static_cast<size_t>(peer),
                              1);
          ++open;
        } catch (const gloo::Exception&) {
          closed.push_back(peer);
        }
      }
      {
        std::lock_guard<std::mutex> lock(waits_mutex_);
        for (const int peer : closed)
          closed_.insert(peer);
        for (Wait* w : waits_) {
          if (broken_ || closed_.count(w->peer)) w->end();
        }
        if (stopping_ || open == 0) {
          park(std::move(armed));
          return;
        }
        if (sentinels_) park(std::move(sentinels_));
        sentinels_ = std::move(armed);
      }
      ++generation;
      try {
        // Nothing is ever sent to these slots: this returns when stopping (aborted), or throws.
        if (!sentinels_->buffer->waitRecv(nullptr, kNoLimit)) return;
      } catch (const gloo::Exception&) {
        // A connection closed: find which, above.
      }
    }
  }
  // The rank that failed first: `peer`, unless `peer` told this rank (its notice) that it closed
  // its connections because of another rank. The pair with `peer` is closed here, so waiting for
  // its notice returns at once: it arrived, or the wait throws.
  int origin_of(int peer) {
    if (peer < 0 || peer >= size_ || peer == rank_ || !notices_[static_cast<size_t>(peer)])
      return peer;
    Parked& notice = *notices_[static_cast<size_t>(peer)];
    try {
      if (!notice.buffer->waitRecv(nullptr, kNoLimit)) return peer;
    } catch (const gloo::Exception&) {
      return peer;
    }
    int32_t origin = -1;
    std::memcpy(&origin, notice.memory.data(), sizeof origin);
    return origin >= 0 && origin < size_ && origin != rank_ ? origin : peer;
  }

  std::string describe(const std::string& text, int peer) {
    const std::string phase = Watchdog::current_phase();
    origin_ = peer;
    std::ostringstream out;
    if (mentions(text, "Timed out waiting")) {
      out << "a transfer with rank " << peer << " did not complete within "
          << static_cast<double>(wait_limit_.count()) / 1000.0
          << " s (GlooOptions::timeout_seconds) while this rank waited in phase " << phase
          << "; Gloo closed every connection";
      return out.str();
    }
    if (mentions(text, "closed by peer") || mentions(text, "reset by peer") ||
        mentions(text, "Socket closed") || mentions(text, "Broken pipe") ||
        mentions(text, "Application timeout caused pair closure")) {
      origin_ = origin_of(peer);
      out << "rank " << origin_ << " closed its connection (exited or killed?) while this rank "
          << "waited in phase " << phase;
      if (origin_ != peer) out << " (rank " << peer << " stopped because of it)";
      return out.str();
    }
    out << "the Gloo transfer with rank " << peer << " failed while this rank waited in phase "
        << phase << ": " << text;
    return out.str();
  }

  // Sends the rank that failed first to every other rank, and gives the sends a moment to leave
  // (they go out at once unless a large transfer is still being written).
  void tell_the_others(int origin) {
    auto notices = std::make_shared<std::vector<std::unique_ptr<Parked>>>();
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || peer == origin) continue;
      auto notice = std::make_unique<Parked>();
      notice->memory.resize(sizeof(int32_t));
      const int32_t value = origin;
      std::memcpy(notice->memory.data(), &value, sizeof value);
      notice->buffer = buffer(notice->memory.data(), sizeof(int32_t));
      try {
        notice->buffer->send(peer, kNoticeSlot, 0, sizeof(int32_t));
      } catch (const gloo::Exception&) {
        continue;  // that connection is closed already
      }
      notices->push_back(std::move(notice));
    }
    auto sent = std::make_shared<std::atomic<bool>>(false);
    std::thread([notices, sent] {
      for (auto& notice : *notices) {
        try {
          notice->buffer->waitSend(nullptr, kNoLimit);
        } catch (const gloo::Exception&) {
          // Closed meanwhile: nothing more to wait for.
        }
      }
      sent->store(true);
    }).detach();
    for (int i = 0; i < 20 && !sent->load(); ++i)
      std::this_thread::sleep_for(Milliseconds(5));
    // What has not left by now will not: the thread (which holds the buffers) stops waiting.
    for (auto& notice : *notices)
      notice->buffer->abortWaitSend();
  }

  const int rank_;
  const int size_;
  const Milliseconds wait_limit_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::transport::Context> context_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Parked>> parked_;
  std::vector<std::unique_ptr<Parked>> notices_;  // by rank; read only after a failure
  std::string failure_;
  int origin_ = -1;

  std::mutex waits_mutex_;  // guards what follows
  std::vector<Wait*> waits_;
  std::set<int> closed_;  // ranks whose connection closed
  bool broken_ = false;
  bool stopping_ = false;
  std::unique_ptr<Parked> sentinels_;
  std::thread monitor_;
};

// A transfer of one request: a send or a receive with one rank of the mesh.
struct Transfer {
  std::unique_ptr<UnboundBuffer> buffer;
  int peer = -1;
  bool send = false;
};

class GlooRequest final : public Request {
 public:
  explicit GlooRequest(std::shared_ptr<Mesh> mesh) : mesh_(std::move(mesh)) {}
  ~GlooRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (...) {
      // A destructor must not throw; the owner's wait() reports errors.
    }
  }

  void post_send(const void* data, int64_t bytes, int peer, uint64_t slot) {
    post(const_cast<void*>(data), bytes, peer, slot, true);
  }
  void post_recv(void* data, int64_t bytes, int peer, uint64_t slot) {
    post(data, bytes, peer, slot, false);
  }

  // Runs after every transfer completed (a reduction of the received blocks).
  std::function<void()> on_complete;
  std::vector<float> floats;  // received blocks of a reduce-scatter
  // Receives from this rank itself: complete once the matching send was posted.
  std::vector<std::shared_ptr<SelfReceive>> self_receives;

  void wait() override {
    if (done_) return;
    done_ = true;
    for (Transfer& t : transfers_) {
      bool done = false;
      try {
        done = mesh_->wait(*t.buffer, t.peer, t.send);
      } catch (const gloo::Exception& e) {
        mesh_->fail(e.what(), t.peer);
      }
      if (!done) mesh_->fail("Connection closed by peer (the mesh's monitor)", t.peer);
    }
    transfers_.clear();
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
  void post(void* data, int64_t bytes, int peer, uint64_t slot, bool send) {
    Transfer t{mesh_->buffer(data, bytes), peer, send};
    try {
      if (send) {
        t.buffer->send(peer, slot, 0, static_cast<size_t>(bytes));
      } else {
        t.buffer->recv(peer, slot, 0, static_cast<size_t>(bytes));
      }
    } catch (const gloo::Exception& e) {
      done_ = true;  // fail() closes the connections: nothing pending is left to wait for
      mesh_->fail(e.what(), peer);
    }
    transfers_.push_back(std::move(t));
  }

  std::shared_ptr<Mesh> mesh_;
  std::vector<Transfer> transfers_;
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

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Mesh> mesh, std::vector<int> members, uint64_t id)
      : mesh_(std::move(mesh)), members_(std::move(members)), id_(id) {
    const auto at = std::find(members_.begin(), members_.end(), mesh_->rank());
    A2D_REQUIRE(at != members_.end(), "a Gloo communicator must hold its own rank");
    rank_ = static_cast<int>(at - members_.begin());
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

  std::unique_ptr<Communicator> split(int color, int key) override { return view(color, key); }

  // split(), as the Gloo communicator it is.
  std::unique_ptr<GlooCommunicator> view(int color, int key) {
    A2D_REQUIRE(color >= 0, "split: the color must not be negative (got ", color, ")");
    const int64_t mine[2] = {color, key};
    std::vector<int64_t> all(2 * static_cast<size_t>(size()));
    const std::vector<int64_t> bytes(static_cast<size_t>(size()), sizeof mine);
    all_gather(Place::at_host(mine), Place::at_host(all.data()), bytes);
    std::vector<std::pair<int64_t, int>> chosen;  // (key, rank here) of this color
    for (int r = 0; r < size(); ++r) {
      if (all[2 * static_cast<size_t>(r)] == color)
        chosen.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
    }
    std::sort(chosen.begin(), chosen.end());
    std::vector<int> members;
    for (const auto& [k, r] : chosen)
      members.push_back(members_[static_cast<size_t>(r)]);
    return std::make_unique<GlooCommunicator>(mesh_, std::move(members),
                                              child_id(id_, splits_++, color));
  }

  RequestPtr all_gather_async(Place send_at, Place recv_at,
                              std::span<const int64_t> bytes) override {
    check_counts(bytes);
    const std::vector<int64_t> offsets = prefix_sums(bytes);
    const int64_t own = bytes[static_cast<size_t>(rank_)];
    std::byte* recv = offsets.back() > 0 ? host_address(recv_at) : nullptr;
    const std::byte* send = own > 0 ? host_address(send_at) : nullptr;
    auto request = std::make_unique<GlooRequest>(mesh_);
    const uint64_t slot = collective_slot();
    for (int step = 1; step < size(); ++step) {
      const int from = (rank_ - step + size()) % size();
      const int64_t n = bytes[static_cast<size_t>(from)];
      if (n > 0)
        request->post_recv(recv + offsets[static_cast<size_t>(from)], n, member(from), slot);
    }
    if (own > 0) {
      for (int step = 1; step < size(); ++step)
        request->post_send(send, own, member((rank_ + step) % size()), slot);
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
    auto request = std::make_unique<GlooRequest>(mesh_);
    if (size() == 1) {
      if (own > 0 && send != recv)
        std::memmove(recv, send, sizeof(float) * static_cast<size_t>(own));
      return request;
    }
    const uint64_t slot = collective_slot();
    // Block j of rank r arrives at floats[(r < rank ? r : r - 1) * own].
    request->floats.resize(static_cast<size_t>((size() - 1) * own));
    float* received = request->floats.data();
    const auto arrived = [rank = rank_, own, received](int r) {
      return received + (r < rank ? r : r - 1) * own;
    };
    if (own > 0) {
      for (int step = 1; step < size(); ++step) {
        const int from = (rank_ - step + size()) % size();
        request->post_recv(arrived(from), own * int64_t{sizeof(float)}, member(from), slot);
      }
    }
    for (int step = 1; step < size(); ++step) {
      const int to = (rank_ + step) % size();
      const int64_t n = floats[static_cast<size_t>(to)];
      if (n > 0)
        request->post_send(send + offsets[static_cast<size_t>(to)], n * int64_t{sizeof(float)},
                           member(to), slot);
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
    auto request = std::make_unique<GlooRequest>(mesh_);
    const bool to_self = send_bytes > 0 && dest == rank_;
    const bool from_self = recv_bytes > 0 && source == rank_;
    if (to_self && from_self && send_bytes == recv_bytes && !self_mail_.pending(tag)) {
      if (send != recv) std::memmove(recv, send, static_cast<size_t>(send_bytes));
      return request;  // the common exchange with oneself: no copy kept
    }
    const uint64_t at = slot(static_cast<uint32_t>(tag));
    if (recv_bytes > 0 && !from_self) request->post_recv(recv, recv_bytes, member(source), at);
    if (to_self) self_mail_.send(tag, send, send_bytes);
    if (from_self) request->self_receives.push_back(self_mail_.receive(tag, recv, recv_bytes));
    if (send_bytes > 0 && !to_self) request->post_send(send, send_bytes, member(dest), at);
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
    auto request = std::make_unique<GlooRequest>(mesh_);
    const uint64_t slot = collective_slot();
    for (int step = 1; step < size(); ++step) {
      const auto from = static_cast<size_t>((rank_ - step + size()) % size());
      if (recv_bytes[from] > 0)
        request->post_recv(recv + recv_offsets[from], recv_bytes[from],
                           member(static_cast<int>(from)), slot);
    }
    for (int step = 1; step < size(); ++step) {
      const auto to = static_cast<size_t>((rank_ + step) % size());
      if (send_bytes[to] > 0)
        request->post_send(send + send_offsets[to], send_bytes[to], member(static_cast<int>(to)),
                           slot);
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
    GlooRequest request(mesh_);
    const uint64_t slot = collective_slot();
    if (rank_ == root) {
      for (int step = 1; step < size(); ++step)
        request.post_send(data, bytes, member((rank_ + step) % size()), slot);
    } else {
      request.post_recv(data, bytes, member(root), slot);
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
    std::vector<char> tokens(static_cast<size_t>(size()), 0);
    GlooRequest request(mesh_);
    const uint64_t slot = collective_slot();
    for (int step = 1; step < size(); ++step) {
      const int from = (rank_ - step + size()) % size();
      request.post_recv(&tokens[static_cast<size_t>(from)], 1, member(from), slot);
    }
    for (int step = 1; step < size(); ++step)
      request.post_send(&tokens[static_cast<size_t>(rank_)], 1, member((rank_ + step) % size()),
                        slot);
    request.wait();
  }

  // Gloo's I/O thread moves the data; progress only tells the watchdog this rank is alive.
  void progress() override { Watchdog::heartbeat(); }
  void set_phase(const std::string& phase) override { Watchdog::note_phase(phase); }

  const std::shared_ptr<Mesh>& mesh() const { return mesh_; }
  // The mesh rank of rank `r` here.
  int member(int r) const { return members_[static_cast<size_t>(r)]; }
  uint64_t slot(uint32_t tag) const { return (id_ << kTagBits) | tag; }

 private:
  uint64_t collective_slot() {
    collectives_ = (collectives_ + 1) % kUserTags;
    return slot(kUserTags | collectives_);
  }

  void check_counts(std::span<const int64_t> counts) const {
    A2D_REQUIRE(static_cast<int>(counts.size()) == size(),
                "a collective needs one count per rank (", size(), "), got ", counts.size());
    for (const int64_t c : counts)
      A2D_REQUIRE(c >= 0, "a collective's block size must not be negative");
  }

  // The host address of a place; buffers the host must not touch need a staged communicator.
  static std::byte* host_address(const Place& place) {
    if (!place.buffer) return place.host ? place.host + place.offset : nullptr;
    auto* memory = static_cast<std::byte*>(place.buffer->host_data());
    A2D_REQUIRE(memory, "the Gloo communicator moves host memory only, and a ",
                place.buffer->backend().name(),
                " buffer is not host-accessible: wrap the communicator with "
                "make_staged_communicator");
    return memory + place.offset;
  }

  // All-reduce: a direct reduce-scatter of `count` elements in `size()` nearly equal parts
  // (each part reduced by its rank, in rank order), then an all-gather of the reduced parts.
  template <typename T>
  void reduce_all(T* data, int64_t count, Reduction reduction) {
    A2D_REQUIRE(count >= 0, "all_reduce count must not be negative");
    if (size() == 1 || count == 0) return;
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
      GlooRequest request(mesh_);
      const uint64_t slot = collective_slot();
      for (int step = 1; step < ranks && own > 0; ++step) {
        const int from = (rank_ - step + ranks) % ranks;
        request.post_recv(arrived(from), own * element, member(from), slot);
      }
      for (int step = 1; step < ranks; ++step) {
        const int to = (rank_ + step) % ranks;
        const int64_t n = parts[static_cast<size_t>(to)];
        if (n > 0)
          request.post_send(data + offsets[static_cast<size_t>(to)], n * element, member(to), slot);
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

  std::shared_ptr<Mesh> mesh_;
  std::vector<int> members_;  // mesh ranks, by rank here
  SelfMail self_mail_;
  uint64_t id_;
  int rank_ = 0;
  uint32_t collectives_ = 0;
  uint64_t splits_ = 0;
};

// --- Bootstrap -----------------------------------------------------------------------------------

void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

std::string from_options(const std::string& given, std::initializer_list<const char*> variables) {
  if (!given.empty()) return given;
  for (const char* variable : variables) {
    const char* value = std::getenv(variable);
    if (value && *value) return value;
  }
  return "";
}

// What each rank contributes to the bootstrap all-gather: its rank, the size it was given, why it
// could not open its device ("" if it could), and the address of its connection to every rank.
struct Card {
  int32_t rank = -1;
  int32_t size = 0;
  std::string failure;
  std::vector<std::string> addresses;  // by rank; its own empty
};

constexpr char kCardMagic[] = "a2d-gloo-card-1";

void put(std::string& out, const std::string& field) {
  const auto n = static_cast<uint32_t>(field.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += field;
}

std::string encode(const Card& card) {
  std::string out(kCardMagic);
  out.append(reinterpret_cast<const char*>(&card.rank), sizeof card.rank);
  out.append(reinterpret_cast<const char*>(&card.size), sizeof card.size);
  put(out, card.failure);
  for (const std::string& address : card.addresses)
    put(out, address);
  return out;
}

// false if `text` is not a card of `size` ranks.
bool decode(const std::string& text, int size, Card& card) {
  size_t at = std::strlen(kCardMagic);
  if (text.compare(0, at, kCardMagic) != 0) return false;
  const auto take = [&](void* into, size_t n) {
    if (at + n > text.size()) return false;
    std::memcpy(into, text.data() + at, n);
    at += n;
    return true;
  };
  const auto field = [&](std::string& into) {
    uint32_t n = 0;
    if (!take(&n, sizeof n) || at + n > text.size()) return false;
    into.assign(text, at, n);
    at += n;
    return true;
  };
  if (!take(&card.rank, sizeof card.rank) || !take(&card.size, sizeof card.size)) return false;
  if (card.size != size || !field(card.failure)) return false;
  card.addresses.assign(static_cast<size_t>(size), "");
  for (std::string& address : card.addresses) {
    if (!field(address)) return false;
  }
  return at == text.size();
}

std::shared_ptr<Mesh> connect_mesh(int rank, int size, const AllGatherBytes& exchange,
                                   const GlooOptions& options) {
  ignore_sigpipe();
  Card mine;
  mine.rank = rank;
  mine.size = size;
  mine.addresses.assign(static_cast<size_t>(size), "");
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::transport::Context> context;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = from_options(options.hostname, {"A2D_GLOO_HOSTNAME"});
    attr.iface = from_options(options.interface, {"A2D_GLOO_INTERFACE", "GLOO_SOCKET_IFNAME"});
    device = gloo::transport::tcp::CreateDevice(attr);
    context = device->createContext(rank, size);
    // Gloo waits five times its context's timeout for a connection.
    context->setTimeout(Milliseconds(
        std::max<int64_t>(1, static_cast<int64_t>(options.connect_timeout_seconds * 1000 / 5))));
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const std::vector<char> address = context->createPair(peer)->address().bytes();
      mine.addresses[static_cast<size_t>(peer)].assign(address.begin(), address.end());
    }
  } catch (const std::exception& e) {
    mine.failure = e.what();
    if (mine.failure.empty()) mine.failure = "unknown error";
  }
  const std::vector<std::string> cards = exchange(encode(mine));
  A2D_REQUIRE(static_cast<int>(cards.size()) == size, "the Gloo bootstrap's exchange returned ",
              cards.size(), " entries for ", size, " ranks");
  std::vector<Card> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    A2D_REQUIRE(decode(cards[static_cast<size_t>(r)], size, all[static_cast<size_t>(r)]) &&
                    all[static_cast<size_t>(r)].rank == r,
                "the Gloo bootstrap's exchange returned a bad entry at rank ", r,
                " (every rank must pass the same size, its own rank and its own bytes)");
  }
  for (int r = 0; r < size; ++r) {
    const Card& card = all[static_cast<size_t>(r)];
    A2D_REQUIRE(card.failure.empty(), "rank ", r, " could not open its Gloo device: ", card.failure,
                " (choose the address with GlooOptions::hostname or ::interface, or "
                "A2D_GLOO_HOSTNAME or A2D_GLOO_INTERFACE)");
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::string& address =
        all[static_cast<size_t>(peer)].addresses[static_cast<size_t>(rank)];
    try {
      context->getPair(peer)->connect(std::vector<char>(address.begin(), address.end()));
    } catch (const std::exception& e) {
      A2D_FAIL("could not connect to rank ", peer, " over Gloo: ", e.what());
    }
  }
  const Milliseconds wait_limit =
      options.timeout_seconds > 0
          ? Milliseconds(std::max<int64_t>(1, static_cast<int64_t>(options.timeout_seconds * 1000)))
          : kNoLimit;
  auto mesh = std::make_shared<Mesh>(rank, size, std::move(device), std::move(context), wait_limit);
  mesh->post_notices();
  mesh->start_monitor();
  return mesh;
}

std::vector<int> everyone(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

GlooCommunicator* as_gloo(Communicator& comm) {
  Communicator* at = &comm;
  while (auto* counting = dynamic_cast<CountingCommunicator*>(at))
    at = &counting->inner();
  return dynamic_cast<GlooCommunicator*>(at);
}

// --- The watchdog's link -------------------------------------------------------------------------

using watchdog_detail::Status;

// Messages between the watchdogs, on the link's view: a status request, its answer, an abort.
struct Message {
  uint32_t kind = 0;
  int32_t from = -1;  // the sender's rank in the view
  uint64_t round = 0;
  Status status;
};
enum : uint32_t { kRequest = 1, kAnswer = 2, kAbort = 3 };
// An abort's `round`: its exit code, and this bit when the others end without a line (a signal).
constexpr uint64_t kQuietAbort = uint64_t{1} << 32;
// The view's tags: messages (received from any rank), goodbyes (a receive pending from every
// rank: it fails when that rank's connection closes), probes (which connections are closed).
constexpr uint32_t kMessageTag = 1;
constexpr uint32_t kGoodbyeTag = 2;
constexpr uint32_t kProbeTag = 3;

std::unique_ptr<Parked> parked_bytes(Mesh& mesh, size_t bytes) {
  auto parked = std::make_unique<Parked>();
  parked->memory.assign(bytes, std::byte{0});
  parked->buffer = mesh.buffer(parked->memory.data(), static_cast<int64_t>(bytes));
  return parked;
}

class GlooLink final : public watchdog_detail::Link {
 public:
  explicit GlooLink(GlooCommunicator& world)
      : view_(world.view(0, world.rank())), mesh_(view_->mesh()) {
    const int ranks = view_->size();
    // A goodbye receive from every rank, before the hosts' all-gather: once any rank is past
    // it, every rank has posted them.
    goodbyes_ = parked_bytes(*mesh_, static_cast<size_t>(ranks));
    for (int peer = 0; peer < ranks; ++peer) {
      if (peer == rank()) continue;
      try {
        goodbyes_->buffer->recv(view_->member(peer), view_->slot(kGoodbyeTag),
                                static_cast<size_t>(peer), 1);
      } catch (const gloo::Exception& e) {
        A2D_FAIL("the watchdog could not listen to rank ", peer, ": ", e.what());
      }
      peers_.push_back(view_->member(peer));
    }
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    hosts_ = all_gather_bytes(*view_, host);
    addresses_ = all_gather_bytes(*view_, watchdog_detail::local_addresses());
    inbox_ = parked_bytes(*mesh_, sizeof(Message));
    listener_ = std::thread([this] { listen(); });
    watcher_ = std::thread([this] { watch(); });
    reaper_ = std::thread([this] { reap(); });
  }

  // Says goodbye (so that this rank's connections closing later is no failure to the others),
  // stops the threads and leaves the buffers that may still be written to the mesh.
  ~GlooLink() override {
    std::vector<std::unique_ptr<Parked>> goodbyes;
    for (int peer = 0; peer < view_->size(); ++peer) {
      if (peer == rank()) continue;
      auto goodbye = parked_bytes(*mesh_, 1);
      goodbye->memory[0] = std::byte{1};
      try {
        goodbye->buffer->send(view_->member(peer), view_->slot(kGoodbyeTag), 0, 1);
      } catch (const gloo::Exception&) {
        continue;  // that rank is gone
      }
      goodbyes.push_back(std::move(goodbye));
    }
    // The others posted their receives long ago, so these are written out at once; not waited
    // for (Gloo never ends the wait of a send to a connection that closed while it was queued),
    // but kept with the mesh.
    for (auto& goodbye : goodbyes)
      mesh_->park(std::move(goodbye));
    {
      std::lock_guard<std::mutex> lock(inbox_mutex_);
      stopping_listener_ = true;
      inbox_->buffer->abortWaitRecv();
    }
    listener_.join();
    goodbyes_->buffer->abortWaitRecv();
    watcher_.join();
    {
      std::lock_guard<std::mutex> lock(outbox_mutex_);
      stopping_ = true;
      if (reaping_) reaping_->buffer->abortWaitSend();
    }
    outbox_cv_.notify_all();
    reaper_.join();
    mesh_->park(std::move(inbox_));
    mesh_->park(std::move(goodbyes_));
    for (auto& sent : outbox_)
      mesh_->park(std::move(sent));
    for (auto& probe : probes_)
      mesh_->park(std::move(probe));
  }

  int rank() const override { return view_->rank(); }
  int size() const override { return view_->size(); }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  const std::vector<std::string>& addresses() const override { return addresses_; }
  void serve() override {}  // the listener answers at once

  void ask_everyone(uint64_t round) override {
    Message request;
    request.kind = kRequest;
    request.from = rank();
    request.round = round;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer != rank()) send(peer, request);
    }
  }

  void collect_answers(uint64_t round, std::map<int, Status>& answers) override {
    std::lock_guard<std::mutex> lock(answers_mutex_);
    for (const auto& [peer, answer] : answers_) {
      if (answer.first == round) answers[peer] = answer.second;
    }
  }

  int gone() const override { return gone_.load(); }
  bool carries(const void* mesh) const override { return mesh == mesh_.get(); }

  [[noreturn]] void abort_job(int code, bool quiet) override {
    Message abort;
    abort.kind = kAbort;
    abort.from = rank();
    abort.round = static_cast<uint64_t>(code) | (quiet ? kQuietAbort : 0);
    for (int peer = 0; peer < size(); ++peer) {
      if (peer != rank()) send(peer, abort);
    }
    // Time for the aborts to reach the others before this rank's connections close.
    std::this_thread::sleep_for(Milliseconds(500));
    std::_Exit(code);
  }

 private:
  // Posts `message` to rank `peer` of the view; the reaper frees it once it is sent.
  void send(int peer, const Message& message) {
    watchdog_detail::count_link_messages(1);
    auto outgoing = parked_bytes(*mesh_, sizeof message);
    std::memcpy(outgoing->memory.data(), &message, sizeof message);
    try {
      outgoing->buffer->send(view_->member(peer), view_->slot(kMessageTag), 0, sizeof message);
    } catch (const gloo::Exception&) {
      return;  // that rank is gone: nothing was posted
    }
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    outbox_.push_back(std::move(outgoing));
    outbox_cv_.notify_one();
  }

  int view_rank_of(int mesh_rank) const {
    for (int r = 0; r < view_->size(); ++r) {
      if (view_->member(r) == mesh_rank) return r;
    }
    return -1;
  }

  // Receives the other ranks' messages, one at a time, from any rank; answers requests at once.
  void listen() {
    std::vector<int> from_ranks = peers_;
    while (!from_ranks.empty()) {
      Parked* inbox = nullptr;
      {
        std::lock_guard<std::mutex> lock(inbox_mutex_);
        if (stopping_listener_) return;
        inbox = inbox_.get();
      }
      std::fill(inbox->memory.begin(), inbox->memory.end(), std::byte{0});
      bool got = false;
      try {
        inbox->buffer->recv(from_ranks, view_->slot(kMessageTag), 0, sizeof(Message));
        got = inbox->buffer->waitRecv(nullptr, kNoLimit);
      } catch (const gloo::Exception&) {
        // The receive was matched to a rank whose connection then closed: the buffer holds
        // that error now. Listen on with a new one, to the ranks still connected.
        std::vector<int> closed;
        {
          std::lock_guard<std::mutex> lock(probes_mutex_);
          closed = closed_peers();
        }
        const size_t before = from_ranks.size();
        std::erase_if(from_ranks, [&](int r) {
          return std::find(closed.begin(), closed.end(), r) != closed.end();
        });
        std::lock_guard<std::mutex> lock(inbox_mutex_);
        if (stopping_listener_ || from_ranks.size() == before) return;
        mesh_->park(std::move(inbox_));
        inbox_ = parked_bytes(*mesh_, sizeof(Message));
        continue;
      }
      if (!got) return;  // stopping (abortWaitRecv)
      Message message;
      std::memcpy(&message, inbox->memory.data(), sizeof message);
      watchdog_detail::count_link_messages(1);
      handle(message);
    }
  }

  void handle(const Message& message) {
    if (message.from < 0 || message.from >= size() || message.from == rank()) return;
    if (message.kind == kRequest) {
      Message answer;
      answer.kind = kAnswer;
      answer.from = rank();
      answer.round = message.round;
      answer.status = watchdog_detail::current_status();
      send(message.from, answer);
    } else if (message.kind == kAnswer) {
      std::lock_guard<std::mutex> lock(answers_mutex_);
      answers_[message.from] = {message.round, message.status};
    } else if (message.kind == kAbort) {
      if (!watchdog_detail::claim_ending()) watchdog_detail::wait_for_the_end();
      // An abort carries its exit code in `round` (older senders: 0, meaning 124).
      const int code = static_cast<int>(message.round & 0xff);
      if (message.round & kQuietAbort) {
        // The sender (signalled) exits first, 0.5 s after telling: a launcher that names the
        // first rank to end (scripts/launch/launch.py, torchrun) then names it, not this one.
        std::this_thread::sleep_for(Milliseconds(1000));
        std::_Exit(code);
      }
      const std::string line = "a2d watchdog: rank " + std::to_string(rank()) +
                               " ends: the job was aborted by rank " +
                               std::to_string(message.from) + " (its report above)\n";
      std::fputs(line.c_str(), stderr);
      std::fflush(stderr);
      std::_Exit(code ? code : 124);
    }
  }

  // Waits on the goodbye receives: a completion is a rank saying goodbye; a failure is a
  // connection that closed without one, a rank gone.
  void watch() {
    for (;;) {
      int from = -1;
      try {
        if (!goodbyes_->buffer->waitRecv(&from, kNoLimit)) return;  // stopping
        std::lock_guard<std::mutex> lock(probes_mutex_);
        left_.insert(from);
      } catch (const gloo::Exception&) {
        std::lock_guard<std::mutex> lock(probes_mutex_);
        for (const int peer : closed_peers()) {
          if (!left_.count(peer)) {
            gone_.store(view_rank_of(peer));
            break;
          }
        }
        return;  // the buffer holds the error now; one rank gone is all the watchdog reports
      }
    }
  }

  // The mesh ranks of the view whose connection is closed: posting a receive on a closed
  // connection throws. (Caller holds probes_mutex_; the receives posted stay pending, their
  // buffers kept.)
  std::vector<int> closed_peers() {
    std::vector<int> closed;
    for (const int peer : peers_) {
      if (closed_.count(peer)) {
        closed.push_back(peer);
        continue;
      }
      auto probe = parked_bytes(*mesh_, 1);
      try {
        probe->buffer->recv(peer, view_->slot(kProbeTag), 0, 1);
      } catch (const gloo::Exception&) {
        closed_.insert(peer);
        closed.push_back(peer);
        continue;
      }
      probes_.push_back(std::move(probe));
    }
    return closed;
  }

  // Frees sent messages: waits for each in turn (a rank that is stopped delays only the freeing).
  void reap() {
    for (;;) {
      std::unique_ptr<Parked> sent;
      {
        std::unique_lock<std::mutex> lock(outbox_mutex_);
        outbox_cv_.wait(lock, [&] { return stopping_ || !outbox_.empty(); });
        if (stopping_) return;
        sent = std::move(outbox_.front());
        outbox_.pop_front();
        reaping_ = sent.get();
      }
      bool done = true;
      try {
        done = sent->buffer->waitSend(nullptr, kNoLimit);
      } catch (const gloo::Exception&) {
        // That rank's connection closed: nothing is pending on the buffer any more.
      }
      std::lock_guard<std::mutex> lock(outbox_mutex_);
      reaping_ = nullptr;
      if (!done) {  // stopping: it may still be pending
        outbox_.push_back(std::move(sent));
        return;
      }
    }
  }

  std::unique_ptr<GlooCommunicator> view_;
  std::shared_ptr<Mesh> mesh_;
  std::vector<int> peers_;  // mesh ranks of the other members
  std::vector<std::string> hosts_;
  std::vector<std::string> addresses_;

  std::mutex inbox_mutex_;
  std::unique_ptr<Parked> inbox_;
  bool stopping_listener_ = false;
  std::thread listener_;
  std::mutex answers_mutex_;
  std::map<int, std::pair<uint64_t, Status>> answers_;  // by rank: (round, status)

  std::unique_ptr<Parked> goodbyes_;
  std::thread watcher_;
  std::atomic<int> gone_{-1};
  std::mutex probes_mutex_;
  std::set<int> left_;    // mesh ranks that said goodbye
  std::set<int> closed_;  // mesh ranks whose connection is closed
  std::vector<std::unique_ptr<Parked>> probes_;

  std::mutex outbox_mutex_;
  std::condition_variable outbox_cv_;
  std::deque<std::unique_ptr<Parked>> outbox_;
  Parked* reaping_ = nullptr;
  bool stopping_ = false;
  std::thread reaper_;
};

}  // namespace

bool gloo_built() {
  return true;
}

std::unique_ptr<Communicator> make_gloo_communicator(int rank, int size,
                                                     const AllGatherBytes& exchange,
                                                     const GlooOptions& options) {
  A2D_REQUIRE(size >= 1 && rank >= 0 && rank < size, "make_gloo_communicator: rank ", rank,
              " is not a rank of a group of ", size);
  A2D_REQUIRE(static_cast<bool>(exchange), "make_gloo_communicator needs an exchange function");
  A2D_REQUIRE(options.timeout_seconds >= 0 && options.connect_timeout_seconds > 0,
              "GlooOptions: timeout_seconds must be >= 0 and connect_timeout_seconds > 0");
  std::shared_ptr<Mesh> mesh = connect_mesh(rank, size, exchange, options);
  if (error_rank() < 0) set_error_rank(rank);
  auto world = std::make_unique<GlooCommunicator>(std::move(mesh), everyone(size), kWorldId);
  world->barrier();  // every rank has connected (and posted its notices)
  return world;
}

namespace watchdog_detail {
std::unique_ptr<Link> make_gloo_link(Communicator& comm) {
  GlooCommunicator* gloo = as_gloo(comm);
  A2D_REQUIRE(gloo,
              "a watchdog over Gloo needs a Gloo communicator (make_gloo_communicator), or a "
              "CountingCommunicator around one");
  return std::make_unique<GlooLink>(*gloo);
}
}  // namespace watchdog_detail

}  // namespace a2d
