// The table of algorithms: the list of entries, and what is read from it alike for every
// algorithm (names, the shape of a plan as the programs print it, the plans a search tries).
#include "table/table.hpp"

#include <string>

#include "attention2d/error.hpp"
#include "attention2d/relayout.hpp"

namespace a2d {

const std::vector<const AlgorithmEntry*>& algorithm_entries() {
  // In the order of the enum (algorithm_entry indexes it).
  static const std::vector<const AlgorithmEntry*> entries = [] {
    std::vector<const AlgorithmEntry*> list = {&attention2d_entry(), &attention2d_overlap_entry(),
                                               &ring_entry(),        &allgather_kv_entry(),
                                               &ulysses_entry(),     &hybrid_entry()};
    for (size_t i = 0; i < list.size(); ++i) {
      A2D_REQUIRE(static_cast<size_t>(list[i]->traits.algorithm) == i, "the table's entry ", i,
                  " (", list[i]->traits.name, ") is out of the enum's order");
    }
    return list;
  }();
  return entries;
}

const AlgorithmEntry& algorithm_entry(Algorithm algorithm) {
  const auto& entries = algorithm_entries();
  const size_t index = static_cast<size_t>(algorithm);
  A2D_REQUIRE(index < entries.size(), "unknown algorithm ", static_cast<int>(algorithm));
  return *entries[index];
}

const AlgorithmTraits& algorithm_traits(Algorithm algorithm) {
  return algorithm_entry(algorithm).traits;
}

std::vector<Algorithm> all_algorithms() {
  std::vector<Algorithm> out;
  for (const AlgorithmEntry* entry : algorithm_entries())
    out.push_back(entry->traits.algorithm);
  return out;
}

std::vector<std::string> algorithm_names() {
  std::vector<std::string> out;
  for (const AlgorithmEntry* entry : algorithm_entries())
    out.emplace_back(entry->traits.name);
  return out;
}

std::string algorithm_list(const std::string& separator, const std::string& last_separator) {
  const std::vector<std::string> names = algorithm_names();
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    text += i == 0                                             ? ""
            : i + 1 == names.size() && !last_separator.empty() ? last_separator
                                                               : separator;
    text += names[i];
  }
  return text;
}

Algorithm parse_algorithm(const std::string& name) {
  for (const AlgorithmEntry* entry : algorithm_entries()) {
    if (name == entry->traits.name) return entry->traits.algorithm;
  }
  A2D_FAIL("unknown algorithm '", name, "'; choose ", algorithm_list(", ", " or "));
}

std::string algorithm_name(Algorithm algorithm) {
  const size_t index = static_cast<size_t>(algorithm);
  const auto& entries = algorithm_entries();
  return index < entries.size() ? entries[index]->traits.name : "?";
}

std::string plan_shape(const Plan& plan, const std::string& no_transpose) {
  const AlgorithmTraits& traits = algorithm_traits(plan.algorithm);
  const std::string transpose = plan.kv_transpose ? "" : no_transpose;
  if (traits.heads_parallel) {
    return "U" + std::to_string(plan.heads_parallel) + " " + plan.grid.describe() + transpose;
  }
  if (traits.grid) return plan.grid.describe() + transpose;
  return layout_name(plan.layout);
}

std::string plan_options(const Plan& plan) {
  const AlgorithmTraits& traits = algorithm_traits(plan.algorithm);
  std::string out;
  if (traits.heads_parallel) out += " --heads-parallel " + std::to_string(plan.heads_parallel);
  if (traits.grid) {
    out += " --grid " + plan.grid.describe() + (plan.kv_transpose ? "" : " --no-kv-transpose");
  } else {
    out += " --layout " + layout_name(plan.layout);
    if (plan.layout == LayoutKind::striped) out += " --stripe " + std::to_string(plan.stripe);
  }
  return out;
}

std::vector<Plan> algorithm_plans(Algorithm algorithm, const Problem& problem, int ranks,
                                  const PlanChoices& choices) {
  std::vector<Plan> out;
  algorithm_entry(algorithm).plans(out, problem, ranks, choices);
  return out;
}

void sequence_plans(std::vector<Plan>& out, Algorithm algorithm, const Problem& problem, int ranks,
                    const PlanChoices& choices) {
  if (!choices.layouts.empty()) {
    for (const LayoutKind layout : choices.layouts) {
      Plan plan = default_plan(algorithm, problem, ranks);
      plan.layout = layout;
      out.push_back(plan);
    }
    return;
  }
  out.push_back(default_plan(algorithm, problem, ranks));
  // In the caller's layout too, where it is one a plan can have (an uneven cut is not, nor one
  // whose parts are renumbered).
  const UserShards* shards = choices.shards;
  if (shards && !shards->layout.uneven() && !shards->layout.is_permuted()) {
    Plan plan = default_plan(algorithm, problem, ranks);
    if (plan.layout != shards->layout.kind() || plan.stripe != shards->layout.stripe()) {
      plan.layout = shards->layout.kind();
      plan.stripe = shards->layout.stripe();
      out.push_back(plan);
    }
  }
}

LayoutKind balanced_layout(const Mask& mask) {
  switch (mask.balance()) {
    case MaskBalance::any:
      return LayoutKind::contiguous;
    case MaskBalance::mirrored:
      return LayoutKind::zigzag;
    case MaskBalance::interleaved:
      return LayoutKind::cyclic;
  }
  return LayoutKind::cyclic;
}

void require_cyclic_layout(const Plan& plan) {
  A2D_REQUIRE(plan.layout == LayoutKind::cyclic, algorithm_name(plan.algorithm),
              " shards the sequence cyclically (token t on rank t mod P); --layout ",
              layout_name(plan.layout), " is not supported");
}

void require_one_group(const Plan& plan, int ranks) {
  if (plan.grid.rows == 1 && plan.grid.cols == ranks) return;
  std::vector<std::string> names;  // those of the table whose plans have a grid
  for (const AlgorithmEntry* entry : algorithm_entries())
    if (entry->traits.grid) names.push_back(entry->traits.name);
  std::string grid_algorithms;
  for (size_t i = 0; i < names.size(); ++i)
    grid_algorithms += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  A2D_FAIL(algorithm_name(plan.algorithm), " runs on all ranks as one group; --grid applies to ",
           grid_algorithms, " (got ", plan.grid.describe(), " for ", ranks, " ranks)");
}

}  // namespace a2d
