// Collective validation: ranks that disagree, or one rank with an invalid request, make every
// rank raise the same CollectiveError before any data moves, and nobody hangs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/relayout.hpp"
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

using a2d::error_of;  // mpi_checks.hpp: a call's error

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

// The arguments of a call, wrong on one rank only: every rank raises that rank's error before any
// data moves (no rank waits for the one that stopped), and the next good call works.
struct CallBuffers {
  CallBuffers(Backend& backend, const Problem& p, int64_t n) {
    const int64_t q = p.batch * n * p.heads * p.head_dim * dtype_bytes(p.dtype);
    const int64_t kv = p.batch * n * p.kv_heads * p.head_dim * dtype_bytes(p.dtype);
    for (BufferPtr* b : {&q_, &o_, &do_, &dq_}) *b = backend.allocate(q);
    for (BufferPtr* b : {&k_, &v_, &dk_, &dv_}) *b = backend.allocate(kv);
    lse_ = backend.allocate(p.batch * p.heads * n * static_cast<int64_t>(sizeof(float)));
    short_ = backend.allocate(q / 2);
    std::vector<std::byte> zeros(static_cast<size_t>(q));
    for (BufferPtr* b : {&q_, &o_, &do_, &k_, &v_})
      backend.upload(zeros.data(), Place::in(**b), (*b)->bytes());
    auto t = [&](BufferPtr& b, int64_t heads) {
      return dense_token_tensor(*b, p.dtype, n, heads, p.head_dim);
    };
    fwd = {t(q_, p.heads), t(k_, p.kv_heads), t(v_, p.kv_heads), t(o_, p.heads),
           dense_row_tensor(*lse_, p.heads, n)};
    bwd = {t(q_, p.heads),  t(k_, p.kv_heads),  t(v_, p.kv_heads),
           t(o_, p.heads),  t(do_, p.heads),    dense_row_tensor(*lse_, p.heads, n),
           t(dq_, p.heads), t(dk_, p.kv_heads), t(dv_, p.kv_heads)};
  }
  BufferPtr q_, k_, v_, o_, do_, dq_, dk_, dv_, lse_, short_;
  ForwardShards fwd;
  BackwardShards bwd;
};

TEST(Reliability, ABadArgumentOnOneRankIsTheSameErrorOnEveryRank) {
  auto world = make_test_world();
  const std::unique_ptr<Backend> backend = test_backend();
  Problem problem = small_problem();
  problem.dtype = test_settings().dtype;
  const int last = world->size() - 1;
  const bool here = world->rank() == last;
  const std::string where = "[rank " + std::to_string(last) + "]";
  const int64_t seq = problem.seq;
  const std::vector<int64_t> counts = {seq - seq / 2, seq / 2};  // uneven, every rank but 0, 1 none
  for (Algorithm algorithm : {Algorithm::attention2d, Algorithm::ring}) {
    const Plan plan = default_plan(algorithm, problem, world->size());
    for (bool caller_layout : {false, true}) {
      std::unique_ptr<DistributedAttention> attention;
      if (caller_layout) {
        std::vector<int64_t> mine(static_cast<size_t>(world->size()), 0);
        mine[0] = counts[0];
        mine[static_cast<size_t>(last)] += counts[1];
        attention = make_attention(problem, plan, *world, *backend,
                                   TokenLayout::contiguous_counts(mine));
      } else {
        attention = make_attention(problem, plan, *world, *backend);
      }
      const int64_t n = attention->layout().count(world->rank());
      ASSERT_GT(attention->layout().count(last), 1);  // every case has elements to misplace
      CallBuffers good(*backend, problem, n);
      const DType other = problem.dtype == DType::bf16 ? DType::f16 : DType::bf16;
      const std::string name = algorithm_name(algorithm) +
                               (caller_layout ? " on the caller's layout" : "");
      struct Case {
        const char* what;
        std::function<void(ForwardShards&, BackwardShards&)> spoil;
        const char* expected;
      };
      const Case cases[] = {
          {"a short buffer",
           [&](ForwardShards& f, BackwardShards& b) {
             f.q = b.d_out = dense_token_tensor(*good.short_, problem.dtype, n, problem.heads,
                                                problem.head_dim);
           },
           "past the end of its buffer"},
          {"no buffer", [&](ForwardShards& f, BackwardShards& b) { f.k.buffer = b.dv.buffer = nullptr; },
           "shard has no buffer"},
          {"another dtype", [&](ForwardShards& f, BackwardShards& b) { f.v.dtype = b.dk.dtype = other; },
           "but the problem's dtype is"},
          {"strides of half the heads",
           [&](ForwardShards& f, BackwardShards& b) {
             f.q = dense_token_tensor(*good.q_, problem.dtype, n, problem.heads / 2, problem.head_dim);
             b.dq = dense_token_tensor(*good.dq_, problem.dtype, n, problem.heads / 2,
                                       problem.head_dim);
           },
           "lays two elements at one address"},
          {"LSE strides of half the tokens",
           [&](ForwardShards& f, BackwardShards& b) {
             f.lse = b.lse = dense_row_tensor(*good.lse_, problem.heads, n / 2);
           },
           "lays two elements at one address"},
      };
      for (const Case& c : cases) {
        ForwardShards f = good.fwd;
        BackwardShards b = good.bwd;
        if (here) c.spoil(f, b);
        const std::string forward = error_of([&] { attention->forward(f); });
        const std::string backward = error_of([&] { attention->backward(b); });
        for (const std::string* message : {&forward, &backward}) {
          EXPECT_NE(message->find(c.expected), std::string::npos)
              << name << ", " << c.what << ": " << *message;
          EXPECT_NE(message->find(where), std::string::npos)
              << name << ", " << c.what << ": " << *message;
          EXPECT_EQ(message->find("raised on this rank alone"), std::string::npos) << *message;
        }
      }
      EXPECT_EQ(error_of([&] { attention->forward(good.fwd); }), "accepted") << name;
      EXPECT_EQ(error_of([&] { attention->backward(good.bwd); }), "accepted") << name;
    }
  }
}

// An application that called MPI_Init itself (no MpiSession): the first communicator it makes
// sets the rank its errors name.
TEST(Reliability, ErrorsNameTheRankWhenTheApplicationStartedMpi) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int before = error_rank();
  set_error_rank(-1);
  EXPECT_EQ(error_rank(), -1);
  { auto world = make_mpi_communicator(MPI_COMM_WORLD); }
  EXPECT_EQ(error_rank(), rank);
  try {
    A2D_REQUIRE(false, "a refusal");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[rank " + std::to_string(rank) + "]"), std::string::npos)
        << e.what();
  }
  set_error_rank(before);
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
