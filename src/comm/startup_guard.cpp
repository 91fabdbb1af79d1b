// The start of an MPI job, watched (startup_guard.hpp).
#include "startup_guard.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifdef A2D_WITH_MPI
#include <mpi.h>
#endif
#ifdef A2D_WITH_PMIX
#include <pmix.h>
#endif

#include "watchdog_link.hpp"

namespace a2d::watchdog_detail {

#ifdef A2D_WITH_MPI

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum Stage : int { kInMpiInit = 1, kSetup = 2, kStarted = 3 };

const char* stage_name(int stage) {
  return stage == kInMpiInit ? "start.mpi_init" : stage == kSetup ? "start.setup" : "start.done";
}

// The guards' own tags on MPI_COMM_WORLD (the library's messages travel on duplicates of it).
constexpr int kTagAsk = 0x5a2d1;
constexpr int kTagAnswer = 0x5a2d2;
constexpr int kHostChars = 64;

struct Answer {
  Status status;
  char host[kHostChars] = {};
};

void copy_text(char* to, const std::string& text, size_t size) {
  std::strncpy(to, text.c_str(), size - 1);
  to[size - 1] = '\0';
}

#ifdef A2D_WITH_PMIX
// A read of one key of one rank (PMIx_Get_nb's callback writes it; it lives until the process
// ends, as an answer may come after the guard stopped waiting for it).
struct KeyRead {
  std::atomic<int> state{0};  // 0: no answer; 1: the key is there; 2: no such key
};

void on_key(pmix_status_t status, pmix_value_t* /*value*/, void* context) {
  static_cast<KeyRead*>(context)->state = status == PMIX_SUCCESS ? 1 : 2;
}

// The heartbeats inside MPI_Init, one key per beat: a key once read is cached by the reader's
// PMIx server, so a value that changes would not be seen to change; a key not yet there is
// fetched again from the rank's server.
std::string beat_key(int64_t beat) {
  return "a2d.beat." + std::to_string(beat);
}
constexpr double kBeatSeconds = 0.5;
#endif

}  // namespace

struct StartupGuard::State {
  double timeout = 0;
  std::atomic<int> stage{kInMpiInit};
  std::atomic<double> stage_since{now()};
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
  int rank = -1, size = 0;  // from PMIx before MPI_Init, from MPI after
  std::string host;
  std::vector<std::string> hosts;  // every rank's, from PMIx where it has them
#ifdef A2D_WITH_PMIX
  bool pmix = false;
  pmix_proc_t me{};
  int64_t beats = 0;                                  // published so far
  std::map<int, int64_t> latest_beat;                 // every rank's, at the last check
  std::vector<std::unique_ptr<KeyRead[]>> key_reads;  // kept: see KeyRead
#endif

  Status own_status() const {
    Status s;
    const int current = stage.load();
    s.sequence = current;
    s.seconds = now() - stage_since.load();
    copy_text(s.phase, stage_name(current), kPhaseChars);
    return s;
  }

#ifdef A2D_WITH_PMIX
  void start_pmix() {
    if (!std::getenv("PMIX_NAMESPACE") || !std::getenv("PMIX_RANK")) return;
    // PMIx_Init counts its callers: MPI_Init's own call shares this connection to the launcher.
    if (PMIx_Init(&me, nullptr, 0) != PMIX_SUCCESS) return;
    pmix = true;
    rank = static_cast<int>(me.rank);
    pmix_proc_t job = me;
    job.rank = PMIX_RANK_WILDCARD;
    pmix_value_t* value = nullptr;
    char size_key[] = PMIX_JOB_SIZE;
    if (PMIx_Get(&job, size_key, nullptr, 0, &value) == PMIX_SUCCESS && value) {
      if (value->type == PMIX_UINT32) size = static_cast<int>(value->data.uint32);
      PMIX_VALUE_RELEASE(value);
    }
    hosts.assign(static_cast<size_t>(std::max(size, 0)), "?");
    for (int peer = 0; peer < size; ++peer) {
      pmix_proc_t proc = me;
      proc.rank = static_cast<pmix_rank_t>(peer);
      char host_key[] = PMIX_HOSTNAME;
      value = nullptr;
      if (PMIx_Get(&proc, host_key, nullptr, 0, &value) == PMIX_SUCCESS && value) {
        if (value->type == PMIX_STRING && value->data.string) hosts[peer] = value->data.string;
        PMIX_VALUE_RELEASE(value);
      }
    }
    publish_beat();
  }

