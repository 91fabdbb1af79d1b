// Unmasked work per rank in closed form. Every count is a sum over a rank's query positions of
// the number of keys the mask lets it see among the keys it holds; the query positions of every
// layout are unions of arithmetic progressions, and the visible-key count is either linear in the
// position or a floor of a linear function, so each sum is a closed form or a floor_sum.
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

// The same count under a document mask: per document [a, b) the queries of the progression in
// it against the keys of the class in it, those keys further limited by the causal mask
// (t <= q) and the window (t > q - W); each a closed form or a floor_sum.
Wide documents_vs_class(const Mask& mask, Wide first, Wide step, Wide count, Wide key_class,
                        Wide modulus) {
  const std::vector<int64_t>& offsets = *mask.doc_offsets;
  const Wide last_query = first + (count - 1) * step;
  const int64_t first_doc = mask.document_of(static_cast<int64_t>(first));
  const int64_t last_doc = mask.document_of(static_cast<int64_t>(last_query));
  const auto keys_up_to = [&](Wide x) { return class_up_to(x, key_class, modulus); };
  Wide total = 0;
  for (int64_t d = first_doc; d <= last_doc; ++d) {
    const Wide a = offsets[static_cast<size_t>(d)], b = offsets[static_cast<size_t>(d) + 1];
    const Wide i0 = a <= first ? 0 : ceil_div(a - first, step);
    const Wide i1 = std::min<Wide>(count, ceil_div(b - first, step));  // queries q < b
    if (i1 <= i0) continue;
    const Wide queries = i1 - i0, q0 = first + i0 * step;
    switch (mask.kind) {
      case MaskKind::none:
        total += queries * (keys_up_to(b - 1) - keys_up_to(a - 1));
        break;
      case MaskKind::causal:
        total +=
            sum_class_up_to(queries, q0, step, key_class, modulus) - queries * keys_up_to(a - 1);
        break;
      case MaskKind::causal_window: {
        // Keys in [max(a, q - W + 1), q]: below q - W + 1 the document's start bounds them for
        // q <= a - 1 + W, the window after.
        const Wide w = mask.window;
        const Wide limit = a - 1 + w;
        const Wide near_start = limit < q0 ? 0 : std::min<Wide>(queries, (limit - q0) / step + 1);
        total += sum_class_up_to(queries, q0, step, key_class, modulus) -
                 near_start * keys_up_to(a - 1) -
                 sum_class_up_to(queries - near_start, q0 + near_start * step - w, step, key_class,
                                 modulus);
        break;
      }
    }
  }
  return total;
}

}  // namespace

Wide model::progression_vs_class(const Mask& mask, Wide n_tokens, Wide first, Wide step, Wide count,
                                 Wide key_class, Wide modulus) {
  if (count <= 0 || key_class >= n_tokens) return 0;
  if (mask.has_documents()) return documents_vs_class(mask, first, step, count, key_class, modulus);
  if (mask.kind == MaskKind::none) return count * ceil_div(n_tokens - key_class, modulus);
  // Keys of the class at or below q: F(q) = floor((q + modulus - key_class) / modulus).
  Wide visible = floor_sum(count, modulus, step, first + modulus - key_class);
  if (mask.kind == MaskKind::causal_window) {
    // Minus those at or below q - W, for the queries with q >= W.
    const Wide w = mask.window;
    const Wide skip = first >= w ? 0 : ceil_div(w - first, step);
    if (skip < count) {
      visible -=
          floor_sum(count - skip, modulus, step, first + skip * step - w + modulus - key_class);
    }
  }
  return visible;
}

Wide model::progression_vs_all(const Mask& mask, Wide n_tokens, Wide first, Wide step, Wide count) {
  if (count <= 0) return 0;
  if (mask.has_documents()) return documents_vs_class(mask, first, step, count, 0, 1);
  const auto linear = [&](Wide k) { return k * (first + 1) + step * k * (k - 1) / 2; };  // sum q+1
  switch (mask.kind) {
    case MaskKind::none:
      return count * n_tokens;
    case MaskKind::causal:
      return linear(count);
    case MaskKind::causal_window: {
      // q + 1 while q + 1 <= W, then W.
      const Wide w = mask.window;
      const Wide below = first + 1 > w ? 0 : std::min<Wide>(count, (w - 1 - first) / step + 1);
      return linear(below) + (count - below) * w;
    }
  }
  return 0;
}

std::vector<model::Progression> model::part_progressions(const TokenLayout& layout, int64_t part) {
  std::vector<Progression> runs;
  const int64_t n = layout.count(part);
  if (n == 0) return runs;
  switch (layout.kind()) {
    case LayoutKind::contiguous:
      runs.push_back({layout.token_at(part, 0), 1, n});
      break;
    case LayoutKind::zigzag: {
      // Chunks `part` and 2P - 1 - part of 2P near-equal chunks (layout.hpp).
      const int64_t chunks = 2 * layout.parts();
      const int64_t base = layout.tokens() / chunks, extra = layout.tokens() % chunks;
      for (const int64_t chunk : {part, chunks - 1 - part}) {
        const int64_t size = base + (chunk < extra ? 1 : 0);
        if (size > 0) runs.push_back({chunk * base + std::min(chunk, extra), 1, size});
      }
      break;
    }
    case LayoutKind::cyclic:
    case LayoutKind::striped: {
      // Offset j inside the stripe: positions part * w + j + k * w * P.
      const int64_t w = layout.stripe(), round = w * layout.parts();
      for (int64_t j = 0; j < std::min(w, n); ++j) {
        const int64_t first = part * w + j;
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
  if (p.mask.has_documents()) {
    // Documents place work anywhere: every rank is evaluated (each in O(documents) steps).
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
