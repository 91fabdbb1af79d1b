// The time of one kernel call on a machine: the per-call form of predict()'s compute terms, for
// the simulated device (src/backends/sim/), which charges every call the engine makes. Summed over
// a rank's calls it is predict()'s C_f and C_b for that rank (docs/cost-model.md, section 3).
#include <algorithm>
#include <span>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "model/model_internal.hpp"

namespace a2d {
namespace {
using model::Wide;

int64_t run_total(std::span<const PositionRun> runs) {
  int64_t total = 0;
  for (const PositionRun& r : runs)
    total += r.count;
  return total;
}

std::vector<int64_t> expand(std::span<const PositionRun> runs) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(run_total(runs)));
  for (const PositionRun& r : runs)
    for (int64_t i = 0; i < r.count; ++i)
      out.push_back(r.first + i * r.step);
  return out;
}

// The same positions in increasing order of step (a pair count does not depend on the order).
PositionRun ascending(PositionRun r) {
  if (r.count <= 1) return {r.first, 1, r.count};
  if (r.step < 0) return {r.first + (r.count - 1) * r.step, -r.step, r.count};
  return r;
}

// sum over the queries a_i = a.first + i a.step of #{keys b_j <= a_i - shift}, for a.step >= 0
// and b.step >= 1: the count per query is clamp(floor((a_i - shift - b_0) / b.step) + 1, 0, n_b),
// zero before i_lo, n_b from i_hi on, and a floor sum between.
Wide keys_at_or_below(const PositionRun& a, const PositionRun& b, Wide shift) {
  const Wide na = a.count, nb = b.count, sa = a.step, sb = b.step;
  const Wide c = Wide{a.first} - shift - b.first;
  const auto first_reaching = [&](Wide target) -> Wide {  // least i with c + sa i >= target
    if (c >= target) return 0;
    if (sa == 0) return na;
    return std::min(na, model::ceil_div(target - c, sa));
  };
  const Wide lo = first_reaching(0), hi = std::max(lo, first_reaching((nb - 1) * sb));
  return model::floor_sum(hi - lo, sb, sa, c + sa * lo) + (hi - lo) + nb * (na - hi);
}

// Pairs of a query run and a key run inside the mask's band lo <= k - q <= hi (a band-only mask:
// MaskView::band_only), asked of the mask, whatever its kind: the keys at or below q + hi less
// those at or below q + lo - 1.
Wide run_pairs(const MaskView& band, const PositionRun& q, const PositionRun& k) {
  if (q.count <= 0 || k.count <= 0) return 0;
  const PositionRun a = ascending(q);
  const auto visible = [&](const PositionRun& b) {
    Wide seen = band.hi >= kMaskUnbounded ? Wide{a.count} * b.count
                                          : keys_at_or_below(a, b, -Wide{band.hi});
    if (band.lo > -kMaskUnbounded) seen -= keys_at_or_below(a, b, 1 - Wide{band.lo});
    return seen;
  };
  // Every key at one position: n_k times the pairs of that one key.
  if (k.count > 1 && k.step == 0) return visible({k.first, 1, 1}) * k.count;
  return visible(ascending(k));
}

std::vector<int64_t> positions_of(std::span<const int64_t> positions,
                                  std::span<const PositionRun> runs, int64_t count) {
  if (!positions.empty()) return {positions.begin(), positions.end()};
  if (!runs.empty()) return expand(runs);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    out[static_cast<size_t>(i)] = i;
  return out;
}

void require_count(std::span<const int64_t> positions, std::span<const PositionRun> runs,
                   int64_t tokens, const char* which) {
  const int64_t given = !positions.empty() ? static_cast<int64_t>(positions.size())
                        : !runs.empty()    ? run_total(runs)
                                           : tokens;
  A2D_REQUIRE(given == tokens, "kernel_call_seconds: ", given, " ", which, " positions for ",
              tokens, " tokens");
}
}  // namespace

std::vector<PositionRun> position_runs(std::span<const int64_t> positions) {
  std::vector<PositionRun> runs;
  const size_t n = positions.size();
  for (size_t i = 0; i < n;) {
    if (i + 1 == n) {
      runs.push_back({positions[i], 1, 1});
      break;
    }
    const int64_t step = positions[i + 1] - positions[i];
    size_t j = i + 1;
    while (j + 1 < n && positions[j + 1] - positions[j] == step)
      ++j;
    runs.push_back({positions[i], step, static_cast<int64_t>(j - i + 1)});
    i = j + 1;
  }
  return runs;
}

