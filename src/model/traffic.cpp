// Bytes and messages per rank, phase by phase. The formulas follow the algorithms' schedules and
// the counting convention of comm.hpp (ring charges; empty blocks are not sent); see
// docs/attention2d.md and docs/baselines.md for their derivation and closed forms.
#include <numeric>
#include <vector>

#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/model.hpp"
#include "model/model_internal.hpp"
#include "table/table.hpp"

namespace a2d {

std::vector<int64_t> model::times(const std::vector<int64_t>& tokens, int64_t per_token) {
  std::vector<int64_t> out(tokens);
  for (auto& x : out)
    x *= per_token;
  return out;
}

// Ring Attention and all-gather K/V send the same blocks: every rank's [k v] part once around
// (all but the part of rank + 1, the all-gather ring charge, in the dtype) and, in the backward,
// every part's fp32 dK, dV accumulator except the rank's own (the reduce-scatter ring charge).
// docs/baselines.md.
model::SequenceBlocks model::sequence_parallel_blocks(const Problem& p, const Plan& plan,
                                                      int rank) {
  const SequenceParts parts = sequence_parts(p, plan, /*with_positions=*/false);
  const WireRecords wire = wire_records(p);
  const int64_t kv_token = p.batch * p.kv_heads;
  return {ring(ring_all_gather_charge(times(parts.counts, kv_token * wire.kv), rank)),
          ring(ring_reduce_scatter_charge(times(parts.counts, kv_token * wire.dkv), rank))};
}

std::map<std::string, Traffic> predict_traffic(const Problem& problem, const Plan& plan, int rank) {
  std::map<std::string, Traffic> phases =
      algorithm_entry(plan.algorithm).traffic(problem, plan, rank);
  // Attention sinks: the heads' fp64 gradient sums, all-reduced once over the world (comm.hpp's
  // all_reduce charge), whatever the algorithm.
  const int64_t ranks = plan.ranks();
  if (problem.sinks && ranks > 1) {
    phases["backward.dsink_all_reduce"] = {
        2 * (ranks - 1) * ((problem.heads + ranks - 1) / ranks) * 8, 2 * (ranks - 1)};
  }
  return phases;
}

std::map<std::string, Traffic> relayout_traffic(const Problem& problem, const Plan& plan,
                                                const UserShards& shards, int rank) {
  const TokenLayout planned = plan_layout(problem, plan);
  const TokenLayout& user = shards.layout;
  A2D_REQUIRE(user.tokens() == problem.seq && user.parts() == planned.parts(),
              "the shards' layout (", user.describe(), ") must split the problem's ", problem.seq,
              " tokens over the plan's ", planned.parts(), " ranks");
  if (same_assignment(user, planned)) return {};
  const RelayoutRecords records = relayout_records(problem, shards.backward);
  return {{kRelayoutForwardIn, exchange_traffic(user, planned, rank, records.forward_in)},
          {kRelayoutForwardOut, exchange_traffic(planned, user, rank, records.forward_out)},
          {kRelayoutBackwardIn, exchange_traffic(user, planned, rank, records.backward_in)},
          {kRelayoutBackwardOut, exchange_traffic(planned, user, rank, records.backward_out)}};
}

std::map<std::string, Traffic> predict_traffic(const Problem& problem, const Plan& plan, int rank,
                                               const UserShards* shards) {
  std::map<std::string, Traffic> phases = predict_traffic(problem, plan, rank);
  // The attention make_attention returns checks every call's shards on every rank together
  // (shard_checks.cpp): one all-reduce of one int64 per call (comm.hpp's charge). Named apart
  // from the algorithm's "forward"/"backward" phases: the time model leaves this latency out.
  const int64_t ranks = plan.ranks();
  if (ranks > 1) {
    const Traffic check{2 * (ranks - 1) * 8, 2 * (ranks - 1)};
    phases[kCheckForwardPhase] = check;
    phases[kCheckBackwardPhase] = check;
  }
  if (shards) {
    for (const auto& [name, t] : relayout_traffic(problem, plan, *shards, rank))
      phases[name] = t;
  }
  return phases;
}

Traffic predicted_total(const std::map<std::string, Traffic>& phases, const std::string& prefix) {
  Traffic sum;
  for (const auto& [name, t] : phases) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    sum.bytes += t.bytes;
    sum.messages += t.messages;
  }
  return sum;
}

}  // namespace a2d
