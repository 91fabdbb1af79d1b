// The time of one kernel call on a machine: the per-call form of predict()'s compute terms, for
// the simulated device (src/backends/sim/), which charges every call the engine makes. Summed over
// a rank's calls it is predict()'s C_f and C_b for that rank (docs/cost-model.md, section 3).
#include <span>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"

namespace a2d {

namespace {
std::vector<int64_t> positions_or_iota(std::span<const int64_t> given, int64_t count) {
  if (!given.empty()) return {given.begin(), given.end()};
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    out[static_cast<size_t>(i)] = i;
  return out;
}
}  // namespace

double kernel_call_seconds(const Machine& machine, const KernelCall& call) {
  A2D_REQUIRE(call.q_tokens >= 0 && call.kv_tokens >= 0 && call.batch >= 1 && call.heads >= 1 &&
                  call.head_dim >= 1,
              "kernel_call_seconds: a call of ", call.q_tokens, " x ", call.kv_tokens,
              " tokens, batch ", call.batch, ", ", call.heads, " heads of ", call.head_dim);
  A2D_REQUIRE(
      call.q_positions.empty() || static_cast<int64_t>(call.q_positions.size()) == call.q_tokens,
      "kernel_call_seconds: ", call.q_positions.size(), " query positions for ", call.q_tokens,
      " tokens");
  A2D_REQUIRE(
      call.kv_positions.empty() || static_cast<int64_t>(call.kv_positions.size()) == call.kv_tokens,
      "kernel_call_seconds: ", call.kv_positions.size(), " key positions for ", call.kv_tokens,
      " tokens");
  if (call.q_tokens == 0 || call.kv_tokens == 0) return 0.0;
  const double batch_heads = static_cast<double>(call.batch * call.heads);
  const double per_pair = 4.0 * static_cast<double>(call.head_dim);
  if (machine.tile_block > 0) {
    // The CPU kernels: the tiles they compute, as predict() charges them (cost_model.cpp).
    const std::vector<int64_t> q = positions_or_iota(call.q_positions, call.q_tokens);
    const std::vector<int64_t> k = positions_or_iota(call.kv_positions, call.kv_tokens);
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
  const int64_t pairs = count_visible_pairs(
      call.mask, call.q_positions.empty() ? nullptr : call.q_positions.data(), call.q_tokens,
      call.kv_positions.empty() ? nullptr : call.kv_positions.data(), call.kv_tokens);
  const bool causal = call.mask.is_causal();
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
