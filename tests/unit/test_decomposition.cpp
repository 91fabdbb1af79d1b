// ATTENTION2D's decomposition as pure functions of (problem, plan, rank): grids, the K/V
// transpose, causal balance over every grid, and the communication bound of the 4 x 4 grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/model.hpp"

namespace a2d {
namespace {

Problem causal_problem(int64_t seq, int64_t heads = 1, int64_t dim = 64) {
  Problem p;
  p.seq = seq;
  p.heads = p.kv_heads = heads;
  p.head_dim = dim;
  p.mask = Mask::causal();
  return p;
}

TEST(Grid, ShapesParsingAndDefault) {
  EXPECT_EQ(grid_shapes(12).size(), 6u);
  EXPECT_EQ(default_grid(16).describe(), "4x4");
  EXPECT_EQ(default_grid(8).describe(), "2x4");
  EXPECT_EQ(default_grid(7).describe(), "1x7");
  EXPECT_EQ(parse_grid("2x8").rows, 2);
  EXPECT_THROW(parse_grid("2by8"), Error);
  EXPECT_THROW(parse_grid("0x4"), Error);
  EXPECT_THROW(check_grid({3, 3}, 8), Error);
}

TEST(Grid, TransposeIsAPermutationWithInverse) {
  for (int ranks = 1; ranks <= 36; ++ranks) {
    for (const GridShape& shape : grid_shapes(ranks)) {
      std::set<int> sources, dests;
      for (int rank = 0; rank < ranks; ++rank) {
        const GridCoords at{shape, rank};
        sources.insert(at.kv_source_rank());
        dests.insert(at.kv_dest_rank());
        // The rank this one sends to receives from this one.
        EXPECT_EQ((GridCoords{shape, at.kv_dest_rank()}).kv_source_rank(), rank);
        EXPECT_EQ(GridCoords::rank_of(shape, at.row(), at.col()), rank);
      }
      EXPECT_EQ(static_cast<int>(sources.size()), ranks);
      EXPECT_EQ(static_cast<int>(dests.size()), ranks);
    }
  }
}

TEST(Decomposition, RowsAndColumnsCoverEveryTokenOnce) {
  const Problem p = causal_problem(1003);
  for (const int ranks : {1, 2, 6, 9, 16}) {
    for (const GridShape& shape : grid_shapes(ranks)) {
      for (const bool transpose : {true, false}) {
        Plan plan = default_plan(Algorithm::attention2d, p, ranks);
        plan.grid = shape;
        plan.kv_transpose = transpose;
        // Every (query, key) pair is computed by exactly one rank.
        int64_t pairs = 0;
        for (int rank = 0; rank < ranks; ++rank) {
          const Attention2DRank at = attention2d_rank(p, plan, rank);
          EXPECT_EQ(at.q_rows(), static_cast<int64_t>(at.q_positions.size()));
          for (const int64_t t : at.q_positions)
            EXPECT_EQ(t % shape.rows, at.row);
          if (transpose) {
            for (const int64_t t : at.kv_positions)
              EXPECT_EQ(t % shape.cols, at.col);
          }
          pairs += at.q_rows() * at.kv_rows();
        }
        EXPECT_EQ(pairs, p.seq * p.seq) << plan.describe();
      }
    }
  }
}

// For N >= 64 P the unmasked score entries of every rank stay within 5 % of the mean, on every
// grid shape, with and without the transpose.
TEST(Decomposition, CausalWorkIsBalancedOnEveryGrid) {
  double worst = 0;
  for (const int ranks : {2, 3, 4, 6, 8, 9, 12, 16, 25, 32, 64}) {
    for (const int64_t seq :
         {int64_t{64} * ranks, int64_t{64} * ranks + 37, int64_t{200} * ranks + 1}) {
      const Problem p = causal_problem(seq);
      for (const GridShape& shape : grid_shapes(ranks)) {
        for (const bool transpose : {true, false}) {
          Plan plan = default_plan(Algorithm::attention2d, p, ranks);
          plan.grid = shape;
          plan.kv_transpose = transpose;
          std::vector<double> work;
          for (int rank = 0; rank < ranks; ++rank) {
            work.push_back(static_cast<double>(attention2d_unmasked_pairs(p, plan, rank)));
          }
          const double mean = std::accumulate(work.begin(), work.end(), 0.0) / ranks;
          const auto [lo, hi] = std::minmax_element(work.begin(), work.end());
          worst = std::max({worst, *hi / mean - 1, 1 - *lo / mean});
          EXPECT_LE(*hi / mean - 1, 0.05) << plan.describe() << " N=" << seq;
          EXPECT_LE(1 - *lo / mean, 0.05) << plan.describe() << " N=" << seq;
          // And the total is exactly the causal triangle.
          EXPECT_DOUBLE_EQ(mean * ranks, static_cast<double>(seq * (seq + 1) / 2));
        }
      }
    }
  }
  RecordProperty("worst_relative_deviation", std::to_string(worst));
}

// The paper's bound: the 4 x 4 forward sends at most 4 N D / sqrt(P) (1 + 2/D) words per head and
// rank (MHA; the counted traffic equals this model exactly, see tests/mpi/test_attention2d.cpp).
TEST(Decomposition, FourByFourForwardWordsStayUnderThePaperBound) {
  for (const int64_t seq : {4096, 1000, 65536}) {
    for (const int64_t dim : {64, 80, 128}) {
      Problem p = causal_problem(seq, 4, dim);
      for (const Algorithm algorithm : {Algorithm::attention2d, Algorithm::attention2d_overlap}) {
        Plan plan = default_plan(algorithm, p, 16);
        ASSERT_EQ(plan.grid.describe(), "4x4");
        const double bound = 4.0 * seq * dim / 4.0 * (1.0 + 2.0 / dim);
        for (int rank = 0; rank < 16; ++rank) {
          const Traffic forward = predicted_total(predict_traffic(p, plan, rank), "forward");
          const double words_per_head = forward.bytes / 4.0 / p.heads;
          EXPECT_LE(words_per_head, bound) << "rank " << rank << " N=" << seq << " D=" << dim;
        }
      }
    }
  }
}

}  // namespace
}  // namespace a2d
