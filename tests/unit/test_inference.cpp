// The pure parts of decode (inference.hpp): where appended tokens go, the bytes of a step, and
// the cost model's decode prediction. No MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "attention2d/error.hpp"
#include "attention2d/inference.hpp"
#include "make_problem.hpp"

namespace a2d {
namespace {

using test::make_problem;

TEST(AppendOwners, ACyclicPromptStaysCyclicForAnyRankCount) {
  for (const int64_t ranks : {1, 2, 3, 5, 7, 64, 1000}) {
    for (const int64_t prompt : {int64_t{0}, int64_t{1}, ranks - 1, 3 * ranks + 2}) {
      const TokenLayout layout(LayoutKind::cyclic, std::max<int64_t>(prompt, 0), ranks);
      std::vector<int64_t> counts(static_cast<size_t>(ranks));
      for (int64_t r = 0; r < ranks; ++r)
        counts[static_cast<size_t>(r)] = layout.count(r);
      const std::vector<int> owners = append_owners(counts, 2 * ranks + 3);
      for (size_t i = 0; i < owners.size(); ++i)
        EXPECT_EQ(owners[i], (prompt + static_cast<int64_t>(i)) % ranks) << ranks << " " << prompt;
    }
  }
}

TEST(AppendOwners, FillsTheLeastLoadedRanksFirstLowestRankOnTies) {
  const std::vector<int> owners = append_owners({5, 2, 2, 4}, 6);
  // Ranks 1 and 2 (2 each) take turns until they reach rank 3's 4, then 3, then 0, 1, ...
  EXPECT_EQ(owners, (std::vector<int>{1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(append_owners({5, 2, 2, 4}, 7).back(), 3);
  EXPECT_EQ(append_owners({5, 2, 2, 4}, 9).back(), 1);
  // Over thousands of virtual ranks with a skewed start, the spread never grows.
  std::mt19937 random(7);
  std::vector<int64_t> counts(3000);
  for (int64_t& c : counts)
    c = static_cast<int64_t>(random() % 50);
  const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
  const int64_t spread = *hi - *lo;
  std::vector<int64_t> after = counts;
  for (const int owner : append_owners(counts, 100000))
    ++after[static_cast<size_t>(owner)];
  const auto [lo2, hi2] = std::minmax_element(after.begin(), after.end());
  EXPECT_LE(*hi2 - *lo2, std::max<int64_t>(1, spread));
  EXPECT_LE(*hi2 - *lo2, 1);  // 100000 tokens are enough to level 3000 ranks from a spread of 49
}

TEST(PlanDecodeStep, GroupsTheNewPositionsByOwnerInRankOrder) {
  const DecodeStep step = plan_decode_step({3, 3, 2}, 5);
  EXPECT_EQ(step.first_position, 8);
  EXPECT_EQ(step.owners, (std::vector<int>{2, 0, 1, 2, 0}));
  EXPECT_EQ(step.counts, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(step.positions, (std::vector<int64_t>{9, 12, 10, 8, 11}));
  EXPECT_EQ(step.positions_of(2), (std::vector<int64_t>{8, 11}));
  EXPECT_THROW(plan_decode_step({1, 1}, 0), Error);
}

TEST(DecodeStepTraffic, EqualsTheClosedForm) {
  std::mt19937 random(3);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    Problem p = make_problem(2, 12, 4, 100, 80, Mask::causal());
    p.dtype = dtype;
    for (const int ranks : {1, 2, 3, 6, 17}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<int64_t> counts(static_cast<size_t>(ranks));
        int64_t t = 0;
        for (int64_t& c : counts)
          t += c = static_cast<int64_t>(random() % 3);
        for (int r = 0; r < ranks; ++r) {
          const DecodeTraffic traffic = decode_step_traffic(p, counts, r);
          const int64_t next = counts[static_cast<size_t>((r + 1) % ranks)];
          const int64_t own = counts[static_cast<size_t>(r)];
          const int64_t expected = ranks == 1 ? 0
                                              : p.batch * p.heads *
                                                    ((t - next) * p.head_dim * dtype_bytes(dtype) +
                                                     (t - own) * 4 * (p.head_dim + 2));
          EXPECT_EQ(traffic.total().bytes, expected);
          int64_t messages = 0;
          for (int j = 0; j < ranks && ranks > 1; ++j) {
            const int64_t c = counts[static_cast<size_t>(j)];
            messages += (c > 0 && j != (r + 1) % ranks) + (c > 0 && j != r);
          }
          EXPECT_EQ(traffic.total().messages, messages);
        }
      }
    }
  }
}

TEST(PredictDecodeStep, BytesStayPutAsTheCacheGrowsAndTheKernelGrows) {
  Problem p = make_problem(1, 32, 8, 4096, 128, Mask::causal());
  p.dtype = DType::bf16;
  const Machine machine = preset_machine("h100-ndr", DType::bf16);
  const Plan plan = default_plan(Algorithm::attention2d, p, 16);
  const DecodePrediction a = predict_decode_step(p, plan, machine, 8, 4096, 1);
  const DecodePrediction b = predict_decode_step(p, plan, machine, 8, 4096 + 16 * 100, 1);
  EXPECT_EQ(a.traffic.bytes, b.traffic.bytes);
  EXPECT_EQ(a.traffic.messages, b.traffic.messages);
  EXPECT_DOUBLE_EQ(a.comm_s, b.comm_s);
  EXPECT_GT(b.kernel_s, a.kernel_s);
  EXPECT_EQ(a.cache_tokens, 256);
  EXPECT_EQ(b.cache_tokens, 356);
  // One token: a rank other than its owner and the owner's ring predecessor forwards its Q
  // (H D e) and sends its partial records (4 (D + 2) H).
  EXPECT_EQ(a.traffic.bytes, p.heads * (p.head_dim * 2 + 4 * (p.head_dim + 2)));
  EXPECT_GT(a.step_s, 0);
  EXPECT_THROW(predict_decode_step(p, plan, machine, 8, 100, 1), Error);
  EXPECT_THROW(
      predict_decode_step(make_problem(1, 4, 4, 64, 16, Mask::none()), plan, machine, 8, 64, 1),
      Error);
}

}  // namespace
}  // namespace a2d
