// Bytes and messages per rank, phase by phase. The formulas follow the algorithms' schedules and
// the counting convention of comm.hpp (ring charges; empty blocks are not sent); see
// docs/attention2d.md and docs/baselines.md for their derivation and closed forms.
#include <numeric>
#include <vector>

#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/model.hpp"
#include "hybrid_model.hpp"

namespace a2d {
namespace {

std::vector<int64_t> times(const std::vector<int64_t>& tokens, int64_t per_token) {
  std::vector<int64_t> out(tokens);
  for (auto& x : out)
    x *= per_token;
  return out;
}

// Ring charges of blocks counted in bytes.
Traffic ring(const RingCharge& charge) {
  return {charge.elements, charge.messages};
}

Traffic point_to_point(int64_t bytes, bool to_self) {
  if (to_self || bytes == 0) return {0, 0};
  return {bytes, 1};
}

Traffic add(const Traffic& a, const Traffic& b) {
  return {a.bytes + b.bytes, a.messages + b.messages};
}

// Record sizes in bytes are wire_records() (decomposition.hpp): tensors in the problem's dtype,
// statistics and partial sums in fp32.
std::map<std::string, Traffic> attention2d_traffic(const Problem& p, const Plan& plan, int rank) {
  const Attention2DRank at = attention2d_rank(p, plan, rank, /*with_positions=*/false);
  const WireRecords wire = wire_records(p);
  const int64_t q_token = p.batch * p.heads;      // query rows per token
  const int64_t kv_token = p.batch * p.kv_heads;  // K/V rows per token
  const int64_t held_kv = at.col_counts[static_cast<size_t>(at.row)];
  const bool overlap = plan.algorithm == Algorithm::attention2d_overlap;
  const Traffic transpose_in =
      point_to_point(at.own_tokens * kv_token * wire.kv, at.kv_dest == rank);
  const Traffic transpose_out =
      point_to_point(held_kv * kv_token * wire.dkv_final, at.kv_source == rank);
  // The K/V gather, the Q gather, the merge and the dK/dV sum are the same ring charges whether
  // they run as collectives (no-overlap) or as point-to-point rings (overlapped).
  const Traffic kv_gather =
      ring(ring_all_gather_charge(times(at.col_counts, kv_token * wire.kv), at.row));
  const auto q_gather = [&](int64_t record) {
    return ring(ring_all_gather_charge(times(at.row_counts, q_token * record), at.col));
  };
  const auto row_reduce = [&](int64_t record) {
    return ring(ring_reduce_scatter_charge(times(at.row_counts, q_token * record), at.col));
  };
  const Traffic dkv_reduce =
      ring(ring_reduce_scatter_charge(times(at.col_counts, kv_token * wire.dkv), at.row));

  std::map<std::string, Traffic> phases;
  phases["forward.kv_transpose"] = transpose_in;
  phases["backward.kv_transpose"] = transpose_in;
  phases["backward.dkv_transpose"] = transpose_out;
  if (overlap) {
    phases["backward.dkv_ring"] = dkv_reduce;
    phases["forward.kv_ring"] = kv_gather;
    phases["forward.q_ring"] = q_gather(wire.q);
    phases["forward.partial_ring"] = row_reduce(wire.partial);
    phases["backward.kv_ring"] = kv_gather;
    phases["backward.q_ring"] = q_gather(wire.q_backward);
    phases["backward.dq_ring"] = row_reduce(wire.dq);
  } else {
    phases["forward.kv_allgather"] = kv_gather;
    phases["forward.q_allgather"] = q_gather(wire.q);
    phases["forward.merge_reduce_scatter"] = row_reduce(wire.partial);
    phases["backward.kv_allgather"] = kv_gather;
    phases["backward.q_allgather"] = q_gather(wire.q_backward);
    phases["backward.dq_reduce_scatter"] = row_reduce(wire.dq);
    phases["backward.dkv_reduce_scatter"] = dkv_reduce;
  }
  return phases;
}

// Ring Attention and all-gather K/V send the same blocks: every rank's [k v] part once around
// (all but the part of rank + 1, the all-gather ring charge, in the dtype) and, in the backward,
// every part's fp32 dK, dV accumulator except the rank's own (the reduce-scatter ring charge).
// docs/baselines.md.
std::map<std::string, Traffic> sequence_parallel_traffic(const Problem& p, const Plan& plan,
                                                         int rank) {
  const SequenceParts parts = sequence_parts(p, plan, /*with_positions=*/false);
  const WireRecords wire = wire_records(p);
  const int64_t kv_token = p.batch * p.kv_heads;
  const Traffic kv = ring(ring_all_gather_charge(times(parts.counts, kv_token * wire.kv), rank));
  const Traffic dkv =
      ring(ring_reduce_scatter_charge(times(parts.counts, kv_token * wire.dkv), rank));
  std::map<std::string, Traffic> phases;
  if (plan.algorithm == Algorithm::ring) {
    phases["forward.kv_ring"] = kv;
    phases["backward.kv_ring"] = kv;
    phases["backward.dkv_ring"] = dkv;
  } else {
    phases["forward.kv_allgather"] = kv;
    phases["backward.kv_allgather"] = kv;
    phases["backward.dkv_reduce_scatter"] = dkv;
  }
  return phases;
}

// Ulysses: to the head shards, each rank sends its own tokens' records for the heads of every
// other rank (P - 1 equal blocks); back to the sequence shards, the results of rank i's tokens to
// every other rank i. Bytes per (token, batch), with hq = H/P and hkv = Hkv/P heads per rank and
// e the dtype's element size (wire_records):
//   forward   in  (hq + 2 hkv) D e                out  4 hq + hq D e (rounded up to 4)
//   backward  in  8 hq + (2 hq + 2 hkv) D e       out  (hq + 2 hkv) D e
std::map<std::string, Traffic> ulysses_traffic(const Problem& p, const Plan& plan, int rank) {
  const SequenceParts parts = sequence_parts(p, plan, /*with_positions=*/false);
  const int ranks = parts.parts();
  const WireRecords wire = wire_records(p, ranks);
  const int64_t own = parts.counts[static_cast<size_t>(rank)];
  const auto to_heads = [&](int64_t bytes_per_token) {
    Traffic t;
    for (int peer = 0; peer < ranks; ++peer) {
      if (peer != rank) t = add(t, point_to_point(own * p.batch * bytes_per_token, false));
    }
    return t;
  };
  const auto to_sequence = [&](int64_t bytes_per_token) {
    Traffic t;
    for (int peer = 0; peer < ranks; ++peer) {
      const int64_t tokens = parts.counts[static_cast<size_t>(peer)];
      if (peer != rank) t = add(t, point_to_point(tokens * p.batch * bytes_per_token, false));
    }
    return t;
  };
  std::map<std::string, Traffic> phases;
  phases["forward.to_heads_all_to_all"] = to_heads(wire.ulysses_in);
  phases["forward.to_sequence_all_to_all"] = to_sequence(wire.ulysses_out);
  phases["backward.to_heads_all_to_all"] = to_heads(wire.ulysses_backward_in);
  phases["backward.to_sequence_all_to_all"] = to_sequence(wire.ulysses_backward_out);
  return phases;
}

}  // namespace

namespace {
std::map<std::string, Traffic> algorithm_traffic(const Problem& problem, const Plan& plan,
                                                 int rank) {
  switch (plan.algorithm) {
    case Algorithm::attention2d:
    case Algorithm::attention2d_overlap:
      return attention2d_traffic(problem, plan, rank);
    case Algorithm::ring:
    case Algorithm::allgather_kv:
      return sequence_parallel_traffic(problem, plan, rank);
    case Algorithm::ulysses:
      return ulysses_traffic(problem, plan, rank);
    case Algorithm::hybrid:
      return model::hybrid_traffic(problem, plan, rank);
  }
  A2D_FAIL("no traffic model for ", algorithm_name(plan.algorithm));
}
}  // namespace

std::map<std::string, Traffic> predict_traffic(const Problem& problem, const Plan& plan, int rank) {
  std::map<std::string, Traffic> phases = algorithm_traffic(problem, plan, rank);
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