int64_t count_visible_pairs(const Mask& mask, std::span<const PositionRun> q,
                            std::span<const PositionRun> k) {
  const int64_t nq = run_total(q), nk = run_total(k);
  // Closed forms per pair of runs where the mask's band alone decides, unless there are so many
  // runs that counting position by position is cheaper; documents and range slices are counted
  // position by position by the mask's own rows.
  const MaskView view = mask.view();
  const bool closed =
      view.band_only() && static_cast<double>(q.size()) * static_cast<double>(k.size()) <=
                              4.0 * static_cast<double>(nq + nk) + 16;
  if (!closed) {
    const std::vector<int64_t> qp = expand(q), kp = expand(k);
    return count_visible_pairs(mask, qp.data(), nq, kp.data(), nk);
  }
  Wide pairs = 0;
  for (const PositionRun& a : q)
    for (const PositionRun& b : k)
      pairs += run_pairs(view, a, b);
  return static_cast<int64_t>(pairs);
}

double kernel_call_seconds(const Machine& machine, const KernelCall& call) {
  A2D_REQUIRE(call.q_tokens >= 0 && call.kv_tokens >= 0 && call.batch >= 1 && call.heads >= 1 &&
                  call.head_dim >= 1,
              "kernel_call_seconds: a call of ", call.q_tokens, " x ", call.kv_tokens,
              " tokens, batch ", call.batch, ", ", call.heads, " heads of ", call.head_dim);
  require_count(call.q_positions, call.q_runs, call.q_tokens, "query");
  require_count(call.kv_positions, call.kv_runs, call.kv_tokens, "key");
  if (call.q_tokens == 0 || call.kv_tokens == 0) return 0.0;
  const double batch_heads = static_cast<double>(call.batch * call.heads);
  const double per_pair = 4.0 * static_cast<double>(call.head_dim);
  if (machine.tile_block > 0) {
    // The CPU kernels: the tiles they compute, as predict() charges them (predict.cpp).
    const std::vector<int64_t> q = positions_of(call.q_positions, call.q_runs, call.q_tokens);
    const std::vector<int64_t> k = positions_of(call.kv_positions, call.kv_runs, call.kv_tokens);
    std::vector<int64_t> block(static_cast<size_t>(machine.tile_block));
    for (int64_t i = 0; i < machine.tile_block; ++i)
      block[static_cast<size_t>(i)] = i;
    if (!call.backward) {
      const ForwardCallCosts costs = forward_call_costs(machine, call.head_dim);
      const double panels =
          static_cast<double>((call.q_tokens + kCpuForwardPanel - 1) / kCpuForwardPanel);
      return batch_heads *
             (costs.entry_s * forward_tile_entries(call.mask, q, k) + costs.panel_s * panels +
              costs.key_s * static_cast<double>(call.kv_tokens));
    }
    const double square = static_cast<double>(machine.tile_block * machine.tile_block);
    return 2.5 * batch_heads * per_pair * backward_tile_entries(call.mask, q, k) /
           (machine.kernel_backward_flops * backward_tile_entries(Mask::none(), block, block) /
            square);
  }
  // Accelerators: unmasked FLOPs at the kernel's rate (the published efficiencies include how
  // the kernels handle masks), the causal rate under a causal mask where the machine has one.
  int64_t pairs = 0;
  if (call.q_positions.empty() && call.kv_positions.empty()) {
    const PositionRun q_all{0, 1, call.q_tokens}, k_all{0, 1, call.kv_tokens};
    pairs = count_visible_pairs(
        call.mask, call.q_runs.empty() ? std::span<const PositionRun>(&q_all, 1) : call.q_runs,
        call.kv_runs.empty() ? std::span<const PositionRun>(&k_all, 1) : call.kv_runs);
  } else {
    const std::vector<int64_t> q = positions_of(call.q_positions, call.q_runs, call.q_tokens);
    const std::vector<int64_t> k = positions_of(call.kv_positions, call.kv_runs, call.kv_tokens);
    pairs = count_visible_pairs(call.mask, q.data(), call.q_tokens, k.data(), call.kv_tokens);
  }
  const bool causal = call.mask.masks_by_position();
  if (!call.backward) {
    const double rate = causal && machine.kernel_forward_causal_flops > 0
                            ? machine.kernel_forward_causal_flops
                            : machine.kernel_forward_flops;
    return batch_heads * per_pair * static_cast<double>(pairs) / rate;
  }
  const double rate = causal && machine.kernel_backward_causal_flops > 0
                          ? machine.kernel_backward_causal_flops
                          : machine.kernel_backward_flops;
  return 2.5 * batch_heads * per_pair * static_cast<double>(pairs) / rate;
}

}  // namespace a2d
