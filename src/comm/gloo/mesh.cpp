// The TCP mesh under the Gloo communicator (gloo/mesh.hpp): its waits, the monitor that ends the
// waits on a closed connection, and how a failure is told to every rank.
#include "mesh.hpp"

#include <gloo/common/error.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <sstream>

#include "attention2d/error.hpp"
#include "attention2d/watchdog.hpp"

namespace a2d::gloo_detail {
namespace {

bool mentions(const std::string& text, const char* what) {
  return text.find(what) != std::string::npos;
}

}  // namespace

Mesh::~Mesh() {
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
    retired_.clear();
    notices_.clear();
  }
  sentinels_.reset();
  context_.reset();
  device_.reset();
}

void Mesh::park(std::unique_ptr<Parked> parked) {
  if (!parked) return;
  std::lock_guard<std::mutex> lock(mutex_);
  parked_.push_back(std::move(parked));
}

void Mesh::retire(std::vector<std::unique_ptr<UnboundBuffer>> buffers) {
  std::vector<std::unique_ptr<UnboundBuffer>> oldest;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    retired_.push_back(std::move(buffers));
    if (retired_.size() <= kRetired) return;
    oldest = std::move(retired_.front());
    retired_.pop_front();
  }
  // `oldest` is freed here, outside the lock.
}

void Mesh::post_notices() {
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

bool Mesh::wait(UnboundBuffer& buffer, int peer, bool send) {
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

void Mesh::fail(const std::string& text, int peer) {
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

void Mesh::break_connections() {
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

void Mesh::unregister(Wait* w) {
  std::lock_guard<std::mutex> lock(waits_mutex_);
  std::erase(waits_, w);
}

bool Mesh::wait_closed(const Wait& w) {
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

void Mesh::monitor() {
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
        armed->buffer->recv(peer, kSentinelSlot + (generation << 4), static_cast<size_t>(peer), 1);
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

int Mesh::origin_of(int peer) {
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

std::string Mesh::describe(const std::string& text, int peer) {
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

void Mesh::tell_the_others(int origin) {
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
}  // namespace a2d::gloo_detail
