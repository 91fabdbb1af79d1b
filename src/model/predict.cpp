// The alpha-beta-gamma model's prediction (cost_model.hpp, docs/cost-model.md): per-phase costs
// and the composition of phases into forward and backward times per algorithm, and the
// exchanges between the caller's shards and the plan's layout.
#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/relayout.hpp"
#include "model/links.hpp"
#include "model/model_internal.hpp"
#include "model/predict.hpp"
#include "table/table.hpp"

namespace a2d {
namespace model {
namespace {

// Ranks whose traffic is evaluated; the maximum per phase is taken.
std::vector<int> sample_ranks(const Plan& plan) {
  const int ranks = plan.grid.size();
  std::vector<int> sample;
  for (int rank = 0; rank < ranks; rank += std::max(1, ranks / 64))
    sample.push_back(rank);
  sample.push_back(ranks - 1);
  return sample;
}

// predict() without the caller's shards; the hybrid's is predict_hybrid's.
Prediction predict_algorithm(const Problem& problem, const Plan& plan, const Machine& machine,
                             int ranks_per_node) {
  problem.validate();
  check_plan(plan, problem, plan.grid.size());
  A2D_REQUIRE(ranks_per_node >= 1, "ranks per node must be at least 1 (got ", ranks_per_node, ")");
  Prediction out;
  const int ranks = plan.grid.size();
  const double element_bytes = static_cast<double>(dtype_bytes(problem.dtype));

  // Per phase, the most any rank sends (phases synchronise the ranks, so the slowest sets the
  // time); per direction, the rank that sends the most over all phases (the words per rank).
  std::map<std::string, Traffic> phases;
  for (const int rank : sample_ranks(plan)) {
    Traffic forward, backward;
    double words_forward = 0, words_backward = 0;
    for (const auto& [name, t] : predict_traffic(problem, plan, rank)) {
      Traffic& worst = phases[name];
      worst.bytes = std::max(worst.bytes, t.bytes);
      worst.messages = std::max(worst.messages, t.messages);
      const bool is_forward = name.rfind("forward", 0) == 0;
      Traffic& total = is_forward ? forward : backward;
      total.bytes += t.bytes;
      total.messages += t.messages;
      // Words in units of the dtype's element (fp32 statistics count as two bf16 words).
      (is_forward ? words_forward : words_backward) += static_cast<double>(t.bytes) / element_bytes;
    }
    if (forward.bytes > out.forward.bytes) out.words_forward = words_forward;
    if (backward.bytes > out.backward.bytes) out.words_backward = words_backward;
    out.forward.bytes = std::max(out.forward.bytes, forward.bytes);
    out.forward.messages = std::max(out.forward.messages, forward.messages);
    out.backward.bytes = std::max(out.backward.bytes, backward.bytes);
    out.backward.messages = std::max(out.backward.messages, backward.messages);
  }
  std::map<std::string, double> seconds, reducing;
  for (const auto& [name, t] : phases) {
    PhaseCost cost;
    cost.name = name;
    cost.traffic = t;
    cost.inter_node = crosses_nodes(plan, group_of(plan, name),
                                    NodeOf(ranks, ranks_per_node, machine.cyclic_placement));
    const Link& link = cost.inter_node ? machine.inter : machine.intra;
    // A link shared by the ranks of a node carries all of their off-node traffic at once.
    const double load =
        cost.inter_node && machine.shared_link
            ? std::max(1.0, shared_link_load(plan, name, ranks_per_node, machine.cyclic_placement))
            : 1.0;
    const bool blocking = t.messages > 0 && blocking_phase(plan, name);
    // A reduction's words arrive and are reduced in turn: the busiest rank reduces as many words
    // as it sends (one block per ring step each way).
    const double reduce_rate = reduction_bytes_per_s(machine, name);
    reducing[name] = reduce_rate > 0 ? static_cast<double>(t.bytes) / reduce_rate : 0.0;
    cost.seconds = t.messages * link.latency_s +
                   load * static_cast<double>(t.bytes) / link.bytes_per_s +
                   (blocking ? machine.sync_s : 0.0) + reducing[name];
    seconds[name] = cost.seconds;
    out.phases.push_back(cost);
  }
  out.forward_flops = busiest_forward_flops(problem, plan);
  out.backward_flops = 2.5 * out.forward_flops;
  const bool causal = problem.mask.masks_by_position();
  const double forward_rate = causal && machine.kernel_forward_causal_flops > 0
                                  ? machine.kernel_forward_causal_flops
                                  : machine.kernel_forward_flops;
  const double backward_rate = causal && machine.kernel_backward_causal_flops > 0
                                   ? machine.kernel_backward_causal_flops
                                   : machine.kernel_backward_flops;
  double cf = out.forward_flops / forward_rate;
  double cb = out.backward_flops / backward_rate;
  if (machine.tile_block > 0) {
    // The CPU kernels compute whole tiles: charge those, at the rates the calibration block's
    // tiles ran at (its rates count unmasked FLOPs, so divide by the block's own tile ratio).
    // The forward also pays per 24-row panel and per key of every call: the block's time less
    // their share is what its entries cost.
    const TileEntries entries = busiest_tile_entries(problem, plan);
    if (entries.forward >= 0) {
      std::vector<int64_t> block(static_cast<size_t>(machine.tile_block));
      std::iota(block.begin(), block.end(), int64_t{0});
      const double square = static_cast<double>(machine.tile_block * machine.tile_block);
      const double per_entry = 4.0 * static_cast<double>(problem.head_dim);
      const double batch = static_cast<double>(problem.batch);
      const ForwardCallCosts call = forward_call_costs(machine, problem.head_dim);
      cf = batch * (call.entry_s * entries.forward + call.panel_s * entries.forward_panels +
                    call.key_s * entries.forward_keys);
      cb = 2.5 * batch * per_entry * entries.backward /
           (machine.kernel_backward_flops * backward_tile_entries(Mask::none(), block, block) /
            square);
    }
  }
  if (machine.permute_bytes_per_s > 0) {
    cf += permuted_bytes(problem, plan, true) / machine.permute_bytes_per_s;
    cb += permuted_bytes(problem, plan, false) / machine.permute_bytes_per_s;
  }
  out.forward_compute_s = cf;
  out.backward_compute_s = cb;
  // Overlap hides the shorter of computation and communication, unless the ranks share cores
  // that are all busy (then the CPU does both, one after the other).
  model::PhaseTimes times{seconds, reducing, phases};
  times.forward_compute = cf;
  times.backward_compute = cb;
  times.can_overlap = machine.shared_cores == 0 || ranks < machine.shared_cores;
  times.step_sync_s = machine.step_sync_s;
  times.rows = plan.grid.rows;
  times.cols = plan.grid.cols;
  times.ranks = ranks;
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  A2D_REQUIRE(entry.critical_path, "no critical path for ", algorithm_name(plan.algorithm));
  const model::CriticalPath path = entry.critical_path(times);
  out.forward_s = path.forward_s;
  out.backward_s = path.backward_s;
  out.memory_bytes = static_cast<int64_t>(memory_bytes(problem, plan, true));
  return out;
}

// The exchanges added to `out`: per phase the most bytes any rank sends (exact) and the most
// messages (over the sample); the busiest rank's totals per direction, the algorithm's and the
// exchanges' together, over the same sample. Time as an all-to-all of the world: the inter-node
// link once the ranks span nodes, a shared link carrying its node's off-node share, the machine's
// synchronisation once.
void add_relayout(Prediction& out, const Problem& problem, const Plan& plan, const Machine& machine,
                  int ranks_per_node, const UserShards& shards, const RelayoutCounts& counts) {
  if (counts.moves_nothing) return;
  const RelayoutRecords records = relayout_records(problem, shards.backward);
  const int ranks = plan.ranks();
  struct Exchange {
    const char* phase;
    bool into_plan;  // user -> plan (else plan -> user)
    int64_t record;
  };
  const Exchange exchanges[4] = {{kRelayoutForwardIn, true, records.forward_in},
                                 {kRelayoutForwardOut, false, records.forward_out},
                                 {kRelayoutBackwardIn, true, records.backward_in},
                                 {kRelayoutBackwardOut, false, records.backward_out}};
  const auto keep_most = [](Traffic& most, const Traffic& t) {
    most.bytes = std::max(most.bytes, t.bytes);
    most.messages = std::max(most.messages, t.messages);
  };
  std::map<std::string, Traffic> worst;
  Traffic forward_total, backward_total;
  for (size_t i = 0; i < counts.sample.size(); ++i) {
    Traffic forward, backward;
    for (const auto& [name, t] : predict_traffic(problem, plan, counts.sample[i])) {
      Traffic& total = name.rfind("forward", 0) == 0 ? forward : backward;
      total.bytes += t.bytes;
      total.messages += t.messages;
    }
    Traffic moved_forward, moved_backward;
    for (const Exchange& x : exchanges) {
      const Traffic& tokens = x.into_plan ? counts.in[i] : counts.out[i];
      const Traffic t{tokens.bytes * x.record, x.record > 0 ? tokens.messages : 0};
      Traffic& mine = x.phase[0] == 'f' ? moved_forward : moved_backward;
      mine.bytes += t.bytes;
      mine.messages += t.messages;
      worst[x.phase].messages = std::max(worst[x.phase].messages, t.messages);
    }
    forward.bytes += moved_forward.bytes;
    forward.messages += moved_forward.messages;
    backward.bytes += moved_backward.bytes;
    backward.messages += moved_backward.messages;
    keep_most(forward_total, forward);
    keep_most(backward_total, backward);
    keep_most(out.relayout_forward, moved_forward);
    keep_most(out.relayout_backward, moved_backward);
  }
  keep_most(out.forward, forward_total);
  keep_most(out.backward, backward_total);
  const double element_bytes = static_cast<double>(dtype_bytes(problem.dtype));
  out.words_forward = static_cast<double>(out.forward.bytes) / element_bytes;
  out.words_backward = static_cast<double>(out.backward.bytes) / element_bytes;

  const NodeOf node(ranks, ranks_per_node, machine.cyclic_placement);
  const bool inter = node.nodes > 1;
  const Link& link = inter ? machine.inter : machine.intra;
  const double load =
      inter && machine.shared_link
          ? std::max(1.0, all_to_all_link_load(ranks, ranks_per_node, machine.cyclic_placement))
          : 1.0;
  for (const Exchange& x : exchanges) {
    PhaseCost cost;
    cost.name = x.phase;
    cost.traffic = {x.record * (x.into_plan ? counts.most_in : counts.most_out),
                    worst[x.phase].messages};
    cost.inter_node = inter;
    cost.seconds = static_cast<double>(cost.traffic.messages) * link.latency_s +
                   load * static_cast<double>(cost.traffic.bytes) / link.bytes_per_s +
                   (cost.traffic.messages > 0 ? machine.sync_s : 0.0);
    (x.phase[0] == 'f' ? out.relayout_forward_s : out.relayout_backward_s) += cost.seconds;
    out.phases.push_back(cost);
  }
  out.forward_s += out.relayout_forward_s;
  out.backward_s += out.relayout_backward_s;

  out.memory_bytes += static_cast<int64_t>(relayout_memory_bytes(problem, plan, shards, true));
}

}  // namespace

RelayoutCounts relayout_counts(const TokenLayout& user, const TokenLayout& planned) {
  RelayoutCounts c;
  if (same_assignment(user, planned)) return c;
  c.moves_nothing = false;
  const int ranks = static_cast<int>(user.parts());
  int busiest_in = 0, busiest_out = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    const int64_t in = user.count(rank) - shared_tokens(user, rank, planned, rank);
    const int64_t back = planned.count(rank) - shared_tokens(planned, rank, user, rank);
    if (in > c.most_in) c.most_in = in, busiest_in = rank;
    if (back > c.most_out) c.most_out = back, busiest_out = rank;
  }
  for (int rank = 0; rank < ranks; rank += std::max(1, ranks / 64))
    c.sample.push_back(rank);
  c.sample.insert(c.sample.end(), {ranks - 1, busiest_in, busiest_out});
  std::sort(c.sample.begin(), c.sample.end());
  c.sample.erase(std::unique(c.sample.begin(), c.sample.end()), c.sample.end());
  for (const int rank : c.sample) {
    c.in.push_back(exchange_traffic(user, planned, rank, 1));
    c.out.push_back(exchange_traffic(planned, user, rank, 1));
  }
  return c;
}

Prediction predict_with(const Problem& problem, const Plan& plan, const Machine& machine,
                        int ranks_per_node, const UserShards* shards,
                        const RelayoutCounts* counts) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  Prediction out = entry.predict ? entry.predict(problem, plan, machine, ranks_per_node)
                                 : predict_algorithm(problem, plan, machine, ranks_per_node);
  if (shards) add_relayout(out, problem, plan, machine, ranks_per_node, *shards, *counts);
  return out;
}

}  // namespace model

using model::predict_with;
using model::relayout_counts;
using model::RelayoutCounts;
using model::require_shards_fit;

Prediction predict(const Problem& problem, const Plan& plan, const Machine& machine,
                   int ranks_per_node, const UserShards* shards) {
  if (!shards) return predict_with(problem, plan, machine, ranks_per_node, nullptr, nullptr);
  require_shards_fit(problem, plan, shards->layout);
  const RelayoutCounts counts = relayout_counts(shards->layout, plan_layout(problem, plan));
  return predict_with(problem, plan, machine, ranks_per_node, shards, &counts);
}

}  // namespace a2d
