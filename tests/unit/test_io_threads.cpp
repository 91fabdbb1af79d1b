// The scheduling policy of Gloo's I/O threads (src/comm/io_threads.hpp): threads made inside
// BatchThreadsCreatedHere are SCHED_BATCH, listed, and the caller's own policy comes back; an
// IoThreads is SCHED_BATCH from a post until a wait begins, and at its own policy otherwise; the
// scan finds a thread waiting as Gloo's loop waits (epoll_wait of 64 events, 10 ms) and no other.
// Linux only.
#include <gtest/gtest.h>

#ifdef __linux__
#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "comm/io_threads.hpp"

namespace a2d {
namespace {

using comm_detail::batch_io_threads;
using comm_detail::BatchThreadsCreatedHere;
using comm_detail::find_gloo_io_loops;
using comm_detail::IoThreads;

int set_policy(int id, int policy) {
  const sched_param none{};
  return sched_setscheduler(id, policy, &none);
}

// A thread that waits in epoll_wait(fd, events, max_events, 10 ms) until stopped, as Gloo's
// tcp::Loop::run does with 64 events.
class Waiter {
 public:
  explicit Waiter(int max_events) : fd_(epoll_create1(0)) {
    thread_ = std::thread([this, max_events] {
      id_.store(static_cast<int>(gettid()));
      std::array<epoll_event, 64> events{};
      while (!stop_.load())
        epoll_wait(fd_, events.data(), max_events, 10);
    });
    while (id_.load() == 0)
      std::this_thread::yield();
  }
  ~Waiter() {
    stop_.store(true);
    thread_.join();
    close(fd_);
  }
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  int id() const { return id_.load(); }
  int policy() const { return sched_getscheduler(id_.load()); }

 private:
  int fd_;
  std::atomic<bool> stop_{false};
  std::atomic<int> id_{0};
  std::thread thread_;
};

TEST(IoThreads, ThreadsMadeInsideTheScopeAreBatchListedAndTheCallerKeepsItsPolicy) {
  ASSERT_EQ(sched_getscheduler(0), SCHED_OTHER);
  {
    const BatchThreadsCreatedHere batch(true);
    const Waiter made(64);
    EXPECT_EQ(made.policy(), SCHED_BATCH);
    EXPECT_EQ(batch.created(), std::vector<int>{made.id()});
  }
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
  const Waiter after(64);
  EXPECT_EQ(after.policy(), SCHED_OTHER);
  {
    const BatchThreadsCreatedHere off(false);
    const Waiter made(64);
    EXPECT_EQ(made.policy(), SCHED_OTHER);
    EXPECT_TRUE(off.created().empty());
  }
}

TEST(IoThreads, TheEnvironmentTurnsItOff) {
  ASSERT_EQ(unsetenv("A2D_GLOO_IO_BATCH"), 0);
  EXPECT_TRUE(batch_io_threads(true));
  EXPECT_FALSE(batch_io_threads(false));
  ASSERT_EQ(setenv("A2D_GLOO_IO_BATCH", "0", 1), 0);
  EXPECT_FALSE(batch_io_threads(true));
  ASSERT_EQ(setenv("A2D_GLOO_IO_BATCH", "1", 1), 0);
  EXPECT_TRUE(batch_io_threads(true));
  ASSERT_EQ(unsetenv("A2D_GLOO_IO_BATCH"), 0);
}

TEST(IoThreads, BatchFromAPostUntilTheWait) {
  const Waiter loop(64);
  ASSERT_EQ(set_policy(loop.id(), SCHED_BATCH), 0);  // as BatchThreadsCreatedHere makes ours
  IoThreads threads({loop.id()});
  EXPECT_EQ(loop.policy(), SCHED_OTHER);  // at rest
  threads.posting();
  EXPECT_EQ(loop.policy(), SCHED_BATCH);
  threads.posting();
  EXPECT_EQ(loop.policy(), SCHED_BATCH);
  {
    const IoThreads::Waiting first(&threads);
    EXPECT_EQ(loop.policy(), SCHED_OTHER);
    threads.posting();  // another thread's post, while this one waits
    EXPECT_EQ(loop.policy(), SCHED_OTHER);
    {
      const IoThreads::Waiting second(&threads);
      EXPECT_EQ(loop.policy(), SCHED_OTHER);
    }
    threads.posting();
    EXPECT_EQ(loop.policy(), SCHED_OTHER);
  }
  EXPECT_EQ(loop.policy(), SCHED_OTHER);  // at rest again
  threads.posting();
  EXPECT_EQ(loop.policy(), SCHED_BATCH);
  { const IoThreads::Waiting wait(&threads); }
  EXPECT_EQ(loop.policy(), SCHED_OTHER);
  const IoThreads::Waiting nothing(nullptr);
  IoThreads none;
  none.posting();
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
}

TEST(IoThreads, TheScanFindsGloosLoopAndNoOtherWaiter) {
  const Waiter gloo_loop(64), other(32);
  const std::vector<int> found = find_gloo_io_loops(200);
  EXPECT_EQ(found, std::vector<int>{gloo_loop.id()});
  EXPECT_EQ(gloo_loop.policy(), SCHED_OTHER);  // found, not changed
}

}  // namespace
}  // namespace a2d

#endif  // __linux__
