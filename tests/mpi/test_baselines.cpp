// The baselines over MPI, at the process count this program was started with and in the dtype and
// on the device it was given (mpi_checks.hpp): Ring Attention in
// every layout (zigzag, striped with stripes 1 and 3, contiguous), all-gather K/V (its default
// layout and striped) and Ulysses (contiguous and zigzag, wherever P divides the K/V heads), on
// causal, windowed and unmasked problems with GQA, MQA and MHA, batch 2, N not a multiple of P
// and N < P. O, LSE, dQ, dK and dV must match the fp64 reference on the rounded inputs within the
// dtype's bounds (output_bounds), and every rank's counted traffic must equal the cost model phase
// by phase. Then every algorithm of
// the library (both ATTENTION2D variants included) runs on the same inputs and their outputs
// must agree with each other; and Ulysses must refuse, on every rank, head counts P does not
// divide.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/harness.hpp"
#include "mpi_checks.hpp"
#include "unit/make_problem.hpp"

namespace a2d {
namespace {

// Outputs of two fp32 algorithms on the same inputs may differ by twice the reference bound's
// typical error; 2e-5 leaves room for that and still catches any wrong block (which moves the
// relative error to ~1e-2 or more). In 16 bits each output is within its bound of the reference
// (output_bounds), so two algorithms are within twice that of each other.
OutputBounds agreement_bounds(DType dtype) {
  if (dtype == DType::f32) return {2e-5, 2e-5, 2e-5, 2e-5, 2e-5, 2e-5};
  const OutputBounds b = output_bounds(dtype);
  return {2 * b.out, 2e-5, 2 * b.dq, 2 * b.dk, 2 * b.dv, 2 * b.dsink};
}
constexpr uint64_t kSeed = 1234;

using test::make_problem;

struct Config {
  std::string name;
  Problem problem;
};

// Small problems (the suite runs them at up to 16 ranks on two cores). K/V heads are multiples
// of P where Ulysses should run; N is never a multiple of P (nor of 2P, zigzag's chunk count).
std::vector<Config> configs(int ranks) {
  const int64_t p = ranks;
  std::vector<Config> list;
  const auto add = [&](const char* name, const Problem& problem) {
    list.push_back({name, in_test_dtype(problem)});
  };
  if (test_settings().masks) {
    // K/V heads a multiple of P, so that Ulysses runs too.
    for (NamedProblem& named : masked_problems(ranks, 2 * p, p))
      list.push_back({std::move(named.name), std::move(named.problem)});
    return list;
  }
  add("causal_gqa", make_problem(1, 2 * p, p, 13 * p + 5, 32, Mask::causal()));
  add("none_mqa_batch2", make_problem(2, 4, 1, 9 * p + 2, 16, Mask::none()));
  add("window_mha_batch2", make_problem(2, p, p, 11 * p + 4, 24, Mask::causal_window(2 * p + 3)));
  if (ranks > 1) {
    add("fewer_tokens_than_ranks_causal_gqa", make_problem(1, 2 * p, p, p - 1, 16, Mask::causal()));
  }
  return list;
}

Plan plan_for(Algorithm algorithm, const Problem& problem, int ranks, LayoutKind layout,
              int64_t stripe = 1) {
  Plan plan = default_plan(algorithm, problem, ranks);
  plan.layout = layout;
  plan.stripe = stripe;
  return plan;
}

// Every baseline plan this problem allows on `ranks` ranks.
std::vector<Plan> baseline_plans(const Problem& problem, int ranks) {
  std::vector<Plan> plans;
  for (const LayoutKind layout :
       {LayoutKind::zigzag, LayoutKind::striped, LayoutKind::contiguous}) {
    plans.push_back(plan_for(Algorithm::ring, problem, ranks, layout));
  }
  plans.push_back(plan_for(Algorithm::ring, problem, ranks, LayoutKind::striped, 3));
  plans.push_back(default_plan(Algorithm::allgather_kv, problem, ranks));
  plans.push_back(plan_for(Algorithm::allgather_kv, problem, ranks, LayoutKind::striped));
  if (problem.kv_heads % ranks == 0) {
    plans.push_back(default_plan(Algorithm::ulysses, problem, ranks));
    plans.push_back(plan_for(Algorithm::ulysses, problem, ranks, LayoutKind::zigzag));
  }
  return plans;
}

// Runs forward and backward of `plan` on the generated inputs, checks every rank's counted
// traffic against the model (the verdict is shared), and returns the outputs in global order on
// rank 0 (empty elsewhere).
GlobalOutputs run_and_check_traffic(CountingCommunicator& world, TrafficLog& log,
                                    const Problem& problem, const Plan& plan,
                                    const std::string& what) {
  const std::unique_ptr<Backend> backend = test_backend();
  auto attention = make_attention(problem, plan, world, *backend);
  ShardSet shards =
      make_shards(problem, attention->layout(), world.rank(), kSeed, true, true, *backend);
  log.clear();
  attention->forward(shards.forward(problem));
  attention->backward(shards.backward(problem));

  expect_traffic_equals_model(world, log, problem, plan, what);

  world.set_phase("io");
  return gather_outputs(world, 0, problem, attention->layout(), shards, true);
}

const char* const kOutputNames[6] = {"O", "LSE", "dQ", "dK", "dV", "dsink"};

// Rank 0's five errors, shared with every rank so that every rank reports the same verdict.
// The largest errors seen, per output (printed for docs/kernels.md).
double largest_errors[6] = {0, 0, 0, 0, 0, -1};  // dsink only with sinks

void expect_all_ranks(Communicator& world, double (&errors)[6], const OutputBounds& bounds,
                      const std::string& what) {
  world.broadcast(errors, sizeof errors, 0);
  for (int i = 0; i < 6; ++i) {
    EXPECT_LE(errors[i], bounds.of(i)) << what << ": " << kOutputNames[i];
    largest_errors[i] = std::max(largest_errors[i], errors[i]);
  }
}

TEST(BaselinesMpi, EveryBaselineAndLayoutMatchesTheReferenceAndTheTrafficModel) {
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_test_world(), log);
  const int ranks = world.size();
  int runs = 0;
  for (const Config& config : configs(ranks)) {
    const Problem& problem = config.problem;
    ReferenceOutputs reference;
    if (world.rank() == 0) {
      reference = reference_outputs(problem, generate_global(problem, kSeed, true), true, 1);
    }
    for (const Plan& plan : baseline_plans(problem, ranks)) {
      const std::string what = config.name + " " + plan.describe();
      const GlobalOutputs outputs = run_and_check_traffic(world, *log, problem, plan, what);
      double errors[6] = {0, 0, 0, 0, 0, -1};
      if (world.rank() == 0) {
        const OutputErrors e = compare_outputs(outputs, reference, true);
        errors[0] = e.out, errors[1] = e.lse, errors[2] = e.dq, errors[3] = e.dk, errors[4] = e.dv;
        errors[5] = e.dsink;
      }
      expect_all_ranks(world, errors, output_bounds(problem.dtype), what);
      // With sinks the reference has dsink and the run's was compared (errors now on every rank).
      if (problem.sinks) {
        EXPECT_GE(errors[5], 0.0) << what << ": no dsink";
      }
      ++runs;
    }
  }
  if (world.rank() == 0) {
    std::cout << "checked " << runs << " baseline runs on " << ranks << " ranks ("
              << test_settings().describe() << "); largest errors: O " << largest_errors[0]
              << " LSE " << largest_errors[1] << " dQ " << largest_errors[2] << " dK "
              << largest_errors[3] << " dV " << largest_errors[4] << " dsink " << largest_errors[5]
              << "\n";
  }
}

// Relative Frobenius difference of two fp32 outputs, `b` taken as the reference.
double difference(const std::vector<float>& a, const std::vector<float>& b) {
  const std::vector<double> expected(b.begin(), b.end());
  EXPECT_EQ(a.size(), b.size());
  return relative_error(a.data(), expected.data(), static_cast<int64_t>(a.size()));
}

TEST(BaselinesMpi, EveryAlgorithmAgreesWithEveryOtherOnTheSameInputs) {
  if (test_settings().masks) GTEST_SKIP() << "the --masks job runs only the matrix";
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_test_world(), log);
  const int ranks = world.size();
  const int64_t p = ranks;
  // Causal GQA that every algorithm runs at every P (Ulysses: Hkv = P); N = 16P + 3.
  const Problem problem = in_test_dtype(make_problem(1, 2 * p, p, 16 * p + 3, 32, Mask::causal()));
  const OutputBounds agreement = agreement_bounds(problem.dtype);
  std::vector<Plan> plans = {default_plan(Algorithm::attention2d, problem, ranks),
                             default_plan(Algorithm::attention2d_overlap, problem, ranks)};
  for (const LayoutKind layout :
       {LayoutKind::zigzag, LayoutKind::striped, LayoutKind::contiguous}) {
    plans.push_back(plan_for(Algorithm::ring, problem, ranks, layout));
  }
  plans.push_back(default_plan(Algorithm::allgather_kv, problem, ranks));
  plans.push_back(default_plan(Algorithm::ulysses, problem, ranks));

