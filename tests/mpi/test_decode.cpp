// Prefill and decode (inference.hpp) over MPI, at the process count this program was started
// with, in the dtype and on the device it was given (mpi_checks.hpp). After every step the O and
// LSE of the new tokens must match the fp64 reference of the whole sequence so far within the
// dtype's bounds (output_bounds), and every rank's counted bytes and messages of the step must
// equal the documented formula (decode_step_traffic and its closed form), which does not depend
// on the cache length. Problems: GQA 12:4 with head dim 80, prompts not divisible by P, steps of
// 1, 3 and P + 2 tokens, a windowed MQA problem with batch 2, sinks and softcap, and a prompt of
// fewer tokens than ranks (a rank starts with an empty cache).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/tools/decode_harness.hpp"
#include "attention2d/tools/harness.hpp"
#include "mpi_checks.hpp"
#include "unit/make_problem.hpp"

namespace a2d {
namespace {

using test::make_problem;
constexpr uint64_t kSeed = 77;

struct Case {
  std::string name;
  Problem problem;
  Algorithm algorithm;
  LayoutKind layout;
  std::vector<int64_t> steps;  // tokens per step
};

std::vector<Case> cases(int ranks) {
  const int64_t p = ranks;
  std::vector<Case> list;
  Problem gqa = in_test_dtype(make_problem(1, 12, 4, 7 * p + 3, 80, Mask::causal()));
  list.push_back({"gqa_12_4_d80_attention2d",
                  gqa,
                  Algorithm::attention2d,
                  LayoutKind::cyclic,
                  {1, 1, 3, 1, p + 2, 3, 1}});
  list.push_back(
      {"gqa_12_4_d80_ring_zigzag", gqa, Algorithm::ring, LayoutKind::zigzag, {3, 1, p + 2, 1}});
  Problem window = in_test_dtype(make_problem(2, 4, 1, 5 * p + 2, 32, Mask::causal_window(9)));
  window.sinks = true;
  window.softcap = 20.0f;
  list.push_back({"window_mqa_batch2_sinks_softcap_allgather",
                  window,
                  Algorithm::allgather_kv,
                  LayoutKind::contiguous,
                  {1, 2, 1, 5}});
  if (ranks > 1) {
    const Problem few = in_test_dtype(make_problem(1, 6, 2, p - 1, 16, Mask::causal()));
    list.push_back({"fewer_prompt_tokens_than_ranks",
                    few,
                    Algorithm::attention2d,
                    LayoutKind::cyclic,
                    {1, 2, 1}});
  }
  return list;
}

// The closed form of inference.hpp: B H [(T - c_{r+1}) D e + (T - c_r) 4 (D + 2)] bytes.
int64_t closed_form_bytes(const Problem& p, const std::vector<int64_t>& counts, int rank) {
  const int ranks = static_cast<int>(counts.size());
  if (ranks == 1) return 0;
  int64_t t = 0;
  for (const int64_t c : counts)
    t += c;
  const int64_t next = counts[static_cast<size_t>((rank + 1) % ranks)];
  const int64_t own = counts[static_cast<size_t>(rank)];
  return p.batch * p.heads *
         ((t - next) * p.head_dim * dtype_bytes(p.dtype) + (t - own) * 4 * (p.head_dim + 2));
}

TEST(DecodeMpi, EveryStepMatchesTheReferenceAndTheByteFormula) {
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_test_world(), log);
  const int ranks = world.size(), rank = world.rank();
  const std::unique_ptr<Backend> backend = test_backend();
  for (const Case& c : cases(ranks)) {
    SCOPED_TRACE(c.name + " at " + std::to_string(ranks) + " ranks, " + test_settings().describe());
    Plan plan = default_plan(c.algorithm, c.problem, ranks);
    plan.layout = c.layout;
    int64_t total = c.problem.seq;
    for (const int64_t t : c.steps)
      total += t;
    const DecodeReference reference(c.problem, kSeed, total);
    const OutputBounds bounds = output_bounds(c.problem.dtype);
    // Capacity 0: the cache starts at the prompt's shard and must grow by doubling.
    std::unique_ptr<DistributedDecoder> decoder = make_decoder(c.problem, plan, world, *backend);

    DecodeTokens prompt = make_decode_tokens(c.problem, *backend, kSeed, total,
                                             decoder->prompt_layout().tokens_of(rank));
    decoder->prefill(prompt.forward());
    ASSERT_EQ(decoder->sequence(), c.problem.seq);
    ASSERT_EQ(decoder->positions(), prompt.positions);

    int64_t step_index = 0;
    for (const int64_t tokens : c.steps) {
      SCOPED_TRACE("step " + std::to_string(step_index++) + " of " + std::to_string(tokens) +
                   " tokens at length " + std::to_string(decoder->sequence()));
      const DecodeStep step = decoder->next_step(tokens);
      DecodeTokens fresh =
          make_decode_tokens(c.problem, *backend, kSeed, total, step.positions_of(rank));
      log->clear();
      decoder->step(tokens, fresh.decode());
      fresh.download();

      // Bytes and messages: the model's, per phase, and the closed form.
      const DecodeTraffic expected = decode_step_traffic(c.problem, step.counts, rank);
      const Traffic gather = log->total("decode.q_allgather");
      const Traffic merge = log->total("decode.merge");
      EXPECT_EQ(gather.bytes, expected.q_allgather.bytes);
      EXPECT_EQ(gather.messages, expected.q_allgather.messages);
      EXPECT_EQ(merge.bytes, expected.merge.bytes);
      EXPECT_EQ(merge.messages, expected.merge.messages);
      EXPECT_EQ(log->total("decode").bytes, closed_form_bytes(c.problem, step.counts, rank));
      EXPECT_EQ(log->total("decode").bytes, expected.total().bytes);
      std::string phases;
      for (const auto& [name, t] : log->phases())
        phases += " " + name + "=" + std::to_string(t.bytes) + "/" + std::to_string(t.messages);
      EXPECT_EQ(log->total().bytes, expected.total().bytes)
          << "a phase outside the formula:" << phases;

      // Exact: the errors over every rank's new tokens (after the traffic was read: this
      // all-reduce is the test's own).
      const DecodeErrors mine = reference.errors(fresh);
      double sums[4] = {mine.out_error, mine.out_norm, mine.lse_error, mine.lse_norm};
      world.all_reduce(sums, 4, Reduction::sum);
      const DecodeErrors all{sums[0], sums[1], sums[2], sums[3]};
      EXPECT_LE(all.out(), bounds.out);
      EXPECT_LE(all.lse(), bounds.lse);
    }
    EXPECT_EQ(decoder->sequence(), total);
    // The cache grew by doubling: at most log2(final / initial) + 1 reallocations.
    const int64_t cached = static_cast<int64_t>(decoder->positions().size());
    EXPECT_GE(decoder->capacity(), cached);
    const int64_t initial = std::max<int64_t>(1, decoder->prompt_layout().count(rank));
    EXPECT_LE(decoder->reallocations(),
              static_cast<int64_t>(std::ceil(
                  std::log2(static_cast<double>(cached) / static_cast<double>(initial)))) +
                  1);
  }
}

// The bytes of a step depend on the owners of its tokens, never on how much is cached: the same
// step shape at two cache lengths that are a multiple of P apart sends the same bytes.
TEST(DecodeMpi, BytesPerStepDoNotGrowWithTheCache) {
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_test_world(), log);
  const int ranks = world.size(), rank = world.rank();
  const std::unique_ptr<Backend> backend = test_backend();
  const Problem problem = in_test_dtype(make_problem(1, 12, 4, 4 * ranks + 1, 80, Mask::causal()));
  const Plan plan = default_plan(Algorithm::attention2d, problem, ranks);
  const int64_t tokens = 2;
  const int64_t steps = 2 * ranks + 1;
  const int64_t total = problem.seq + steps * tokens;
  auto decoder = make_decoder(problem, plan, world, *backend, 4);
  DecodeTokens prompt =
      make_decode_tokens(problem, *backend, kSeed, total, decoder->prompt_layout().tokens_of(rank));
  decoder->prefill(prompt.forward());
  std::vector<int64_t> bytes;
  for (int64_t s = 0; s < steps; ++s) {
    DecodeTokens fresh = make_decode_tokens(problem, *backend, kSeed, total,
                                            decoder->next_step(tokens).positions_of(rank));
    log->clear();
    decoder->step(tokens, fresh.decode());
    bytes.push_back(log->total().bytes);
  }
  // Cyclic: the owners repeat every P steps of 2 tokens (or sooner).
  for (int64_t s = ranks; s < steps; ++s)
    EXPECT_EQ(bytes[static_cast<size_t>(s)], bytes[static_cast<size_t>(s - ranks)]) << s;
  for (const int64_t b : bytes)
    EXPECT_LE(b, tokens * problem.heads *
                     (problem.head_dim * dtype_bytes(problem.dtype) + 4 * (problem.head_dim + 2)));
}

