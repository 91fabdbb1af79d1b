#include "attention2d/planner.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "attention2d/error.hpp"
#include "attention2d/node_layout.hpp"
#include "backends/cuda/cuda_plan.hpp"

namespace a2d {

namespace {
bool is_preset(const std::string& name) {
  const std::vector<std::string> presets = preset_names();
  return std::find(presets.begin(), presets.end(), name) != presets.end();
}

void check_choice(const MachineChoice& choice) {
  A2D_REQUIRE(choice.machine_file.empty() || choice.name.empty(), "--machine ", choice.name,
              " and --machine-file ", choice.machine_file,
              " contradict each other: the file describes the whole machine; give one of them");
  A2D_REQUIRE(choice.max_memory >= -1, "the memory cap must be a size, 0 (none) or -1");
}
}  // namespace

bool MachineChoice::gpu(int ranks) const {
  check_choice(*this);
  if (!machine_file.empty()) return machine_file_is_gpu(machine_file);
  if (name == "local") return false;
  if (!name.empty()) {
    A2D_REQUIRE(is_preset(name), "unknown machine '", name,
                "'; choose local, a100-hdr or h100-ndr");
    return true;
  }
  return !has_calibration(calibration_file, ranks);  // the default preset is one of GPUs
}

DType MachineChoice::default_dtype(int ranks) const {
  return gpu(ranks) ? DType::bf16 : DType::f32;
}

Machine MachineChoice::machine(int ranks, DType dtype) const {
  check_choice(*this);
  if (!machine_file.empty()) return load_machine_file(machine_file, dtype);
  if (name == "local") return local_machine(calibration_file, ranks, dtype);
  if (!name.empty()) return preset_machine(name, dtype);
  if (has_calibration(calibration_file, ranks)) {
    return local_machine(calibration_file, ranks, dtype);
  }
  Machine m = preset_machine(kDefaultMachine, dtype);
  m.description += " (the default machine: no calibration of this machine for " +
                   std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + " in " +
                   calibration_file + "; a2d calibrate measures it, --machine names another)";
  return m;
}

int64_t MachineChoice::memory_cap(const Machine& m) const {
  return max_memory < 0 ? m.memory_bytes : max_memory;
}

int model_ranks_per_node(const Machine& machine, int requested, int ranks) {
  const int per_node = std::max(1, machine.ranks_per_node > 0 ? machine.ranks_per_node : requested);
  A2D_REQUIRE(ranks <= per_node || ranks % per_node == 0, ranks, " ranks on nodes of ", per_node,
              " (",
              machine.ranks_per_node > 0 ? "the machine file's ranks_per_node" : "--gpus-per-node",
              ") leave a node partly filled; give a multiple of ", per_node, " ranks (",
              ranks / per_node * per_node > 0 ? std::to_string(ranks / per_node * per_node) + " or "
                                              : std::string(),
              (ranks / per_node + 1) * per_node, ")");
  return std::min(per_node, ranks);
}

void check_machine_runs(const Machine& machine, const Problem& problem) {
  if (!machine.gpu) return;
  // The CUDA backend's own capabilities (src/backends/cuda/cuda_plan.hpp), which it checks again
  // on every rank before any data moves.
  const std::string what = "the plan is for the GPUs of " + machine.name +
                           ", and a2d's CUDA kernels (the backend that runs there) ";
  A2D_REQUIRE(cuda_plan::supported_dtype(problem.dtype), what, "take bf16 or fp16, not ",
              dtype_name(problem.dtype), ": use --dtype bf16 (or fp16)");
  A2D_REQUIRE(cuda_plan::supported_head_dim(problem.head_dim), what,
              "are built for head dimensions 64, 80, 96 and 128, not ", problem.head_dim);
  A2D_REQUIRE(problem.softcap == 0.0f, what, "do not implement logit softcapping (--softcap) yet");
}

namespace {

// The least memory per rank of any plan that can run the problem on `ranks` ranks (the search's
// candidates, without the caller's shards); infinity when none can run.
double least_memory(const Problem& problem, int ranks) {
  PlanChoices choices;
  choices.both_kv_transposes = true;
  double least = std::numeric_limits<double>::infinity();
  for (const Algorithm algorithm : all_algorithms()) {
    for (const Plan& plan : algorithm_plans(algorithm, problem, ranks, choices)) {
      try {
        least = std::min(least, static_cast<double>(memory_per_rank(problem, plan)));
      } catch (const Error&) {
        // a plan this problem does not allow
      }
    }
  }
  return least;
}

}  // namespace

int64_t least_memory_per_rank(const Problem& problem, int ranks) {
  const double least = least_memory(problem, ranks);
  return least == std::numeric_limits<double>::infinity() ? -1 : static_cast<int64_t>(least);
}

std::string what_would_fit(const Problem& problem, int ranks, int ranks_per_node,
                           int64_t memory_cap) {
  const double cap = static_cast<double>(memory_cap);
  std::vector<std::string> clauses;
  // More ranks: multiples of the node (doubling), up to 2^20.
  const int64_t step = std::max(1, ranks_per_node);
  for (int64_t more = std::max<int64_t>(ranks * int64_t{2}, step); more <= (1 << 20); more *= 2) {
    const int64_t rounded = (more + step - 1) / step * step;
    if (least_memory(problem, static_cast<int>(rounded)) <= cap) {
      clauses.push_back(std::to_string(rounded) + " ranks" +
                        (step > 1 ? " (" + std::to_string(rounded / step) + " nodes of " +
                                        std::to_string(step) + ")"
                                  : std::string()));
      break;
    }
  }
  if (problem.dtype == DType::f32) {
    Problem narrow = problem;
    narrow.dtype = DType::bf16;
    if (least_memory(narrow, ranks) <= cap) clauses.push_back("--dtype bf16");
  }
  // The longest sequence that fits on these ranks (memory grows with N).
  int64_t low = 0, high = problem.seq;
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    Problem shorter = problem;
    shorter.seq = mid;
    if (shorter.mask.fixed_length()) shorter.mask = Mask::none();  // documents, slices: N only
    bool fits = false;
    try {
      shorter.validate();
      fits = least_memory(shorter, ranks) <= cap;
    } catch (const Error&) {
    }
    (fits ? low : high) = mid;
  }
  if (low >= 1) {
    clauses.push_back("--seq " + std::to_string(low) + " or less on " + std::to_string(ranks) +
                      (ranks == 1 ? " rank" : " ranks"));
  }
  std::string text;
  for (size_t i = 0; i < clauses.size(); ++i)
    text += (i == 0 ? "" : i + 1 == clauses.size() ? " or " : ", ") + clauses[i];
  return text.empty() ? "no plan on up to 2^20 ranks, nor with a shorter sequence" : text;
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
  const int per_node = model_ranks_per_node(machine, ranks_per_node, ranks);
  const int64_t cap = choice.memory_cap(machine);
  const PlanSearch search =
      search_plans(problem, ranks, machine, per_node, true, choose_placement, shards, cap);
  // The hybrid at U = 1 is ATTENTION2D (the search ranks it as such).
  const bool hybrid_one = algo == "hybrid" && heads_parallel == 1;
  const auto matches = [&](const RankedPlan& r) {
    if (hybrid_one) {
      return r.plan.algorithm == Algorithm::attention2d &&
             (grid.empty() || r.plan.grid.describe() == parse_grid(grid).describe());
    }
    if (!algo.empty() && algorithm_name(r.plan.algorithm) != algo) return false;
    if (!grid.empty() && r.plan.grid.describe() != parse_grid(grid).describe()) return false;
    return heads_parallel <= 0 || r.plan.heads_parallel == heads_parallel;
  };
  PlannedRun planned;
  planned.machine_description = machine.name + ": " + machine.description;
  planned.memory_cap = cap;
  planned.ranks_per_node = per_node;
  bool found = false;
  for (const RankedPlan& r : search.ranked) {
    if (!matches(r)) continue;
    if (!found) {
      found = true;
      planned.plan = r.plan;
      planned.prediction = r.prediction;
      planned.cyclic_placement = r.cyclic_placement;
      if (hybrid_one) {
        planned.plan.algorithm = Algorithm::hybrid;
        planned.prediction = predict(problem, planned.plan, machine, per_node, shards);
      }
    } else if (planned.runners_up.size() < 2) {
      // Other plans, not the same plan in the other placement of ranks on nodes.
      bool seen = r.plan.describe() == planned.plan.describe();
      for (const RankedPlan& shown : planned.runners_up)
        seen = seen || r.plan.describe() == shown.plan.describe();
      if (!seen) planned.runners_up.push_back(r);
    }
    if (r.plan.algorithm == Algorithm::ring && !planned.best_ring) planned.best_ring = r;
  }
  for (const RankedPlan& r : search.excluded)
    if (matches(r)) ++planned.excluded;
  if (found) return planned;

