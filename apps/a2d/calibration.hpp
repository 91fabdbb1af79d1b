// Measuring this machine for the cost model's `local` preset (`a2d calibrate`, and `a2d bench
// --calibrate`, which measures right before its rows so predictions and measurements are taken
// side by side on a shared machine).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "attention2d/comm.hpp"
#include "attention2d/cost_model.hpp"

namespace a2d::commands {

struct CalibrationSettings {
  int64_t block = 1024;  // query and key rows of the timed kernel calls
  int64_t heads = 4;
  int64_t head_dim = 64;
  int64_t iters = 3;  // timed repetitions (median of the slowest rank)
  int64_t threads = 1;
  // Each timed region of kernel calls repeats the call for up to kernel_region_s seconds and, where
  // kernel_region_flops > 0, for no more calls than do that much work (a problem's per rank).
  double kernel_region_s = 1.0;
  double kernel_region_flops = 0;
  // Called (on every rank) as each measurement starts, with "k/n: what"; empty: silent.
  std::function<void(const std::string&)> progress;
  void validate() const;  // collective callers wrap it in collective_check
};

// Every rank of `world` takes part; every rank gets the same result.
Calibration measure_calibration(Communicator& world, const CalibrationSettings& settings);

// The calibration's four kernel timings (forward and backward, unmasked and on a causal diagonal
// block), each a timed region of repeated calls on the slowest rank (see kernel_region_s), taken
// one round at a time: measure_calibration takes its rounds back to back, and `a2d bench
// --calibrate` also takes one between the rounds of its rows, so that the kernel rates of its
// predictions are those of the span the rows ran in. Every member function is collective.
class KernelSampler {
 public:
  KernelSampler(Communicator& world, const CalibrationSettings& settings);  // sizes the regions
  ~KernelSampler();
  KernelSampler(const KernelSampler&) = delete;
  KernelSampler& operator=(const KernelSampler&) = delete;

  void sample(bool keep = true);  // one timed region of every timing, in turn
  int64_t samples() const;        // rounds kept
  // Sets c's kernel rates from the medians of the rounds kept (at least one), and scales the
  // forward's per-panel and per-key costs, where c has a forward rate, by its change.
  void apply(Calibration& c) const;

 private:
  friend Calibration measure_calibration(Communicator& world, const CalibrationSettings& settings);
  struct State;
  Communicator& world_;
  std::unique_ptr<State> state_;
};

// The human-readable summary (rank 0 calls it).
void print_calibration(const Calibration& c, const CalibrationSettings& settings,
                       const std::string& file);

}  // namespace a2d::commands
