// The watchdog (watchdog.hpp): one logic over two links (watchdog_link.hpp), MPI's in
// mpi_link.cpp and Gloo's in gloo/link.cpp. The phase tracker every communicator feeds, the
// report of a stall, and the watchdog's thread.
#include "attention2d/watchdog.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/startup_guard.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/error.hpp"
#include "shared.hpp"

namespace a2d {
namespace watchdog_detail {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::atomic<bool> g_end_announced{false};

namespace {

// The phase tracker every communicator feeds; shared with the watchdog's threads.
struct Tracker {
  std::mutex mutex;
  std::string phase = "start";
  int64_t sequence = 0;
  double since = now();
  bool outside = false;

  Status status() {
    std::lock_guard<std::mutex> lock(mutex);
    Status s;
    s.sequence = static_cast<double>(sequence);
    s.seconds = now() - since;
    s.outside = outside ? 1 : 0;
    std::strncpy(s.phase, phase.c_str(), kPhaseChars - 1);
    return s;
  }
};

Tracker g_tracker;

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < ranks.size(); ++i)
    out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// " on host h2" or " on hosts h1, h2" for a group of ranks: which machine to look at.
std::string hosts_of(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  std::vector<std::string> names;
  for (int peer : ranks) {
    const std::string& host =
        peer >= 0 && peer < static_cast<int>(hosts.size()) ? hosts[peer] : std::string("?");
    if (std::find(names.begin(), names.end(), host) == names.end()) names.push_back(host);
  }
  std::string text = names.size() > 1 ? " on hosts " : " on host ";
  const size_t shown = std::min<size_t>(names.size(), 4);
  for (size_t i = 0; i < shown; ++i)
    text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
  return text;
}

std::atomic<int64_t> g_link_messages{0};

std::atomic<bool> g_ending{false};

}  // namespace

Status current_status() {
  return g_tracker.status();
}

void count_link_messages(int64_t messages) {
  g_link_messages.fetch_add(messages);
}

bool claim_ending() {
  return !g_ending.exchange(true);
}

void wait_for_the_end() {
  for (;;)
    std::this_thread::sleep_for(std::chrono::seconds(1));
}

std::string stall_report(int rank, double timeout, const std::map<int, Status>& answers,
                         const std::vector<std::string>& hosts) {
  const auto own = answers.find(rank);
  const Status mine = own == answers.end() ? Status{} : own->second;
  // Ranks inside attention2d, grouped by (sequence, phase); ranks outside, by their last phase.
  double furthest = 0, last = 1e300;
  bool any_inside = false;
  for (const auto& [peer, s] : answers) {
    if (s.outside) continue;
    any_inside = true;
    furthest = std::max(furthest, s.sequence);
    last = std::min(last, s.sequence);
  }
  if (!any_inside) last = furthest;
  std::map<std::pair<double, std::string>, std::vector<int>> groups;
  std::map<std::pair<double, std::string>, double> longest;  // -1: not known for any of them
  std::map<std::string, std::vector<int>> idle;
  std::map<std::string, double> idle_longest;
  for (const auto& [peer, s] : answers) {
    if (s.outside) {
      idle[s.phase].push_back(peer);
      idle_longest[s.phase] = std::max(idle_longest[s.phase], s.seconds);
      continue;
    }
    const auto key = std::make_pair(s.sequence, std::string(s.phase));
    groups[key].push_back(peer);
    const auto known = longest.find(key);
    longest[key] = known == longest.end() ? s.seconds : std::max(known->second, s.seconds);
  }
  std::ostringstream out;
  out << "a2d watchdog: rank " << rank << " made no progress for " << mine.seconds << " s in phase "
      << mine.phase << " (timeout " << timeout << " s)\n";
  for (const auto& [key, ranks] : groups) {
    out << "  "
        << (key.first == last && last < furthest ? "did not arrive (furthest behind): "
            : key.first < furthest               ? "behind: "
                                                 : "waiting: ")
        << rank_list(ranks) << " (phase " << static_cast<int64_t>(key.first) << " " << key.second;
    if (longest[key] >= 0) out << ", " << longest[key] << " s";
    out << ")" << hosts_of(ranks, hosts) << "\n";
  }
  for (const auto& [phase, ranks] : idle) {
    out << "  idle: " << rank_list(ranks) << " (outside attention2d since " << idle_longest[phase]
        << " s, after phase " << phase << ")" << hosts_of(ranks, hosts) << "\n";
  }
  std::vector<int> silent;
  for (int peer = 0; peer < static_cast<int>(hosts.size()); ++peer) {
    if (!answers.count(peer)) silent.push_back(peer);
  }
  if (!silent.empty()) {
    out << "  not answering (dead or stuck): " << rank_list(silent) << hosts_of(silent, hosts)
        << "\n";
  }
  out << "a2d watchdog: aborting the job\n";
  return out.str();
}

// The watchdog's thread and what it knows (Watchdog::State).
struct Engine {
  std::unique_ptr<Link> link;
  double timeout = 0;
  double idle_limit = 0;  // how long an idle rank that answers is waited for
  std::atomic<bool> stop{false};
  std::thread thread;
  uint64_t round = 0;
  // A transfer of this process that failed on the link's mesh (transport_failed).
  std::mutex failure_mutex;
  std::string failure;
  // Every rank's addresses (for tcp_bytes_moved and tcp_stall_lines), filled by run().
  std::set<std::string> peers;

