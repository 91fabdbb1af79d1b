// Plan requests become plans here, for every front end (planner.hpp's resolve_plan): what a2d
// run, bench and decode ask with --algo, --grid, ..., and what the C++ door is asked.
#include <string>

#include "attention2d/error.hpp"
#include "attention2d/plan.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/cost_model.hpp"
#include "table/table.hpp"

namespace a2d {

namespace {
// No algorithm yet (the planner chooses), or one whose plan has a grid (its table entry's traits).
bool grid_matters_for(const std::string& algo) {
  if (algo.empty()) return true;
  for (const Algorithm algorithm : all_algorithms()) {
    if (algorithm_name(algorithm) == algo) return algorithm_traits(algorithm).grid;
  }
  return false;
}
}  // namespace

bool PlanRequest::chosen_by_planner() const {
  return algo.empty() || (grid.empty() && grid_matters_for(algo));
}

Plan resolve_plan(const PlanRequest& request, const Problem& problem, int ranks,
                  std::string* chosen, const UserShards* shards) {
  const std::string& algo = request.algo;
  const std::string& grid = request.grid;
  const int64_t heads_parallel = request.heads_parallel;
  // Clear errors for an unknown algorithm or a grid that does not fit the ranks, first.
  if (!algo.empty()) parse_algorithm(algo);
  const bool hybrid = algo == "hybrid";
  A2D_REQUIRE(heads_parallel == 0 || hybrid, "--heads-parallel applies to --algo hybrid only");
  A2D_REQUIRE(heads_parallel >= 0, "--heads-parallel must be at least 1, got ", heads_parallel);
  int64_t u = heads_parallel;
  if (!grid.empty() && hybrid) {
    // The grid of each heads group: U x R x C must make the job.
    const GridShape shape = parse_grid(grid);
    A2D_REQUIRE(u > 0 || ranks % shape.size() == 0, "hybrid: the grid ", shape.describe(), " (",
                shape.size(), " ranks per heads group) does not divide the job's ", ranks,
                " ranks; choose R x C dividing ", ranks);
    if (u == 0) u = ranks / shape.size();
    A2D_REQUIRE(u * shape.size() == ranks, "hybrid: --heads-parallel ", u, " times the grid ",
                shape.describe(), " makes ", u * shape.size(), " ranks, but the job has ", ranks,
                "; choose U x R x C = ", ranks);
  } else if (!grid.empty()) {
    check_grid(parse_grid(grid), ranks);
  }
  if (hybrid && u > 0) {
    A2D_REQUIRE(ranks % u == 0, "hybrid: --heads-parallel ", u, " does not divide the job's ",
                ranks, " ranks");
    // The heads' conditions first, with check_plan's own words, before any search.
    Plan probe = default_plan(Algorithm::hybrid, problem, ranks);
    probe.heads_parallel = static_cast<int>(u);
    probe.grid = grid.empty() ? default_grid(ranks / static_cast<int>(u)) : parse_grid(grid);
    check_plan(probe, problem, ranks);
  }
  Plan p;
  const bool grid_matters = grid_matters_for(algo);
  // With the caller's shards the model also weighs running in their layout (Ring, all-gather
  // K/V and Ulysses take any layout): it chooses whenever the grid is open.
  if (request.chosen_by_planner() || (shards && grid.empty())) {
    MachineChoice machine = request.machine;
    if (machine.calibration_file.empty()) machine.calibration_file = default_calibration_file();
    const PlannedRun planned = choose_plan(problem, ranks, ranks, machine, algo,
                                           grid_matters ? grid : "", static_cast<int>(u), shards);
    p = planned.plan;
    if (chosen) *chosen = "plan chosen by the cost model (" + planned.machine_description + ")";
  } else {
    p = default_plan(parse_algorithm(algo), problem, ranks);
    if (!grid.empty()) p.grid = parse_grid(grid);
    if (hybrid) p.heads_parallel = static_cast<int>(u);
  }
  if (!request.layout.empty()) p.layout = parse_layout(request.layout);
  p.stripe = request.stripe;
  if (!request.kv_transpose) p.kv_transpose = false;
  A2D_REQUIRE(request.threads >= 1 && request.threads <= 1024,
              "--threads must be between 1 and 1024, got ", request.threads);
  p.threads = static_cast<int>(request.threads);
  check_plan(p, problem, ranks);
  return p;
}

}  // namespace a2d
