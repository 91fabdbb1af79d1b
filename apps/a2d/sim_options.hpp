// a2d sim's options, declared in both builds: the SMPI build runs the command (sim_command.cpp),
// the native build prints them for `a2d sim --help` (an SMPI binary runs only under smpirun,
// whose SimGrid takes --help for itself).
#pragma once

#include <cstdint>
#include <string>

#include "attention2d/tools/cli.hpp"
#include "problem_options.hpp"

namespace a2d::commands {

struct SimOptions {
  cli::ProblemOptions problem;
  std::string machine = "h100-ndr";
  std::string machine_file;
  std::string plans;  // "" = every algorithm of the table (src/table/), set by declare
  int64_t gpus_per_node = 1;
  int64_t top = 0;
  int64_t warmup = 0, iters = 1;  // deterministic: a warm-up call changes nothing
  double memory_gbs = -1;         // -1: the preset's HBM bandwidth, 0 with a machine file
  double host_reduction_gbs = 0;
  int64_t pool_gib = 64;
  bool backward = false, json = false, cuda_rules = false;
};

inline constexpr const char* kSimUsage =
    "`sim/run.sh --platform NAME -np P -- [a2d sim options]`";
inline constexpr const char* kSimAbout =
    "Runs plans of the engine on the simulated device inside SimGrid (SMPI) and reports the\n"
    "simulated time of the slowest rank, per phase, beside the cost model's prediction\n"
    "(docs/simulation.md). A simulation, not a measurement.";

// The options of a2d sim, declared into `options` for `o` (its dtype bf16, a GPU's; its plans
// every algorithm of the table).
void declare_sim_options(cli::Options& options, SimOptions& o);

}  // namespace a2d::commands
