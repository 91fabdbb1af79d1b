// Collective validation: ranks that disagree, or one rank with an invalid request, make every
// rank raise the same CollectiveError before any data moves, and nobody hangs.
#include <gtest/gtest.h>
#include <mpi.h>

#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/mpi_comm.hpp"
#include "mpi_checks.hpp"

namespace a2d {
namespace {

Problem small_problem() {
  Problem p;
  p.seq = 100;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.mask = Mask::causal();
  return p;
}

std::string error_of(Communicator& world, const Problem& problem, const Plan& plan) {
  const std::unique_ptr<Backend> backend = make_backend("cpu");
  try {
    make_attention(problem, plan, world, *backend);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Reliability, RanksThatDisagreeAreNamedOnEveryRank) {
  auto world = make_test_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  Problem problem = small_problem();
  const Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  if (world->rank() == 1) problem.seq = 101;
  const std::string message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("different problems or plans"), std::string::npos) << message;
  EXPECT_NE(message.find("seq: 100 on rank"), std::string::npos) << message;
  EXPECT_NE(message.find("101 on rank 1"), std::string::npos) << message;
}

TEST(Reliability, RanksWithDifferentDtypesAreNamedOnEveryRank) {
  auto world = make_test_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  Problem problem = small_problem();
  const Plan plan = default_plan(Algorithm::ring, problem, world->size());
  if (world->rank() == 1) problem.dtype = DType::bf16;
  const std::string message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("dtype: fp32 on rank"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16 on rank 1"), std::string::npos) << message;
}

// Masks that differ between ranks in what the kind and window do not show: the slices (their
// digest, with their count) and a window's right side; and a kind that differs.
TEST(Reliability, RanksWithDifferentMasksAreNamedOnEveryRank) {
  auto world = make_test_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  Problem problem = small_problem();
  const auto slices = [](int64_t prefix) {
    return Mask::from_ranges(
        {{0, 100, 0, prefix, RangeType::full}, {prefix, 100, prefix, 100, RangeType::causal}});
  };
  problem.mask = world->rank() == 1 ? slices(31) : slices(30);
  const Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  std::string message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("different problems or plans"), std::string::npos) << message;
  EXPECT_NE(message.find("document boundaries and slices (hash)"), std::string::npos) << message;
  EXPECT_EQ(message.find("mask slices:"), std::string::npos) << message;  // the counts agree
  problem.mask = world->rank() == 1 ? Mask::window_size(8, 3) : Mask::window_size(8, 4);
  message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("window (right): 3 on rank 1"), std::string::npos) << message;
  problem.mask = world->rank() == 1 ? Mask::causal() : slices(30);
  message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("mask: causal on rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("ranges on rank"), std::string::npos) << message;
}

// A slice out of bounds on one rank (its file, say): every rank stops with that rank's reason.
TEST(Reliability, OneRankWithASliceOutOfBoundsStopsEveryRank) {
  auto world = make_test_world();
  Problem problem = small_problem();
  const Plan plan = default_plan(Algorithm::ring, problem, world->size());
  const int last = world->size() - 1;
  problem.mask =
      Mask::from_ranges({{0, world->rank() == last ? 101 : 100, 0, 50, RangeType::inv_causal}});
  const std::string message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("lies outside the sequence of 100 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("[rank " + std::to_string(last) + "]"), std::string::npos) << message;
}

TEST(Reliability, OneRankWithAnInvalidRequestStopsEveryRank) {
  auto world = make_test_world();
  Problem problem = small_problem();
  const Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  if (world->rank() == world->size() - 1) problem.mask = Mask::causal_window(0);
  const std::string message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("window must be at least 1"), std::string::npos) << message;
  EXPECT_NE(message.find("[rank " + std::to_string(world->size() - 1) + "]"), std::string::npos)
      << message;
}

// The brief text the programs print once: the failing rank's message without a source location,
// prefixed with that rank unless every rank failed.
TEST(Reliability, BriefErrorsNameTheRankOnlyWhenSomeRanksFailed) {
  auto world = make_test_world();
  const int last = world->size() - 1;
  auto brief_of = [&](bool fail_here) {
    try {
      collective_check(*world, [&] { A2D_REQUIRE(!fail_here, "the input is bad"); });
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(".cpp:"), std::string::npos) << e.what();
      return e.brief();
    }
    return std::string("accepted");
  };
  const std::string one = brief_of(world->rank() == last);
  EXPECT_EQ(one, world->size() > 1 ? "rank " + std::to_string(last) + ": the input is bad"
                                   : std::string("the input is bad"));
  const std::string all = brief_of(true);
  EXPECT_EQ(all, world->size() > 1 ? "the input is bad (on every rank)" : "the input is bad");
  if (world->size() > 2) {
    EXPECT_EQ(brief_of(world->rank() >= 1), "rank 1: the input is bad (and " +
                                                std::to_string(world->size() - 2) +
                                                " more ranks failed)");
  }
}

TEST(Reliability, AgreeingRanksPass) {
  auto world = make_test_world();
  const Problem problem = small_problem();
  Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  plan.threads = 1 + world->rank() % 2;  // kernel threads may differ between ranks
  const std::unique_ptr<Backend> backend = make_backend("cpu");
  EXPECT_NO_THROW(make_attention(problem, plan, *world, *backend));
}

}  // namespace
}  // namespace a2d
