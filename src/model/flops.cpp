// Unmasked work per rank in closed form. Every count is a sum over a rank's query positions of
// the number of keys the mask lets it see among the keys it holds; the query positions of every
// layout are unions of arithmetic progressions, every mask is a union of pieces (a rectangle cut
// to a band of diagonals, Mask::pieces), and within a piece the visible-key count is a floor of a
// linear function of the position, so each sum is a closed form or a floor_sum.
#include <algorithm>
#include <numeric>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/layout.hpp"
#include "model/model_internal.hpp"
#include "table/table.hpp"

namespace a2d {
using model::flops;
using model::total_pairs;
using model::Wide;

// sum_{i=0}^{n-1} floor((a i + b) / m) for n >= 0, m >= 1, a >= 0, b >= 0 (the classic
// Euclid-like recursion; O(log) steps).
Wide model::floor_sum(Wide n, Wide m, Wide a, Wide b) {
  Wide total = 0;
  while (n > 0) {
    if (a >= m) {
      total += (n - 1) * n / 2 * (a / m);
      a %= m;
    }
    if (b >= m) {
      total += n * (b / m);
      b %= m;
    }
    const Wide y_max = a * n + b;
    if (y_max < m) break;
    n = y_max / m;
    b = y_max % m;
    std::swap(m, a);
  }
  return total;
}

namespace {
using model::ceil_div;
using model::floor_sum;

// Keys t = key_class (mod modulus) with 0 <= t <= x, for x >= -1.
Wide class_up_to(Wide x, Wide key_class, Wide modulus) {
  return x < 0 ? 0 : (x + modulus - key_class) / modulus;
}
// sum_{i < count} class_up_to(first + i * step), for first >= -1.
Wide sum_class_up_to(Wide count, Wide first, Wide step, Wide key_class, Wide modulus) {
  if (count <= 0) return 0;
  return floor_sum(count, modulus, step, first + modulus - key_class);
}

// First index i >= 0 with first + i step >= x, and last index with first + i step <= y (-1 if
// none).
Wide first_index_at_least(Wide x, Wide first, Wide step) {
  return x <= first ? 0 : ceil_div(x - first, step);
}
Wide last_index_at_most(Wide y, Wide first, Wide step) {
  return y < first ? -1 : (y - first) / step;
}

// The visible pairs of one piece of the mask (mask.hpp: q in [q0, q1), k in [k0, k1), lo <= k - q
// <= hi): per query q of the progression, the keys of the class in [max(k0, q + lo), min(k1 - 1, q
// + hi)]. Both ends are a constant or q plus a constant, switching at one query each, so the sum
// is at most four sums of class_up_to over sub-progressions: closed forms and floor_sums.
Wide piece_vs_class(const MaskPiece& piece, Wide first, Wide step, Wide count, Wide key_class,
                    Wide modulus) {
  const Wide q0 = piece.q0, q1 = piece.q1, k0 = piece.k0, k1 = piece.k1;
  const Wide lo = piece.lo, hi = piece.hi;
  if (k1 <= k0 || q1 <= q0 || hi < lo) return 0;
  // Queries whose interval is not empty: q + hi >= k0 and q + lo <= k1 - 1.
  const Wide q_low = std::max(q0, k0 - hi), q_high = std::min(q1 - 1, k1 - 1 - lo);
  const Wide i_begin = first_index_at_least(q_low, first, step);
  const Wide i_end = std::min(count, last_index_at_most(q_high, first, step) + 1);
  if (i_end <= i_begin) return 0;
  const auto keys_up_to = [&](Wide x) { return class_up_to(x, key_class, modulus); };
  // sum over i in [b, e) of class_up_to(first + i step + offset), first + b step + offset >= -1.
  const auto sum_shifted = [&](Wide b, Wide e, Wide offset) {
    return e <= b ? Wide{0}
                  : sum_class_up_to(e - b, first + b * step + offset, step, key_class, modulus);
  };
  // Upper end q + hi while q <= k1 - 1 - hi, then k1 - 1.
  const Wide upper_split =
      std::clamp(last_index_at_most(k1 - 1 - hi, first, step) + 1, i_begin, i_end);
  // Lower end k0 while q < k0 - lo, then q + lo.
  const Wide lower_split = std::clamp(first_index_at_least(k0 - lo, first, step), i_begin, i_end);
  const Wide upper =
      sum_shifted(i_begin, upper_split, hi) + (i_end - upper_split) * keys_up_to(k1 - 1);
  const Wide lower =
      (lower_split - i_begin) * keys_up_to(k0 - 1) + sum_shifted(lower_split, i_end, lo - 1);
  return upper - lower;
}

}  // namespace

Wide model::progression_vs_class(const Mask& mask, Wide n_tokens, Wide first, Wide step, Wide count,
                                 Wide key_class, Wide modulus) {
  if (count <= 0 || key_class >= n_tokens) return 0;
  if (!mask.hides_pairs()) return count * ceil_div(n_tokens - key_class, modulus);
  const Wide last_query = first + (count - 1) * step;
  Wide total = 0;
  for (const MaskPiece& piece : mask.pieces(static_cast<int64_t>(n_tokens))) {
    if (piece.q1 <= first || piece.q0 > last_query) continue;
    total += piece_vs_class(piece, first, step, count, key_class, modulus);
  }
  return total;
}

Wide model::progression_vs_all(const Mask& mask, Wide n_tokens, Wide first, Wide step, Wide count) {
  return progression_vs_class(mask, n_tokens, first, step, count, 0, 1);
}

std::vector<model::Progression> model::part_progressions(const TokenLayout& layout, int64_t part) {
  std::vector<Progression> runs;
  const int64_t n = layout.count(part);
  if (n == 0) return runs;
  const int64_t slot = layout.slot(part);  // the part of the plain layout (layout.hpp)
  switch (layout.kind()) {
    case LayoutKind::contiguous:
      runs.push_back({layout.token_at(part, 0), 1, n});
      break;
    case LayoutKind::zigzag: {
      // Chunks `slot` and 2P - 1 - slot of 2P near-equal chunks (layout.hpp).
      const int64_t chunks = 2 * layout.parts();
      const int64_t base = layout.tokens() / chunks, extra = layout.tokens() % chunks;
      for (const int64_t chunk : {slot, chunks - 1 - slot}) {
        const int64_t size = base + (chunk < extra ? 1 : 0);
        if (size > 0) runs.push_back({chunk * base + std::min(chunk, extra), 1, size});
      }
      break;
    }
    case LayoutKind::cyclic:
    case LayoutKind::striped: {
      // Offset j inside the stripe: positions slot * w + j + k * w * P.
      const int64_t w = layout.stripe(), round = w * layout.parts();
      for (int64_t j = 0; j < std::min(w, n); ++j) {
        const int64_t first = slot * w + j;
        if (first >= layout.tokens()) break;
        runs.push_back({first, round, (layout.tokens() - first + round - 1) / round});
      }
      break;
    }
  }
  return runs;
}

double model::flops(const Problem& p, Wide pairs_all_heads) {
  return 4.0 * static_cast<double>(pairs_all_heads) * static_cast<double>(p.head_dim * p.batch);
}

Wide model::total_pairs(const Problem& p) {
  return progression_vs_all(p.mask, p.seq, 0, 1, p.seq);
}

double model::sequence_rank_flops(const Problem& p, const Plan& plan, int rank) {
  const TokenLayout layout(plan.layout, p.seq, plan.grid.size(), plan.stripe);
  Wide pairs = 0;
  for (const Progression& run : part_progressions(layout, rank)) {
    pairs += progression_vs_all(p.mask, p.seq, run.first, run.step, run.count);
  }
  return flops(p, pairs * p.heads);
}

double rank_forward_flops(const Problem& p, const Plan& plan, int rank) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.group_plan) {
    return rank_forward_flops(entry.group_problem(p, plan), entry.group_plan(plan),
                              entry.group_rank(plan, rank));
  }
  return entry.rank_flops(p, plan, rank);
}

double busiest_forward_flops(const Problem& p, const Plan& plan) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.group_plan) {
    return busiest_forward_flops(entry.group_problem(p, plan), entry.group_plan(plan));
  }
  const int ranks = plan.grid.size();
  std::vector<int> sample;
  if (p.mask.balance() == MaskBalance::interleaved) {
    // Documents and ranges place work anywhere: every rank is evaluated (each in O(pieces) steps).
    for (int rank = 0; rank < ranks; ++rank)
      sample.push_back(rank);
  } else if (entry.flops_sample) {
    sample = entry.flops_sample(plan);
  } else {
    for (int rank = 0; rank < ranks; rank += std::max(1, ranks / 128))
      sample.push_back(rank);
    sample.push_back(ranks - 1);
  }
  double busiest = 0;
  for (const int rank : sample)
    busiest = std::max(busiest, entry.rank_flops(p, plan, rank));
  if (entry.critical_flops) busiest = std::max(busiest, entry.critical_flops(p, plan));
  return busiest;
}

double flops_balance(const Problem& p, const Plan& plan) {
  const double mean = flops(p, total_pairs(p) * p.heads) / plan.ranks();
  return mean > 0 ? busiest_forward_flops(p, plan) / mean : 1.0;
}

}  // namespace a2d
