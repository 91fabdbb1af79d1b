// The watchdog's link over Gloo (watchdog_link.hpp, make_gloo_link): a view of the world's
// mesh on which the watchdogs ask each other's status, answer, abort the job, and see which
// ranks said goodbye or whose connection closed.
#include <gloo/common/error.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "comm/watchdog_link.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/watchdog.hpp"
#include "communicator.hpp"
#include "mesh.hpp"

namespace a2d {
namespace {

using gloo_detail::as_gloo;
using gloo_detail::GlooCommunicator;
using gloo_detail::kNoLimit;
using gloo_detail::Mesh;
using gloo_detail::Milliseconds;
using gloo_detail::Parked;

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