  std::vector<GlobalOutputs> outputs;
  for (const Plan& plan : plans) {
    outputs.push_back(run_and_check_traffic(world, *log, problem, plan, plan.describe()));
  }
  for (size_t a = 0; a < plans.size(); ++a) {
    for (size_t b = a + 1; b < plans.size(); ++b) {
      double errors[6] = {0, 0, 0, 0, 0, -1};
      if (world.rank() == 0) {
        const GlobalOutputs& x = outputs[a];
        const GlobalOutputs& y = outputs[b];
        errors[0] = difference(x.out, y.out), errors[1] = difference(x.lse, y.lse);
        errors[2] = difference(x.dq, y.dq), errors[3] = difference(x.dk, y.dk);
        errors[4] = difference(x.dv, y.dv);
      }
      expect_all_ranks(world, errors, agreement,
                       plans[a].describe() + " vs " + plans[b].describe());
    }
  }
  if (world.rank() == 0) {
    std::cout << "compared " << plans.size() << " algorithms pairwise on " << ranks << " ranks\n";
  }
}

TEST(BaselinesMpi, UlyssesRefusesKvHeadsTheRanksDoNotDivideOnEveryRank) {
  if (test_settings().masks) GTEST_SKIP() << "the --masks job runs only the matrix";
  auto world = make_test_world();
  const int ranks = world->size();
  if (ranks == 1) GTEST_SKIP() << "one rank divides every head count";
  // Hkv = P + 1 is never a multiple of P > 1; H = 2 Hkv (GQA).
  const Problem problem =
      make_problem(1, 2 * (ranks + 1), ranks + 1, 8 * ranks, 16, Mask::causal());
  const Plan plan = default_plan(Algorithm::ulysses, problem, ranks);
  const std::unique_ptr<Backend> backend = test_backend();
  int64_t refused = 0;
  try {
    make_attention(problem, plan, *world, *backend);
  } catch (const Error& e) {
    refused = 1;
    const std::string expected = "the number of ranks (" + std::to_string(ranks) +
                                 ") must divide the number of K/V heads (" +
                                 std::to_string(ranks + 1) + ")";
    EXPECT_NE(e.message().find(expected), std::string::npos) << e.message();
  }
  // No rank may have started: every one refused by itself, before any communication.
  world->all_reduce(&refused, 1, Reduction::sum);
  EXPECT_EQ(refused, ranks);
}

}  // namespace
}  // namespace a2d
