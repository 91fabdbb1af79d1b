// The table's entries of ATTENTION2D (src/algorithms/attention2d.cpp; docs/attention2d.md): the
// no-overlap variant (the paper's Algorithm 1) and the overlapped one (Algorithms 4-6), on a grid
// R x C of P ranks with the cyclic layout. Their plans, checks, factory and model.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "algorithms/algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "table/table.hpp"

namespace a2d {
namespace {

using namespace model;  // NOLINT: the model's shared terms, read as the formulas' own

bool overlapped_variant(const Plan& plan) {
  return plan.algorithm == Algorithm::attention2d_overlap;
}

// ---- Plans ------------------------------------------------------------------------------------

void defaults(Plan& plan, const Problem&, int ranks) {
  plan.grid = default_grid(ranks);
  plan.layout = LayoutKind::cyclic;
}

void check(const Plan& plan, const Problem&, int ranks) {
  check_grid(plan.grid, ranks);
  require_cyclic_layout(plan);
}

// Every grid of P (or the chosen one), with the K/V transpose and, where asked, without.
void plans(std::vector<Plan>& out, const Problem& problem, int ranks, const PlanChoices& choices,
           Algorithm algorithm) {
  const std::vector<GridShape> shapes =
      choices.grid ? std::vector<GridShape>{*choices.grid} : grid_shapes(ranks);
  for (const GridShape& shape : shapes) {
    for (const bool transpose : {true, false}) {
      if (!transpose && !choices.both_kv_transposes) continue;
      Plan plan = default_plan(algorithm, problem, ranks);
      plan.grid = shape;
      plan.kv_transpose = transpose;
      out.push_back(plan);
    }
  }
}

// ---- Traffic ----------------------------------------------------------------------------------

// Record sizes in bytes are wire_records() (decomposition.hpp): tensors in the problem's dtype,
// statistics and partial sums in fp32.
std::map<std::string, Traffic> traffic(const Problem& p, const Plan& plan, int rank) {
  const Attention2DRank at = attention2d_rank(p, plan, rank, /*with_positions=*/false);
  const WireRecords wire = wire_records(p);
  const int64_t q_token = p.batch * p.heads;      // query rows per token
  const int64_t kv_token = p.batch * p.kv_heads;  // K/V rows per token
  const int64_t held_kv = at.col_counts[static_cast<size_t>(at.row)];
  const bool overlap = overlapped_variant(plan);
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

// The K/V transposes are between transpose partners, the K/V and dK/dV gathers and sums along the
// columns, the Q and partial-result gathers and sums along the rows.
Group phase_group(const std::string& step) {
  if (step == "kv_transpose" || step == "dkv_transpose") return Group::pair;
  if (step == "kv_allgather" || step == "kv_ring" || step == "dkv_reduce_scatter" ||
      step == "dkv_ring") {
    return Group::column;
  }
  return Group::row;
}

// ATTENTION2D-O's rings move while the ranks compute; only its transposes block.
bool overlap_blocking(const std::string& step) {
  return step == "kv_transpose" || step == "dkv_transpose";
}

// ---- Critical path ----------------------------------------------------------------------------

CriticalPath critical_path(const PhaseTimes& x) {
  CriticalPath out;
  out.forward_s = x.t("forward.kv_transpose") + x.t("forward.kv_allgather") +
                  x.t("forward.q_allgather") + x.forward_compute +
                  x.t("forward.merge_reduce_scatter");
  out.backward_s = x.t("backward.kv_transpose") + x.t("backward.q_allgather") +
                   x.t("backward.kv_allgather") + x.backward_compute +
                   x.t("backward.dq_reduce_scatter") + x.t("backward.dkv_reduce_scatter") +
                   x.t("backward.dkv_transpose");
  return out;
}

CriticalPath overlap_critical_path(const PhaseTimes& x) {
  CriticalPath out;
  const int rows = x.rows, cols = x.cols;
  const double cf = x.forward_compute, cb = x.backward_compute;
  const auto per_step = [&](const std::string& name) { return x.per_step(name); };
  const auto overlapped = [&](double compute, double comm) { return x.overlapped(compute, comm); };
  // Phase A: R steps of (own queries x one K/V part) hiding the next part's transfer.
  // Phase B: C - 1 steps of (one visiting Q part x all gathered K/V) hiding the Q and
  // partial transfers; the last partial arrives after the last step.
  double forward = 0;
  for (int s = 0; s < rows; ++s)
    forward += overlapped(cf / (rows * cols), s + 1 < rows ? per_step("forward.kv_ring") : 0.0);
  for (int s = 1; s < cols; ++s) {
    forward += overlapped(cf / cols, per_step("forward.q_ring") + per_step("forward.partial_ring"));
  }
  if (cols > 1) forward += per_step("forward.partial_ring");
  out.forward_s = x.t("forward.kv_transpose") + forward + x.reduced("forward.partial_ring");
  // The backward's dK/dV column sum is a ring of R - 1 steps beside the last pass over the
  // K/V parts: with C = 1, phase A (step s sends the part computed at step s, so the last
  // send is exposed); with C > 1, the last step of phase B, which attends its Q part to the
  // K/V parts one at a time (R calls, each but the first hiding a step of the sum).
  const double dkv = per_step("backward.dkv_ring");
  const double q = per_step("backward.q_ring"), dq = per_step("backward.dq_ring");
  double backward = 0;
  for (int s = 0; s < rows; ++s) {
    backward += overlapped(cb / (rows * cols), (s + 1 < rows ? per_step("backward.kv_ring") : 0.0) +
                                                   (cols == 1 && s >= 2 ? dkv : 0.0));
  }
  if (cols == 1 && rows > 1) backward += dkv;
  for (int s = 1; s + 1 < cols; ++s)
    backward += overlapped(cb / cols, q + dq);
  if (cols > 1) {
    // The last step: R calls of c = C_b/(CR). Its Q and dQ transfers are in flight during
    // all of them; step k of the sum starts when call k is done and step k - 1 has arrived,
    // so the sum ends at c + (R - 1)·step(dkv_ring) when its steps outlast the calls.
    const double call = cb / (cols * rows);
    if (x.can_overlap) {
      backward += std::max({cb / cols, q + dq, call + (rows - 1) * dkv});
    } else {
      backward += overlapped(call, q + dq);
      for (int k = 2; k <= rows; ++k)
        backward += overlapped(call, dkv);
    }
    backward += dq;
  }
  out.backward_s = x.t("backward.kv_transpose") + backward + x.reduced("backward.dq_ring") +
                   x.reduced("backward.dkv_ring") + x.t("backward.dkv_transpose");
  return out;
}

// ---- FLOPs ------------------------------------------------------------------------------------

double rank_flops(const Problem& p, const Plan& plan, int rank) {
  const GridCoords at{plan.grid, rank};
  const Wide rows = plan.grid.rows, cols = plan.grid.cols, ranks = plan.grid.size();
  const Wide r = at.row(), c = at.col();
  const Wide queries = ceil_div(p.seq - r, rows);  // t = r (mod R)
  Wide pairs = 0;
  if (plan.kv_transpose) {
    pairs = progression_vs_class(p.mask, p.seq, r, rows, queries, c, cols);  // keys t = c (mod C)
  } else {
    for (Wide k = 0; k < rows; ++k) {  // keys t mod P in [c R, c R + R)
      pairs += progression_vs_class(p.mask, p.seq, r, rows, queries, c * rows + k, ranks);
    }
  }
  return flops(p, pairs * p.heads);
}

// The first, middle and last of every row and column index: the causal work of a rank grows with
// its row and shrinks with its column, so the extremes lie on these lines.
std::vector<int> flops_sample(const Plan& plan) {
  std::vector<int> sample;
  const int rows = plan.grid.rows, cols = plan.grid.cols;
  const int pick_rows[] = {0, rows / 2, rows - 1};
  const int pick_cols[] = {0, cols / 2, cols - 1};
  for (const int r : pick_rows)
    for (int c = 0; c < cols; c += std::max(1, cols / 64))
      sample.push_back(GridCoords::rank_of(plan.grid, r, c));
  for (const int c : pick_cols)
    for (int r = 0; r < rows; r += std::max(1, rows / 64))
      sample.push_back(GridCoords::rank_of(plan.grid, r, c));
  for (const int r : pick_rows)
    for (const int c : pick_cols)
      sample.push_back(GridCoords::rank_of(plan.grid, r, c));
  return sample;
}

// ---- Memory -----------------------------------------------------------------------------------

Transient memory(const Problem&, const Plan& plan, const MemoryTerms& m) {
  const double b = m.b, h = m.h, d = m.d, e = m.e, f = m.f, n = m.n, big_n = m.big_n;
  const double kv_row = m.kv_row, q_row = m.q_row;
  const double q_rows = std::ceil(big_n / plan.grid.rows),
               kv_rows = std::ceil(big_n / plan.grid.cols);
  const double q_back = b * h * (2 * f + 2 * d * e);  // bytes of one Q-side backward row
  const double dkv_return = (m.narrow ? 2 : 1) * e * n * kv_row;  // rounded part, own part
  Transient out;
  if (!overlapped_variant(plan)) {
    out.forward = e * (n * kv_row + kv_rows * kv_row + q_rows * q_row) +
                  f * (q_rows * b * h * (d + 2) + n * b * h * (d + 2));
    out.backward = q_rows * q_back + e * (n * kv_row + kv_rows * kv_row) +
                   f * (q_rows * q_row + kv_rows * kv_row + n * q_row + n * kv_row) + dkv_return;
  } else {
    out.forward = e * (n * kv_row + kv_rows * kv_row + 3 * n * q_row) + f * 4 * n * b * h * (d + 2);
    out.backward = e * (n * kv_row + kv_rows * kv_row) + 3 * n * q_back +
                   f * (4 * n * q_row + kv_rows * kv_row + n * kv_row) + dkv_return;
  }
  return out;
}

// ---- Reordering -------------------------------------------------------------------------------

struct PermuteTerms {
  double b, h, big_n, kv_row, dkv_row, q_rows, kv_rows;
  bool q_sorted, kv_sorted;
  WireRecords wire;
};

PermuteTerms permute_terms(const Problem& p, const Plan& plan) {
  PermuteTerms x;
  x.b = static_cast<double>(p.batch);
  x.h = static_cast<double>(p.heads);
  const double hkv = static_cast<double>(p.kv_heads);
  x.big_n = static_cast<double>(p.seq);
  x.wire = wire_records(p);
  x.kv_row = x.b * hkv * static_cast<double>(x.wire.kv);    // one [k v] record row
  x.dkv_row = x.b * hkv * static_cast<double>(x.wire.dkv);  // one fp32 [dk dv] row
  // A gather over more than one rank interleaves positions (cyclic shards).
  x.q_sorted = plan.grid.cols > 1;
  x.kv_sorted = plan.grid.rows > 1;
  x.q_rows = std::ceil(x.big_n / plan.grid.rows);
  x.kv_rows = std::ceil(x.big_n / plan.grid.cols);
  return x;
}

// Forward: Q and K/V sorted, the partial results (acc, max, sum) put back. Backward: the Q-side
// records (q, dO, LSE, delta) and K/V sorted, dQ and dK/dV put back.
double reordered_bytes(const Problem& p, const Plan& plan, bool forward) {
  const PermuteTerms x = permute_terms(p, plan);
  if (forward) {
    return (x.q_sorted ? x.q_rows * x.b * x.h * static_cast<double>(x.wire.q + x.wire.partial)
                       : 0) +
           (x.kv_sorted ? x.kv_rows * x.kv_row : 0);
  }
  return (x.q_sorted ? x.q_rows * x.b * x.h * static_cast<double>(x.wire.q_backward + x.wire.dq)
                     : 0) +
         (x.kv_sorted ? x.kv_rows * (x.kv_row + x.dkv_row) : 0);
}

// The gathered K/V is sorted before phase B (none with one column); the backward sorts dK/dV with
// it and puts both back before phase B's last step.
double overlap_reordered_bytes(const Problem& p, const Plan& plan, bool forward) {
  const PermuteTerms x = permute_terms(p, plan);
  if (!x.kv_sorted || plan.grid.cols == 1) return 0;
  return forward ? x.kv_rows * x.kv_row : 2 * x.kv_rows * (x.kv_row + x.dkv_row);
}

// ---- Kernel calls -----------------------------------------------------------------------------

// Forward and backward make the same calls but in ATTENTION2D-O's backward, whose last phase-B
// step attends its Q part to the K/V parts one at a time.
Calls kernel_calls(const Problem& problem, const Plan& plan, const SequenceParts&, int rank,
                   bool backward) {
  Calls out;
  out.heads = problem.heads;
  // Under a mask that hides pairs ATTENTION2D sorts the gathered rows by position (records.hpp).
  const bool by_position = problem.mask.hides_pairs();  // sort_by_position (records.hpp)
  const Attention2DRank at = attention2d_rank(problem, plan, rank);
  const std::vector<int64_t> kv = by_position ? sorted(at.kv_positions) : at.kv_positions;
  if (!overlapped_variant(plan)) {
    out.calls.push_back({by_position ? sorted(at.q_positions) : at.q_positions, kv});
    return out;
  }
  // Phase A: own queries against each K/V part; phase B: every other Q part against all K/V.
  std::vector<int64_t> q_offsets(at.row_counts.size() + 1, 0),
      kv_offsets(at.col_counts.size() + 1, 0);
  std::partial_sum(at.row_counts.begin(), at.row_counts.end(), q_offsets.begin() + 1);
  std::partial_sum(at.col_counts.begin(), at.col_counts.end(), kv_offsets.begin() + 1);
  const std::vector<int64_t> own =
      slice(at.q_positions, q_offsets[static_cast<size_t>(at.col)], at.own_tokens);
  for (size_t part = 0; part < at.col_counts.size(); ++part)
    out.calls.push_back({own, slice(at.kv_positions, kv_offsets[part], at.col_counts[part])});
  const int rows = plan.grid.rows, cols = plan.grid.cols;
  const size_t last = static_cast<size_t>((at.col + 1) % cols);  // phase B's last Q part
  for (size_t part = 0; part < at.row_counts.size(); ++part) {
    if (static_cast<int>(part) == at.col) continue;
    const std::vector<int64_t> q = slice(at.q_positions, q_offsets[part], at.row_counts[part]);
    if (backward && part == last && rows > 1) {
      for (size_t kv_part = 0; kv_part < at.col_counts.size(); ++kv_part)
        out.calls.push_back(
            {q, slice(at.kv_positions, kv_offsets[kv_part], at.col_counts[kv_part])});
    } else {
      out.calls.push_back({q, kv});
    }
  }
  return out;
}

AlgorithmEntry common_entry() {
  AlgorithmEntry e;
  e.traits.grid = true;
  e.traits.cyclic_only = true;
  e.default_plan = defaults;
  e.check = check;
  e.make = algorithms::make_attention2d;
  e.traffic = traffic;
  e.phase_group = phase_group;
  e.rank_flops = rank_flops;
  e.flops_sample = flops_sample;
  e.memory = memory;
  e.kernel_calls = kernel_calls;
  return e;
}

}  // namespace

const AlgorithmEntry& attention2d_entry() {
  static const AlgorithmEntry entry = [] {
    AlgorithmEntry e = common_entry();
    e.traits.algorithm = Algorithm::attention2d;
    e.traits.name = "attention2d";
    e.plans = [](std::vector<Plan>& out, const Problem& problem, int ranks,
                 const PlanChoices& choices) {
      plans(out, problem, ranks, choices, Algorithm::attention2d);
    };
    e.critical_path = critical_path;
    e.permuted_bytes = reordered_bytes;
    return e;
  }();
  return entry;
}

const AlgorithmEntry& attention2d_overlap_entry() {
  static const AlgorithmEntry entry = [] {
    AlgorithmEntry e = common_entry();
    e.traits.algorithm = Algorithm::attention2d_overlap;
    e.traits.name = "attention2d-overlap";
    e.plans = [](std::vector<Plan>& out, const Problem& problem, int ranks,
                 const PlanChoices& choices) {
      plans(out, problem, ranks, choices, Algorithm::attention2d_overlap);
    };
    e.blocking = overlap_blocking;
    e.critical_path = overlap_critical_path;
    e.permuted_bytes = overlap_reordered_bytes;
    e.backward_calls_differ = true;
    return e;
  }();
  return entry;
}

}  // namespace a2d
