// The hybrid's model (heads x ATTENTION2D, src/algorithms/hybrid.cpp): its all-to-alls counted
// as Ulysses' are, inside each sequence group of U ranks, and ATTENTION2D's own model on the
// group problem (H/U query heads, max(Hkv/U, 1) K/V heads, the whole sequence) for the rest.
// docs/cost-model.md and docs/attention2d.md give the formulas.
#include "hybrid_model.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "model/model_internal.hpp"

namespace a2d::model {
namespace {

const char* const kAllToAlls[4] = {"forward.to_heads_all_to_all", "forward.to_sequence_all_to_all",
                                   "backward.to_heads_all_to_all",
                                   "backward.to_sequence_all_to_all"};

// The all-to-alls of world rank `rank` (member u of sequence group s, which owns c_u tokens;
// c_j for the other members j): to the heads it sends its own tokens' records to each other
// member, back to the sequence the records of each other member's tokens.
//   forward   to heads     sum_{j != u, c_u > 0} c_u B (hq + 2 hkv) D e
//             to sequence  sum_{j != u, c_j > 0} c_j B (4 hq + hq D e, rounded up to 4)
//   backward  to heads     sum_{j != u, c_u > 0} c_u B (8 hq + (2 hq + 2 hkv) D e)
//             to sequence  sum_{j != u, c_j > 0} c_j B (hq + 2 hkv) D e
std::map<std::string, Traffic> all_to_all_traffic(const Problem& p, const Plan& plan, int rank) {
  const HybridRank at = hybrid_rank(plan, rank);
  const std::vector<int64_t> counts = hybrid_member_counts(p, plan, at.sequence_group);
  WireRecords wire;
  set_heads_records(wire, p, hybrid_heads(p, plan.heads_parallel, at.heads_group));
  const int64_t own = counts[static_cast<size_t>(at.heads_group)];
  const auto exchange = [&](int64_t record, bool own_tokens) {
    Traffic t;
    for (int j = 0; j < plan.heads_parallel; ++j) {
      const int64_t tokens = own_tokens ? own : counts[static_cast<size_t>(j)];
      if (j == at.heads_group || tokens == 0) continue;
      t.bytes += tokens * p.batch * record;
      ++t.messages;
    }
    return t;
  };
  return {{kAllToAlls[0], exchange(wire.ulysses_in, true)},
          {kAllToAlls[1], exchange(wire.ulysses_out, false)},
          {kAllToAlls[2], exchange(wire.ulysses_backward_in, true)},
          {kAllToAlls[3], exchange(wire.ulysses_backward_out, false)}};
}

// The node of world rank q (as links.hpp's NodeOf: consecutive ranks per node, or dealt
// out to the nodes in turn).
int node_of(int rank, int ranks, int per_node, bool cyclic) {
  const int nodes = (ranks + per_node - 1) / per_node;
  return cyclic ? rank % nodes : rank / per_node;
}

}  // namespace

std::map<std::string, Traffic> hybrid_traffic(const Problem& problem, const Plan& plan, int rank) {
  const HybridRank at = hybrid_rank(plan, rank);
  std::map<std::string, Traffic> phases = predict_traffic(
      hybrid_group_problem(problem, plan), hybrid_group_plan(plan), at.sequence_group);
  for (auto& [name, t] : all_to_all_traffic(problem, plan, rank))
    phases[name] = t;
  return phases;
}

double hybrid_memory_bytes(const Problem& problem, const Plan& plan, bool with_backward) {
  // The world shards, and beside them the group's (ATTENTION2D's shards and transient buffers on
  // the group problem) or the all-to-all buffers, whichever is larger.
  const int ranks = plan.ranks(), group_ranks = plan.grid.size(), u = plan.heads_parallel;
  const TokenLayout layout(LayoutKind::cyclic, problem.seq, ranks);
  const double own = static_cast<double>(layout.max_count());
  const double group_tokens = std::ceil(static_cast<double>(problem.seq) / group_ranks);
  WireRecords wire;
  set_heads_records(wire, problem, hybrid_heads(problem, u, 0));
  const int64_t record = with_backward ? std::max(wire.ulysses_backward_in, wire.ulysses_in)
                                       : std::max(wire.ulysses_in, wire.ulysses_out);
  const double exchange =
      static_cast<double>(problem.batch) * (u * own + group_tokens) * static_cast<double>(record);
  const double group = static_cast<double>(memory_per_rank(
      hybrid_group_problem(problem, plan), hybrid_group_plan(plan), nullptr, with_backward));
  return shard_bytes(problem, own, with_backward) + std::max(exchange, group);
}

Prediction predict_hybrid(const Problem& problem, const Plan& plan, const Machine& machine,
                          int ranks_per_node) {
  problem.validate();
  check_plan(plan, problem, plan.ranks());
  A2D_REQUIRE(ranks_per_node >= 1, "ranks per node must be at least 1 (got ", ranks_per_node, ")");
  const int ranks = plan.ranks(), group_ranks = plan.grid.size(), u = plan.heads_parallel;
  const Problem group_problem = hybrid_group_problem(problem, plan);
  // Heads group u's grid is world ranks S u .. S u + S - 1: under block placement its ranks
  // share nodes as those of a machine of min(G, S) ranks per node (exactly so when one of G and
  // S divides the other); the placement flag is passed on as it is.
  Prediction out = predict(group_problem, hybrid_group_plan(plan), machine,
                           std::max(1, std::min(ranks_per_node, group_ranks)));

  // Words and messages per rank: the rank that sends the most over all phases, per direction,
  // as predict() does (every rank, so the maximum is exact).
  const double element_bytes = static_cast<double>(dtype_bytes(problem.dtype));
  out.forward = out.backward = {};
  std::map<std::string, Traffic> worst;
  for (int rank = 0; rank < ranks; rank += std::max(1, ranks / 256)) {
    Traffic forward, backward;
    for (const auto& [name, t] : predict_traffic(problem, plan, rank)) {
      Traffic& w = worst[name];
      w.bytes = std::max(w.bytes, t.bytes);
      w.messages = std::max(w.messages, t.messages);
      Traffic& total = name.rfind("forward", 0) == 0 ? forward : backward;
      total.bytes += t.bytes;
      total.messages += t.messages;
    }
    out.forward.bytes = std::max(out.forward.bytes, forward.bytes);
    out.forward.messages = std::max(out.forward.messages, forward.messages);
    out.backward.bytes = std::max(out.backward.bytes, backward.bytes);
    out.backward.messages = std::max(out.backward.messages, backward.messages);
  }
  out.words_forward = static_cast<double>(out.forward.bytes) / element_bytes;
  out.words_backward = static_cast<double>(out.backward.bytes) / element_bytes;

  // The all-to-alls: over the inter-node link when a sequence group (ranks s, s + S, ...) spans
  // nodes; a link shared by a node's ranks carries every one of their off-node blocks.
  double load = 0;
  bool inter = false;
  {
    const int nodes = (ranks + ranks_per_node - 1) / ranks_per_node;
    std::vector<double> leaving(static_cast<size_t>(nodes), 0.0);
    for (int rank = 0; rank < ranks; ++rank) {
      const HybridRank at = hybrid_rank(plan, rank);
      const int node = node_of(rank, ranks, ranks_per_node, machine.cyclic_placement);
      int off = 0;
      for (int j = 0; j < u; ++j) {
        const int peer = hybrid_world_rank(plan, j, at.sequence_group);
        if (node_of(peer, ranks, ranks_per_node, machine.cyclic_placement) != node) ++off;
      }
      inter = inter || off > 0;
      if (u > 1) leaving[static_cast<size_t>(node)] += static_cast<double>(off) / (u - 1);
    }
    load = *std::max_element(leaving.begin(), leaving.end());
  }
  const Link& link = inter ? machine.inter : machine.intra;
  std::map<std::string, double> seconds;
  for (const char* name : kAllToAlls) {
    const Traffic t = worst[name];
    PhaseCost cost;
    cost.name = name;
    cost.traffic = t;
    cost.inter_node = inter;
    const double share = inter && machine.shared_link ? std::max(1.0, load) : 1.0;
    cost.seconds = static_cast<double>(t.messages) * link.latency_s +
                   share * static_cast<double>(t.bytes) / link.bytes_per_s +
                   (t.messages > 0 ? machine.sync_s : 0.0);
    seconds[name] = cost.seconds;
    out.phases.push_back(cost);
  }
  out.forward_s += seconds[kAllToAlls[0]] + seconds[kAllToAlls[1]];
  out.backward_s += seconds[kAllToAlls[2]] + seconds[kAllToAlls[3]];

  out.memory_bytes = static_cast<int64_t>(hybrid_memory_bytes(problem, plan, true));
  return out;
}

}  // namespace a2d::model
