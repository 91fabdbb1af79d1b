// Internal: the scheduling policy of Gloo's I/O threads (docs/backends.md, "Small calls over
// Gloo").
//
// Gloo's TCP transport moves every byte on one I/O thread per device (tcp/loop.cc: epoll_wait of
// up to 64 events, a 10 ms tick). That thread handles a connection's events only if it gets the
// connection's lock at once (Pair::handleEvents: try_to_lock, "skip handling the events until the
// next tick"), and the connection's descriptor stays readable, so while another thread holds the
// lock the I/O thread spins on epoll_wait. The caller's thread holds it while it posts a send or
// a receive, for one writev; in an exchange the peer's message often arrives just then, the I/O
// thread wakes, and the scheduler lets a woken thread preempt the one running (wakeup
// preemption): the caller is descheduled holding the lock, and its own I/O thread spins until the
// scheduler takes the core back (3-4 ms here). (The larger cause of the same spin, buffers freed
// right after their wait, is the mesh's: Mesh::retire.)
//
// SCHED_BATCH (sched(7)) is the same fair policy at the same weight without wakeup preemption.
// An I/O thread under it cannot preempt a caller that posts; but it cannot preempt another
// program's thread either, and kept under it, every message on a busy machine waits for the
// running thread's slice (8 ms per decode step while two compilers held both cores). So the
// policy follows the caller: SCHED_BATCH from a post until the wait for it (IoThreads::posting),
// the thread's own policy from the wait on (IoThreads::Waiting), when a message must be handled
// at once and the caller holds no lock of Gloo's; at rest the thread keeps the policy it was made
// with, so a library's own traffic on it (a torch group's collectives) is as before. Two system
// calls per request. Measured, it takes away most of the remaining milliseconds-long calls where
// the ranks' threads float over the cores (Python under a torch launcher), and changes nothing
// measurable where mpirun binds each rank to a core.
//
// Linux only; elsewhere nothing changes. A2D_GLOO_IO_BATCH=0 leaves the threads' policy alone.
#pragma once

#include <mutex>
#include <vector>

namespace a2d::comm_detail {

// Whether Gloo's I/O threads are managed as above: `requested` (GlooOptions), unless the
// environment says A2D_GLOO_IO_BATCH=0 (to measure or rule out the change).
bool batch_io_threads(bool requested);

// The I/O threads of one transport (thread ids in this process), whose policy follows this
// process's posts and waits as above. Thread-safe.
class IoThreads {
 public:
  IoThreads() = default;  // none: nothing changes
  explicit IoThreads(std::vector<int> ids);
  IoThreads(const IoThreads&) = delete;
  IoThreads& operator=(const IoThreads&) = delete;

  bool empty() const { return ids_.empty(); }

  // Before a transfer is posted: SCHED_BATCH, unless a thread is waiting.
  void posting();

  // From construction, and until the next posting() after the last Waiting ends: the threads'
  // own policy. `threads` may be null.
  class Waiting {
   public:
    explicit Waiting(IoThreads* threads);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    IoThreads* threads_;
  };

 private:
  void set_all(int policy);

  std::vector<int> ids_;
  std::mutex mutex_;  // guards what follows and the switches
  int waiting_ = 0;
  bool batch_ = false;
};

// While alive, threads this thread creates are SCHED_BATCH (they inherit its policy): the calling
// thread is SCHED_BATCH, and its own policy is back when this ends. Does nothing unless `enabled`
// and the calling thread's policy is the default one (SCHED_OTHER): a real-time or batch caller's
// policy is its own business. created(): the threads made meanwhile (under SCHED_BATCH).
class BatchThreadsCreatedHere {
 public:
  explicit BatchThreadsCreatedHere(bool enabled);
  ~BatchThreadsCreatedHere();
  BatchThreadsCreatedHere(const BatchThreadsCreatedHere&) = delete;
  BatchThreadsCreatedHere& operator=(const BatchThreadsCreatedHere&) = delete;

  std::vector<int> created() const;

 private:
  bool active_ = false;
  std::vector<int> before_;  // this process's threads at construction
};

// The Gloo I/O threads of this process that another library made (a torch gloo process group's
// device): the threads under SCHED_OTHER blocked in epoll_wait with Gloo's loop's arguments (64
// events, 10 ms). A loop thread is there all but a few microseconds of every tick when no message
// moves; this looks up to `tries` times, 1 ms apart, until it finds one.
std::vector<int> find_gloo_io_loops(int tries = 20);

}  // namespace a2d::comm_detail
