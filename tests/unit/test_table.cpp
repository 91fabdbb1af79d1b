// The table of algorithms (src/table/): every entry complete and in the enum's order, the names
// it generates, and the plan descriptions and options read from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/error.hpp"
#include "table/table.hpp"

namespace a2d {
namespace {

// The lists of names the programs print (--algo's choices, a2d bench's and a2d sim's defaults,
// a2d model's curves) come from the table, in its order.
TEST(Table, NameListsComeFromTheTable) {
  std::vector<std::string> names;
  for (const Algorithm algorithm : all_algorithms())
    names.push_back(algorithm_name(algorithm));
  ASSERT_EQ(algorithm_names(), names);
  ASSERT_GE(names.size(), 3u);
  std::string commas;
  for (const std::string& name : names)
    commas += (commas.empty() ? "" : ",") + name;
  EXPECT_EQ(algorithm_list(","), commas);
  const std::string text = algorithm_list(", ", " or ");
  EXPECT_EQ(text.rfind(names[0] + ", " + names[1] + ", ", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - names.back().size() - 4), " or " + names.back()) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), ','), static_cast<long>(names.size()) - 2);
}

// tests/CMakeLists.txt reads the names from the table's sources (each entry's traits.name) for
// its per-algorithm tests: the same names as the table's, none missing, none extra.
TEST(Table, TestListsReadFromTheSourcesNameEveryAlgorithm) {
  std::vector<std::string> read;
  std::istringstream words(A2D_TEST_ALGORITHMS);
  for (std::string name; words >> name;)
    read.push_back(name);
  std::vector<std::string> names = algorithm_names();
  std::sort(read.begin(), read.end());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(read, names);
}

TEST(Table, EveryEntryIsCompleteAndInTheEnumsOrder) {
  const auto& entries = algorithm_entries();
  ASSERT_EQ(entries.size(), all_algorithms().size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const AlgorithmEntry& e = *entries[i];
    SCOPED_TRACE(e.traits.name);
    EXPECT_EQ(static_cast<size_t>(e.traits.algorithm), i);
    EXPECT_EQ(&algorithm_entry(e.traits.algorithm), &e);
    EXPECT_EQ(parse_algorithm(e.traits.name), e.traits.algorithm);
    EXPECT_EQ(algorithm_name(e.traits.algorithm), e.traits.name);
    EXPECT_TRUE(e.default_plan && e.check && e.make && e.plans && e.traffic);
    // A group model gives all three group hooks and its own prediction; every other entry the
    // hooks predict() composes.
    const bool group = e.group_problem != nullptr;
    EXPECT_EQ(e.group_plan != nullptr, group);
    EXPECT_EQ(e.group_rank != nullptr, group);
    if (group) {
      EXPECT_TRUE(e.predict);
    } else {
      EXPECT_TRUE(e.critical_path && e.rank_flops && e.memory && e.kernel_calls);
    }
  }
}

TEST(Table, UnknownNamesListEveryAlgorithm) {
  try {
    parse_algorithm("bogus");
    FAIL() << "parse_algorithm accepted 'bogus'";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("unknown algorithm 'bogus'; choose attention2d, "
                               "attention2d-overlap, ring, allgather-kv, ulysses or hybrid"),
              std::string::npos)
        << e.message();
  }
}

TEST(Table, DefaultPlansRunAndDescribeWhatTheirAlgorithmUses) {
  Problem problem;
  problem.heads = problem.kv_heads = 4;
  problem.seq = 64;
  problem.head_dim = 8;
  problem.mask = Mask::causal();
  for (const Algorithm algorithm : all_algorithms()) {
    const Plan plan = default_plan(algorithm, problem, 4);
    EXPECT_NO_THROW(check_plan(plan, problem, 4)) << plan.describe();
  }
  EXPECT_EQ(default_plan(Algorithm::attention2d, problem, 4).describe(),
            "attention2d grid=2x2 layout=cyclic kv_transpose=yes threads=1");
  EXPECT_EQ(default_plan(Algorithm::ring, problem, 4).describe(),
            "ring grid=1x4 layout=zigzag threads=1");
  EXPECT_EQ(default_plan(Algorithm::hybrid, problem, 4).describe(),
            "hybrid heads_parallel=4 grid=1x1 layout=cyclic kv_transpose=yes threads=1");

  Plan overlap = default_plan(Algorithm::attention2d_overlap, problem, 4);
  overlap.kv_transpose = false;
  EXPECT_EQ(plan_shape(overlap, " no-transpose"), "2x2 no-transpose");
  EXPECT_EQ(plan_options(overlap), " --grid 2x2 --no-kv-transpose");
  Plan ring = default_plan(Algorithm::ring, problem, 4);
  ring.layout = LayoutKind::striped;
  ring.stripe = 3;
  EXPECT_EQ(plan_shape(ring, "-nt"), "striped");
  EXPECT_EQ(plan_options(ring), " --layout striped --stripe 3");
  const Plan hybrid = default_plan(Algorithm::hybrid, problem, 4);
  EXPECT_EQ(plan_shape(hybrid, "-nt"), "U4 1x1");
  EXPECT_EQ(plan_options(hybrid), " --heads-parallel 4 --grid 1x1");
}

TEST(Table, PlansFollowTheChoices) {
  Problem problem;
  problem.heads = problem.kv_heads = 4;
  problem.seq = 64;
  problem.head_dim = 8;
  PlanChoices choices;
  // Grids of 4: 1x4, 2x2, 4x1, each with and without the transpose.
  choices.both_kv_transposes = true;
  EXPECT_EQ(algorithm_plans(Algorithm::attention2d, problem, 4, choices).size(), 6u);
  const GridShape grid{2, 2};
  choices.grid = &grid;
  choices.both_kv_transposes = false;
  EXPECT_EQ(algorithm_plans(Algorithm::attention2d_overlap, problem, 4, choices).size(), 1u);
  // U = 2 (grids 1x2, 2x1) and U = 4 (1x1), or U = 1 alone when chosen.
  choices.grid = nullptr;
  EXPECT_EQ(algorithm_plans(Algorithm::hybrid, problem, 4, choices).size(), 3u);
  choices.heads_parallel = 1;
  const auto one = algorithm_plans(Algorithm::hybrid, problem, 4, choices);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].heads_parallel, 1);
  choices.layouts = {LayoutKind::contiguous, LayoutKind::cyclic};
  const auto layouts = algorithm_plans(Algorithm::ulysses, problem, 4, choices);
  ASSERT_EQ(layouts.size(), 2u);
  EXPECT_EQ(layouts[1].layout, LayoutKind::cyclic);
}

}  // namespace
}  // namespace a2d
