#include "attention2d/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "attention2d/error.hpp"

namespace a2d {
namespace {

constexpr int kTagRequest = 71;
constexpr int kTagReply = 72;
constexpr int kPhaseChars = 64;
// How long a rank that called MPI_Abort waits for the launcher to end it before it exits itself.
constexpr double kAbortGraceSeconds = 5.0;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What a rank reports about itself.
struct Status {
  double sequence = 0;  // number of phases entered so far
  double seconds = 0;   // time in the current phase
  char phase[kPhaseChars] = {};
};

// The phase tracker every communicator feeds; shared with the watchdog thread.
struct Tracker {
  std::mutex mutex;
  std::string phase = "start";
  int64_t sequence = 0;
  double since = now();

  Status status() {
    std::lock_guard<std::mutex> lock(mutex);
    Status s;
    s.sequence = static_cast<double>(sequence);
    s.seconds = now() - since;
    std::strncpy(s.phase, phase.c_str(), kPhaseChars - 1);
    return s;
  }
};

Tracker g_tracker;
std::atomic<bool> g_active{false};

// A2D_FAULT_STALL / A2D_FAULT_EXIT: "RANK:PHASE[:SECONDS]" for this rank, if any.
struct Fault {
  bool set = false;
  std::string phase;
  double seconds = 0;
};

Fault fault_for(const char* variable, int rank) {
  Fault fault;
  const char* text = std::getenv(variable);
  if (!text) return fault;
  const std::string spec = text;
  const auto first = spec.find(':');
  if (first == std::string::npos || std::atoi(spec.substr(0, first).c_str()) != rank) return fault;
  const auto second = spec.find(':', first + 1);
  fault.set = true;
  fault.phase =
      spec.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  if (second != std::string::npos) fault.seconds = std::atof(spec.c_str() + second + 1);
  return fault;
}

int world_rank() {
  int initialized = 0, rank = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

struct Watchdog::State {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  double timeout = 0;
  std::vector<std::string> hosts;  // every rank's host (MPI_Get_processor_name), by rank

  std::atomic<bool> stop{false};
  std::thread thread;

  void serve_requests() {
    for (;;) {
      int pending = 0;
      MPI_Status probe;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagRequest, comm, &pending, &probe);
      if (!pending) return;
      char ignored = 0;
      MPI_Recv(&ignored, 1, MPI_CHAR, probe.MPI_SOURCE, kTagRequest, comm, MPI_STATUS_IGNORE);
      Status mine = g_tracker.status();
      MPI_Send(&mine, sizeof mine, MPI_BYTE, probe.MPI_SOURCE, kTagReply, comm);
    }
  }

  // " on host h2" or " on hosts h1, h2" for a group of ranks: which machine to look at.
  std::string hosts_of(const std::vector<int>& ranks) const {
    std::vector<std::string> names;
    for (int peer : ranks) {
      if (std::find(names.begin(), names.end(), hosts[peer]) == names.end())
        names.push_back(hosts[peer]);
    }
    std::string text = names.size() > 1 ? " on hosts " : " on host ";
    const size_t shown = std::min<size_t>(names.size(), 4);
    for (size_t i = 0; i < shown; ++i)
      text += (i ? ", " : "") + names[i];
    if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
    return text;
  }

  // Called when this rank made no progress for the timeout. Aborts the job if no rank did (or a
  // rank does not answer); returns if some rank is still making progress.
  void check_everyone(const Status& mine) {
    // Ask everyone, keep serving the others' requests, wait up to two seconds for the answers.
    std::vector<MPI_Request> sends;
    const char request = 1;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      sends.emplace_back();
      MPI_Isend(&request, 1, MPI_CHAR, peer, kTagRequest, comm, &sends.back());
    }
    std::map<int, Status> answers;
    answers[rank] = mine;
    const double deadline = now() + 2.0;
    while (static_cast<int>(answers.size()) < size && now() < deadline) {
      serve_requests();
      int pending = 0;
      MPI_Status probe;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagReply, comm, &pending, &probe);
      if (!pending) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      Status s;
      MPI_Recv(&s, sizeof s, MPI_BYTE, probe.MPI_SOURCE, kTagReply, comm, MPI_STATUS_IGNORE);
      answers[probe.MPI_SOURCE] = s;
    }
    if (static_cast<int>(answers.size()) == size) {
      for (const auto& [peer, s] : answers) {
        if (s.seconds < timeout) return;  // that rank is progressing: this is no hang (yet)
      }
    }
    double furthest = 0, last = 1e300;
    for (const auto& [peer, s] : answers) {
      furthest = std::max(furthest, s.sequence);
      last = std::min(last, s.sequence);
    }
    // Group ranks by (sequence, phase).
    std::map<std::pair<double, std::string>, std::vector<int>> groups;
    std::map<std::pair<double, std::string>, double> longest;
    for (const auto& [peer, s] : answers) {
      const auto key = std::make_pair(s.sequence, std::string(s.phase));
      groups[key].push_back(peer);
      longest[key] = std::max(longest[key], s.seconds);
    }
    std::ostringstream out;
    out << "a2d watchdog: rank " << rank << " made no progress for " << mine.seconds
        << " s in phase " << mine.phase << " (timeout " << timeout << " s)\n";
    for (const auto& [key, ranks] : groups) {
      out << "  "
          << (key.first == last && last < furthest ? "did not arrive (furthest behind): "
              : key.first < furthest               ? "behind: "
                                                   : "waiting: ")
          << (ranks.size() > 1 ? "ranks " : "rank ");
      for (size_t i = 0; i < ranks.size(); ++i)
        out << (i ? ", " : "") << ranks[i];
      out << " (phase " << static_cast<int64_t>(key.first) << " " << key.second << ", "
          << longest[key] << " s)" << hosts_of(ranks) << "\n";
    }
    std::vector<int> silent;
    for (int peer = 0; peer < size; ++peer) {
      if (!answers.count(peer)) silent.push_back(peer);
    }
    if (!silent.empty()) {
      out << "  not answering (dead or stuck): " << (silent.size() > 1 ? "ranks " : "rank ");
      for (size_t i = 0; i < silent.size(); ++i)
        out << (i ? ", " : "") << silent[i];
      out << hosts_of(silent) << "\n";
    }
    out << "a2d watchdog: aborting the job\n";
    std::fputs(out.str().c_str(), stderr);
    std::fflush(stderr);
    // MPI_Abort asks the launcher to end every rank; it may never return when the launcher waits
    // on a host whose processes are all stopped (its daemon too). This rank then ends itself
    // after kAbortGraceSeconds, so that no live rank outlasts its abort for long (see
    // docs/reliability.md, "Faults across hosts").
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceSeconds));
      std::fputs("a2d watchdog: MPI_Abort did not end this rank; it exits itself\n", stderr);
      std::_Exit(124);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, 124);
    std::_Exit(124);
  }

  void run() {
    double next_check = 0;
    while (!stop.load()) {
      serve_requests();
      const Status mine = g_tracker.status();
      if (mine.seconds > timeout && now() >= next_check) {
        check_everyone(mine);
        next_check = now() + std::min(timeout, 10.0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

Watchdog::Watchdog(MPI_Comm comm, double timeout_seconds) : state_(std::make_unique<State>()) {
  if (timeout_seconds <= 0) return;
  int level = 0;
  MPI_Query_thread(&level);
  A2D_REQUIRE(level >= MPI_THREAD_MULTIPLE,
              "the watchdog (--timeout) needs an MPI library "
              "initialised with MPI_THREAD_MULTIPLE; this one provides level ",
              level);
  A2D_REQUIRE(!g_active.load(), "only one watchdog may be active in a process");
  MPI_Comm_dup(comm, &state_->comm);
  MPI_Comm_rank(state_->comm, &state_->rank);
  MPI_Comm_size(state_->comm, &state_->size);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  std::vector<char> all(static_cast<size_t>(state_->size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, state_->comm);
  for (int peer = 0; peer < state_->size; ++peer)
    state_->hosts.emplace_back(all.data() + static_cast<size_t>(peer) * MPI_MAX_PROCESSOR_NAME);
  state_->timeout = timeout_seconds;
  {
    std::lock_guard<std::mutex> lock(g_tracker.mutex);
    g_tracker.since = now();
  }
  g_active.store(true);
  state_->thread = std::thread([state = state_.get()] { state->run(); });
}

void Watchdog::heartbeat() {
  std::lock_guard<std::mutex> lock(g_tracker.mutex);
  g_tracker.since = now();
}

Watchdog::~Watchdog() {
  if (!state_->thread.joinable()) return;
  state_->stop.store(true);
  state_->thread.join();
  g_active.store(false);
  MPI_Comm_free(&state_->comm);
}

bool Watchdog::active() const {
  return state_->thread.joinable();
}

void Watchdog::note_phase(const std::string& phase) {
  {
    std::lock_guard<std::mutex> lock(g_tracker.mutex);
    g_tracker.phase = phase;
    ++g_tracker.sequence;
    g_tracker.since = now();
  }
  // Test-only fault injection (see the header).
  static const Fault stall = fault_for("A2D_FAULT_STALL", world_rank());
  static const Fault exit_fault = fault_for("A2D_FAULT_EXIT", world_rank());
  if (stall.set && stall.phase == phase) {
    std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  }
  if (exit_fault.set && exit_fault.phase == phase) {
    std::fprintf(stderr, "a2d: A2D_FAULT_EXIT: rank %d exits in phase %s\n", world_rank(),
                 phase.c_str());
    std::_Exit(9);
  }
}

}  // namespace a2d
