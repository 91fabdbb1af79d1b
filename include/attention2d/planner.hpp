// attention2d: the planner, the library call behind `a2d plan`, the Python module's choose_plan
// and `a2d run` / `a2d bench` without --algo or --grid. It picks the machine model and the
// fastest plan that fits in memory by the cost model (cost_model.hpp's search_plans), restricted
// as the caller asks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attention2d/cost_model.hpp"

namespace a2d {

// The machine every planning command models when none is named and this machine has no
// calibration for the job's rank count (docs/usage.md, "Defaults").
inline constexpr const char* kDefaultMachine = "h100-ndr";

struct MachineChoice {
  // a100-hdr, h100-ndr, local (needs the calibration), or "" = local if calibrated for the rank
  // count, else kDefaultMachine; the machine's description says which and why.
  std::string name;
  std::string calibration_file;
  // A machine file: the machine, its ranks per node and its links from the file (then `name`
  // must be empty: a file and a preset contradict each other).
  std::string machine_file;
  // The memory per rank plans must fit in (bytes): -1 = the machine's (Machine::memory_bytes),
  // 0 = no cap.
  int64_t max_memory = -1;

  // Whether the machine is one of GPUs (the default dtype is then bf16, else fp32): known before
  // the dtype, which the machine's kernel rates depend on.
  bool gpu(int ranks) const;
  DType default_dtype(int ranks) const;
  // The machine for `ranks` ranks; a preset's or file's kernel rates are those of `dtype`.
  // Throws a2d::Error for a name and a file together, an unknown name, or a file it cannot use.
  Machine machine(int ranks, DType dtype) const;
  // The cap `max_memory` gives on `machine` (0: none).
  int64_t memory_cap(const Machine& machine) const;
};

// The ranks per node to model: the machine file's where the machine has one, else `requested`;
// at most `ranks`. Throws a2d::Error when the job's ranks span several nodes but are not a
// multiple of the ranks per node (a partly filled node the model would misplace).
int model_ranks_per_node(const Machine& machine, int requested, int ranks);

// Throws a2d::Error, saying what to change, when the machine's ranks are GPUs and a2d's CUDA
// kernels do not compute the problem (dtype, head dimension, documents, softcap): a plan for
// that machine could not run.
void check_machine_runs(const Machine& machine, const Problem& problem);

struct PlannedRun {
  Plan plan;
  Prediction prediction;
  std::string machine_description;
  // A machine file's nodes of several ranks: the placement of ranks on nodes the planner chose
  // (true: round-robin, mpirun --map-by node).
  bool cyclic_placement = false;
  // The reasons: the next plans the search ranks after it (up to two other plans, under the same
  // restrictions; not the same plan in the other placement), the fastest Ring Attention plan that
  // fits (the paper's baseline; none when none fits or the restrictions exclude it), the memory cap
  // and the plans it excluded.
  std::vector<RankedPlan> runners_up;
  std::optional<RankedPlan> best_ring;
  int64_t memory_cap = 0;
  int excluded = 0;
  int ranks_per_node = 1;
};

// The fastest plan by the model that fits in the machine's memory (choice.max_memory); `algo`,
// `grid` ("" = free) and `heads_parallel` (0 = free) restrict the search. `ranks_per_node` is the
// caller's, unless the machine (a machine file) has its own, or, without a machine file, Slurm's
// environment places `ranks` ranks evenly on nodes (read_node_layout; its placement, block or
// round-robin, is then the launcher's, not the planner's choice). With `shards` every plan is
// charged the exchanges from and to the caller's layout. Throws a2d::Error naming why each
// algorithm was skipped when no plan can run, and, when plans can run but none fits in memory,
// how many they are, what the smallest needs and what would fit (more ranks, bf16, a shorter
// sequence).
PlannedRun choose_plan(const Problem& problem, int ranks, int ranks_per_node,
                       const MachineChoice& choice, const std::string& algo,
                       const std::string& grid, int heads_parallel = 0,
                       const UserShards* shards = nullptr);

// What a front end asks of the plan (a2d run's --algo, --grid, --layout, ...; the C++ door's
// argument): every field left empty (or 0) is chosen, by the cost model where it decides speed
// (the algorithm, the grid, hybrid's U) and by the algorithm's default otherwise.
struct PlanRequest {
  std::string algo;    // "" = the fastest by the cost model
  std::string grid;    // "" = the fastest grid by the cost model (where the algorithm has one)
  std::string layout;  // "" = the algorithm's
  int64_t stripe = 1;
  int64_t threads = 1;  // kernel threads per rank
  bool kv_transpose = true;
  int64_t heads_parallel = 0;  // hybrid's U; 0 = from the grid, else the fastest by the model
  // The planner's machine; an empty calibration_file is default_calibration_file(), as a2d run
  // reads it.
  MachineChoice machine;

  // Whether resolve_plan leaves the choice to the cost model (no algorithm, or no grid where the
  // algorithm has one).
  bool chosen_by_planner() const;
};

// The plan `request` asks for, checked against the problem and the job's `ranks` (check_plan):
// the one place a request becomes a plan, for every front end (a2d run, bench and decode; the
// Python package; the C++ door). The cost model chooses where the request leaves it open
// (chosen_by_planner, or, with the caller's `shards`, whenever the grid is open: it then also
// weighs running in the shards' own layout) and charges the exchanges from and to `shards`;
// `chosen` (if not null) then says so and on which machine model. Throws a2d::Error naming the field (in a2d run's option words).
Plan resolve_plan(const PlanRequest& request, const Problem& problem, int ranks,
                  std::string* chosen = nullptr, const UserShards* shards = nullptr);

// When no plan fits in `memory_cap` bytes per rank: what would (the fewest ranks, a multiple of
// ranks_per_node, at which some plan fits; bf16 where the problem is fp32; the longest sequence
// that fits on `ranks`), one clause each, for an error message.
// The least memory per rank (memory_per_rank) of any plan that can run the problem on `ranks`
// ranks; -1 when none can. What a front end that lets the planner choose compares with its hosts'
// memory before the plan is chosen (memory_check.hpp).
int64_t least_memory_per_rank(const Problem& problem, int ranks);

std::string what_would_fit(const Problem& problem, int ranks, int ranks_per_node,
                           int64_t memory_cap);

}  // namespace a2d
