#include "attention2d/decomposition.hpp"

#include <numeric>

namespace a2d {

int64_t Attention2DRank::q_rows() const {
  return std::accumulate(row_counts.begin(), row_counts.end(), int64_t{0});
}
int64_t Attention2DRank::kv_rows() const {
  return std::accumulate(col_counts.begin(), col_counts.end(), int64_t{0});
}

Attention2DRank attention2d_rank(const Problem& problem, const Plan& plan, int rank) {
  const GridShape& shape = plan.grid;
  const GridCoords at{shape, rank};
  const TokenLayout layout(LayoutKind::cyclic, problem.seq, shape.size());
  Attention2DRank out;
  out.rank = rank;
  out.row = at.row();
  out.col = at.col();
  out.own_tokens = layout.count(rank);
  for (int c = 0; c < shape.cols; ++c) out.row_parts.push_back(GridCoords::rank_of(shape, out.row, c));
  // With the transpose, p(r', c) holds cyclic part r' * C + c (tokens t = c mod C over the
  // column); without it, the part it started with.
  for (int r = 0; r < shape.rows; ++r) {
    out.col_parts.push_back(plan.kv_transpose ? r * shape.cols + out.col
                                              : GridCoords::rank_of(shape, r, out.col));
  }
  for (const int part : out.row_parts) {
    out.row_counts.push_back(layout.count(part));
    for (const int64_t t : layout.tokens_of(part)) out.q_positions.push_back(t);
  }
  for (const int part : out.col_parts) {
    out.col_counts.push_back(layout.count(part));
    for (const int64_t t : layout.tokens_of(part)) out.kv_positions.push_back(t);
  }
  out.kv_source = plan.kv_transpose ? at.kv_source_rank() : rank;
  out.kv_dest = plan.kv_transpose ? at.kv_dest_rank() : rank;
  return out;
}

int64_t attention2d_unmasked_pairs(const Problem& problem, const Plan& plan, int rank) {
  const Attention2DRank work = attention2d_rank(problem, plan, rank);
  return count_visible_pairs(problem.mask, work.q_positions.data(), work.q_rows(),
                             work.kv_positions.data(), work.kv_rows());
}

}  // namespace a2d
