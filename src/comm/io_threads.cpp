// The scheduling policy of Gloo's I/O threads (io_threads.hpp).
#include "io_threads.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#ifdef __linux__
#include <sched.h>
#include <sys/syscall.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#endif

namespace a2d::comm_detail {

bool batch_io_threads(bool requested) {
  const char* value = std::getenv("A2D_GLOO_IO_BATCH");
  if (value && std::strcmp(value, "0") == 0) return false;
  return requested;
}

#ifdef __linux__

namespace {

// This process's threads.
std::vector<int> thread_ids() {
  std::vector<int> ids;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", error)) {
    const int id = std::atoi(entry.path().filename().c_str());
    if (id > 0) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool set_policy(int id, int policy) {
  const sched_param none{};
  return sched_setscheduler(id, policy, &none) == 0;
}

// Whether thread `id` of this process is blocked in epoll_wait(fd, events, 64, 10): the first
// fields of /proc/self/task/ID/syscall are the system call's number and its arguments, in hex
// ("running" or "-1 ..." when it is not in one).
bool in_gloo_loop_wait(int id) {
  std::ifstream file("/proc/self/task/" + std::to_string(id) + "/syscall");
  std::string line;
  if (!std::getline(file, line)) return false;
  std::istringstream fields(line);
  long number = -1;
  std::string fd, events, max_events, timeout;
  if (!(fields >> number >> fd >> events >> max_events >> timeout)) return false;
  bool epoll = false;
#ifdef SYS_epoll_wait
  epoll = epoll || number == SYS_epoll_wait;
#endif
#ifdef SYS_epoll_pwait
  epoll = epoll || number == SYS_epoll_pwait;
#endif
  return epoll && max_events == "0x40" && timeout == "0xa";
}

}  // namespace

IoThreads::IoThreads(std::vector<int> ids) : ids_(std::move(ids)) {
  // At rest, the policy the thread was made with (ours are made SCHED_BATCH to be told apart).
  set_all(SCHED_OTHER);
}

void IoThreads::set_all(int policy) {
  for (const int id : ids_)
    set_policy(id, policy);
}

void IoThreads::posting() {
  if (ids_.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (batch_ || waiting_ > 0) return;
  set_all(SCHED_BATCH);
  batch_ = true;
}

IoThreads::Waiting::Waiting(IoThreads* threads) : threads_(threads) {
  if (!threads_ || threads_->empty()) return;
  std::lock_guard<std::mutex> lock(threads_->mutex_);
  ++threads_->waiting_;
  if (!threads_->batch_) return;
  threads_->set_all(SCHED_OTHER);
  threads_->batch_ = false;
}

IoThreads::Waiting::~Waiting() {
  if (!threads_ || threads_->empty()) return;
  std::lock_guard<std::mutex> lock(threads_->mutex_);
  --threads_->waiting_;
}

BatchThreadsCreatedHere::BatchThreadsCreatedHere(bool enabled) {
  if (!enabled || sched_getscheduler(0) != SCHED_OTHER) return;
  before_ = thread_ids();
  active_ = set_policy(0, SCHED_BATCH);
}

BatchThreadsCreatedHere::~BatchThreadsCreatedHere() {
  if (active_) set_policy(0, SCHED_OTHER);
}

std::vector<int> BatchThreadsCreatedHere::created() const {
  std::vector<int> made;
  if (!active_) return made;
  for (const int id : thread_ids()) {
    // A thread another thread made meanwhile has its maker's policy, not this one's.
    if (!std::binary_search(before_.begin(), before_.end(), id) &&
        sched_getscheduler(id) == SCHED_BATCH)
      made.push_back(id);
  }
  return made;
}

std::vector<int> find_gloo_io_loops(int tries) {
  std::vector<int> found;
  for (int attempt = 0; attempt < tries && found.empty(); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (const int id : thread_ids()) {
      if (sched_getscheduler(id) == SCHED_OTHER && in_gloo_loop_wait(id)) found.push_back(id);
    }
  }
  return found;
}

#else

IoThreads::IoThreads(std::vector<int> /*ids*/) {}
void IoThreads::set_all(int /*policy*/) {}
void IoThreads::posting() {}
IoThreads::Waiting::Waiting(IoThreads* /*threads*/) : threads_(nullptr) {}
IoThreads::Waiting::~Waiting() = default;
BatchThreadsCreatedHere::BatchThreadsCreatedHere(bool /*enabled*/) {}
BatchThreadsCreatedHere::~BatchThreadsCreatedHere() = default;
std::vector<int> BatchThreadsCreatedHere::created() const {
  return {};
}
std::vector<int> find_gloo_io_loops(int /*tries*/) {
  return {};
}

#endif

}  // namespace a2d::comm_detail
