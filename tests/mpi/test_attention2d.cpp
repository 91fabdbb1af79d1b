// ATTENTION2D over MPI, at the process count this program was started with: every grid shape of
// P (1 x P and P x 1 included), both variants, with and without the K/V transpose, causal, windowed
// and unmasked, GQA 12:4 and MQA, N not a multiple of P and N < P, head dims 64 and 80. O, LSE,
// dQ, dK and dV must match the fp64 reference within kFp32RelativeBound, and every rank's counted
// traffic must equal the cost model's prediction phase by phase.
#include <gtest/gtest.h>
#include <mpi.h>

#include <iostream>
#include <memory>
#include <sstream>

#include "attention2d/attention.hpp"
#include "attention2d/check.hpp"
#include "attention2d/error.hpp"
#include "attention2d/harness.hpp"
#include "attention2d/model.hpp"
#include "attention2d/mpi_comm.hpp"
#include "mpi_checks.hpp"

namespace a2d {
namespace {

struct Config {
  std::string name;
  Problem problem;
};

std::vector<Config> configs(int ranks) {
  const int64_t p = ranks;
  // N not a multiple of P (1000 at P = 16, as the issue asks), and N < P.
  const int64_t uneven = ranks == 16 ? 1000 : 37 * p + 5;
  std::vector<Config> list;
  auto add = [&](std::string name, int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq,
                 int64_t dim, Mask mask) {
    Problem problem;
    problem.batch = batch;
    problem.heads = heads;
    problem.kv_heads = kv_heads;
    problem.seq = seq;
    problem.head_dim = dim;
    problem.mask = mask;
    list.push_back({std::move(name), problem});
  };
  add("causal_gqa12_4_d64", 1, 12, 4, uneven, 64, Mask::causal());
  add("none_gqa12_4_d80", 1, 12, 4, 13 * p + 3, 80, Mask::none());
  add("causal_mqa8_1_d80_batch2", 2, 8, 1, 11 * p + 1, 80, Mask::causal());
  add("none_mqa4_1_d64", 1, 4, 1, 9 * p + 2, 64, Mask::none());
  add("window_mha_d64", 1, 3, 3, 17 * p + 4, 64, Mask::causal_window(2 * p + 3));
  if (ranks > 1) add("fewer_tokens_than_ranks_causal", 1, 4, 2, p - 1, 80, Mask::causal());
  return list;
}

TEST(Attention2DMpi, EveryGridAndVariantMatchesTheReferenceAndTheTrafficModel) {
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_mpi_communicator(MPI_COMM_WORLD), log);
  const int ranks = world.size();
  const int rank = world.rank();
  const uint64_t seed = 1234;
  int runs = 0;
  for (const Config& config : configs(ranks)) {
    const Problem& problem = config.problem;
    ReferenceOutputs reference;
    if (rank == 0) {
      reference = reference_outputs(problem, generate_global(problem, seed, true), true, 1);
    }
    for (const GridShape& shape : grid_shapes(ranks)) {
      for (const Algorithm algorithm : {Algorithm::attention2d, Algorithm::attention2d_overlap}) {
        for (const bool transpose : {true, false}) {
          Plan plan = default_plan(algorithm, problem, ranks);
          plan.grid = shape;
          plan.kv_transpose = transpose;
          const std::string what = config.name + " " + plan.describe();
          auto attention = make_attention(problem, plan, world);
          ShardSet shards = make_shards(problem, attention->layout(), rank, seed, true, true);
          log->clear();
          attention->forward(shards.forward(problem));
          attention->backward(shards.backward(problem));

          // Traffic: every rank against the model; any mismatch fails on every rank.
          const std::string mismatch = traffic_mismatches(*log, problem, plan, rank);
          if (!mismatch.empty())
            std::cerr << "rank " << rank << " " << what << ":" << mismatch << "\n";
          world.set_phase("control");  // the checks' own messages are not the algorithm's
          int64_t bad = mismatch.empty() ? 0 : 1;
          world.all_reduce(&bad, 1, Reduction::sum);
          EXPECT_EQ(bad, 0) << what << ": counted traffic differs from the model on " << bad
                            << " ranks (details on stderr)";

          expect_model_totals(world, *log, problem, plan, what);

          // Outputs: gathered on rank 0, compared there, verdict shared.
          world.set_phase("io");
          const GlobalOutputs outputs =
              gather_outputs(world, 0, problem, attention->layout(), shards, true);
          double errors[5] = {0, 0, 0, 0, 0};
          if (rank == 0) {
            const OutputErrors e = compare_outputs(outputs, reference, true);
            errors[0] = e.out, errors[1] = e.lse, errors[2] = e.dq, errors[3] = e.dk,
            errors[4] = e.dv;
          }
          world.broadcast(errors, sizeof errors, 0);
          const char* names[5] = {"O", "LSE", "dQ", "dK", "dV"};
          for (int i = 0; i < 5; ++i) {
            EXPECT_LE(errors[i], kFp32RelativeBound) << what << ": " << names[i];
          }
          ++runs;
        }
      }
    }
  }
  if (rank == 0) std::cout << "checked " << runs << " distributed runs on " << ranks << " ranks\n";
}

TEST(Attention2DMpi, GridThatDoesNotMatchTheRanksIsRefusedOnEveryRank) {
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
  Problem problem;
  problem.seq = 64;
  problem.head_dim = 16;
  Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  plan.grid = {world->size() + 1, 1};
  try {
    make_attention(problem, plan, *world);
    ADD_FAILURE() << "a grid of the wrong size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("has " + std::to_string(world->size() + 1) + " places"),
              std::string::npos)
        << e.message();
  }
}

}  // namespace
}  // namespace a2d
