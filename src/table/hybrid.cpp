// The table's entry of the hybrid, heads x ATTENTION2D (src/algorithms/hybrid.cpp; docs/
// attention2d.md, "Heads x ATTENTION2D"): U heads groups of R x C ranks each, an all-to-all of U
// ranks to and from the heads groups. Its model is ATTENTION2D's on each heads group with the
// all-to-alls added (src/model/hybrid_model.cpp).
#include <string>

#include "algorithms/algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "model/hybrid_model.hpp"
#include "table/table.hpp"

namespace a2d {
namespace {

// The most heads parallelism without replicating K/V: the largest U dividing P, H and Hkv.
void defaults(Plan& plan, const Problem& problem, int ranks) {
  int u = 1;
  for (int d = 1; d <= ranks; ++d) {
    if (ranks % d == 0 && problem.heads % d == 0 && problem.kv_heads % d == 0) u = d;
  }
  plan.heads_parallel = u;
  plan.grid = default_grid(ranks / u);
  plan.layout = LayoutKind::cyclic;
}

void check(const Plan& plan, const Problem& problem, int ranks) {
  const int64_t u = plan.heads_parallel;
  A2D_REQUIRE(u >= 1, "--heads-parallel must be at least 1 (got ", u, ")");
  A2D_REQUIRE(plan.grid.rows >= 1 && plan.grid.cols >= 1 && u * plan.grid.size() == ranks,
              "hybrid: --heads-parallel ", u, " times the grid ", plan.grid.describe(), " makes ",
              u * plan.grid.size(), " ranks, but the job has ", ranks,
              "; choose U x R x C = ", ranks);
  A2D_REQUIRE(problem.heads % u == 0, "hybrid: --heads-parallel ", u,
              " must divide the number of query heads (", problem.heads, ")");
  A2D_REQUIRE(problem.kv_heads % u == 0 || u % problem.kv_heads == 0, "hybrid: --heads-parallel ",
              u, " must divide the number of K/V heads (", problem.kv_heads,
              "), or be a multiple of it (K/V heads are then replicated)");
  require_cyclic_layout(plan);
}

// Every U > 1 dividing P and every grid of P / U (U = 1 is ATTENTION2D's plans), or those of the
// chosen U and grid; U = 1 itself when chosen, on the chosen grid or the default one.
void plans(std::vector<Plan>& out, const Problem& problem, int ranks, const PlanChoices& choices) {
  const int u = choices.heads_parallel;
  for (const Plan& plan : hybrid_plans(problem, ranks)) {
    if (u > 0 && plan.heads_parallel != u) continue;
    if (choices.grid && plan.grid.describe() != choices.grid->describe()) continue;
    out.push_back(plan);
  }
  if (u == 1) {
    Plan plan = default_plan(Algorithm::hybrid, problem, ranks);
    plan.heads_parallel = 1;
    plan.grid = choices.grid ? *choices.grid : default_grid(ranks);
    out.push_back(plan);
  }
}

int group_rank(const Plan& plan, int rank) {
  return hybrid_rank(plan, rank).sequence_group;
}

}  // namespace

const AlgorithmEntry& hybrid_entry() {
  static const AlgorithmEntry entry = [] {
    AlgorithmEntry e;
    e.traits.algorithm = Algorithm::hybrid;
    e.traits.name = "hybrid";
    e.traits.grid = true;
    e.traits.heads_parallel = true;
    e.traits.cyclic_only = true;
    e.default_plan = defaults;
    e.check = check;
    e.make = algorithms::make_hybrid;
    e.plans = plans;
    e.group_problem = hybrid_group_problem;
    e.group_plan = hybrid_group_plan;
    e.group_rank = group_rank;
    e.predict = model::predict_hybrid;
    e.memory_bytes = model::hybrid_memory_bytes;
    e.traffic = model::hybrid_traffic;
    return e;
  }();
  return entry;
}

}  // namespace a2d
