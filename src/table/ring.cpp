// The table's entry of Ring Attention (src/algorithms/ring.cpp; docs/baselines.md): all ranks in
// one ring, K/V parts passed around while each rank attends its own queries to the part it holds.
#include <algorithm>

#include "algorithms/algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "table/table.hpp"

namespace a2d {
namespace {

using namespace model;  // NOLINT: the model's shared terms, read as the formulas' own

// The layout that balances the mask over the ring (balanced_layout: zigzag for causal work,
// docs/baselines.md); any layout is exact.
void defaults(Plan& plan, const Problem& problem, int ranks) {
  plan.grid = {1, ranks};
  plan.layout = balanced_layout(problem.mask);
}

void check(const Plan& plan, const Problem&, int ranks) {
  require_one_group(plan, ranks);
}

void plans(std::vector<Plan>& out, const Problem& problem, int ranks, const PlanChoices& choices) {
  sequence_plans(out, Algorithm::ring, problem, ranks, choices);
}

std::map<std::string, Traffic> traffic(const Problem& p, const Plan& plan, int rank) {
  const SequenceBlocks blocks = sequence_parallel_blocks(p, plan, rank);
  return {{"forward.kv_ring", blocks.kv},
          {"backward.kv_ring", blocks.kv},
          {"backward.dkv_ring", blocks.dkv}};
}

// The ring's transfers move while the ranks compute.
bool blocking(const std::string&) {
  return false;
}

// P steps, each computing on one K/V part while the next one moves; the backward's dK/dV ring
// one step behind.
CriticalPath critical_path(const PhaseTimes& x) {
  const int ranks = x.ranks;
  double forward = 0, backward = 0;
  for (int s = 0; s < ranks; ++s) {
    const bool shift = s + 1 < ranks;
    forward += x.overlapped(x.forward_compute / ranks, shift ? x.per_step("forward.kv_ring") : 0.0);
    backward += x.overlapped(x.backward_compute / ranks,
                             (shift ? x.per_step("backward.kv_ring") : 0.0) +
                                 (s >= 1 ? x.per_step("backward.dkv_ring") : 0.0));
  }
  CriticalPath out;
  out.forward_s = forward;
  out.backward_s = backward + (ranks > 1 ? x.per_step("backward.dkv_ring") : 0.0) +
                   x.reduced("backward.dkv_ring");
  return out;
}

// Step-synchronous critical path of the contiguous ring under a causal mask: at step 0 the
// busiest rank does its diagonal block, at every later step some rank has a full block of an
// earlier chunk.
double critical_flops(const Problem& p, const Plan& plan) {
  const int ranks = plan.grid.size();
  if (!(plan.layout == LayoutKind::contiguous && p.mask.plain_causal() && ranks > 1)) {
    return 0;
  }
  const TokenLayout layout(plan.layout, p.seq, ranks, plan.stripe);
  const Wide n = layout.max_count();
  const Wide critical = n * (n + 1) / 2 + static_cast<Wide>(ranks - 1) * n * n;
  return flops(p, critical * p.heads);
}

Transient memory(const Problem&, const Plan&, const MemoryTerms& m) {
  const double b = m.b, h = m.h, d = m.d, e = m.e, f = m.f, n = m.n;
  const double kv_row = m.kv_row, q_row = m.q_row;
  Transient out;
  out.forward = e * 2 * n * kv_row + f * n * b * h * (d + 2);
  out.backward = e * 2 * n * kv_row + f * (n * b * h + 4 * n * kv_row + (m.narrow ? n * q_row : 0));
  return out;
}

// Own queries against each part in turn, as the ring brings them.
Calls kernel_calls(const Problem& problem, const Plan&, const SequenceParts& parts, int rank,
                   bool) {
  Calls out;
  out.heads = problem.heads;
  const std::vector<int64_t> own = slice(parts.positions, parts.offsets[static_cast<size_t>(rank)],
                                         parts.counts[static_cast<size_t>(rank)]);
  for (int part = 0; part < parts.parts(); ++part)
    out.calls.push_back({own, slice(parts.positions, parts.offsets[static_cast<size_t>(part)],
                                    parts.counts[static_cast<size_t>(part)])});
  return out;
}

}  // namespace

const AlgorithmEntry& ring_entry() {
  static const AlgorithmEntry entry = [] {
    AlgorithmEntry e;
    e.traits.algorithm = Algorithm::ring;
    e.traits.name = "ring";
    e.default_plan = defaults;
    e.check = check;
    e.make = algorithms::make_ring;
    e.plans = plans;
    e.traffic = traffic;
    e.blocking = blocking;
    e.critical_path = critical_path;
    e.rank_flops = sequence_rank_flops;
    e.critical_flops = critical_flops;
    e.memory = memory;
    e.kernel_calls = kernel_calls;
    e.calls_need_parts = true;
    return e;
  }();
  return entry;
}

}  // namespace a2d