  void publish_beat() {
    pmix_value_t beat;
    PMIX_VALUE_CONSTRUCT(&beat);
    beat.type = PMIX_INT64;
    beat.data.int64 = beats;
    const std::string key = beat_key(beats++);
    if (PMIx_Put(PMIX_GLOBAL, key.c_str(), &beat) == PMIX_SUCCESS) PMIx_Commit();
  }

  // One read of `keys[peer]` for every rank with a key to read; waits up to 2 s for the answers.
  // Returns the reads (0: no answer, 1: there, 2: not there), by rank.
  std::vector<int> read_keys(const std::map<int, std::string>& keys) {
    key_reads.push_back(std::make_unique<KeyRead[]>(static_cast<size_t>(size)));
    KeyRead* reads = key_reads.back().get();
    for (const auto& [peer, key] : keys) {
      pmix_proc_t proc = me;
      proc.rank = static_cast<pmix_rank_t>(peer);
      if (PMIx_Get_nb(&proc, key.c_str(), nullptr, 0, on_key, &reads[peer]) != PMIX_SUCCESS)
        reads[peer].state = 2;
    }
    for (const double deadline = now() + 2.0; now() < deadline;) {
      bool all = true;
      for (const auto& entry : keys)
        all = all && reads[entry.first].state.load() != 0;
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::vector<int> states(static_cast<size_t>(size), 0);
    for (const auto& entry : keys)
      states[static_cast<size_t>(entry.first)] = reads[entry.first].state.load();
    return states;
  }

  // Inside MPI_Init: every rank's latest heartbeat, searched from the one seen at the last check
  // (doubling the step while the keys are there, then halving). A rank whose keys cannot be read
  // (its host's PMIx server frozen or unreachable), that never published one (not started), or
  // whose latest beat is the one seen at the last check (stopped) is not answering.
  std::map<int, Status> ask_through_pmix() {
    std::map<int, Status> answers;
    answers[rank] = own_status();
    struct Search {
      int64_t present = -1, absent = -1, step = 1;
    };
    std::map<int, Search> searches;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const auto seen = latest_beat.find(peer);
      searches[peer].present = seen == latest_beat.end() ? -1 : seen->second;
    }
    std::map<int, bool> lost;
    for (int round = 0; round < 128; ++round) {
      std::map<int, std::string> keys;
      for (auto& [peer, search] : searches) {
        if (lost[peer] || (search.absent >= 0 && search.absent == search.present + 1)) continue;
        const int64_t beat = search.absent < 0 ? search.present + search.step
                                               : (search.present + search.absent) / 2;
        keys[peer] = beat_key(std::max<int64_t>(beat, 0));
      }
      if (keys.empty()) break;
      const std::vector<int> states = read_keys(keys);
      for (const auto& [peer, key] : keys) {
        Search& search = searches[peer];
        const int64_t beat = std::stoll(key.substr(std::strlen("a2d.beat.")));
        const int state = states[static_cast<size_t>(peer)];
        if (state == 0) {
          lost[peer] = true;
        } else if (state == 1) {
          search.present = beat;
          search.step *= 2;
        } else {
          search.absent = beat;
        }
      }
    }
    for (const auto& [peer, search] : searches) {
      const auto seen = latest_beat.find(peer);
      const bool stopped = seen != latest_beat.end() && seen->second == search.present;
      if (lost[peer] || search.present < 0 || stopped) continue;
      latest_beat[peer] = search.present;
      Status s;
      s.sequence = kInMpiInit;  // started; how far inside MPI_Init is not known here
      s.seconds = -1;
      copy_text(s.phase, stage_name(kInMpiInit), kPhaseChars);
      answers[peer] = s;
    }
    return answers;
  }
#endif

