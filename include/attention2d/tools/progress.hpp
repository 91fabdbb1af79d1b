// attention2d: long runs say so (docs/reliability.md, "Long runs"), for the a2d subcommands. Before
// a run the model predicts to take longer than about 10 s, one line with that prediction; while a
// run goes on past about 30 s, a line at most every 10 s with its phase, iteration, the share done,
// the time elapsed and the time left:
//
//   a2d kernel: predicted 43 min for 1 forward call (an estimate: ...)
//   a2d kernel: forward, iteration 1 of 1, 1.2% done, 30 s elapsed, ~41 min left
//
// On rank 0's stderr only (stdout, --json's too, is untouched); --quiet turns both off. For tests
// the thresholds come from the environment, in seconds: A2D_PROGRESS_PREDICT (10),
// A2D_PROGRESS_AFTER (30) and A2D_PROGRESS_EVERY (10).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "attention2d/cost_model.hpp"
#include "attention2d/peak.hpp"

namespace a2d {

extern const char* const kQuietHelp;

// What the fp64 reference (--check) computes per second and thread: plain loops in double, for
// the prediction of a run with --check (measured: docs/reliability.md, "Long runs").
inline constexpr double kReferenceFlopsPerThread = 1e9;

struct ProgressSettings {
  double predict_s = 10;  // a prediction above this is printed
  double after_s = 30;    // progress lines once the run has gone on this long
  double every_s = 10;    // and at most this often
  static ProgressSettings from_environment();
};

// A time in words: "0.4 s", "45 s", "3 min 20 s", "2 h 5 min", "2 d 3 h".
std::string duration_text(double seconds);

// The CPU kernels' share of this machine's FMA peak (docs/performance.md: the fast paths reach
// 0.8-0.95 of it; the AVX2 path on a CPU whose peak is AVX-512's about half that; the portable
// path about 0.05), for a time estimate where no calibration exists.
struct KernelEfficiency {
  double forward = 0;
  double backward = 0;
};
KernelEfficiency kernel_efficiency(const FmaPeak& peak);

// The machine to predict a run of `ranks` ranks of `threads` threads on this CPU with: this
// machine's calibration for `ranks` (a2d calibrate), else an estimate from the FMA peak (measured
// here, on one thread, unless `peak` is given) times kernel_efficiency, with the cores shared by
// the ranks of this host and its links guessed (5 us, 5 GB/s). `source` says which, for the
// prediction's line.
struct LocalMachine {
  Machine machine;
  std::string source;
};
// `dtype`: the problem's (bf16 takes the calibration's bf16 rates, or the tile peak, where bf16
// runs on its own instructions: the amx and avx512bf16 kernel paths).
LocalMachine local_machine_for_prediction(int ranks, int threads,
                                          const std::string& calibration_file,
                                          const FmaPeak* peak = nullptr,
                                          DType dtype = DType::f32);
// Whether a run of `flops` per rank could take longer than `seconds` on this CPU at all (at a
// pessimistic 2 GFLOP/s per thread): only then is the peak worth measuring for a prediction.
bool could_take_longer(double flops_per_rank, int threads, double seconds);

// The reporter. Stages run one after another; each has a predicted duration (seconds; their sum
// is the prediction) and, where known, the share of it done (a counter read by the reporting
// thread: thread-safe). The share of the run done is the finished stages' predictions and the
// current stage's share of its own, over the sum; the time left is what the time since the first
// predicted stage began says at that rate (setup before it, such as generating the inputs, is not
// in the prediction), or the prediction less that time before anything is done.
class Progress {
 public:
  // `enabled`: this process reports (rank 0, not --quiet).
  Progress(std::string command, bool enabled,
           ProgressSettings settings = ProgressSettings::from_environment());
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }
  // The whole run's prediction: printed, as "COMMAND: predicted T for WHAT (SOURCE)", when over
  // the threshold. Starts the reporting thread.
  void predict(double seconds, const std::string& what, const std::string& source);
  // A stage begins: `name` (or `phase`, called at each line: the phase now, e.g. the watchdog's),
  // iteration `iteration` of `iterations` (0: none), `seconds` predicted, `done` its share done
  // (0..1) or none.
  void stage(const std::string& name, int64_t iteration, int64_t iterations, double seconds,
             std::function<double()> done = {}, std::function<std::string()> phase = {});
  // The run is over: no more lines.
  void finish();

  // The line for the state now (for tests of the format).
  std::string line(double elapsed_s);

 private:
  void run();

  std::string command_;
  bool enabled_;
  ProgressSettings settings_;
  double start_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
  // The run's stages (guarded by mutex_).
  double total_s_ = 0;        // predicted, all stages
  double work_start_s_ = -1;  // when the first stage with a prediction began (the rate's start)
  double finished_s_ = 0;     // predicted, the stages finished
  std::string name_;
  std::function<std::string()> phase_;
  int64_t iteration_ = 0, iterations_ = 0;
  double stage_s_ = 0;
  std::function<double()> done_;
};

}  // namespace a2d