TEST(DecodeMpi, RefusesAnUnmaskedProblemOnEveryRankBeforeAnyDataMoves) {
  auto world = make_test_world();
  const std::unique_ptr<Backend> backend = test_backend();
  const Problem problem = in_test_dtype(make_problem(1, 4, 2, 9, 16, Mask::none()));
  const Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  int64_t refused = 0;
  try {
    make_decoder(problem, plan, *world, *backend);
  } catch (const CollectiveError& e) {
    refused = 1;
    EXPECT_NE(e.brief().find("decoding needs a causal mask"), std::string::npos) << e.brief();
  }
  world->all_reduce(&refused, 1, Reduction::sum);
  EXPECT_EQ(refused, world->size());
}

TEST(DecodeMpi, RefusesAStepBeforePrefillAndAnEmptyStep) {
  auto world = make_test_world();
  const std::unique_ptr<Backend> backend = test_backend();
  const Problem problem = in_test_dtype(make_problem(1, 4, 2, 9, 16, Mask::causal()));
  const Plan plan = default_plan(Algorithm::attention2d, problem, world->size());
  auto decoder = make_decoder(problem, plan, *world, *backend);
  try {
    decoder->step(1, {});
    ADD_FAILURE() << "a step before prefill ran";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("call prefill() first"), std::string::npos) << e.message();
  }
  try {
    decoder->next_step(0);
    ADD_FAILURE() << "a step of no tokens was planned";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("at least one token"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace a2d
