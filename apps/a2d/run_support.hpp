// Pieces shared by `a2d run` and `a2d bench`: running a subcommand body so errors never hang the
// job, the collective agreement on the problem, timing distributed calls, and the report.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/comm_kind.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/session.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/tools/harness.hpp"

namespace a2d {
class Watchdog;
}

namespace a2d::commands {

// Runs `body` on every rank. A CollectiveError (every rank failed together) is printed and gives
// exit code 2; any other error is printed and aborts the whole MPI job (exit 3), because the other
// ranks may be waiting for this one. SIGTERM and SIGINT end the job (Watchdog::stop_on_signals).
int run_collectively(Communicator& world, const std::function<int()>& body);

// What a2d run, bench and decode start with: MPI for the command's lifetime, the world's traffic
// counted into one log (make_session charges the algorithms' communicator to it too), and
// `body` run collectively on it (run_collectively).
using CountedBody =
    std::function<int(CountingCommunicator& world, const std::shared_ptr<TrafficLog>& log)>;
// The watchdog's default --timeout of run and bench, seconds (docs/reliability.md).
constexpr double kDefaultTimeout = 300;

// startup_timeout > 0: the start of the job is watched until the command's watchdog runs
// (MpiSession); the commands with --timeout pass startup_timeout(), others nothing.
int run_counted(int* argc, char*** argv, const CountedBody& body, double startup_timeout = 0);
// The --timeout a command line gives (`fallback` where it gives none or a value that is not a
// number: the options' own parse, after MPI_Init, refuses that), read before MPI starts.
double startup_timeout(int argc, char** argv, int first, double fallback);

// The Session of a2d run, bench and decode (attention2d/session.hpp) over `world`: its
// algorithms run on `world` itself for mpi (the algorithms stage a GPU's buffers through host
// memory); for nccl on an NCCL communicator, for gloo on a Gloo mesh bootstrapped over MPI, whose
// traffic is charged to `log`, as `world`'s is. It keeps `watchdog` (over MPI, which covered the
// start), which over gloo is replaced by one over the mesh with the same timeout. Collective;
// refusals throw on every rank.
std::unique_ptr<Session> make_session(Communicator& world, const std::shared_ptr<TrafficLog>& log,
                                      std::unique_ptr<Backend> backend, CommKind kind,
                                      std::unique_ptr<Watchdog> watchdog, double timeout);

// Threads for the single-process fp64 reference (every core of this machine).
int reference_threads();

struct PhaseTiming {
  double median_ms = 0;    // median over iterations of the slowest rank's time
  double rank_min_ms = 0;  // per-rank medians: min, mean and max across ranks
  double rank_avg_ms = 0;
  double rank_max_ms = 0;
  int64_t bytes = 0;     // sent by one call, max over ranks
  int64_t messages = 0;  // sent by one call, max over ranks
  // The part of them in the exchanges between the caller's shards and the plan's layout (phases
  // "<direction>.relayout_*"), max over ranks; 0 without them.
  int64_t relayout_bytes = 0;
  int64_t relayout_messages = 0;
};

// One direction's JSON fields ("fwd" or "bwd"), as a2d run and a2d bench write them: <d>_ms,
// <d>_ms_rank_min, _avg, _max, <d>_gflops_per_rank (`flops` over the median time and the ranks),
// bytes_sent_<d>, messages_<d>.
void add_timing_fields(cli::JsonLine& line, const std::string& direction, const PhaseTiming& t,
                       double flops, int ranks);

struct Timings {
  PhaseTiming forward, backward;
  // Wall-clock milliseconds per named phase of the algorithm ("forward.kernel", ...; ".setup" is
  // the time before the first named phase): per rank the median over the timed calls, then the
  // largest over the ranks. Phases are as rank 0 names them.
  std::map<std::string, double> phase_ms;
};

// Times calls of one plan: each call() is one forward (and backward) call, each after a barrier,
// kept for the summary when `measured`; the traffic of one call is read from `log`. finish() is
// collective. a2d bench keeps one per row and calls them round-robin.
class AttentionTimer {
 public:
  AttentionTimer(Communicator& world, TrafficLog& log, DistributedAttention& attention,
                 const Problem& problem, ShardSet& shards, bool backward);
  void call(bool measured);
  Timings finish();
  // Called on every rank before each direction's call ("forward", "backward"), before its barrier:
  // the progress lines' stages.
  std::function<void(const std::string& direction)> before_call;

 private:
  // One direction's measured calls: the slowest rank's and this rank's times, one call's traffic.
  struct Samples {
    std::vector<double> slowest, mine;
    Traffic traffic, relayout;
  };
  void time_direction(const std::string& direction, const std::function<void()>& body,
                      bool measured, Samples& samples);

  Communicator& world_;
  TrafficLog& log_;
  DistributedAttention& attention_;
  const Problem& problem_;
  ShardSet& shards_;
  bool with_backward_;
  Samples forward_, backward_;
  std::map<std::string, std::vector<double>> phase_samples_;
};

// warmup + iters calls of forward (and backward), each after a barrier; the traffic of one call
// is read from `log`.
// before_call(direction, call): as AttentionTimer::before_call, with the call's index.
Timings time_attention(Communicator& world, TrafficLog& log, DistributedAttention& attention,
                       const Problem& problem, ShardSet& shards, bool backward, int64_t warmup,
                       int64_t iters,
                       const std::function<void(const std::string&, int64_t)>& before_call = {});

// Peak resident memory growth of this process while `body` runs: the kernel's high-water mark is
// reset first (/proc/self/clear_refs), then VmHWM - VmRSS(before) is read back. Returns -1 where
// /proc does not allow it.
int64_t peak_memory_growth(const std::function<void()>& body);

// Bytes of a rank's shard buffers (inputs, outputs and gradients, in the problem's dtype).
int64_t shard_bytes(const ShardSet& shards);

// Unmasked FLOPs of one forward call of the whole problem (4 * pairs * D per head).
double forward_flops(const Problem& problem);

struct RunReport {
  Problem problem;
  Plan plan;
  int ranks = 1;
  bool backward = false;
  Timings timings;
  bool checked = false;
  OutputErrors errors;
  std::string device = "cpu";
  std::string comm = "mpi";
  // With --shards: the caller's layout and the plan's, between which the run exchanged.
  std::string shards;
  std::string plan_layout;

  std::string text() const;
  std::string json() const;
};

}  // namespace a2d::commands
