// Collective validation: ranks that disagree, or one rank with an invalid request, make every
// rank raise the same CollectiveError before any data moves, and nobody hangs.
#include <gtest/gtest.h>
#include <mpi.h>

#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/mpi_comm.hpp"

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
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
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
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  Problem problem = small_problem();
  const Plan plan = default_plan(Algorithm::ring, problem, world->size());
  if (world->rank() == 1) problem.dtype = DType::bf16;
  const std::string message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("dtype: fp32 on rank"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16 on rank 1"), std::string::npos) << message;
}

TEST(Reliability, OneRankWithAnInvalidRequestStopsEveryRank) {
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
  Problem problem = small_problem();
  const Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  if (world->rank() == world->size() - 1) problem.mask = Mask::causal_window(0);
  const std::string message = error_of(*world, problem, plan);
  EXPECT_NE(message.find("window must be at least 1"), std::string::npos) << message;
  EXPECT_NE(message.find("[rank " + std::to_string(world->size() - 1) + "]"), std::string::npos)
      << message;
}

TEST(Reliability, AgreeingRanksPass) {
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
  const Problem problem = small_problem();
  Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  plan.threads = 1 + world->rank() % 2;  // kernel threads may differ between ranks
  const std::unique_ptr<Backend> backend = make_backend("cpu");
  EXPECT_NO_THROW(make_attention(problem, plan, *world, *backend));
}

}  // namespace
}  // namespace a2d
