// The cost model's closed forms of FLOPs against the exact, token-by-token decomposition, and the
// kernel tiles and calls it charges.
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

double exact_flops(const Problem& p, const Plan& plan, int rank) {
  const double per_pair = 4.0 * p.head_dim * p.batch;
  switch (plan.algorithm) {
    case Algorithm::attention2d:
    case Algorithm::attention2d_overlap:
      return per_pair * p.heads * attention2d_unmasked_pairs(p, plan, rank);
    case Algorithm::ring:
    case Algorithm::allgather_kv:
      return per_pair * p.heads * sequence_parallel_unmasked_pairs(p, plan, rank);
    case Algorithm::ulysses:
      return per_pair * ulysses_heads(p, plan.grid.size(), rank).heads *
             count_visible_pairs(p.mask, nullptr, p.seq, nullptr, p.seq);
    case Algorithm::hybrid: {
      const Problem group = hybrid_group_problem(p, plan);
      return per_pair * group.heads *
             attention2d_unmasked_pairs(group, hybrid_group_plan(plan),
                                        hybrid_rank(plan, rank).sequence_group);
    }
  }
  return 0;
}

TEST(CostModel, ClosedFormFlopsEqualTheExactDecompositionForEveryRank) {
  int checked = 0;
  for (const Mask& base : {Mask::none(), Mask::causal(), Mask::causal_window(7)}) {
    for (const int ranks : {1, 2, 3, 4, 6, 9}) {
      for (const int64_t seq : {int64_t{1}, int64_t{ranks - 1 > 0 ? ranks - 1 : 1}, int64_t{37},
                                int64_t{64 * ranks + 5}}) {
        // Without documents, with one-token documents around a long one, and the skewed mix.
        std::vector<int64_t> around_long = {1, seq - 2, 1};
        if (seq > 7) around_long = {1, seq - 7, 1, 1, 3, 1};
        for (const int documents : {0, 1, 2}) {
          if (documents > 0 && seq < 4) continue;
          const Mask mask = documents == 0 ? base
                            : documents == 1
                                ? base.with_documents(around_long)
                                : base.with_documents(generated_document_lengths("skewed", seq, 3));
          const Problem p = problem_of(seq, mask, 2 * ranks, ranks);
          std::vector<Plan> plans;
          for (const GridShape& shape : grid_shapes(ranks)) {
            for (const bool transpose : {true, false}) {
              Plan plan = default_plan(Algorithm::attention2d, p, ranks);
              plan.grid = shape;
              plan.kv_transpose = transpose;
              plans.push_back(plan);
            }
          }
          for (const LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag,
                                          LayoutKind::striped, LayoutKind::cyclic}) {
            for (const int64_t stripe : {1, 3}) {
              Plan plan = default_plan(Algorithm::ring, p, ranks);
              plan.layout = layout;
              plan.stripe = stripe;
              plans.push_back(plan);
            }
          }
          plans.push_back(default_plan(Algorithm::ulysses, p, ranks));
          // Every hybrid factorisation (U divides H = 2P and Hkv = P).
          for (const Plan& plan : hybrid_plans(p, ranks))
            plans.push_back(plan);
          for (const Plan& plan : plans) {
            double busiest = 0;
            for (int rank = 0; rank < ranks; ++rank) {
              const double exact = exact_flops(p, plan, rank);
              ASSERT_DOUBLE_EQ(rank_forward_flops(p, plan, rank), exact)
                  << plan.describe() << " " << mask.describe() << " N=" << seq << " rank " << rank;
              busiest = std::max(busiest, exact);
              ++checked;
            }
            // Small grids are sampled completely: the busiest rank is found (the contiguous causal
            // ring reports its larger step-synchronous critical path).
            EXPECT_GE(busiest_forward_flops(p, plan), busiest) << plan.describe();
            if (!(plan.algorithm == Algorithm::ring && plan.layout == LayoutKind::contiguous)) {
              EXPECT_DOUBLE_EQ(busiest_forward_flops(p, plan), busiest) << plan.describe();
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 3000);
}

// The same for flash-attn's two-sided windows (alone and with documents) and range masks: the
// closed forms sum over the mask's pieces (Mask::pieces), and every rank's count must equal the
// token-by-token one, and the busiest rank be found (every rank is evaluated for ranges).
TEST(CostModel, ClosedFormFlopsOfWindowsAndRangesEqualTheExactDecomposition) {
  int checked = 0;
  for (const int ranks : {1, 2, 3, 4, 6, 7}) {
    for (const int64_t seq : {int64_t{ranks + 1}, int64_t{37}, int64_t{64 * ranks + 5}}) {
      std::vector<Mask> masks = {Mask::window_size(3, 2), Mask::window_size(-1, 5),
                                 Mask::window_size(6, -1), Mask::window_size(0, 1)};
      if (seq > 7)
        masks.push_back(Mask::window_size(4, 4).with_documents({1, seq - 7, 1, 1, 3, 1}));
      masks.push_back(Mask::from_ranges(parse_mask_ranges("prefix-lm:25%", seq)));
      masks.push_back(Mask::from_ranges(parse_mask_ranges("block-causal:5", seq)));
      if (seq >= 37) masks.push_back(Mask::from_ranges(parse_mask_ranges("random:9:4", seq)));
      for (const Mask& mask : masks) {
        const Problem p = problem_of(seq, mask, 2 * ranks, ranks);
        std::vector<Plan> plans;
        for (const GridShape& shape : grid_shapes(ranks)) {
          for (const bool transpose : {true, false}) {
            Plan plan = default_plan(Algorithm::attention2d, p, ranks);
            plan.grid = shape;
            plan.kv_transpose = transpose;
            plans.push_back(plan);
          }
        }
        for (const LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag,
                                        LayoutKind::striped, LayoutKind::cyclic}) {
          for (const int64_t stripe : {1, 3}) {
            Plan plan = default_plan(Algorithm::allgather_kv, p, ranks);
            plan.layout = layout;
            plan.stripe = stripe;
            plans.push_back(plan);
          }
        }
        plans.push_back(default_plan(Algorithm::ulysses, p, ranks));
        for (const Plan& plan : hybrid_plans(p, ranks))
          plans.push_back(plan);
        for (const Plan& plan : plans) {
          double busiest = 0;
          for (int rank = 0; rank < ranks; ++rank) {
            const double exact = exact_flops(p, plan, rank);
            ASSERT_DOUBLE_EQ(rank_forward_flops(p, plan, rank), exact)
                << plan.describe() << " " << mask.describe() << " N=" << seq << " rank " << rank;
            busiest = std::max(busiest, exact);
            ++checked;
          }
          if (mask.balance() == MaskBalance::interleaved) {
            EXPECT_DOUBLE_EQ(busiest_forward_flops(p, plan), busiest) << plan.describe();
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 3000);
}

TEST(CostModel, KernelTilesAreCountedAsTheKernelsSkipThem) {
  const auto range = [](int64_t first, int64_t count) {
    std::vector<int64_t> positions(static_cast<size_t>(count));
    std::iota(positions.begin(), positions.end(), first);
    return positions;
  };
  // Non-causal: every tile, padded (1024 rows are 22 query tiles of 48 and 11 key tiles of 96;
  // 43 forward panels of 24).
  const std::vector<int64_t> block = range(0, 1024);
  EXPECT_EQ(backward_tile_entries(Mask::none(), block, block), 1056.0 * 1056.0);
  EXPECT_EQ(forward_tile_entries(Mask::none(), block, block), 1032.0 * 1024.0);
  // A causal diagonal block of one key tile: both query tiles are partly visible, computed whole.
  const std::vector<int64_t> diagonal = range(0, 96);
  EXPECT_EQ(backward_tile_entries(Mask::causal(), diagonal, diagonal), 2.0 * 48 * 96);
  // Forward: 4 panels of 24 rows against one 256-key tile; panel i sees blocks up to its last
  // row, trimmed at the hidden end: 24 * (24, 48, 72, 96) keys.
  EXPECT_EQ(forward_tile_entries(Mask::causal(), diagonal, diagonal), 24.0 * (24 + 48 + 72 + 96));
  // Keys entirely after the queries: nothing.
  EXPECT_EQ(backward_tile_entries(Mask::causal(), range(0, 96), range(96, 96)), 0.0);
  EXPECT_EQ(forward_tile_entries(Mask::causal(), range(0, 96), range(96, 96)), 0.0);
  // A key tile straddling two runs far apart (chunks of 64 keys) is partly visible to every query
  // tile and computed whole, although a third of it is hidden: 96 x 96 entries for the 96 x 64
  // the mask lets through; the second key tile (the rest of the later chunk) is skipped.
  std::vector<int64_t> straddle = range(1000, 64);
  for (const int64_t p : range(5000, 64))
    straddle.push_back(p);
  const std::vector<int64_t> queries = range(2000, 96);
  EXPECT_EQ(backward_tile_entries(Mask::causal(), queries, straddle), 2.0 * 48 * 96);
}

TEST(CostModel, ForwardPanelsAndKeysAreCountedPerCall) {
  Problem problem;
  problem.seq = 50;
  problem.heads = problem.kv_heads = 2;
  problem.head_dim = 8;
  // One rank: one call of 50 queries (3 panels of 24) against 50 keys, per head.
  const TileEntries one =
      busiest_tile_entries(problem, default_plan(Algorithm::attention2d, problem, 1));
  EXPECT_EQ(one.forward_panels, 2 * 3.0);
  EXPECT_EQ(one.forward_keys, 2 * 50.0);
  // Ring Attention on 2 ranks: two calls of 25 queries (2 panels) against 25 keys, per head.
  const TileEntries ring = busiest_tile_entries(problem, default_plan(Algorithm::ring, problem, 2));
  EXPECT_EQ(ring.forward_panels, 2 * 2 * 2.0);
  EXPECT_EQ(ring.forward_keys, 2 * 2 * 25.0);
  // The model charges them on top of the entries: with the calibration block's own shape the
  // totals agree, and short calls pay more per entry.
  Machine m = shared_machine();
  m.tile_block = 48;
  Machine overheads = m;
  overheads.kernel_forward_panel_s = 1e-6;
  overheads.kernel_forward_key_s = 1e-8;
  const Plan ring_plan = default_plan(Algorithm::ring, problem, 2);
  EXPECT_GT(predict(problem, ring_plan, overheads, 2).forward_compute_s,
            predict(problem, ring_plan, m, 2).forward_compute_s);
}

}  // namespace
}  // namespace a2d