  // Answers the other ranks' guards (MPI is up on this rank).
  void serve() {
    for (;;) {
      int pending = 0;
      MPI_Status probe;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagAsk, MPI_COMM_WORLD, &pending, &probe);
      if (!pending) return;
      char ignored = 0;
      MPI_Recv(&ignored, 1, MPI_CHAR, probe.MPI_SOURCE, kTagAsk, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      Answer answer;
      answer.status = own_status();
      copy_text(answer.host, host, kHostChars);
      MPI_Send(&answer, sizeof answer, MPI_BYTE, probe.MPI_SOURCE, kTagAnswer, MPI_COMM_WORLD);
    }
  }

  // After MPI_Init: every rank's guard, asked over MPI_COMM_WORLD, answering within 2 s.
  std::map<int, Status> ask_through_mpi() {
    std::map<int, Status> answers;
    answers[rank] = own_status();
    static const char ask = 1;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      MPI_Request sent;
      MPI_Isend(&ask, 1, MPI_CHAR, peer, kTagAsk, MPI_COMM_WORLD, &sent);
      MPI_Request_free(&sent);
    }
    for (const double deadline = now() + 2.0;
         answers.size() < static_cast<size_t>(size) && now() < deadline;) {
      serve();
      int pending = 0;
      MPI_Status probe;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagAnswer, MPI_COMM_WORLD, &pending, &probe);
      if (!pending) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      Answer answer;
      MPI_Recv(&answer, sizeof answer, MPI_BYTE, probe.MPI_SOURCE, kTagAnswer, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      answer.host[kHostChars - 1] = '\0';
      answers[probe.MPI_SOURCE] = answer.status;
      if (hosts[probe.MPI_SOURCE] == "?") hosts[probe.MPI_SOURCE] = answer.host;
    }
    return answers;
  }

  // This rank has been in one stage for the timeout: returns if every rank answers (a slow
  // start), else reports and ends the job.
  void check_everyone() {
    const bool mpi = stage.load() >= kSetup;
    std::map<int, Status> answers;
    if (mpi) {
      answers = ask_through_mpi();
    } else {
#ifdef A2D_WITH_PMIX
      answers = ask_through_pmix();
#endif
    }
    if (answers.size() == static_cast<size_t>(size)) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(0.1 * std::min(rank, 20)));
    if (!claim_ending()) wait_for_the_end();
    std::string report = stall_report(rank, timeout, answers, hosts);
    if (!mpi) {
      report.insert(report.rfind("a2d watchdog: aborting"),
                    "  (asked through the launcher's PMIx: while mpirun's launch is unfinished, "
                    "the hosts that do answer may not reach one another either)\n");
    }
    std::fputs(report.c_str(), stderr);
    std::fflush(stderr);
    if (mpi) abort_mpi_job(124);
    std::_Exit(124);  // inside MPI_Init: the launcher ends the others when this rank is gone
  }

  void run() {
    double next_check = 0;
    [[maybe_unused]] double next_beat = now() + 0.5;
    [[maybe_unused]] bool beats_read = false;
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      const int current = stage.load();
      if (current >= kSetup) {
        lock.unlock();
        serve();
        lock.lock();
      }
#ifdef A2D_WITH_PMIX
      // Beats until the start is done (a rank that left MPI_Init still beats for those inside).
      if (current < kStarted && pmix && now() >= next_beat) {
        lock.unlock();
        publish_beat();
        // Halfway to the timeout inside MPI_Init, every rank's latest beat, so that the check
        // at the timeout tells a rank stopped since then from a live one.
        if (current == kInMpiInit && !beats_read && now() - stage_since.load() > timeout / 2) {
          ask_through_pmix();
          beats_read = true;
        }
        lock.lock();
        next_beat = now() + kBeatSeconds;
      }
#endif
      const bool can_ask = current >= kSetup || size > 1;  // inside MPI_Init only with PMIx
      if (current < kStarted && can_ask && now() - stage_since.load() > timeout &&
          now() >= next_check) {
        lock.unlock();
        check_everyone();
        lock.lock();
        next_check = now() + timeout;
        continue;
      }
      // Answers are awaited for 2 s: a fifth of that is soon enough once the start is done.
      wake.wait_for(lock, std::chrono::milliseconds(current >= kStarted ? 400 : 50));
    }
  }
};

