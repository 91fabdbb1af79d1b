// The plan search of the cost model (cost_model.hpp, search_plans): every algorithm's plans,
// predicted, ranked by time, ties broken by memory, bytes and placement.
#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/relayout.hpp"
#include "model/predict.hpp"
#include "table/table.hpp"

namespace a2d {

using model::predict_with;
using model::relayout_counts;
using model::RelayoutCounts;
using model::require_shards_fit;

PlanSearch search_plans(const Problem& problem, int ranks, const Machine& machine,
                        int ranks_per_node, bool include_backward, bool choose_placement,
                        const UserShards* shards, int64_t memory_cap) {
  PlanSearch search;
  // Every algorithm's plans: ATTENTION2D's on every grid of P, with and without the K/V
  // transpose; the baselines' in their default layout and the caller's; the hybrid at every
  // U > 1 dividing P and every grid of P / U (U = 1 is ATTENTION2D). Those the problem does not
  // allow are skipped with check_plan's reason.
  std::vector<Plan> candidates;
  PlanChoices choices;
  choices.both_kv_transposes = true;
  choices.shards = shards;
  for (const Algorithm algorithm : all_algorithms()) {
    for (Plan& plan : algorithm_plans(algorithm, problem, ranks, choices))
      candidates.push_back(std::move(plan));
  }
  // Both placements of the ranks on nodes, where there is a choice (several nodes of several
  // ranks) and the caller lets the search choose.
  std::vector<bool> placements = {machine.cyclic_placement};
  if (choose_placement && ranks_per_node > 1 && ranks_per_node < ranks)
    placements.push_back(!machine.cyclic_placement);
  // What the exchanges move depends on the plan's layout only: counted once per layout.
  std::deque<std::pair<TokenLayout, RelayoutCounts>> counted;  // stable addresses
  const auto counts_for = [&](const Plan& plan) -> const RelayoutCounts* {
    if (!shards) return nullptr;
    const TokenLayout planned = plan_layout(problem, plan);
    for (const auto& [layout, counts] : counted)
      if (layout == planned) return &counts;
    require_shards_fit(problem, plan, shards->layout);
    counted.emplace_back(planned, relayout_counts(shards->layout, planned));
    return &counted.back().second;
  };
  for (const bool cyclic : placements) {
    Machine placed = machine;
    placed.cyclic_placement = cyclic;
    for (const Plan& plan : candidates) {
      try {
        search.ranked.push_back(
            {plan, predict_with(problem, plan, placed, ranks_per_node, shards, counts_for(plan)),
             cyclic});
      } catch (const Error& e) {
        // Once per reason (plans of one algorithm that differ in their grid often share it),
        // without the algorithm's name repeated where the reason starts with it.
        std::string reason = e.message();
        const std::string name = algorithm_name(plan.algorithm);
        if (reason.rfind(name + ": ", 0) == 0) reason.erase(0, name.size() + 2);
        const std::pair<std::string, std::string> entry{name, reason};
        if (cyclic == machine.cyclic_placement &&
            std::find(search.skipped.begin(), search.skipped.end(), entry) == search.skipped.end())
          search.skipped.push_back(entry);
      }
    }
  }
  const auto total = [&](const RankedPlan& r) {
    return r.prediction.forward_s + (include_backward ? r.prediction.backward_s : 0.0);
  };
  const auto bytes = [](const RankedPlan& r) {
    return r.prediction.forward.bytes + r.prediction.backward.bytes;
  };
  std::stable_sort(search.ranked.begin(), search.ranked.end(),
                   [&](const RankedPlan& a, const RankedPlan& b) { return total(a) < total(b); });
  // Ties: of the plans left, those within kPlanTieTolerance of the fastest of them, the one
  // needing the least memory per rank first, then the fewest bytes per rank, then the machine's
  // own placement of ranks, then the fastest.
  // (Quadratic in the plans within the tolerance only.)
  std::vector<RankedPlan> ordered;
  ordered.reserve(search.ranked.size());
  std::vector<bool> taken(search.ranked.size(), false);
  size_t first_left = 0;
  while (ordered.size() < search.ranked.size()) {
    while (taken[first_left])
      ++first_left;
    const double limit = total(search.ranked[first_left]) * (1 + kPlanTieTolerance);
    size_t best = first_left;
    for (size_t i = first_left + 1; i < search.ranked.size() && total(search.ranked[i]) <= limit;
         ++i) {
      if (taken[i]) continue;
      const RankedPlan& a = search.ranked[i];
      const RankedPlan& b = search.ranked[best];
      if (a.prediction.memory_bytes != b.prediction.memory_bytes) {
        if (a.prediction.memory_bytes < b.prediction.memory_bytes) best = i;
      } else if (bytes(a) != bytes(b)) {
        if (bytes(a) < bytes(b)) best = i;
      } else if (a.cyclic_placement != b.cyclic_placement) {
        // The same plan in both placements: the machine's own (no launcher option to change).
        if (a.cyclic_placement == machine.cyclic_placement) best = i;
      }
    }
    taken[best] = true;
    ordered.push_back(std::move(search.ranked[best]));
  }
  // The plans that do not fit in the cap, apart, in the same order.
  search.memory_cap = memory_cap;
  search.ranked.clear();
  for (RankedPlan& r : ordered) {
    if (memory_cap > 0 && r.prediction.memory_bytes > memory_cap) {
      search.excluded.push_back(std::move(r));
    } else {
      search.ranked.push_back(std::move(r));
    }
  }
  return search;
}

}  // namespace a2d
