// The table's entry of Ulysses (src/algorithms/ulysses.cpp; docs/baselines.md): an all-to-all from
// sequence shards to head shards, whole-sequence attention on H/P heads per rank, and back.
#include <algorithm>
#include <numeric>
#include <string>

#include "algorithms/algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "table/table.hpp"

namespace a2d {
namespace {

using namespace model;  // NOLINT: the model's shared terms, read as the formulas' own

void defaults(Plan& plan, const Problem&, int ranks) {
  plan.grid = {1, ranks};
  plan.layout = LayoutKind::contiguous;
}

// Ulysses gives every rank whole K/V heads, each to one rank only.
void check(const Plan& plan, const Problem& problem, int ranks) {
  require_one_group(plan, ranks);
  if (problem.kv_heads % ranks == 0) return;
  // The heads all-to-all that does run here: the hybrid's largest U (a divisor of P that divides
  // the query heads and divides, or is a multiple of, the K/V heads; those then replicated).
  int64_t u = 0;
  for (int64_t d = ranks; d > 1 && u == 0; --d) {
    if (ranks % d == 0 && problem.heads % d == 0 &&
        (problem.kv_heads % d == 0 || d % problem.kv_heads == 0))
      u = d;
  }
  A2D_REQUIRE(false, "ulysses shards the heads: the number of ranks (", ranks,
              ") must divide the number of K/V heads (", problem.kv_heads,
              "); use a number of ranks that divides ", problem.kv_heads,
              ", or --algo ring, allgather-kv or attention2d",
              u > 0 ? ", or --algo hybrid --heads-parallel " + std::to_string(u) +
                          " (the heads' all-to-all over " + std::to_string(u) + " ranks" +
                          (problem.kv_heads % u == 0 ? "" : ", K/V heads replicated") + ")"
                    : std::string());
}

void plans(std::vector<Plan>& out, const Problem& problem, int ranks, const PlanChoices& choices) {
  sequence_plans(out, Algorithm::ulysses, problem, ranks, choices);
}

// To the head shards, each rank sends its own tokens' records for the heads of every other rank
// (P - 1 equal blocks); back to the sequence shards, the results of rank i's tokens to every other
// rank i. Bytes per (token, batch), with hq = H/P and hkv = Hkv/P heads per rank and e the
// dtype's element size (wire_records):
//   forward   in  (hq + 2 hkv) D e                out  4 hq + hq D e (rounded up to 4)
//   backward  in  8 hq + (2 hq + 2 hkv) D e       out  (hq + 2 hkv) D e
std::map<std::string, Traffic> traffic(const Problem& p, const Plan& plan, int rank) {
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

CriticalPath critical_path(const PhaseTimes& x) {
  CriticalPath out;
  out.forward_s = x.t("forward.to_heads_all_to_all") + x.forward_compute +
                  x.t("forward.to_sequence_all_to_all");
  out.backward_s = x.t("backward.to_heads_all_to_all") + x.backward_compute +
                   x.t("backward.to_sequence_all_to_all");
  return out;
}

// The whole sequence on the rank's heads.
double rank_flops(const Problem& p, const Plan& plan, int rank) {
  const UlyssesHeads group = ulysses_heads(p, plan.grid.size(), rank);
  return flops(p, total_pairs(p) * group.heads);
}

Transient memory(const Problem& p, const Plan&, const MemoryTerms& m) {
  const double b = m.b, h = m.h, hkv = m.hkv, d = m.d, e = m.e, f = m.f, n = m.n, big_n = m.big_n;
  const int ranks = m.ranks;
  const double hq = h / ranks, hk = hkv / ranks;
  const WireRecords wire = wire_records(p, ranks);
  Transient out;
  out.forward = e * n * b * (h + 2 * hkv) * d + big_n * b * static_cast<double>(wire.ulysses_in) +
                big_n * b * static_cast<double>(wire.ulysses_out) +
                n * b * ranks * static_cast<double>(wire.ulysses_out);
  out.backward = f * n * b * h + n * b * ranks * static_cast<double>(wire.ulysses_backward_in) +
                 big_n * b * static_cast<double>(wire.ulysses_backward_in) +
                 f * big_n * b * (hq + 2 * hk) * d +
                 (m.narrow ? big_n * b * static_cast<double>(wire.ulysses_backward_out) : 0) +
                 n * b * ranks * static_cast<double>(wire.ulysses_backward_out);
  return out;
}

// One call: the whole sequence against itself, on the rank's heads.
Calls kernel_calls(const Problem& problem, const Plan& plan, const SequenceParts&, int rank, bool) {
  Calls out;
  std::vector<int64_t> all(static_cast<size_t>(problem.seq));
  std::iota(all.begin(), all.end(), int64_t{0});
  out.calls.push_back({all, all});
  out.heads = ulysses_heads(problem, plan.grid.size(), rank).heads;
  return out;
}

}  // namespace

const AlgorithmEntry& ulysses_entry() {
  static const AlgorithmEntry entry = [] {
    AlgorithmEntry e;
    e.traits.algorithm = Algorithm::ulysses;
    e.traits.name = "ulysses";
    e.default_plan = defaults;
    e.check = check;
    e.make = algorithms::make_ulysses;
    e.plans = plans;
    e.traffic = traffic;
    e.critical_path = critical_path;
    e.rank_flops = rank_flops;
    e.memory = memory;
    e.kernel_calls = kernel_calls;
    e.whole_sequence_calls = true;
    return e;
  }();
  return entry;
}

}  // namespace a2d
