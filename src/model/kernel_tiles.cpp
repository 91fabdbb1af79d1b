// The work the CPU kernels really do. The backward skips a (query tile, key tile) pair only when
// the mask hides the whole pair and computes every other pair whole; the forward skips hidden
// (panel, key tile) pairs and trims a partly visible one to the 4-key blocks between its first
// and last visible block. The unmasked FLOPs the
// rest of the model (and every report) counts leave out the masked part of partly visible
// tiles, which is large when a kernel call's rows come in short runs far apart (the chunks of a
// zigzag shard: N / 2P rows each) or interleave positions. This file replays the kernel calls
// of a plan with their positions and counts the tiles, so the model charges what the kernels
// compute (docs/cost-model.md, "Kernel tiles").
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "model/model_internal.hpp"
#include "table/table.hpp"

namespace a2d {
using model::Calls;

std::vector<int64_t> model::sorted(std::vector<int64_t> positions) {
  std::sort(positions.begin(), positions.end());
  return positions;
}

std::vector<int64_t> model::slice(const std::vector<int64_t>& positions, int64_t begin,
                                  int64_t count) {
  return {positions.begin() + begin, positions.begin() + begin + count};
}

namespace {

struct Span {
  int64_t min, max;
};

// Least and largest position of each run of `tile` consecutive rows.
std::vector<Span> tile_spans(const std::vector<int64_t>& positions, int64_t tile) {
  std::vector<Span> spans;
  const int64_t n = static_cast<int64_t>(positions.size());
  for (int64_t begin = 0; begin < n; begin += tile) {
    const auto first = positions.begin() + begin;
    const auto last = positions.begin() + std::min(n, begin + tile);
    const auto [lo, hi] = std::minmax_element(first, last);
    spans.push_back({*lo, *hi});
  }
  return spans;
}

// Ranks whose calls are replayed: the corners and middles of the grid (ATTENTION2D) or of the
// ring, where the busiest rank of every layout lies.
std::vector<int> tile_sample(const Problem& problem, const Plan& plan) {
  std::set<int> ranks;
  if (problem.mask.balance() == MaskBalance::interleaved) {
    // Documents and ranges place work anywhere: every rank.
    for (int rank = 0; rank < plan.grid.size(); ++rank)
      ranks.insert(rank);
    return {ranks.begin(), ranks.end()};
  }
  const int rows = plan.grid.rows, cols = plan.grid.cols;
  for (const int r : {0, rows / 2, rows - 1})
    for (const int c : {0, cols / 2, cols - 1})
      ranks.insert(c * rows + r);  // world rank of p(r, c): columns hold consecutive ranks
  return {ranks.begin(), ranks.end()};
}

}  // namespace

double forward_tile_entries(const Mask& mask, const std::vector<int64_t>& q,
                            const std::vector<int64_t>& k) {
  const std::vector<Span> panels = tile_spans(q, kCpuForwardPanel);
  const std::vector<Span> blocks = tile_spans(k, kCpuForwardKeyStep);
  const int64_t keys = static_cast<int64_t>(k.size());
  double entries = 0;
  for (int64_t begin = 0; begin < keys; begin += kCpuForwardTileK) {
    const int64_t cols = std::min(kCpuForwardTileK, keys - begin);
    const int64_t first_block = begin / kCpuForwardKeyStep;
    const int64_t block_count = (cols + kCpuForwardKeyStep - 1) / kCpuForwardKeyStep;
    const auto [lo, hi] = std::minmax_element(k.begin() + begin, k.begin() + begin + cols);
    for (const Span& panel : panels) {
      const BlockVisibility visibility = classify_block(mask, panel.min, panel.max, *lo, *hi);
      if (visibility == BlockVisibility::hidden) continue;
      int64_t first = 0, last = block_count;
      if (visibility == BlockVisibility::partial) {
        // The kernel trims hidden 4-key blocks at both ends of a partly visible tile.
        const auto hidden = [&](int64_t b) {
          const Span& block = blocks[static_cast<size_t>(first_block + b)];
          return classify_block(mask, panel.min, panel.max, block.min, block.max) ==
                 BlockVisibility::hidden;
        };
        while (first < last && hidden(first))
          ++first;
        while (last > first && hidden(last - 1))
          --last;
      }
      entries += static_cast<double>(kCpuForwardPanel * (std::min(last * kCpuForwardKeyStep, cols) -
                                                         first * kCpuForwardKeyStep));
    }
  }
  return entries;
}

double backward_tile_entries(const Mask& mask, const std::vector<int64_t>& q,
                             const std::vector<int64_t>& k) {
  const std::vector<Span> q_tiles = tile_spans(q, kCpuBackwardTileQ);
  const std::vector<Span> k_tiles = tile_spans(k, kCpuBackwardTileK);
  double pairs = 0;
  for (const Span& kt : k_tiles)
    for (const Span& qt : q_tiles)
      if (classify_block(mask, qt.min, qt.max, kt.min, kt.max) != BlockVisibility::hidden) ++pairs;
  return pairs * static_cast<double>(kCpuBackwardTileQ * kCpuBackwardTileK);
}

ForwardCallCosts fit_forward_call_costs(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                        const std::vector<double>& seconds) {
  A2D_REQUIRE(shapes.size() == seconds.size() && shapes.size() >= 3,
              "fitting the forward's per-call costs needs a time for each of at least 3 shapes");
  std::vector<std::array<double, 3>> features;
  for (const auto& [rows, keys] : shapes) {
    std::vector<int64_t> q(static_cast<size_t>(rows)), k(static_cast<size_t>(keys));
    std::iota(q.begin(), q.end(), int64_t{0});
    std::iota(k.begin(), k.end(), int64_t{0});
    features.push_back({forward_tile_entries(Mask::none(), q, k),
                        static_cast<double>((rows + kCpuForwardPanel - 1) / kCpuForwardPanel),
                        static_cast<double>(keys)});
  }
  std::array<bool, 3> used = {true, true, true};
  std::array<double, 3> x = {0, 0, 0};
  for (int attempt = 0; attempt < 3; ++attempt) {
    // Normal equations of the weighted problem (each equation divided by its time); an unknown
    // no longer in use is pinned to 0.
    double m[3][3] = {}, b[3] = {};
    for (size_t i = 0; i < shapes.size(); ++i) {
      A2D_REQUIRE(seconds[i] > 0, "a timed call took no time");
      const double w = 1.0 / (seconds[i] * seconds[i]);
      for (int r = 0; r < 3; ++r) {
        if (!used[r]) continue;
        b[r] += w * features[i][r] * seconds[i];
        for (int c = 0; c < 3; ++c)
          if (used[c]) m[r][c] += w * features[i][r] * features[i][c];
      }
    }
    for (int r = 0; r < 3; ++r)
      if (!used[r]) m[r][r] = 1;
    // Gaussian elimination with partial pivoting.
    for (int col = 0; col < 3; ++col) {
      int pivot = col;
      for (int r = col + 1; r < 3; ++r)
        if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
      std::swap(m[col], m[pivot]);
      std::swap(b[col], b[pivot]);
      if (m[col][col] == 0) return {};  // shapes that cannot separate the costs
      for (int r = col + 1; r < 3; ++r) {
        const double f = m[r][col] / m[col][col];
        for (int c = col; c < 3; ++c)
          m[r][c] -= f * m[col][c];
        b[r] -= f * b[col];
      }
    }
    for (int r = 2; r >= 0; --r) {
      double v = b[r];
      for (int c = r + 1; c < 3; ++c)
        v -= m[r][c] * x[static_cast<size_t>(c)];
      x[static_cast<size_t>(r)] = v / m[r][r];
    }
    bool dropped = false;
    for (int r = 1; r < 3; ++r) {
      if (used[r] && x[static_cast<size_t>(r)] < 0) {
        used[r] = false;
        dropped = true;
      }
    }
    if (!dropped) break;
  }
  if (!(x[0] > 0)) return {};
  return {x[0], used[1] ? x[1] : 0.0, used[2] ? x[2] : 0.0};
}

ForwardCallCosts forward_call_costs(const Machine& machine, int64_t head_dim) {
  if (machine.tile_block <= 0) return {};
  std::vector<int64_t> block(static_cast<size_t>(machine.tile_block));
  std::iota(block.begin(), block.end(), int64_t{0});
  const double square = static_cast<double>(machine.tile_block * machine.tile_block);
  const double per_entry = 4.0 * static_cast<double>(head_dim);
  const double block_s = per_entry * square / machine.kernel_forward_flops;  // one head
  const double block_panels =
      static_cast<double>((machine.tile_block + kCpuForwardPanel - 1) / kCpuForwardPanel);
  const double block_keys = static_cast<double>(machine.tile_block);
  double panel_s = machine.kernel_forward_panel_s, key_s = machine.kernel_forward_key_s;
  if (block_panels * panel_s + block_keys * key_s >= block_s) panel_s = key_s = 0;
  const double entry_s = (block_s - block_panels * panel_s - block_keys * key_s) /
                         forward_tile_entries(Mask::none(), block, block);
  return {entry_s, panel_s, key_s};
}

namespace {
// Tile pairs of every call a rank makes (heads included).
TileEntries rank_tile_entries(const Problem& problem, const Plan& plan, const SequenceParts& parts,
                              int rank) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  A2D_REQUIRE(entry.kernel_calls, "no kernel calls for ", algorithm_name(plan.algorithm));
  const Calls calls = entry.kernel_calls(problem, plan, parts, rank, false);
  double forward = 0, backward = 0, panels = 0, keys = 0;
  const bool own_backward = entry.backward_calls_differ;
  const Calls split = own_backward ? entry.kernel_calls(problem, plan, parts, rank, true) : Calls{};
  for (const auto& [q, k] : (own_backward ? split : calls).calls)
    backward += backward_tile_entries(problem.mask, q, k);
  for (const auto& [q, k] : calls.calls) {
    forward += forward_tile_entries(problem.mask, q, k);
    panels += static_cast<double>((static_cast<int64_t>(q.size()) + kCpuForwardPanel - 1) /
                                  kCpuForwardPanel);
    keys += static_cast<double>(k.size());
  }
  const double heads = static_cast<double>(calls.heads);
  return {forward * heads, backward * heads, panels * heads, keys * heads};
}

// Tile pairs of the busiest call pattern, estimated before any position is generated.
double tile_estimate(const Problem& problem, const Plan& plan) {
  const double n = static_cast<double>(problem.seq);
  const double per_rank =
      algorithm_entry(plan.algorithm).whole_sequence_calls ? 1.0 : plan.grid.size();
  return (n / kCpuBackwardTileQ + 1) * (n / kCpuBackwardTileK + 1) / per_rank + n;
}

SequenceParts parts_of(const Problem& problem, const Plan& plan) {
  return algorithm_entry(plan.algorithm).calls_need_parts ? sequence_parts(problem, plan)
                                                          : SequenceParts{};
}
}  // namespace

