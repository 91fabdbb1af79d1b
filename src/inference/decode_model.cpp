// The cost model of a decode step (inference.hpp, docs/inference.md): the two collectives of
// decode_step_traffic under the alpha-beta model, the merge's reduction rate, and the kernel of
// T queries against the busiest rank's cache at the machine's forward rates (the CPU kernels by
// their tiles, panels and keys, as predict() charges a forward call).
#include <algorithm>
#include <numeric>
#include <queue>

#include "attention2d/error.hpp"
#include "attention2d/inference.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d {
namespace {

// The positions rank `rank` caches once `appended` tokens have followed the prompt (replaying
// append_owners one token at a time), and every rank's counts.
std::vector<int64_t> replay_positions(const TokenLayout& layout, int64_t appended, int rank,
                                      std::vector<int64_t>& counts) {
  const int64_t ranks = layout.parts();
  counts.assign(static_cast<size_t>(ranks), 0);
  for (int64_t r = 0; r < ranks; ++r)
    counts[static_cast<size_t>(r)] = layout.count(r);
  std::vector<int64_t> positions = layout.tokens_of(rank);
  using Entry = std::pair<int64_t, int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> least;
  for (int64_t r = 0; r < ranks; ++r)
    least.emplace(counts[static_cast<size_t>(r)], r);
  for (int64_t i = 0; i < appended; ++i) {
    auto [count, owner] = least.top();
    least.pop();
    least.emplace(count + 1, owner);
    ++counts[static_cast<size_t>(owner)];
    if (owner == rank) positions.push_back(layout.tokens() + i);
  }
  return positions;
}

// Seconds of one forward kernel call of `q` queries against `k` keys (positions), per predict()'s
// charging of a forward call: unmasked FLOPs at the forward rate, or on CPUs (tile_block > 0)
// the tiles the kernel computes plus its per-panel and per-key costs.
double kernel_seconds(const Problem& problem, const Machine& machine, const std::vector<int64_t>& q,
                      const std::vector<int64_t>& k) {
  if (k.empty() || q.empty()) return 0;
  const double heads = static_cast<double>(problem.heads);
  const double batch = static_cast<double>(problem.batch);
  const double per_entry = 4.0 * static_cast<double>(problem.head_dim);
  if (machine.tile_block > 0) {
    const ForwardCallCosts call = forward_call_costs(machine, problem.head_dim);
    const double panels = static_cast<double>(
        (static_cast<int64_t>(q.size()) + kCpuForwardPanel - 1) / kCpuForwardPanel);
    return batch * heads *
           (call.entry_s * forward_tile_entries(problem.mask, q, k) + call.panel_s * panels +
            call.key_s * static_cast<double>(k.size()));
  }
  const double rate = problem.mask.masks_by_position() && machine.kernel_forward_causal_flops > 0
                          ? machine.kernel_forward_causal_flops
                          : machine.kernel_forward_flops;
  const double pairs = static_cast<double>(
      count_visible_pairs(problem.mask, q.data(), static_cast<int64_t>(q.size()), k.data(),
                          static_cast<int64_t>(k.size())));
  return batch * heads * per_entry * pairs / rate;
}

double collective_seconds(const Traffic& t, const Link& link, const Machine& machine,
                          double reduce_bytes_per_s) {
  if (t.messages == 0) return 0;
  return static_cast<double>(t.messages) * link.latency_s +
         static_cast<double>(t.bytes) / link.bytes_per_s + machine.sync_s +
         (reduce_bytes_per_s > 0 ? static_cast<double>(t.bytes) / reduce_bytes_per_s : 0.0);
}

}  // namespace

DecodePrediction predict_decode_step(const Problem& prompt, const Plan& plan,
                                     const Machine& machine, int ranks_per_node,
                                     int64_t cached_tokens, int64_t tokens_per_step) {
  check_decodable(prompt);
  A2D_REQUIRE(cached_tokens >= prompt.seq, "the cache holds at least the prompt (", prompt.seq,
              " tokens), not ", cached_tokens);
  const int ranks = plan.grid.size();
  const TokenLayout layout(plan.layout, prompt.seq, ranks, plan.stripe);
  const int64_t appended = cached_tokens - prompt.seq;

  std::vector<int64_t> counts;
  replay_positions(layout, appended, 0, counts);
  const DecodeStep step = plan_decode_step(counts, tokens_per_step);
  // The busiest kernel: the rank with the most keys after the append.
  int busiest = 0;
  for (int r = 1; r < ranks; ++r) {
    const auto a = static_cast<size_t>(r), b = static_cast<size_t>(busiest);
    if (counts[a] + step.counts[a] > counts[b] + step.counts[b]) busiest = r;
  }
  std::vector<int64_t> keys = replay_positions(layout, appended, busiest, counts);
  const std::vector<int64_t> mine = step.positions_of(busiest);
  keys.insert(keys.end(), mine.begin(), mine.end());

  DecodePrediction out;
  out.cache_tokens = *std::max_element(counts.begin(), counts.end());
  out.cache_bytes = out.cache_tokens * prompt.batch * prompt.kv_heads * 2 * prompt.head_dim *
                    dtype_bytes(prompt.dtype);
  out.kernel_s = kernel_seconds(prompt, machine, step.positions, keys);

  // The collectives are rings over all ranks: across nodes as soon as the job spans several.
  const Link& link = ranks > std::max(ranks_per_node, 1) ? machine.inter : machine.intra;
  double gather_s = 0, merge_s = 0;
  for (int r = 0; r < ranks; ++r) {
    const DecodeTraffic t = decode_step_traffic(prompt, step.counts, r);
    gather_s = std::max(gather_s, collective_seconds(t.q_allgather, link, machine, 0));
    merge_s =
        std::max(merge_s, collective_seconds(t.merge, link, machine, machine.merge_bytes_per_s));
    const Traffic total = t.total();
    if (total.bytes > out.traffic.bytes) out.traffic.bytes = total.bytes;
    out.traffic.messages = std::max(out.traffic.messages, total.messages);
  }
  out.comm_s = gather_s + merge_s;
  out.step_s = out.kernel_s + out.comm_s;
  return out;
}

}  // namespace a2d