  const std::string restricted =
      (algo.empty() ? std::string() : " with --algo " + algo) +
      (grid.empty() ? std::string() : " and --grid " + grid) +
      (heads_parallel > 0 ? " and --heads-parallel " + std::to_string(heads_parallel)
                          : std::string());
  if (planned.excluded > 0) {
    int64_t least = std::numeric_limits<int64_t>::max();
    for (const RankedPlan& r : search.excluded)
      if (matches(r)) least = std::min(least, r.prediction.memory_bytes);
    A2D_FAIL("no plan fits in ", format_bytes(static_cast<double>(cap)), " per rank on ", ranks,
             ranks == 1 ? " rank" : " ranks", restricted, ": the ", planned.excluded,
             planned.excluded == 1 ? " plan that can run needs " : " plans that can run need ",
             "at least ", format_bytes(static_cast<double>(least)), " (",
             choice.max_memory > 0 ? "--max-memory" : machine.name + "'s memory per rank",
             "). What would fit: ", what_would_fit(problem, ranks, per_node, cap),
             choice.max_memory > 0 ? "; or a larger --max-memory" : "");
  }
  std::string reasons;
  for (const auto& [name, reason] : search.skipped) {
    if (algo.empty() || name == algo) reasons += "\n  " + name + ": " + reason;
  }
  A2D_FAIL("no plan can run this problem on ", ranks, ranks == 1 ? " rank" : " ranks", restricted,
           reasons);
}

}  // namespace a2d