TileEntries busiest_tile_entries(const Problem& problem, const Plan& plan) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.group_plan) {
    return busiest_tile_entries(entry.group_problem(problem, plan), entry.group_plan(plan));
  }
  const std::vector<int> sample = tile_sample(problem, plan);
  if (tile_estimate(problem, plan) * static_cast<double>(sample.size()) > 5e6) return {-1, -1};
  const SequenceParts parts = parts_of(problem, plan);
  TileEntries busiest;
  for (const int rank : sample) {
    const TileEntries e = rank_tile_entries(problem, plan, parts, rank);
    busiest.forward = std::max(busiest.forward, e.forward);
    busiest.backward = std::max(busiest.backward, e.backward);
    busiest.forward_panels = std::max(busiest.forward_panels, e.forward_panels);
    busiest.forward_keys = std::max(busiest.forward_keys, e.forward_keys);
  }
  return busiest;
}

TileBalance tile_balance(const Problem& problem, const Plan& plan) {
  // Every group computes the same tiles (the hybrid's heads groups, on their own heads).
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.group_plan) {
    return tile_balance(entry.group_problem(problem, plan), entry.group_plan(plan));
  }
  const int ranks = plan.grid.size();
  if (tile_estimate(problem, plan) * ranks > 5e7) return {};
  const SequenceParts parts = parts_of(problem, plan);
  TileBalance out;
  for (int rank = 0; rank < ranks; ++rank) {
    const TileEntries e = rank_tile_entries(problem, plan, parts, rank);
    out.busiest_forward = std::max(out.busiest_forward, e.forward);
    out.busiest_backward = std::max(out.busiest_backward, e.backward);
    out.mean_forward += e.forward / ranks;
    out.mean_backward += e.backward / ranks;
  }
  return out;
}

}  // namespace a2d
