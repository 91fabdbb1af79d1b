#include "attention2d/decomposition.hpp"

#include <algorithm>
#include <numeric>

#include "attention2d/error.hpp"

namespace a2d {

int64_t Attention2DRank::q_rows() const {
  return std::accumulate(row_counts.begin(), row_counts.end(), int64_t{0});
}
int64_t Attention2DRank::kv_rows() const {
  return std::accumulate(col_counts.begin(), col_counts.end(), int64_t{0});
}

Attention2DRank attention2d_rank(const Problem& problem, const Plan& plan, int rank,
                                 bool with_positions) {
  const GridShape& shape = plan.grid;
  const GridCoords at{shape, rank};
  const TokenLayout layout(LayoutKind::cyclic, problem.seq, shape.size());
  Attention2DRank out;
  out.rank = rank;
  out.row = at.row();
  out.col = at.col();
  out.own_tokens = layout.count(rank);
  for (int c = 0; c < shape.cols; ++c)
    out.row_parts.push_back(GridCoords::rank_of(shape, out.row, c));
  // With the transpose, p(r', c) holds cyclic part r' * C + c (tokens t = c mod C over the
  // column); without it, the part it started with.
  for (int r = 0; r < shape.rows; ++r) {
    out.col_parts.push_back(plan.kv_transpose ? r * shape.cols + out.col
                                              : GridCoords::rank_of(shape, r, out.col));
  }
  for (const int part : out.row_parts) {
    out.row_counts.push_back(layout.count(part));
    if (!with_positions) continue;
    for (const int64_t t : layout.tokens_of(part))
      out.q_positions.push_back(t);
  }
  for (const int part : out.col_parts) {
    out.col_counts.push_back(layout.count(part));
    if (!with_positions) continue;
    for (const int64_t t : layout.tokens_of(part))
      out.kv_positions.push_back(t);
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

const int64_t* SequenceParts::positions_of(int part) const {
  return positions.data() + offsets[static_cast<size_t>(part)];
}

SequenceParts sequence_parts(const Problem& problem, const Plan& plan, bool with_positions) {
  const int ranks = plan.grid.size();
  const TokenLayout layout(plan.layout, problem.seq, ranks, plan.stripe);
  SequenceParts out;
  out.offsets.push_back(0);
  for (int part = 0; part < ranks; ++part) {
    out.counts.push_back(layout.count(part));
    out.offsets.push_back(out.offsets.back() + out.counts.back());
    if (!with_positions) continue;
    for (const int64_t t : layout.tokens_of(part))
      out.positions.push_back(t);
  }
  return out;
}

int ring_part_at(int ranks, int rank, int step) {
  return ((rank - step) % ranks + ranks) % ranks;
}

namespace {
int64_t pairs_between(const Problem& problem, const SequenceParts& parts, int q_part, int kv_part) {
  return count_visible_pairs(problem.mask, parts.positions_of(q_part),
                             parts.counts[static_cast<size_t>(q_part)], parts.positions_of(kv_part),
                             parts.counts[static_cast<size_t>(kv_part)]);
}
}  // namespace

int64_t ring_step_unmasked_pairs(const Problem& problem, const Plan& plan, int rank, int step) {
  const SequenceParts parts = sequence_parts(problem, plan);
  return pairs_between(problem, parts, rank, ring_part_at(parts.parts(), rank, step));
}

int64_t sequence_parallel_unmasked_pairs(const Problem& problem, const Plan& plan, int rank) {
  const SequenceParts parts = sequence_parts(problem, plan);
  return count_visible_pairs(problem.mask, parts.positions_of(rank),
                             parts.counts[static_cast<size_t>(rank)], parts.positions.data(),
                             problem.seq);
}

int64_t ring_critical_path_pairs(const Problem& problem, const Plan& plan) {
  const SequenceParts parts = sequence_parts(problem, plan);
  const int ranks = parts.parts();
  int64_t path = 0;
  for (int step = 0; step < ranks; ++step) {
    int64_t busiest = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      const int part = ring_part_at(ranks, rank, step);
      busiest = std::max(busiest, pairs_between(problem, parts, rank, part));
    }
    path += busiest;
  }
  return path;
}

UlyssesHeads ulysses_heads(const Problem& problem, int ranks, int rank) {
  A2D_REQUIRE(ranks >= 1 && problem.kv_heads % ranks == 0,
              "Ulysses needs the number of K/V heads (", problem.kv_heads,
              ") to be a multiple of the number of ranks (", ranks, ")");
  UlyssesHeads out;
  out.kv_heads = problem.kv_heads / ranks;
  out.heads = problem.heads / ranks;
  out.first_kv_head = rank * out.kv_heads;
  out.first_head = rank * out.heads;
  return out;
}

WireRecords wire_records(const Problem& problem, int ulysses_ranks) {
  const int64_t d = problem.head_dim, e = dtype_bytes(problem.dtype), f = 4;
  WireRecords w;
  w.q = d * e;
  w.kv = 2 * d * e;
  w.partial = f * (d + 2);
  w.q_backward = 2 * f + 2 * d * e;
  w.dq = f * d;
  w.dkv = 2 * f * d;
  w.dkv_final = 2 * d * e;
  if (ulysses_ranks > 0) set_heads_records(w, problem, ulysses_heads(problem, ulysses_ranks, 0));
  return w;
}

void set_heads_records(WireRecords& w, const Problem& problem, const UlyssesHeads& group) {
  const int64_t d = problem.head_dim, e = dtype_bytes(problem.dtype), f = 4;
  const int64_t hq = group.heads, hkv = group.kv_heads;
  w.ulysses_in = (hq + 2 * hkv) * d * e;
  w.ulysses_out = (f * hq + hq * d * e + f - 1) / f * f;
  w.ulysses_backward_in = 2 * f * hq + (2 * hq + 2 * hkv) * d * e;
  w.ulysses_backward_out = (hq + 2 * hkv) * d * e;
}

HybridRank hybrid_rank(const Plan& plan, int rank) {
  const int s = plan.grid.size();
  return {rank / s, rank % s};
}

int hybrid_world_rank(const Plan& plan, int heads_group, int sequence_group) {
  return sequence_group + plan.grid.size() * heads_group;
}

UlyssesHeads hybrid_heads(const Problem& problem, int heads_parallel, int group) {
  const int64_t u = heads_parallel, hkv = problem.kv_heads;
  A2D_REQUIRE(u >= 1 && problem.heads % u == 0 && (hkv % u == 0 || u % hkv == 0),
              "the hybrid needs --heads-parallel (", u, ") to divide the query heads (",
              problem.heads, ") and to divide or be a multiple of the K/V heads (", hkv, ")");
  UlyssesHeads out;
  out.heads = problem.heads / u;
  out.first_head = group * out.heads;
  out.kv_heads = hkv % u == 0 ? hkv / u : 1;
  out.first_kv_head = hkv % u == 0 ? group * out.kv_heads : group / (u / hkv);
  return out;
}

int64_t hybrid_kv_replication(const Problem& problem, int heads_parallel) {
  return problem.kv_heads % heads_parallel == 0 ? 1 : heads_parallel / problem.kv_heads;
}

Problem hybrid_group_problem(const Problem& problem, const Plan& plan) {
  const UlyssesHeads group = hybrid_heads(problem, plan.heads_parallel, 0);
  Problem inner = problem;
  inner.heads = group.heads;
  inner.kv_heads = group.kv_heads;
  inner.sinks = false;
  return inner;
}

Plan hybrid_group_plan(const Plan& plan) {
  Plan inner = plan;
  inner.algorithm = Algorithm::attention2d;
  inner.layout = LayoutKind::cyclic;
  inner.heads_parallel = 1;
  return inner;
}

std::vector<Plan> hybrid_plans(const Problem& problem, int ranks) {
  std::vector<Plan> plans;
  for (int u = 2; u <= ranks; ++u) {
    if (ranks % u != 0) continue;
    for (const GridShape& shape : grid_shapes(ranks / u)) {
      Plan plan = default_plan(Algorithm::hybrid, problem, ranks);
      plan.heads_parallel = u;
      plan.grid = shape;
      plans.push_back(plan);
    }
  }
  return plans;
}

std::vector<int64_t> hybrid_member_counts(const Problem& problem, const Plan& plan,
                                          int sequence_group) {
  const TokenLayout layout(LayoutKind::cyclic, problem.seq, plan.ranks());
  std::vector<int64_t> counts;
  for (int u = 0; u < plan.heads_parallel; ++u)
    counts.push_back(layout.count(hybrid_world_rank(plan, u, sequence_group)));
  return counts;
}

}  // namespace a2d
