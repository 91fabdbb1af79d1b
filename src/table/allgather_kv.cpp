// The table's entry of all-gather K/V (src/algorithms/allgather_kv.cpp; docs/baselines.md): every
// rank gathers all of K/V and attends its own queries to it in one call.
#include <algorithm>

#include "algorithms/algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "table/table.hpp"

namespace a2d {
namespace {

using namespace model;  // NOLINT: the model's shared terms, read as the formulas' own

// The layout that balances the mask (balanced_layout: zigzag for causal work, docs/baselines.md);
// any layout is exact.
void defaults(Plan& plan, const Problem& problem, int ranks) {
  plan.grid = {1, ranks};
  plan.layout = balanced_layout(problem.mask);
}

void check(const Plan& plan, const Problem&, int ranks) {
  require_one_group(plan, ranks);
}

void plans(std::vector<Plan>& out, const Problem& problem, int ranks, const PlanChoices& choices) {
  sequence_plans(out, Algorithm::allgather_kv, problem, ranks, choices);
}

// The same blocks as Ring Attention's, as collectives.
std::map<std::string, Traffic> traffic(const Problem& p, const Plan& plan, int rank) {
  const SequenceBlocks blocks = sequence_parallel_blocks(p, plan, rank);
  return {{"forward.kv_allgather", blocks.kv},
          {"backward.kv_allgather", blocks.kv},
          {"backward.dkv_reduce_scatter", blocks.dkv}};
}

CriticalPath critical_path(const PhaseTimes& x) {
  CriticalPath out;
  out.forward_s = x.t("forward.kv_allgather") + x.forward_compute;
  out.backward_s =
      x.t("backward.kv_allgather") + x.backward_compute + x.t("backward.dkv_reduce_scatter");
  return out;
}

Transient memory(const Problem&, const Plan&, const MemoryTerms& m) {
  const double e = m.e, f = m.f, n = m.n, big_n = m.big_n;
  const double kv_row = m.kv_row, q_row = m.q_row;
  Transient out;
  out.forward = e * big_n * kv_row;
  out.backward =
      e * big_n * kv_row + f * (big_n * kv_row + n * kv_row + (m.narrow ? n * q_row : 0));
  return out;
}

// Gathered K/V sorted; in the backward also dK/dV put back.
double reordered_bytes(const Problem& p, const Plan&, bool forward) {
  const double b = static_cast<double>(p.batch);
  const double hkv = static_cast<double>(p.kv_heads);
  const double big_n = static_cast<double>(p.seq);
  const WireRecords wire = wire_records(p);
  const double kv_row = b * hkv * static_cast<double>(wire.kv);    // one [k v] record row
  const double dkv_row = b * hkv * static_cast<double>(wire.dkv);  // one fp32 [dk dv] row
  return forward ? big_n * kv_row : big_n * (kv_row + dkv_row);
}

// Own queries against every key; under a mask that hides pairs the gathered keys are sorted by
// position.
Calls kernel_calls(const Problem& problem, const Plan&, const SequenceParts& parts, int rank,
                   bool) {
  Calls out;
  out.heads = problem.heads;
  const bool by_position = problem.mask.hides_pairs();  // sort_by_position (records.hpp)
  const std::vector<int64_t> own = slice(parts.positions, parts.offsets[static_cast<size_t>(rank)],
                                         parts.counts[static_cast<size_t>(rank)]);
  out.calls.push_back({own, by_position ? sorted(parts.positions) : parts.positions});
  return out;
}

}  // namespace

const AlgorithmEntry& allgather_kv_entry() {
  static const AlgorithmEntry entry = [] {
    AlgorithmEntry e;
    e.traits.algorithm = Algorithm::allgather_kv;
    e.traits.name = "allgather-kv";
    e.default_plan = defaults;
    e.check = check;
    e.make = algorithms::make_allgather_kv;
    e.plans = plans;
    e.traffic = traffic;
    e.critical_path = critical_path;
    e.rank_flops = sequence_rank_flops;
    e.memory = memory;
    e.permuted_bytes = reordered_bytes;
    e.kernel_calls = kernel_calls;
    e.calls_need_parts = true;
    return e;
  }();
  return entry;
}

}  // namespace a2d
