// The cost model's plan search, and the exchanges between the caller's shards and a plan's layout
// it charges and weighs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <sstream>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "cost_model_case.hpp"

namespace a2d {
namespace {

using namespace cost_model_case;

// The caller's shards of a test: an even contiguous slice per rank, an uneven cut with rank 1
// empty, zigzag, cyclic and striped(2).
std::vector<TokenLayout> shard_layouts(int64_t seq, int ranks) {
  std::vector<TokenLayout> list = {
      TokenLayout(LayoutKind::contiguous, seq, ranks), TokenLayout(LayoutKind::zigzag, seq, ranks),
      TokenLayout(LayoutKind::cyclic, seq, ranks), TokenLayout(LayoutKind::striped, seq, ranks, 2)};
  std::vector<int64_t> counts(static_cast<size_t>(ranks), 0);
  counts[0] = ranks == 1 ? seq : seq / 3;
  for (int r = 2; r < ranks; ++r)
    counts[static_cast<size_t>(r)] = (seq - counts[0]) / (ranks - 2);
  int64_t total = 0;
  for (const int64_t c : counts)
    total += c;
  counts.back() += seq - total;
  list.push_back(TokenLayout::contiguous_counts(counts));
  return list;
}

TEST(CostModel, SearchListsEveryCandidateAndSkipsUlyssesWithAReason) {
  Problem p = problem_of(4096, Mask::causal(), 12, 4);
  p.dtype = DType::bf16;
  const PlanSearch search = search_plans(p, 6, preset_machine("h100-ndr", DType::bf16), 8);
  // 4 grids x 2 variants x 2 transposes + ring + allgather-kv + the hybrid at U = 2 (grids 1x3
  // and 3x1); Ulysses cannot (6 does not divide 4), nor the hybrid at U = 3 (grids 1x2, 2x1) and
  // U = 6 (neither divides nor is a multiple of Hkv = 4). Each reason once (U = 3's two grids
  // share theirs), without the algorithm's name repeated at its start.
  EXPECT_EQ(search.ranked.size(), 20u);
  ASSERT_EQ(search.skipped.size(), 3u);
  EXPECT_EQ(search.skipped[0].first, "ulysses");
  int hybrids = 0;
  for (const RankedPlan& r : search.ranked) {
    if (r.plan.algorithm != Algorithm::hybrid) continue;
    EXPECT_EQ(r.plan.heads_parallel, 2);
    ++hybrids;
  }
  EXPECT_EQ(hybrids, 2);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(search.skipped[i].first, "hybrid");
    EXPECT_NE(search.skipped[i].second.find("must divide the number of K/V heads (4)"),
              std::string::npos)
        << search.skipped[i].second;
    EXPECT_NE(search.skipped[i].second.rfind("hybrid:", 0), 0u) << search.skipped[i].second;
  }
  EXPECT_NE(search.skipped[1].second, search.skipped[2].second);
  EXPECT_NE(search.skipped[1].second.find("--heads-parallel 3 "), std::string::npos);
  EXPECT_NE(search.skipped[2].second.find("--heads-parallel 6 "), std::string::npos);
  // Fastest first, but for ties: plans within kPlanTieTolerance of each other rank by memory
  // (test_planner.cpp checks that order).
  for (size_t i = 1; i < search.ranked.size(); ++i) {
    const auto total = [](const RankedPlan& r) {
      return r.prediction.forward_s + r.prediction.backward_s;
    };
    EXPECT_LE(total(search.ranked[i - 1]), total(search.ranked[i]) * (1 + kPlanTieTolerance));
  }
}

TEST(CostModel, RelayoutPhasesChargeTheExchangeOfEveryRank) {
  Machine machine = preset_machine("h100-ndr", DType::bf16);
  machine.sync_s = 3e-6;  // charged once per exchange that sends
  int checked = 0;
  for (const int ranks : {1, 3, 4, 6, 7}) {
    // N odd and divisible by neither P nor 2P; GQA 12:4; bf16 with an odd head dim (records of
    // O and LSE padded to 4 bytes) and fp32.
    for (const DType dtype : {DType::bf16, DType::f32}) {
      Problem p = problem_of(14 * ranks + 5, Mask::causal(), 12, 4);
      p.batch = 1;
      p.head_dim = dtype == DType::bf16 ? 9 : 8;
      p.dtype = dtype;
      std::vector<Plan> plans;
      for (const Algorithm algorithm : all_algorithms()) {
        const Plan plan = default_plan(algorithm, p, ranks);
        try {
          check_plan(plan, p, ranks);
          plans.push_back(plan);
        } catch (const Error&) {
        }
      }
      for (const TokenLayout& user : shard_layouts(p.seq, ranks)) {
        for (const RelayoutBackward variant :
             {RelayoutBackward::saved, RelayoutBackward::stateless}) {
          const UserShards shards{user, variant};
          const RelayoutRecords records = relayout_records(p, variant);
          for (const Plan& plan : plans) {
            const std::string what =
                user.describe() + " " + plan.describe() + " " + relayout_backward_name(variant);
            const TokenLayout planned = plan_layout(p, plan);
            const bool nothing = same_assignment(user, planned);
            // Per rank: the four phases are exchange_traffic of the records, each way.
            std::map<std::string, Traffic> worst;
            Traffic forward, backward;
            for (int rank = 0; rank < ranks; ++rank) {
              const auto phases = predict_traffic(p, plan, rank, &shards);
              const auto expect_phase = [&](const char* name, const Traffic& expected) {
                const auto it = phases.find(name);
                if (nothing) {
                  EXPECT_TRUE(it == phases.end()) << what << " " << name;
                  return;
                }
                ASSERT_TRUE(it != phases.end()) << what << " " << name;
                EXPECT_EQ(it->second.bytes, expected.bytes) << what << " " << name << " " << rank;
                EXPECT_EQ(it->second.messages, expected.messages) << what << " " << name;
                worst[name].bytes = std::max(worst[name].bytes, expected.bytes);
                worst[name].messages = std::max(worst[name].messages, expected.messages);
              };
              const Traffic in_f = exchange_traffic(user, planned, rank, records.forward_in);
              const Traffic out_f = exchange_traffic(planned, user, rank, records.forward_out);
              const Traffic in_b = exchange_traffic(user, planned, rank, records.backward_in);
              const Traffic out_b = exchange_traffic(planned, user, rank, records.backward_out);
              expect_phase(kRelayoutForwardIn, in_f);
              expect_phase(kRelayoutForwardOut, out_f);
              expect_phase(kRelayoutBackwardIn, in_b);
              expect_phase(kRelayoutBackwardOut, out_b);
              if (nothing) continue;
              forward.bytes = std::max(forward.bytes, in_f.bytes + out_f.bytes);
              forward.messages = std::max(forward.messages, in_f.messages + out_f.messages);
              backward.bytes = std::max(backward.bytes, in_b.bytes + out_b.bytes);
              backward.messages = std::max(backward.messages, in_b.messages + out_b.messages);
            }
            // predict(): the busiest rank's, per phase and per direction, and their time in
            // forward_s and backward_s.
            const Prediction plain = predict(p, plan, machine, 2);
            const Prediction with = predict(p, plan, machine, 2, &shards);
            EXPECT_EQ(with.relayout_forward.bytes, forward.bytes) << what;
            EXPECT_EQ(with.relayout_forward.messages, forward.messages) << what;
            EXPECT_EQ(with.relayout_backward.bytes, backward.bytes) << what;
            EXPECT_EQ(with.relayout_backward.messages, backward.messages) << what;
            double forward_s = 0, backward_s = 0;
            for (const PhaseCost& phase : with.phases) {
              if (phase.name.find(".relayout_") == std::string::npos) continue;
              EXPECT_EQ(phase.traffic.bytes, worst[phase.name].bytes) << what << phase.name;
              EXPECT_EQ(phase.traffic.messages, worst[phase.name].messages) << what << phase.name;
              // An all-to-all of the world: over the inter-node link once it spans nodes (two
              // ranks per node here), the machine's synchronisation when it sends.
              const bool inter = ranks > 2;
              EXPECT_EQ(phase.inter_node, inter) << what;
              const Link& link = inter ? machine.inter : machine.intra;
              const double seconds = static_cast<double>(phase.traffic.messages) * link.latency_s +
                                     static_cast<double>(phase.traffic.bytes) / link.bytes_per_s +
                                     (phase.traffic.messages > 0 ? machine.sync_s : 0.0);
              EXPECT_NEAR(phase.seconds, seconds, 1e-15) << what << phase.name;
              (phase.name[0] == 'f' ? forward_s : backward_s) += phase.seconds;
            }
            EXPECT_NEAR(with.relayout_forward_s, forward_s, 1e-15) << what;
            EXPECT_NEAR(with.relayout_backward_s, backward_s, 1e-15) << what;
            EXPECT_NEAR(with.forward_s, plain.forward_s + forward_s, 1e-12) << what;
            EXPECT_NEAR(with.backward_s, plain.backward_s + backward_s, 1e-12) << what;
            EXPECT_EQ(nothing, with.relayout_forward.bytes == 0) << what;
            if (nothing) {
              EXPECT_EQ(with.memory_bytes, plain.memory_bytes) << what;
            } else {
              EXPECT_GT(with.memory_bytes, plain.memory_bytes) << what;
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 400);
}

TEST(CostModel, RelayoutOnASharedLinkCarriesTheNodesOffNodeShare) {
  // 16 ranks, 4 per node sharing one link: an all-to-all's node carries 4 * 12/15 of a rank's
  // bytes, as Ulysses' does.
  Machine machine = preset_machine("a100-hdr", DType::bf16);
  machine.shared_link = true;
  const Problem p = problem_of(4099, Mask::causal(), 8, 8);
  const Plan plan = default_plan(Algorithm::attention2d, p, 16);
  const UserShards shards{TokenLayout(LayoutKind::contiguous, 4099, 16), RelayoutBackward::saved};
  const Prediction with = predict(p, plan, machine, 4, &shards);
  int seen = 0;
  for (const PhaseCost& phase : with.phases) {
    if (phase.name.find(".relayout_") == std::string::npos) continue;
    EXPECT_TRUE(phase.inter_node);
    EXPECT_NEAR(
        phase.seconds,
        static_cast<double>(phase.traffic.messages) * machine.inter.latency_s +
            4.0 * 12 / 15 * static_cast<double>(phase.traffic.bytes) / machine.inter.bytes_per_s,
        1e-15);
    ++seen;
  }
  EXPECT_EQ(seen, 4);
}

TEST(CostModel, PlannerWeighsTheExchangeFromTheCallersShards) {
  // 16 H100s, 4 per node, N = 65536, 8 heads on 2 K/V heads (no Ulysses): ATTENTION2D-O is the
  // fastest on its own cyclic layout, but on zigzag shards the exchange in and out costs more than
  // Ring Attention, which runs on zigzag shards as they are.
  Problem p = problem_of(65536, Mask::causal(), 8, 2);
  p.batch = 1;
  p.head_dim = 128;
  p.dtype = DType::bf16;
  const Machine machine = preset_machine("h100-ndr", DType::bf16);
  const PlanSearch plain = search_plans(p, 16, machine, 4);
  EXPECT_EQ(plain.ranked.front().plan.algorithm, Algorithm::attention2d_overlap);
  const UserShards zigzag{TokenLayout(LayoutKind::zigzag, 65536, 16), RelayoutBackward::saved};
  const PlanSearch on_zigzag = search_plans(p, 16, machine, 4, true, false, &zigzag);
  EXPECT_EQ(on_zigzag.ranked.front().plan.algorithm, Algorithm::ring);
  EXPECT_EQ(on_zigzag.ranked.front().plan.layout, LayoutKind::zigzag);
  EXPECT_EQ(on_zigzag.ranked.front().prediction.relayout_forward_s, 0.0);
  // Every plan of another layout pays its exchanges; the same plans are ranked.
  EXPECT_EQ(on_zigzag.ranked.size(), plain.ranked.size());
  for (const RankedPlan& r : on_zigzag.ranked) {
    const bool same = same_assignment(zigzag.layout, plan_layout(p, r.plan));
    EXPECT_EQ(same, r.prediction.relayout_forward_s == 0) << r.plan.describe();
  }
  // Cyclic shards are ATTENTION2D's own: the same choice as without them.
  const UserShards cyclic{TokenLayout(LayoutKind::cyclic, 65536, 16), RelayoutBackward::saved};
  const PlanSearch on_cyclic = search_plans(p, 16, machine, 4, true, false, &cyclic);
  EXPECT_EQ(on_cyclic.ranked.front().plan.describe(), plain.ranked.front().plan.describe());
  // Striped(3) shards: the baselines are also tried in that layout.
  const UserShards striped{TokenLayout(LayoutKind::striped, 65536, 16, 3), RelayoutBackward::saved};
  const PlanSearch on_striped = search_plans(p, 16, machine, 4, true, false, &striped);
  bool ring_striped = false;
  for (const RankedPlan& r : on_striped.ranked) {
    ring_striped = ring_striped ||
                   (r.plan.algorithm == Algorithm::ring && r.plan.layout == LayoutKind::striped &&
                    r.plan.stripe == 3 && r.prediction.relayout_forward_s == 0);
  }
  EXPECT_TRUE(ring_striped);
  // Shards of another size are refused by predict (and skipped with the reason by the search).
  const UserShards wrong{TokenLayout(LayoutKind::zigzag, 65535, 16), RelayoutBackward::saved};
  EXPECT_THROW(predict(p, plain.ranked.front().plan, machine, 4, &wrong), Error);
}

}  // namespace
}  // namespace a2d