namespace {
std::mutex g_guard_mutex;
StartupGuard::State* g_guard = nullptr;
}  // namespace

StartupGuard::StartupGuard(double timeout_seconds) {
  if (timeout_seconds <= 0) return;
  state_ = std::make_unique<State>();
  state_->timeout = timeout_seconds;
#ifdef A2D_WITH_PMIX
  state_->start_pmix();
#endif
  state_->stage_since = now();
  {
    std::lock_guard<std::mutex> lock(g_guard_mutex);
    g_guard = state_.get();
  }
  state_->thread = std::thread([state = state_.get()] { state->run(); });
}

StartupGuard::~StartupGuard() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(g_guard_mutex);
    g_guard = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
#ifdef A2D_WITH_PMIX
  if (state_->pmix) PMIx_Finalize(nullptr, 0);
  // Reads still on their way write into key_reads: it must outlive them.
  static std::vector<std::unique_ptr<KeyRead[]>> kept;
  for (auto& reads : state_->key_reads)
    kept.push_back(std::move(reads));
#endif
}

void StartupGuard::mpi_initialized() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    MPI_Comm_rank(MPI_COMM_WORLD, &state_->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &state_->size);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(name, &length);
    state_->host = name;
    state_->hosts.resize(static_cast<size_t>(state_->size), "?");
    if (state_->hosts[static_cast<size_t>(state_->rank)] == "?")
      state_->hosts[static_cast<size_t>(state_->rank)] = state_->host;
    state_->stage_since = now();
    state_->stage = kSetup;
  }
  state_->wake.notify_all();
}

void startup_done() {
  std::lock_guard<std::mutex> lock(g_guard_mutex);
  if (!g_guard || g_guard->stage.load() != kSetup) return;
  g_guard->stage_since = now();
  g_guard->stage = kStarted;
}

void wait_for_every_rank_in_mpi() {
#ifdef A2D_WITH_PMIX
  if (!std::getenv("PMIX_NAMESPACE") || !std::getenv("PMIX_RANK")) return;
  pmix_proc_t me{};
  if (PMIx_Init(&me, nullptr, 0) != PMIX_SUCCESS) return;  // counted: shares MPI's connection
  // A key of this library's, committed before the fence: the fence has data to collect, so the
  // launcher gathers every rank's contribution (Slurm: its ring) before it releases any rank.
  pmix_value_t value;
  PMIX_VALUE_CONSTRUCT(&value);
  value.type = PMIX_INT32;
  value.data.int32 = 1;
  if (PMIx_Put(PMIX_GLOBAL, "a2d.mpi_up", &value) == PMIX_SUCCESS && PMIx_Commit() == PMIX_SUCCESS) {
    pmix_info_t collect;
    bool yes = true;
    PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    PMIx_Fence(nullptr, 0, &collect, 1);
    PMIX_INFO_DESTRUCT(&collect);
  }
  PMIx_Finalize(nullptr, 0);
#endif
}

#else  // no MPI: no job to start

struct StartupGuard::State {};
StartupGuard::StartupGuard(double) {}
StartupGuard::~StartupGuard() = default;
void StartupGuard::mpi_initialized() {}
void startup_done() {}
void wait_for_every_rank_in_mpi() {}

#endif

}  // namespace a2d::watchdog_detail
