// The C++ door (shard_attention.hpp) at the process count this program was started with:
//   * its outputs equal, bit for bit, the engine's (make_attention with the door's plan) on the
//     same inputs: the planner's plan, a requested algorithm, the caller's uneven shards; N odd,
//     GQA 6:2, causal;
//   * an array that does not match the problem on one rank (shape, dtype, pointer, strides) is the
//     same CollectiveError on every rank, naming that rank, in the forward and the backward;
//   * requests that differ between ranks, or cannot run on one, are refused on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/shard_attention.hpp"
#include "attention2d/tools/harness.hpp"
#include "mpi_checks.hpp"

namespace a2d {
namespace {

constexpr uint64_t kSeed = 97;

Problem door_problem() {
  Problem p;
  p.seq = 37;
  p.heads = 6;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.mask = Mask::causal();
  return p;
}

HostTensor tokens_of(std::vector<float>& x, const Problem& p, int64_t n, int64_t heads) {
  return HostTensor(x.data(), {p.batch, n, heads, p.head_dim});
}
HostTensor rows_of(std::vector<float>& x, const Problem& p, int64_t n) {
  return HostTensor(x.data(), {p.batch, p.heads, n});
}

void door_forward_backward(ShardAttention& door, ShardSet& s) {
  const Problem& p = door.problem();
  const int64_t n = door.tokens();
  door.forward(tokens_of(s.q, p, n, p.heads), tokens_of(s.k, p, n, p.kv_heads),
               tokens_of(s.v, p, n, p.kv_heads), tokens_of(s.out, p, n, p.heads),
               rows_of(s.lse, p, n));
  door.backward(tokens_of(s.q, p, n, p.heads), tokens_of(s.k, p, n, p.kv_heads),
                tokens_of(s.v, p, n, p.kv_heads), tokens_of(s.out, p, n, p.heads),
                tokens_of(s.d_out, p, n, p.heads), rows_of(s.lse, p, n),
                tokens_of(s.dq, p, n, p.heads), tokens_of(s.dk, p, n, p.kv_heads),
                tokens_of(s.dv, p, n, p.kv_heads));
}

TEST(Door, EqualsTheEngineBitForBit) {
  auto world = make_test_world();
  const std::unique_ptr<Backend> backend = make_backend("cpu");
  const Problem problem = door_problem();
  const int ranks = world->size();
  std::vector<int64_t> uneven(static_cast<size_t>(ranks), 0);
  uneven[0] = 20;
  uneven[static_cast<size_t>(ranks - 1)] += problem.seq - 20;
  const TokenLayout caller = TokenLayout::contiguous_counts(uneven);
  PlanRequest ring;
  ring.algo = "ring";
  PlanRequest attention2d;
  attention2d.algo = "attention2d";
  struct Case {
    const char* name;
    PlanRequest request;
    const TokenLayout* shards;
  };
  for (const Case& c : {Case{"planner", {}, nullptr}, Case{"ring", ring, nullptr},
                        Case{"attention2d, caller's shards", attention2d, &caller},
                        Case{"planner, caller's shards", {}, &caller}}) {
    ShardAttention door(*world, problem, c.request, c.shards);
    if (c.request.algo.empty()) {
      EXPECT_NE(door.chosen(), "") << c.name;
    }
    const TokenLayout& layout = door.layout();
    ShardSet mine = make_shards(problem, layout, world->rank(), kSeed, true, true, *backend);
    door_forward_backward(door, mine);

    auto engine = c.shards ? make_attention(problem, door.plan(), *world, *backend, *c.shards)
                           : make_attention(problem, door.plan(), *world, *backend);
    ShardSet theirs = make_shards(problem, layout, world->rank(), kSeed, true, true, *backend);
    engine->forward(theirs.forward(problem));
    engine->backward(theirs.backward(problem));
    const std::pair<const char*, std::vector<float> ShardSet::*> outputs[] = {
        {"O", &ShardSet::out}, {"LSE", &ShardSet::lse}, {"dQ", &ShardSet::dq},
        {"dK", &ShardSet::dk}, {"dV", &ShardSet::dv}};
    for (const auto& [name, member] : outputs) {
      const std::vector<float>& a = mine.*member;
      const std::vector<float>& b = theirs.*member;
      ASSERT_EQ(a.size(), b.size()) << c.name << " " << name;
      // (A rank without tokens has empty vectors, whose data() may be null: nothing to compare.)
      EXPECT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0)
          << c.name << " (" << door.plan().describe() << "): " << name;
    }
  }
}

TEST(Door, ABadArrayOnOneRankIsTheSameErrorOnEveryRank) {
  auto world = make_test_world();
  const std::unique_ptr<Backend> backend = make_backend("cpu");
  const Problem p = door_problem();
  const int last = world->size() - 1;
  const bool here = world->rank() == last;
  const std::string where = "[rank " + std::to_string(last) + "]";
  PlanRequest request;
  request.algo = "attention2d";
  ShardAttention door(*world, p, request);
  const int64_t n = door.tokens();
  ASSERT_GT(door.layout().count(last), 1);
  ShardSet s = make_shards(p, door.layout(), world->rank(), kSeed, true, true, *backend);
  std::vector<uint16_t> half(s.q.size());
  const int64_t H = p.heads, G = p.kv_heads, D = p.head_dim;
  struct Case {
    const char* what;
    std::function<HostTensor()> q;  // the spoiled array, Q (forward) and dQ (backward)
    const char* expected;
  };
  const Case cases[] = {
      {"one token too many", [&] { return HostTensor(s.q.data(), {1, n + 1, H, D}); },
       "but this rank's "},
      {"K/V heads", [&] { return HostTensor(s.q.data(), {1, n, G, D}); }, "but this rank's "},
      {"bf16", [&] { return HostTensor(half.data(), {1, n, H, D}, DType::bf16); },
       "the problem's dtype is fp32"},
      {"a null pointer", [&] { return HostTensor(nullptr, {1, n, H, D}); }, "is a null pointer"},
      {"head_dim not adjacent",
       [&] { return HostTensor(s.q.data(), {1, n, H, D}, DType::f32, {n * H * D, H * D, 1, H}); },
       "head_dim stride is"},
      {"strides of half the heads",
       [&] {
         return HostTensor(s.q.data(), {1, n, H, D}, DType::f32, {n * H * D, H / 2 * D, D, 1});
       },
       "lays two elements at one address"},
  };
  for (const Case& c : cases) {
    const HostTensor good = tokens_of(s.q, p, n, H);
    const HostTensor q = here ? c.q() : good;
    const std::string forward = error_of([&] {
      door.forward(q, tokens_of(s.k, p, n, G), tokens_of(s.v, p, n, G), tokens_of(s.out, p, n, H),
                   rows_of(s.lse, p, n));
    });
    const HostTensor dq = here ? c.q() : tokens_of(s.dq, p, n, H);
    const std::string backward = error_of([&] {
      door.backward(good, tokens_of(s.k, p, n, G), tokens_of(s.v, p, n, G),
                    tokens_of(s.out, p, n, H), tokens_of(s.d_out, p, n, H), rows_of(s.lse, p, n),
                    dq, tokens_of(s.dk, p, n, G), tokens_of(s.dv, p, n, G));
    });
    for (const std::string* message : {&forward, &backward}) {
      EXPECT_NE(message->find(c.expected), std::string::npos) << c.what << ": " << *message;
      EXPECT_NE(message->find(where), std::string::npos) << c.what << ": " << *message;
    }
  }
  const std::string lse = error_of([&] {
    door.forward(tokens_of(s.q, p, n, H), tokens_of(s.k, p, n, G), tokens_of(s.v, p, n, G),
                 tokens_of(s.out, p, n, H), HostTensor(s.lse.data(), {1, here ? n : H, here ? H : n}));
  });
  EXPECT_NE(lse.find("but this rank's LSE is"), std::string::npos) << lse;
  // Still usable after the refusals.
  EXPECT_EQ(error_of([&] { door_forward_backward(door, s); }), "accepted");
}

TEST(Door, RequestsThatDifferOrCannotRunAreRefusedOnEveryRank) {
  auto world = make_test_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  const Problem p = door_problem();
  const int last = world->size() - 1;
  PlanRequest request;
  request.algo = world->rank() == last ? "ring" : "allgather-kv";
  std::string message = error_of([&] { ShardAttention door(*world, p, request); });
  EXPECT_NE(message.find("different problems or plans"), std::string::npos) << message;
  request.algo = "attention2d";
  request.grid = world->rank() == last ? "7x7" : "";
  message = error_of([&] { ShardAttention door(*world, p, request); });
  EXPECT_NE(message.find("[rank " + std::to_string(last) + "]"), std::string::npos) << message;
  EXPECT_NE(message.find("7x7"), std::string::npos) << message;
}

}  // namespace
}  // namespace a2d
