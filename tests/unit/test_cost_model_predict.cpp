// The cost model's predictions: per-phase times (synchronisation, overlap, permutation,
// reductions, element sizes, shared links) and the hybrid's traffic against its closed forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <sstream>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "cost_model_case.hpp"

namespace a2d {
namespace {

using namespace cost_model_case;

TEST(CostModel, ContiguousRingCriticalPathMatchesTheStepSynchronousSchedule) {
  const Problem p = problem_of(64 * 8, Mask::causal());
  Plan plan = default_plan(Algorithm::ring, p, 8);
  plan.layout = LayoutKind::contiguous;
  const double per_pair = 4.0 * p.head_dim * p.batch * p.heads;
  EXPECT_DOUBLE_EQ(busiest_forward_flops(p, plan), per_pair * ring_critical_path_pairs(p, plan));
}

TEST(CostModel, PredictionsArePositiveAndAttention2DSendsLessThanRing) {
  Problem p = problem_of(1 << 15, Mask::causal(), 32, 32);
  p.head_dim = 128;
  p.batch = 1;
  p.dtype = DType::bf16;
  const Machine machine = preset_machine("a100-hdr", DType::bf16);
  const Prediction ring = predict(p, default_plan(Algorithm::ring, p, 64), machine, 4);
  const Prediction a2d = predict(p, default_plan(Algorithm::attention2d, p, 64), machine, 4);
  EXPECT_GT(ring.forward_s, 0);
  EXPECT_GT(a2d.backward_s, 0);
  EXPECT_LT(a2d.forward.bytes * 2, ring.forward.bytes);  // 8x8 grid: ~4ND/8 vs 2ND words
  EXPECT_DOUBLE_EQ(a2d.forward_flops * 2.5, a2d.backward_flops);
  EXPECT_GT(a2d.memory_bytes, 0);
}

TEST(CostModel, SynchronisationIsChargedPerBlockingOperationAndPerRingStep) {
  Problem problem;
  problem.seq = 64;
  problem.heads = problem.kv_heads = 2;
  problem.head_dim = 8;
  const Machine plain = shared_machine();
  Machine synced = plain;
  synced.sync_s = 1;
  synced.step_sync_s = 10;
  // ATTENTION2D-NO: every phase is a blocking operation; those in which some rank sends pay once.
  Plan no = default_plan(Algorithm::attention2d, problem, 4);
  no.grid = grid_of(2, 2);
  const Prediction base = predict(problem, no, plain, 4);
  double forward_blocking = 0, backward_blocking = 0;
  for (const PhaseCost& phase : base.phases) {
    if (phase.traffic.messages == 0) continue;
    (phase.name.rfind("forward", 0) == 0 ? forward_blocking : backward_blocking) += 1;
  }
  EXPECT_EQ(forward_blocking, 4);  // K/V transpose, K/V and Q gathers, the merge
  EXPECT_EQ(backward_blocking, 6);
  const Prediction no_synced = predict(problem, no, synced, 4);
  EXPECT_NEAR(no_synced.forward_s - base.forward_s, forward_blocking, 1e-9);
  EXPECT_NEAR(no_synced.backward_s - base.backward_s, backward_blocking, 1e-9);
  // Ring Attention: no blocking operation; a step pays when it waits for a transfer (forward:
  // the first P - 1 shifts; backward: K/V shifts and dK/dV shifts, which cover all P steps).
  const Plan ring = default_plan(Algorithm::ring, problem, 4);
  const Prediction ring_base = predict(problem, ring, plain, 4);
  const Prediction ring_synced = predict(problem, ring, synced, 4);
  EXPECT_NEAR(ring_synced.forward_s - ring_base.forward_s, 10.0 * 3, 1e-9);
  EXPECT_NEAR(ring_synced.backward_s - ring_base.backward_s, 10.0 * 4, 1e-9);
  // One accelerator per rank overlaps: the machine's synchronisation terms are 0 there anyway,
  // and overlap does not add them.
  Machine accelerators = synced;
  accelerators.shared_cores = 0;
  Machine accelerators_plain = plain;
  accelerators_plain.shared_cores = 0;
  EXPECT_NEAR(predict(problem, ring, accelerators, 4).forward_s,
              predict(problem, ring, accelerators_plain, 4).forward_s, 1e-9);
}

// ATTENTION2D-O's backward sums dK/dV along the column as a ring beside the last pass over the
// K/V parts (docs/attention2d.md): where computation overlaps communication and dominates it,
// only the transposes, the last dQ step and (with one column) the sum's last step show.
TEST(CostModel, OverlappedBackwardHidesTheColumnSumOfDkDv) {
  Problem problem;
  problem.seq = 96;
  problem.heads = problem.kv_heads = 2;
  problem.head_dim = 8;
  Machine accelerators = shared_machine();
  accelerators.shared_cores = 0;
  accelerators.kernel_forward_flops = accelerators.kernel_backward_flops = 1e3;  // compute-bound
  const auto seconds = [](const Prediction& p, const std::string& name) {
    for (const PhaseCost& phase : p.phases)
      if (phase.name == name) return phase.seconds;
    ADD_FAILURE() << "no phase " << name;
    return 0.0;
  };
  const auto messages = [](const Prediction& p, const std::string& name) {
    for (const PhaseCost& phase : p.phases)
      if (phase.name == name) return static_cast<double>(phase.traffic.messages);
    return 0.0;
  };
  for (const auto& [rows, cols] : {std::pair{2, 3}, std::pair{3, 2}, std::pair{6, 1}}) {
    Plan plan = default_plan(Algorithm::attention2d_overlap, problem, 6);
    plan.grid = grid_of(rows, cols);
    const Prediction p = predict(problem, plan, accelerators, 6);
    const double exposed = cols > 1
                               ? seconds(p, "backward.dq_ring") / messages(p, "backward.dq_ring")
                               : seconds(p, "backward.dkv_ring") / messages(p, "backward.dkv_ring");
    EXPECT_GT(seconds(p, "backward.dkv_ring"), 0) << rows << "x" << cols;
    EXPECT_NEAR(p.backward_s,
                seconds(p, "backward.kv_transpose") + p.backward_compute_s + exposed +
                    seconds(p, "backward.dkv_transpose"),
                1e-9 * p.backward_s)
        << rows << "x" << cols;
  }
  // Where ranks share cores, every step of the sum costs its time and a step's synchronisation.
  Machine synced = shared_machine();
  synced.step_sync_s = 10;
  Plan square = default_plan(Algorithm::attention2d_overlap, problem, 4);
  square.grid = grid_of(2, 2);
  const double base = predict(problem, square, shared_machine(), 4).backward_s;
  // Phase A's K/V shift, the last phase-B step's Q and dQ transfers, its second call's dK/dV step.
  EXPECT_NEAR(predict(problem, square, synced, 4).backward_s - base, 3 * 10.0, 1e-9);
}

TEST(CostModel, SortedRowsAreChargedAtThePermutationRate) {
  Problem problem;
  problem.seq = 8;
  problem.heads = problem.kv_heads = 1;
  problem.head_dim = 2;
  Plan no = default_plan(Algorithm::attention2d, problem, 4);
  no.grid = grid_of(2, 2);
  EXPECT_EQ(permuted_bytes(problem, no, true), 0.0);  // no mask: nothing is sorted
  problem.mask = Mask::causal();
  no = default_plan(Algorithm::attention2d, problem, 4);
  no.grid = grid_of(2, 2);
  // fp32, in floats (4 bytes each): 4 gathered Q rows (q: 2 floats) sorted and 4 partial rows
  // (acc, max, sum: 4) put back; 4 gathered [k v] rows (4 floats) sorted. Backward: Q-side records
  // (q, dO, LSE, delta: 6) sorted and dQ (2) put back; K/V sorted and dK/dV put back.
  EXPECT_EQ(permuted_bytes(problem, no, true), 4 * (4.0 * (2 + 4) + 4.0 * 4));
  EXPECT_EQ(permuted_bytes(problem, no, false), 4 * (4.0 * (6 + 2) + 2 * 4.0 * 4));
  Plan one_row = no;
  one_row.grid = grid_of(1, 4);  // a column of one rank gathers no K/V: only Q is sorted
  EXPECT_EQ(permuted_bytes(problem, one_row, true), 4 * (8.0 * (2 + 4)));
  Plan overlap = default_plan(Algorithm::attention2d_overlap, problem, 4);
  overlap.grid = grid_of(2, 2);
  EXPECT_EQ(permuted_bytes(problem, overlap, true), 4 * (4.0 * 4));
  // Backward: K/V and dK/dV sorted before phase B, both put back before its last step (which
  // attends its Q part to the K/V parts one at a time, in their gathered order).
  EXPECT_EQ(permuted_bytes(problem, overlap, false), 4 * (4 * 4.0 * 4));
  Plan one_column = overlap;
  one_column.grid = grid_of(4, 1);  // no phase B: the K/V parts are used in their gathered order
  EXPECT_EQ(permuted_bytes(problem, one_column, true), 0.0);
  EXPECT_EQ(permuted_bytes(problem, one_column, false), 0.0);
  const Plan gather = default_plan(Algorithm::allgather_kv, problem, 4);
  EXPECT_EQ(permuted_bytes(problem, gather, true), 4 * (8.0 * 4));
  EXPECT_EQ(permuted_bytes(problem, gather, false), 4 * (2 * 8.0 * 4));
  EXPECT_EQ(permuted_bytes(problem, default_plan(Algorithm::ring, problem, 4), true), 0.0);
  // Charged at the machine's rate: bytes / (bytes per second).
  Machine fast = shared_machine();
  Machine sorting = fast;
  sorting.permute_bytes_per_s = 1.0;  // one second per byte
  EXPECT_NEAR(predict(problem, no, sorting, 4).forward_compute_s -
                  predict(problem, no, fast, 4).forward_compute_s,
              permuted_bytes(problem, no, true), 1e-9);
}

// The gamma term of reductions: every word a reduce-scatter or reduction ring receives is merged
// (partial attention results) or summed (gradients), charged per word the busiest rank sends in
// the phase, at the machine's rate.
TEST(CostModel, ReductionsAreChargedPerReceivedWordAtTheirRates) {
  Problem problem;
  problem.seq = 60;
  problem.heads = 4;
  problem.kv_heads = 2;
  problem.head_dim = 8;
  const Machine plain = shared_machine();
  Machine merging = plain, summing = plain;
  merging.merge_bytes_per_s = 4.0;  // one second per float
  summing.sum_bytes_per_s = 8.0;    // half a second per float
  const auto floats = [](const Prediction& p, const std::string& phase) {
    for (const PhaseCost& c : p.phases) {
      if (c.name == phase) return static_cast<double>(c.traffic.bytes) / 4.0;
    }
    return 0.0;
  };
  for (const Algorithm algorithm :
       {Algorithm::attention2d, Algorithm::ring, Algorithm::allgather_kv, Algorithm::ulysses}) {
    const Plan plan = default_plan(algorithm, problem, 2);
    SCOPED_TRACE(algorithm_name(algorithm));
    const Prediction base = predict(problem, plan, plain, 2);
    const Prediction merged = predict(problem, plan, merging, 2);
    const Prediction summed = predict(problem, plan, summing, 2);
    EXPECT_NEAR(merged.forward_s - base.forward_s, floats(base, "forward.merge_reduce_scatter"),
                1e-9);
    EXPECT_NEAR(merged.backward_s, base.backward_s, 1e-9);  // gradients are summed, not merged
    EXPECT_NEAR(summed.forward_s, base.forward_s, 1e-9);
    EXPECT_NEAR(
        summed.backward_s - base.backward_s,
        0.5 * (floats(base, "backward.dq_reduce_scatter") +
               floats(base, "backward.dkv_reduce_scatter") + floats(base, "backward.dkv_ring")),
        1e-9);
  }
  // The cases above are not empty: ATTENTION2D-NO on one row of 2 merges, all-gather K/V and
  // Ring Attention sum dK, dV; Ulysses reduces nothing.
  Plan row = default_plan(Algorithm::attention2d, problem, 2);
  row.grid = grid_of(1, 2);
  const Prediction row_base = predict(problem, row, plain, 2);
  EXPECT_GT(floats(row_base, "forward.merge_reduce_scatter"), 0.0);
  EXPECT_GT(predict(problem, row, merging, 2).forward_s, row_base.forward_s);
  EXPECT_GT(floats(predict(problem, default_plan(Algorithm::ring, problem, 2), plain, 2),
                   "backward.dkv_ring"),
            0.0);
  // ATTENTION2D-O merges along its partial ring and sums along its dQ ring, once per received
  // part (the ring formulas charge a step's transfer per message, the reductions once).
  Plan overlap = default_plan(Algorithm::attention2d_overlap, problem, 2);
  overlap.grid = grid_of(1, 2);
  const Prediction o_base = predict(problem, overlap, plain, 2);
  EXPECT_GT(floats(o_base, "forward.partial_ring"), 0.0);
  EXPECT_NEAR(predict(problem, overlap, merging, 2).forward_s - o_base.forward_s,
              floats(o_base, "forward.partial_ring"), 1e-9);
  EXPECT_NEAR(
      predict(problem, overlap, summing, 2).backward_s - o_base.backward_s,
      0.5 * (floats(o_base, "backward.dq_ring") + floats(o_base, "backward.dkv_reduce_scatter")),
      1e-9);
}

// The element size of each phase: bf16 tensors 2 bytes per element, fp32 statistics, partial
// results and partial sums 4 (wire_records), on a 2 x 2 grid of ATTENTION2D-NO, N = 8, D = 4, one
// head: every rank owns 2 tokens, gathers 2 more Q and K/V rows and keeps 2.
TEST(CostModel, Bf16ChargesTwoBytesPerTensorElementAndFourPerStatistic) {
  Problem problem;
  problem.seq = 8;
  problem.heads = problem.kv_heads = 1;
  problem.head_dim = 4;
  problem.dtype = DType::bf16;
  const WireRecords wire = wire_records(problem);
  EXPECT_EQ(wire.q, 4 * 2);
  EXPECT_EQ(wire.kv, 2 * 4 * 2);
  EXPECT_EQ(wire.partial, 4 * (4 + 2));
  EXPECT_EQ(wire.q_backward, 2 * 4 + 2 * 4 * 2);
  EXPECT_EQ(wire.dq, 4 * 4);
  EXPECT_EQ(wire.dkv, 2 * 4 * 4);
  EXPECT_EQ(wire.dkv_final, 2 * 4 * 2);
  Plan plan = default_plan(Algorithm::attention2d, problem, 4);
  plan.grid = grid_of(2, 2);
  Problem fp32 = problem;
  fp32.dtype = DType::f32;
  // Rank 0 (row 0, column 0): the diagonal keeps its K/V; 2 tokens of the other rank of its row
  // and of its column are gathered (one block each), 2 of its own are merged and summed.
  const auto bf16 = predict_traffic(problem, plan, 0);
  const auto f32 = predict_traffic(fp32, plan, 0);
  EXPECT_EQ(bf16.at("forward.q_allgather").bytes, 2 * wire.q);
  EXPECT_EQ(bf16.at("forward.kv_allgather").bytes, 2 * wire.kv);
  EXPECT_EQ(bf16.at("forward.merge_reduce_scatter").bytes, 2 * wire.partial);
  EXPECT_EQ(bf16.at("backward.q_allgather").bytes, 2 * wire.q_backward);
  EXPECT_EQ(bf16.at("backward.dq_reduce_scatter").bytes, 2 * wire.dq);
  EXPECT_EQ(bf16.at("backward.dkv_reduce_scatter").bytes, 2 * wire.dkv);
  for (const char* phase : {"forward.q_allgather", "forward.kv_allgather", "backward.kv_allgather"})
    EXPECT_EQ(2 * bf16.at(phase).bytes, f32.at(phase).bytes) << phase;
  for (const char* phase : {"forward.merge_reduce_scatter", "backward.dq_reduce_scatter",
                            "backward.dkv_reduce_scatter"})
    EXPECT_EQ(bf16.at(phase).bytes, f32.at(phase).bytes) << phase;
  // Words in units of the dtype's element.
  const Prediction p = predict(problem, plan, shared_machine(), 4);
  EXPECT_DOUBLE_EQ(2 * p.words_forward, static_cast<double>(p.forward.bytes));
}

TEST(CostModel, SharedLinksCarryTheOffNodeTrafficOfEveryRankOfTheirNode) {
  // 16 ranks, 4 per node (nodes hold ranks 0-3, 4-7, ...). Grid 4x4, column-major: a column is
  // one node, so the column phases stay inside and every rank's row successor (rank + 4) is on
  // another node: the node's link carries 4 ranks' row traffic.
  Plan grid = default_plan(Algorithm::attention2d, problem_of(4096, Mask::causal()), 16);
  grid.grid = {4, 4};
  EXPECT_EQ(shared_link_load(grid, "forward.q_allgather", 4), 4);
  EXPECT_EQ(shared_link_load(grid, "forward.kv_allgather", 4), 0);
  // 2x8: a node holds two columns of two ranks; in a row's ring the first column's successor is
  // the second (same node), the second's the next node's: 2 of the node's 4 ranks send off it.
  grid.grid = {2, 8};
  EXPECT_EQ(shared_link_load(grid, "forward.q_allgather", 4), 2);
  EXPECT_EQ(shared_link_load(grid, "forward.kv_allgather", 4), 0);
  // 8x2: a column spans two nodes; of a node's 4 ranks, one has its column successor off it.
  grid.grid = {8, 2};
  EXPECT_EQ(shared_link_load(grid, "forward.kv_allgather", 4), 1);
  EXPECT_EQ(shared_link_load(grid, "forward.q_allgather", 4), 4);
  // Cyclic placement (rank q on node q mod 4): the 4x4 grid's rows lie inside nodes, and a
  // node's 4 ranks each send their column traffic off it.
  grid.grid = {4, 4};
  EXPECT_EQ(shared_link_load(grid, "forward.q_allgather", 4, true), 0);
  EXPECT_EQ(shared_link_load(grid, "forward.kv_allgather", 4, true), 4);
  grid.grid = {8, 2};
  // One rank per node: every link carries its one rank's traffic.
  EXPECT_EQ(shared_link_load(grid, "forward.q_allgather", 1), 1);
  // Ring Attention's world ring: one rank per node sends off it.
  const Plan ring = default_plan(Algorithm::ring, problem_of(4096, Mask::causal()), 16);
  EXPECT_EQ(shared_link_load(ring, "forward.kv_ring", 4), 1);
  // Ulysses' all-to-all: 4 ranks, each sending 12 of its 15 parts off the node.
  const Plan ulysses =
      default_plan(Algorithm::ulysses, problem_of(4096, Mask::causal(), 16, 16), 16);
  EXPECT_DOUBLE_EQ(shared_link_load(ulysses, "forward.to_heads_all_to_all", 4), 4.0 * 12 / 15);

  // The model charges it: the 4x4 grid's row phases cost 4 times their bytes on a shared link,
  // once on a link per rank; Ring Attention's steps the same either way.
  Machine machine;
  machine.kernel_forward_flops = machine.kernel_backward_flops = 1e12;
  machine.intra = {1e-6, 10e9};
  machine.inter = {50e-6, 12.5e6};
  Machine shared = machine;
  shared.shared_link = true;
  const Problem p = problem_of(4096, Mask::causal());
  grid.grid = {4, 4};
  const auto phase = [](const Prediction& prediction, const std::string& name) {
    for (const PhaseCost& c : prediction.phases)
      if (c.name == name) return c;
    ADD_FAILURE() << "no phase " << name;
    return PhaseCost{};
  };
  const Prediction own = predict(p, grid, machine, 4), common = predict(p, grid, shared, 4);
  const PhaseCost q_own = phase(own, "forward.q_allgather"),
                  q_common = phase(common, "forward.q_allgather");
  ASSERT_TRUE(q_own.inter_node);
  const double latency = static_cast<double>(q_own.traffic.messages) * 50e-6;
  EXPECT_NEAR(q_common.seconds - latency, 4 * (q_own.seconds - latency), 1e-9);
  EXPECT_DOUBLE_EQ(phase(own, "forward.kv_allgather").seconds,
                   phase(common, "forward.kv_allgather").seconds);
  EXPECT_DOUBLE_EQ(predict(p, ring, machine, 4).forward_s, predict(p, ring, shared, 4).forward_s);
  // The search predicts both placements when asked, and the rows-in-nodes placement makes the
  // 4x4 grid's row phases intra-node.
  Machine cyclic = shared;
  cyclic.cyclic_placement = true;
  const Prediction rows_inside = predict(p, grid, cyclic, 4);
  EXPECT_FALSE(phase(rows_inside, "forward.q_allgather").inter_node);
  EXPECT_TRUE(phase(rows_inside, "forward.kv_allgather").inter_node);
  const PlanSearch one = search_plans(p, 16, shared, 4),
                   both = search_plans(p, 16, shared, 4, true, true);
  EXPECT_EQ(both.ranked.size(), 2 * one.ranked.size());
  EXPECT_EQ(std::count_if(both.ranked.begin(), both.ranked.end(),
                          [](const RankedPlan& r) { return r.cyclic_placement; }),
            static_cast<long>(one.ranked.size()));
}

// The hybrid's closed forms (docs/attention2d.md, "Heads x ATTENTION2D"): with N a multiple of P
// (n = N/P own tokens, U n per grid rank), fp32 (one word = 4 bytes), B = 1, no K/V transpose,
// hq = H/U and hk = max(Hkv/U, 1), every rank sends
//   forward   (U-1) n (2 hq D + 2 hk D + hq) + U n (2 hk D + (C-1) hq (2 D + 2))
//   backward  (U-1) n (3 hq D + 4 hk D + 2 hq) + U n (4 hk D + (C-1) hq (3 D + 2))
// words in 2 (U-1) + (R-1) + 2 (C-1) and 2 (U-1) + 2 (R-1) + 2 (C-1) messages.
TEST(CostModel, HybridTrafficEqualsTheClosedForms) {
  int checked = 0, replicated = 0;
  for (const int ranks : {2, 4, 6, 8, 12}) {
    for (const int64_t kv_heads : {int64_t{24}, int64_t{4}, int64_t{2}}) {
      Problem p = problem_of(7 * ranks, Mask::causal(), 24, kv_heads);
      p.batch = 1;
      for (Plan plan : hybrid_plans(p, ranks)) {
        plan.kv_transpose = false;
        try {
          check_plan(plan, p, ranks);
        } catch (const Error&) {
          continue;
        }
        const double u = plan.heads_parallel, r = plan.grid.rows, c = plan.grid.cols;
        const double n = 7, d = static_cast<double>(p.head_dim);
        const double hq = 24 / u, hk = std::max(static_cast<double>(kv_heads) / u, 1.0);
        const double forward = (u - 1) * n * (2 * hq * d + 2 * hk * d + hq) +
                               u * n * (2 * (r - 1) * hk * d + (c - 1) * hq * (2 * d + 2));
        const double backward = (u - 1) * n * (3 * hq * d + 4 * hk * d + 2 * hq) +
                                u * n * (4 * (r - 1) * hk * d + (c - 1) * hq * (3 * d + 2));
        for (int rank = 0; rank < ranks; ++rank) {
          const auto phases = predict_traffic(p, plan, rank);
          const Traffic f = predicted_total(phases, "forward");
          const Traffic b = predicted_total(phases, "backward");
          EXPECT_DOUBLE_EQ(static_cast<double>(f.bytes) / 4, forward) << plan.describe();
          EXPECT_DOUBLE_EQ(static_cast<double>(b.bytes) / 4, backward) << plan.describe();
          EXPECT_EQ(f.messages, 2 * (u - 1) + (r - 1) + 2 * (c - 1)) << plan.describe();
          EXPECT_EQ(b.messages, 2 * (u - 1) + 2 * (r - 1) + 2 * (c - 1)) << plan.describe();
          ++checked;
        }
        if (hybrid_kv_replication(p, plan.heads_parallel) > 1) ++replicated;
      }
    }
  }
  EXPECT_GT(checked, 300);
  EXPECT_GT(replicated, 5);
}

// U = P (R = C = 1) sends what Ulysses sends, and U = 1 what ATTENTION2D sends, phase by phase.
TEST(CostModel, HybridAtItsEndsIsUlyssesAndAttention2D) {
  const Problem p = problem_of(9 * 8 + 5, Mask::causal(), 16, 8);
  Plan ulysses_like = default_plan(Algorithm::hybrid, p, 8);
  ulysses_like.heads_parallel = 8;
  ulysses_like.grid = {1, 1};
  Plan ulysses = default_plan(Algorithm::ulysses, p, 8);
  ulysses.layout = LayoutKind::cyclic;
  Plan attention2d_like = default_plan(Algorithm::hybrid, p, 8);
  attention2d_like.heads_parallel = 1;
  attention2d_like.grid = {2, 4};
  Plan attention2d = default_plan(Algorithm::attention2d, p, 8);
  attention2d.grid = {2, 4};
  for (int rank = 0; rank < 8; ++rank) {
    for (const auto& [mine, theirs] :
         {std::pair{ulysses_like, ulysses}, std::pair{attention2d_like, attention2d}}) {
      const auto a = predict_traffic(p, mine, rank), b = predict_traffic(p, theirs, rank);
      for (const auto& [phase, t] : b) {
        ASSERT_TRUE(a.count(phase)) << phase;
        EXPECT_EQ(a.at(phase).bytes, t.bytes) << phase << " rank " << rank;
        EXPECT_EQ(a.at(phase).messages, t.messages) << phase << " rank " << rank;
      }
      EXPECT_EQ(predicted_total(a, "").bytes, predicted_total(b, "").bytes);
    }
  }
}

}  // namespace
}  // namespace a2d
