// Internal: messages of a rank to itself (send_recv with dest or source == rank) for the
// communicators whose transport has no connection to itself (Gloo's mesh, a caller's process
// group: group_comm.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "attention2d/error.hpp"

namespace a2d::comm_detail {

// A receive of a rank from itself (send_recv with source == rank), filled by the matching send.
struct SelfReceive {
  std::byte* data = nullptr;
  int64_t bytes = 0;
  int tag = 0;
  bool arrived = false;
  bool cancelled = false;  // its request gave up (it threw): no send may write into it
};

// Messages of a rank to itself, matched by tag in the order they were posted (as MPI matches
// them), across calls: a send is copied when it is posted (it completes at once) and delivered
// to the first receive of its tag, which may be posted before or after it.
class SelfMail {
 public:
  void send(int tag, const std::byte* data, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& receives = waiting_[tag];
    while (!receives.empty() && receives.front()->cancelled)
      receives.pop_front();
    if (!receives.empty()) {
      std::shared_ptr<SelfReceive> receive = receives.front();
      receives.pop_front();
      deliver(*receive, data, bytes);
      return;
    }
    sent_[tag].emplace_back(data, data + bytes);
  }
  std::shared_ptr<SelfReceive> receive(int tag, std::byte* data, int64_t bytes) {
    auto receive = std::make_shared<SelfReceive>(SelfReceive{data, bytes, tag, false});
    std::lock_guard<std::mutex> lock(mutex_);
    auto& sent = sent_[tag];
    if (!sent.empty()) {
      deliver(*receive, sent.front().data(), static_cast<int64_t>(sent.front().size()));
      sent.pop_front();
    } else {
      waiting_[tag].push_back(receive);
    }
    return receive;
  }
  // Whether a send to itself is waiting for a receive of `tag`.
  bool pending(int tag) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sent_.find(tag);
    return it != sent_.end() && !it->second.empty();
  }

 private:
  static void deliver(SelfReceive& receive, const std::byte* data, int64_t bytes) {
    A2D_REQUIRE(bytes == receive.bytes, "a send to oneself of ", bytes,
                " bytes met a receive from oneself of ", receive.bytes, " bytes (tag ", receive.tag,
                ")");
    if (bytes > 0 && receive.data != data)
      std::memmove(receive.data, data, static_cast<size_t>(bytes));
    receive.arrived = true;
  }

  std::mutex mutex_;
  std::map<int, std::deque<std::vector<std::byte>>> sent_;
  std::map<int, std::deque<std::shared_ptr<SelfReceive>>> waiting_;
};

}  // namespace a2d::comm_detail
