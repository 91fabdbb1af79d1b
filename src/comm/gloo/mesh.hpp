// Internal: the TCP mesh under the Gloo communicator (gloo_comm.hpp). A Mesh is one Gloo context:
// a TCP connection to every other rank, served by the device's I/O thread; communicators are
// views of it (gloo/communicator.hpp).
//
// Transfers are unbound buffers, one per transfer (Gloo allows one pending operation per buffer).
// Gloo sends only once the receiver has posted its receive (it announces each with a message), so
// collectives post their receives first.
#pragma once

#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/io_threads.hpp"

namespace a2d::gloo_detail {

using Milliseconds = std::chrono::milliseconds;
using UnboundBuffer = gloo::transport::UnboundBuffer;

// Gloo's waits take a limit, and a limit of zero times out at once: "no limit" is 2^40 ms (35
// years), which steady_clock::now() plus it in nanoseconds does not overflow.
constexpr Milliseconds kNoLimit{int64_t{1} << 40};

// The mesh's own slot (id 0, which no view has): a failing rank tells the others which rank
// failed first (see Mesh::fail).
constexpr uint64_t kNoticeSlot = 1;
// Slots 2 + 16 g of id 0: the monitor's receives of generation g (see Mesh::monitor).
constexpr uint64_t kSentinelSlot = 2;

// Memory and the unbound buffer over it, kept alive together.
struct Parked {
  std::vector<std::byte> memory;
  std::unique_ptr<UnboundBuffer> buffer;
};

class Mesh {
 public:
  // io_threads: the device's I/O thread(s), whose policy follows the posts and waits
  // (comm/io_threads.hpp).
  Mesh(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
       std::shared_ptr<gloo::transport::Context> context, Milliseconds wait_limit,
       std::vector<int> io_threads)
      : rank_(rank),
        size_(size),
        wait_limit_(wait_limit),
        device_(std::move(device)),
        context_(std::move(context)),
        io_threads_(std::move(io_threads)) {}
  // The monitor first, then the buffers (an operation still pending on one is dropped by Gloo
  // when it is gone), then the connections (closed with the context), then the I/O thread (with
  // the device).
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Milliseconds wait_limit() const { return wait_limit_; }

  // The device's I/O thread: a request calls posting() before each post and holds a Waiting
  // while it waits.
  comm_detail::IoThreads& io_threads() { return io_threads_; }

  std::unique_ptr<UnboundBuffer> buffer(void* data, int64_t bytes) {
    return context_->createUnboundBuffer(data, static_cast<size_t>(bytes));
  }

  // Keeps `parked` until the mesh ends: a buffer a peer may still send into, or send out of.
  void park(std::unique_ptr<Parked> parked);

  // Keeps the buffers of a completed request while kRetired more requests complete, then frees
  // them. Gloo's I/O thread signals a completion from inside its read or write, still holding the
  // buffer (and the connection's lock), and a buffer's destructor yields in a loop until the I/O
  // thread lets go of it: freed at once, right after the wait that the signal ended, the buffers
  // made the waiting thread, which had often just preempted the I/O thread on its core, spin
  // against it for milliseconds (docs/backends.md, "Small calls over Gloo").
  void retire(std::vector<std::unique_ptr<UnboundBuffer>> buffers);
  static constexpr size_t kRetired = 8;

  // Posts a receive of a notice from every other rank (at creation, before any transfer).
  void post_notices();

  // Gloo signals a failed connection to the operations queued on it, but not to a send it is
  // still writing or a receive it is reading (their waits would never end): every wait is
  // registered here, and the monitor ends the waits on a connection that closed.
  void start_monitor() {
    if (size_ > 1) monitor_ = std::thread([this] { monitor(); });
  }

  // Waits for the transfer on `buffer` with `peer`: true once complete, false if the connection
  // to `peer` closed meanwhile (or the mesh was closed); Gloo's errors are thrown.
  bool wait(UnboundBuffer& buffer, int peer, bool send);

  // A transfer with `peer` failed with Gloo's `text`: the a2d::Error to throw, or (with a watchdog
  // over this mesh) the watchdog's report. Tells the other ranks which rank failed first, closes
  // every connection (so no rank waits for this one, and nothing arrives any more into memory
  // that pending receives pointed to), and throws.
  [[noreturn]] void fail(const std::string& text, int peer);

  // Closes every connection, as Gloo itself does when an operation times out (it is the way to
  // make every pending operation of every thread fail at once): a receive that waits past its
  // limit signals every pair. The waits it does not reach end here.
  void break_connections();

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

  void unregister(Wait* w);

  // A wait on a connection that closed: a transfer that completed before returns at once and one
  // that Gloo failed throws at once, but one it was in the middle of would wait forever, so it is
  // ended after a moment.
  static bool wait_closed(const Wait& w);

  // Keeps a receive pending on every open connection, on a slot no rank sends to: Gloo fails it
  // when the connection closes. Then the monitor finds which connections closed (posting on a
  // closed one throws), ends the waits on them, and arms a new set on the others.
  void monitor();
  // The rank that failed first: `peer`, unless `peer` told this rank (its notice) that it closed
  // its connections because of another rank. The pair with `peer` is closed here, so waiting for
  // its notice returns at once: it arrived, or the wait throws.
  int origin_of(int peer);

  std::string describe(const std::string& text, int peer);

  // Sends the rank that failed first to every other rank, and gives the sends a moment to leave
  // (they go out at once unless a large transfer is still being written).
  void tell_the_others(int origin);

  const int rank_;
  const int size_;
  const Milliseconds wait_limit_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::transport::Context> context_;
  comm_detail::IoThreads io_threads_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Parked>> parked_;
  std::deque<std::vector<std::unique_ptr<UnboundBuffer>>> retired_;  // by request, oldest first
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

}  // namespace a2d::gloo_detail
