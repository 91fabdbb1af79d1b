// The hybrid (heads x ATTENTION2D, P = U x R x C) over MPI, at the process count this program was
// started with and in the dtype and on the device it was given (mpi_checks.hpp): every (U, R, C)
// the heads allow, U = 1 (ATTENTION2D) and R = C = 1 (Ulysses) included, with and without the K/V
// transpose of the groups' ATTENTION2D, on GQA 12:4, GQA with K/V heads replicated (U > Hkv), MQA
// and MHA, causal, windowed, unmasked and packed documents with sinks and softcap, batch 2, N odd
// and not a multiple of P, and N < R C. O, LSE, dQ, dK and dV must each match the fp64 reference on
// the rounded inputs within the dtype's bounds, and every rank's counted traffic must equal the
// cost model phase by phase (docs/attention2d.md gives the formulas). Then every bad combination
// must be refused on every rank before any data moves.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/harness.hpp"
#include "mpi_checks.hpp"
#include "unit/make_problem.hpp"

namespace a2d {
namespace {

using test::make_problem;
constexpr uint64_t kSeed = 4321;

struct Config {
  std::string name;
  Problem problem;
};

// Small problems: the suite runs them at up to 8 ranks on two cores.
std::vector<Config> configs(int ranks) {
  const int64_t p = ranks;
  std::vector<Config> list;
  const auto add = [&](std::string name, Problem problem) {
    list.push_back({std::move(name), in_test_dtype(problem)});
  };
  if (test_settings().mask_kinds) {
    // 12 query heads on 2 K/V heads (even P: U > Hkv replicates them) or 3 (odd P).
    for (NamedProblem& named : masked_problems(ranks, 12, ranks % 2 == 0 ? 2 : 3))
      list.push_back({std::move(named.name), std::move(named.problem)});
    return list;
  }
  add("causal_gqa12_4", make_problem(1, 12, 4, 13 * p + 5, 32, Mask::causal()));
  // Hkv = 2 < U for every U > 2: K/V heads replicated U / 2 times (P even).
  if (ranks % 2 == 0) {
    add("none_gqa_replicated_batch2", make_problem(2, p, 2, 9 * p + 3, 16, Mask::none()));
  }
  add("window_mha_d24", make_problem(1, 2 * p, 2 * p, 11 * p + 1, 24, Mask::causal_window(p + 3)));
  Problem documents = make_problem(1, 4, 1, 7 * p + 3, 16, Mask::causal());
  documents.mask = documents.mask.with_documents({1, 2 * p, 4 * p - 1, 1, p + 2});
  documents.sinks = true;
  documents.softcap = 2.0f;
  add("docs_causal_mqa_sinks_softcap", documents);
  add("fewer_tokens_than_ranks_causal", make_problem(1, 4, 4, p - 1, 16, Mask::causal()));
  return list;
}

// Every hybrid plan the problem allows on `ranks`: U = 1 on every grid, then hybrid_plans; the
// K/V transpose off on one grid per U.
std::vector<Plan> plans_for(const Problem& problem, int ranks) {
  std::vector<Plan> plans;
  for (const GridShape& shape : grid_shapes(ranks)) {
    Plan plan = default_plan(Algorithm::hybrid, problem, ranks);
    plan.heads_parallel = 1;
    plan.grid = shape;
    plans.push_back(plan);
  }
  for (const Plan& plan : hybrid_plans(problem, ranks))
    plans.push_back(plan);
  std::vector<Plan> allowed;
  int last_u = 0;
  for (Plan& plan : plans) {
    try {
      check_plan(plan, problem, ranks);
    } catch (const Error&) {
      continue;
    }
    allowed.push_back(plan);
    if (plan.heads_parallel != last_u && plan.grid.rows > 1) {
      last_u = plan.heads_parallel;
      plan.kv_transpose = false;
      allowed.push_back(plan);
    }
  }
  return allowed;
}

const char* const kOutputNames[6] = {"O", "LSE", "dQ", "dK", "dV", "dsink"};

TEST(HybridMpi, EveryFactorisationMatchesTheReferenceAndTheTrafficModel) {
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_test_world(), log);
  const std::unique_ptr<Backend> backend = test_backend();
  const int ranks = world.size();
  int runs = 0, replicated = 0;
  double largest[6] = {0, 0, 0, 0, 0, -1};
  for (const Config& config : configs(ranks)) {
    const Problem& problem = config.problem;
    ReferenceOutputs reference;
    if (world.rank() == 0) {
      reference = reference_outputs(problem, generate_global(problem, kSeed, true), true, 1);
    }
    for (const Plan& plan : plans_for(problem, ranks)) {
      const std::string what = config.name + " " + plan.describe();
      auto attention = make_attention(problem, plan, world, *backend);
      ShardSet shards =
          make_shards(problem, attention->layout(), world.rank(), kSeed, true, true, *backend);
      log->clear();
      attention->forward(shards.forward(problem));
      attention->backward(shards.backward(problem));

      expect_traffic_equals_model(world, *log, problem, plan, what);

      world.set_phase("io");
      const GlobalOutputs outputs =
          gather_outputs(world, 0, problem, attention->layout(), shards, true);
      double errors[6] = {0, 0, 0, 0, 0, -1};
      if (world.rank() == 0) {
        const OutputErrors e = compare_outputs(outputs, reference, true);
        errors[0] = e.out, errors[1] = e.lse, errors[2] = e.dq, errors[3] = e.dk, errors[4] = e.dv;
        errors[5] = e.dsink;
      }
      world.broadcast(errors, sizeof errors, 0);
      const OutputBounds bounds = output_bounds(problem.dtype);
      for (int i = 0; i < 6; ++i) {
        EXPECT_LE(errors[i], bounds.of(i)) << what << ": " << kOutputNames[i];
        largest[i] = std::max(largest[i], errors[i]);
      }
      if (problem.sinks) {
        EXPECT_GE(errors[5], 0.0) << what << ": no dsink";
      }
      ++runs;
      if (hybrid_kv_replication(problem, plan.heads_parallel) > 1) ++replicated;
    }
  }
  // Every P of the suite has a factorisation with U > 1 and, for even P, one with K/V replicated.
  if (ranks > 1) {
    EXPECT_GT(runs, static_cast<int>(grid_shapes(ranks).size()));
  }
  if (ranks % 2 == 0 && ranks > 2) {
    EXPECT_GT(replicated, 0);
  }
  if (world.rank() == 0) {
    std::cout << "checked " << runs << " hybrid runs (" << replicated
              << " with K/V heads replicated) on " << ranks << " ranks ("
              << test_settings().describe() << "); largest errors: O " << largest[0] << " LSE "
              << largest[1] << " dQ " << largest[2] << " dK " << largest[3] << " dV " << largest[4]
              << " dsink " << largest[5] << "\n";
  }
}

// Every rank refuses, by itself and before any communication, with the same message.
void expect_refused_everywhere(Communicator& world, const Problem& problem, const Plan& plan,
                               const std::string& expected) {
  const std::unique_ptr<Backend> backend = test_backend();
  int64_t refused = 0;
  try {
    make_attention(problem, plan, world, *backend);
  } catch (const Error& e) {
    refused = 1;
    EXPECT_NE(e.message().find(expected), std::string::npos) << e.message();
  }
  world.all_reduce(&refused, 1, Reduction::sum);
  EXPECT_EQ(refused, world.size()) << plan.describe() << ": " << expected;
}

TEST(HybridMpi, BadFactorisationsAreRefusedOnEveryRank) {
  if (test_settings().masks) GTEST_SKIP() << "the --masks job runs only the matrix";
  auto world = make_test_world();
  const int ranks = world->size();
  const Problem problem = make_problem(1, 12, 4, 8 * ranks + 1, 16, Mask::causal());
  Plan plan = default_plan(Algorithm::hybrid, problem, ranks);
  // U x R x C != P.
  plan.heads_parallel = 2;
  plan.grid = {1, ranks};
  expect_refused_everywhere(*world, problem, plan, "makes " + std::to_string(2 * ranks) + " ranks");
  // U = 5 divides neither H = 12 nor relates to Hkv = 4 (with P = 5 R C, any grid).
  Problem five = problem;
  five.heads = 10;
  five.kv_heads = 10;
  plan.heads_parallel = 3;
  plan.grid = {1, 1};
  if (ranks == 3) {
    expect_refused_everywhere(*world, five, plan, "must divide the number of query heads (10)");
  }
  // U divides H = 12 but neither divides nor is a multiple of Hkv = 4.
  if (ranks % 6 == 0) {
    plan.heads_parallel = 6;
    plan.grid = default_grid(ranks / 6);
    expect_refused_everywhere(*world, problem, plan,
                              "must divide the number of K/V heads (4), or be a multiple");
  }
  // Another layout than cyclic.
  plan = default_plan(Algorithm::hybrid, problem, ranks);
  plan.layout = LayoutKind::zigzag;
  expect_refused_everywhere(*world, problem, plan, "shards the sequence cyclically");
  // --heads-parallel on another algorithm.
  Plan other = default_plan(Algorithm::attention2d, problem, ranks);
  other.heads_parallel = 2;
  expect_refused_everywhere(*world, problem, other, "applies to --algo hybrid only");
}

}  // namespace
}  // namespace a2d