  static void print(const std::string& text) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  }

  // Called when this rank made no progress for the timeout. Aborts the job if no rank did (or a
  // rank does not answer); returns if some rank is still making progress.
  void check_everyone(const Status& mine) {
    // Ask everyone, keep serving the others' requests, wait up to two seconds for the answers.
    ++round;
    link->ask_everyone(round);
    std::map<int, Status> answers;
    answers[link->rank()] = mine;
    const double deadline = now() + 2.0;
    const auto everyone = static_cast<size_t>(link->size());
    while (answers.size() < everyone && now() < deadline) {
      link->serve();
      link->collect_answers(round, answers);
      if (answers.size() < everyone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // This rank moved on while it asked (what it waited for arrived), or is stopping: no hang. A
    // job's end races the question: the rank this one waited for sends its last message and
    // stops its watchdog, which then answers nobody (cli.mpi.watchdog's long check under the
    // sanitizers: rank 0 "not answering" after its check had passed).
    const Status after = current_status();
    if (stop.load() || after.outside || after.sequence != mine.sequence ||
        after.seconds < mine.seconds)
      return;
    if (answers.size() == everyone) {
      for (const auto& [peer, s] : answers) {
        // That rank is progressing inside, or alive and busy outside attention2d (a checkpoint,
        // an evaluation) within the idle limit: this is no hang (yet).
        if (s.seconds < (s.outside ? idle_limit : timeout)) return;
      }
    }
    // Ranks that wait for the same one time out together: rank 0 reports at once, the others
    // after a wait that grows with their rank, in which the first abort reaches them.
    std::this_thread::sleep_for(std::chrono::duration<double>(0.1 * std::min(link->rank(), 20)));
    if (!claim_ending()) wait_for_the_end();
    std::string report = stall_report(link->rank(), timeout, answers, link->hosts());
    // This rank's connections with data in flight (retransmitting, or probing a closed window):
    // where a stall on the network comes from.
    const std::string tcp = tcp_stall_lines(peers, link->addresses(), link->hosts());
    report.insert(report.rfind("a2d watchdog: aborting"), tcp);
    print(report);
    link->abort_job();
  }

  // Reports a rank that is gone, or else a transfer of this rank that failed, and ends the job.
  // Rank 0 reports at once, the others after a wait that grows with their rank, in which an abort
  // already on its way arrives: of the ranks noticing one fault, mostly one reports it. The link
  // usually knows which rank is gone a moment after a transfer noticed a connection closed.
  void report_fault() {
    std::this_thread::sleep_for(std::chrono::duration<double>(0.1 * std::min(link->rank(), 20)));
    for (int i = 0; i < 10 && link->gone() < 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::string what;
    const int peer = link->gone();
    if (peer >= 0) {
      what = gone_text(peer, current_status());
    } else {
      std::lock_guard<std::mutex> lock(failure_mutex);
      what = failure;
    }
    if (!claim_ending()) wait_for_the_end();
    print("a2d watchdog: " + what + "\na2d watchdog: aborting the job\n");
    link->abort_job();
  }

  std::string gone_text(int peer, const Status& mine) const {
    const auto& hosts = link->hosts();
    std::ostringstream out;
    out << "rank " << peer << " is gone (its connection closed) while this rank was in phase "
        << (mine.outside ? "outside attention2d, after " : "") << mine.phase << " (this is rank "
        << link->rank() << " on host " << hosts[static_cast<size_t>(link->rank())] << "; rank "
        << peer << " ran on host " << hosts[static_cast<size_t>(peer)] << ")";
    return out.str();
  }

  bool failed() {
    std::lock_guard<std::mutex> lock(failure_mutex);
    return !failure.empty();
  }

  // Bytes between the job's hosts count as progress (watchdog_link.hpp, tcp_bytes_moved): a
  // transfer that crawls, or resumes after TCP's retransmission backoff, is no hang; a job whose
  // connections are all silent still is.
  void note_transport(double& next_sample, int64_t& moved_at_progress,
                      int64_t& messages_at_progress) {
    if (now() < next_sample) return;
    next_sample = now() + kTransportSampleSeconds;
    const int64_t moved = tcp_bytes_moved(peers, retransmission_cap_ms(timeout));
    const int64_t messages = g_link_messages.load();
    if (moved < moved_at_progress) moved_at_progress = moved;  // a connection closed
    if (!transport_progress(moved - moved_at_progress, messages - messages_at_progress)) return;
    moved_at_progress = moved;
    messages_at_progress = messages;
    std::lock_guard<std::mutex> lock(g_tracker.mutex);
    if (!g_tracker.outside) g_tracker.since = now();
  }

  void run() {
    double next_check = 0, next_sample = 0;
    for (const std::string& text : link->addresses()) {
      std::istringstream words(text);
      for (std::string address; words >> address;)
        peers.insert(address);
    }
    int64_t moved_at_progress = tcp_bytes_moved(peers), messages_at_progress = 0;
    while (!stop.load()) {
      link->serve();
      note_transport(next_sample, moved_at_progress, messages_at_progress);
      const Status mine = current_status();
      // A transfer of this rank that failed on the link's mesh, or a rank that is gone: reported
      // at once from inside attention2d; a rank outside reports a rank gone when it enters again
      // (a job may end with ranks leaving while others are idle).
      if (failed() || (link->gone() >= 0 && !mine.outside)) report_fault();
      if (!mine.outside && mine.seconds > timeout && now() >= next_check) {
        check_everyone(mine);
        next_check = now() + std::min(timeout, 10.0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

namespace {
std::atomic<bool> g_active{false};
// The active watchdog, for transport_failed.
std::mutex g_state_mutex;
Engine* g_state = nullptr;
}  // namespace

}  // namespace watchdog_detail

struct Watchdog::State : watchdog_detail::Engine {};

using watchdog_detail::g_active;
using watchdog_detail::g_state;
using watchdog_detail::g_state_mutex;

#ifdef A2D_WITH_MPI
Watchdog::Watchdog(MPI_Comm comm, double timeout_seconds, double idle_limit_seconds)
    : state_(std::make_unique<State>()) {
  if (timeout_seconds <= 0) return;
  int level = 0;
  MPI_Query_thread(&level);
  A2D_REQUIRE(level >= MPI_THREAD_MULTIPLE,
              "the watchdog (--timeout) needs an MPI library "
              "initialised with MPI_THREAD_MULTIPLE; this one provides level ",
              level);
  A2D_REQUIRE(!g_active.load(), "only one watchdog may be active in a process");
  state_->link = watchdog_detail::make_mpi_link(comm);
  start(timeout_seconds, idle_limit_seconds);
}
#endif

Watchdog::Watchdog(Communicator& gloo_world, double timeout_seconds, double idle_limit_seconds)
    : state_(std::make_unique<State>()) {
  if (timeout_seconds <= 0) return;
  A2D_REQUIRE(!g_active.load(), "only one watchdog may be active in a process");
  state_->link = watchdog_detail::make_gloo_link(gloo_world);
  start(timeout_seconds, idle_limit_seconds);
}

void Watchdog::start(double timeout_seconds, double idle_limit_seconds) {
  state_->timeout = timeout_seconds;
  state_->idle_limit = std::max(idle_limit_seconds, timeout_seconds);
  {
    std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
    watchdog_detail::g_tracker.since = watchdog_detail::now();
  }
  g_active.store(true);
  {
    std::lock_guard<std::mutex> lock(g_state_mutex);
    g_state = state_.get();
  }
  state_->thread = std::thread([state = state_.get()] { state->run(); });
  watchdog_detail::startup_done();  // the start of the job is watched no longer (startup_guard.hpp)
}

Watchdog::~Watchdog() {
  if (!state_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(g_state_mutex);
    g_state = nullptr;
  }
  state_->stop.store(true);
  state_->thread.join();
  state_->link.reset();
  g_active.store(false);
}

bool Watchdog::active() const {
  return state_->thread.joinable();
}

void Watchdog::heartbeat() {
  std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
  watchdog_detail::g_tracker.since = watchdog_detail::now();
}

void Watchdog::note_idle() {
  std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
  watchdog_detail::g_tracker.outside = true;
  watchdog_detail::g_tracker.since = watchdog_detail::now();
}

std::string Watchdog::current_phase() {
  std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
  const std::string& phase = watchdog_detail::g_tracker.phase;
  return watchdog_detail::g_tracker.outside ? "outside attention2d (after " + phase + ")" : phase;
}

void Watchdog::transport_failed(const void* mesh, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(g_state_mutex);
    if (!g_state || !g_state->link || (mesh != nullptr && !g_state->link->carries(mesh))) return;
    std::lock_guard<std::mutex> failure_lock(g_state->failure_mutex);
    if (g_state->failure.empty()) g_state->failure = message;
  }
  // The watchdog's thread reports it and ends the process.
  watchdog_detail::wait_for_the_end();
}

namespace watchdog_detail {
void abort_job_for_signal(int code) {
  std::lock_guard<std::mutex> lock(g_state_mutex);
  if (g_state && g_state->link && !g_state->stop.load()) g_state->link->abort_job(code, true);
}
}  // namespace watchdog_detail

void Watchdog::note_phase(const std::string& phase) {
  {
    std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
    watchdog_detail::g_tracker.phase = phase;
    watchdog_detail::g_tracker.outside = false;
    ++watchdog_detail::g_tracker.sequence;
    watchdog_detail::g_tracker.since = watchdog_detail::now();
  }
  // Test-only fault injection (see the header).
  watchdog_detail::inject_faults(phase);
}

}  // namespace a2d
