// attention2d: the planner, the library call behind `a2d plan`, the Python module's choose_plan
// and `a2d run` / `a2d bench` without --algo or --grid. It picks the machine model and the
// fastest plan by the cost model (cost_model.hpp's search_plans), restricted as the caller asks.
#pragma once

#include <string>

#include "attention2d/cost_model.hpp"

namespace a2d {

struct MachineChoice {
  // a100-hdr, h100-ndr, local (needs the calibration), or "" = local if calibrated for the rank
  // count, else `generic`: a placeholder machine (1 us, 10 GB/s, 50 GFLOP/s per rank) used only to
  // rank plans when nothing was calibrated; docs/cost-model.md.
  std::string name;
  std::string calibration_file;
  // A machine file: the machine, its ranks per node and its links from the file (name and
  // calibration_file are then ignored).
  std::string machine_file;

  // The machine for `ranks` ranks; a preset's kernel rates are those of `dtype`.
  Machine machine(int ranks, DType dtype) const;
};

// The ranks per node to model: the machine file's where the machine has one, else `requested`;
// at most `ranks`.
int model_ranks_per_node(const Machine& machine, int requested, int ranks);

struct PlannedRun {
  Plan plan;
  Prediction prediction;
  // A machine file's nodes of several ranks: the placement of ranks on nodes the planner chose
  // (true: cyclic, mpirun --map-by node).
  std::string machine_description;
  bool cyclic_placement = false;
};

// The fastest plan by the model; `algo`, `grid` ("" = free) and `heads_parallel` (0 = free)
// restrict the search. `ranks_per_node` is the caller's, unless the machine (a machine file) has
// its own, or, without a machine file, Slurm's environment places `ranks` ranks evenly on nodes
// (read_node_layout; its placement, block or cyclic, is then the launcher's, not the planner's
// choice). With `shards` every plan is charged the exchanges from and to the caller's layout.
// Throws a2d::Error naming why each algorithm was skipped when no plan fits.
PlannedRun choose_plan(const Problem& problem, int ranks, int ranks_per_node,
                       const MachineChoice& choice, const std::string& algo,
                       const std::string& grid, int heads_parallel = 0,
                       const UserShards* shards = nullptr);

}  // namespace a2d
