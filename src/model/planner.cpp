#include "attention2d/planner.hpp"

#include <algorithm>
#include <fstream>
#include <optional>

#include "attention2d/error.hpp"
#include "attention2d/node_layout.hpp"

namespace a2d {

Machine MachineChoice::machine(int ranks, DType dtype) const {
  if (!machine_file.empty()) return load_machine_file(machine_file);
  if (name == "local") return local_machine(calibration_file, ranks);
  if (!name.empty()) return preset_machine(name, dtype);
  try {
    return local_machine(calibration_file, ranks);
  } catch (const Error&) {
    Machine generic;
    generic.name = "generic";
    generic.description = "uncalibrated placeholder (run a2d calibrate for this machine's numbers)";
    generic.kernel_forward_flops = 50e9;
    generic.kernel_backward_flops = 40e9;
    generic.intra = {1e-6, 10e9};
    generic.inter = generic.intra;
    return generic;
  }
}

int model_ranks_per_node(const Machine& machine, int requested, int ranks) {
  const int per_node = machine.ranks_per_node > 0 ? machine.ranks_per_node : requested;
  return std::max(1, std::min(per_node, ranks));
}

PlannedRun choose_plan(const Problem& problem, int ranks, int ranks_per_node,
                       const MachineChoice& choice, const std::string& algo,
                       const std::string& grid, int heads_parallel, const UserShards* shards) {
  Machine machine = choice.machine(ranks, problem.dtype);
  // A machine file describes nodes, so the placement of ranks on them is the planner's choice too.
  bool choose_placement = machine.ranks_per_node > 0;
  // Without one, Slurm's nodes where several hold this job's ranks evenly: the ranks are already
  // placed, so the placement is the launcher's. Slurm's variables are the step's, the same on
  // every rank; Open MPI tells each rank only its own node's count, so ranks on a node that mpirun
  // filled only partly would plan for other nodes than the rest, and plans must agree: mpirun's
  // layout is printed by a2d info, not planned for.
  if (choice.machine_file.empty()) {
    if (const std::optional<NodeLayout> layout = read_node_layout();
        layout && layout->source == "slurm" && layout->nodes() > 1 && layout->ranks() == ranks &&
        layout->uniform_tasks_per_node() > 0) {
      machine.ranks_per_node = layout->uniform_tasks_per_node();
      machine.cyclic_placement = layout->cyclic;
      choose_placement = false;
      machine.description += "; nodes: " + layout->describe();
    }
  }
  const PlanSearch search =
      search_plans(problem, ranks, machine, model_ranks_per_node(machine, ranks_per_node, ranks),
                   true, choose_placement, shards);
  // The hybrid at U = 1 is ATTENTION2D (the search ranks it as such): its fastest grid.
  const bool hybrid_one = algo == "hybrid" && heads_parallel == 1;
  for (const RankedPlan& r : search.ranked) {
    if (hybrid_one && r.plan.algorithm == Algorithm::attention2d) {
      if (!grid.empty() && r.plan.grid.describe() != parse_grid(grid).describe()) continue;
      Plan plan = r.plan;
      plan.algorithm = Algorithm::hybrid;
      return {plan,
              predict(problem, plan, machine, model_ranks_per_node(machine, ranks_per_node, ranks),
                      shards),
              machine.name + ": " + machine.description, r.cyclic_placement};
    }
    if (!algo.empty() && algorithm_name(r.plan.algorithm) != algo) continue;
    if (!grid.empty() && r.plan.grid.describe() != parse_grid(grid).describe()) continue;
    if (heads_parallel > 0 && r.plan.heads_parallel != heads_parallel) continue;
    return {r.plan, r.prediction, machine.name + ": " + machine.description, r.cyclic_placement};
  }
  std::string reasons;
  for (const auto& [name, reason] : search.skipped) {
    if (algo.empty() || name == algo) reasons += "\n  " + name + ": " + reason;
  }
  A2D_FAIL("no plan can run this problem on ", ranks, " ranks",
           algo.empty() ? std::string() : " with --algo " + algo,
           grid.empty() ? std::string() : " and --grid " + grid,
           heads_parallel > 0 ? " and --heads-parallel " + std::to_string(heads_parallel)
                              : std::string(),
           reasons);
}

}  // namespace a2d
