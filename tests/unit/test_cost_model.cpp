// The cost model's closed forms against the exact, token-by-token decomposition, and the model's
// basic properties.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <numeric>
#include <sstream>
#include <vector>

#include <algorithm>

#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"

namespace a2d {
namespace {

Problem problem_of(int64_t seq, Mask mask, int64_t heads = 4, int64_t kv_heads = 2) {
  Problem p;
  p.batch = 2;
  p.seq = seq;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = 8;
  p.mask = mask;
  return p;
}

double exact_flops(const Problem& p, const Plan& plan, int rank) {
  const double per_pair = 4.0 * p.head_dim * p.batch;
  switch (plan.algorithm) {
    case Algorithm::attention2d:
    case Algorithm::attention2d_overlap:
      return per_pair * p.heads * attention2d_unmasked_pairs(p, plan, rank);
    case Algorithm::ring:
    case Algorithm::allgather_kv:
      return per_pair * p.heads * sequence_parallel_unmasked_pairs(p, plan, rank);
    case Algorithm::ulysses:
      return per_pair * ulysses_heads(p, plan.grid.size(), rank).heads *
             count_visible_pairs(p.mask, nullptr, p.seq, nullptr, p.seq);
    case Algorithm::hybrid: {
      const Problem group = hybrid_group_problem(p, plan);
      return per_pair * group.heads *
             attention2d_unmasked_pairs(group, hybrid_group_plan(plan),
                                        hybrid_rank(plan, rank).sequence_group);
    }
  }
  return 0;
}

TEST(CostModel, ClosedFormFlopsEqualTheExactDecompositionForEveryRank) {
  int checked = 0;
  for (const Mask& base : {Mask::none(), Mask::causal(), Mask::causal_window(7)}) {
    for (const int ranks : {1, 2, 3, 4, 6, 9}) {
      for (const int64_t seq : {int64_t{1}, int64_t{ranks - 1 > 0 ? ranks - 1 : 1}, int64_t{37},
                                int64_t{64 * ranks + 5}}) {
        // Without documents, with one-token documents around a long one, and the skewed mix.
        std::vector<int64_t> around_long = {1, seq - 2, 1};
        if (seq > 7) around_long = {1, seq - 7, 1, 1, 3, 1};
        for (const int documents : {0, 1, 2}) {
          if (documents > 0 && seq < 4) continue;
          const Mask mask = documents == 0 ? base
                            : documents == 1
                                ? base.with_documents(around_long)
                                : base.with_documents(generated_document_lengths("skewed", seq, 3));
          const Problem p = problem_of(seq, mask, 2 * ranks, ranks);
          std::vector<Plan> plans;
          for (const GridShape& shape : grid_shapes(ranks)) {
            for (const bool transpose : {true, false}) {
              Plan plan = default_plan(Algorithm::attention2d, p, ranks);
              plan.grid = shape;
              plan.kv_transpose = transpose;
              plans.push_back(plan);
            }
          }
          for (const LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag,
                                          LayoutKind::striped, LayoutKind::cyclic}) {
            for (const int64_t stripe : {1, 3}) {
              Plan plan = default_plan(Algorithm::ring, p, ranks);
              plan.layout = layout;
              plan.stripe = stripe;
              plans.push_back(plan);
            }
          }
          plans.push_back(default_plan(Algorithm::ulysses, p, ranks));
          // Every hybrid factorisation (U divides H = 2P and Hkv = P).
          for (const Plan& plan : hybrid_plans(p, ranks))
            plans.push_back(plan);
          for (const Plan& plan : plans) {
            double busiest = 0;
            for (int rank = 0; rank < ranks; ++rank) {
              const double exact = exact_flops(p, plan, rank);
              ASSERT_DOUBLE_EQ(rank_forward_flops(p, plan, rank), exact)
                  << plan.describe() << " " << mask.describe() << " N=" << seq << " rank " << rank;
              busiest = std::max(busiest, exact);
              ++checked;
            }
            // Small grids are sampled completely: the busiest rank is found (the contiguous causal
            // ring reports its larger step-synchronous critical path).
            EXPECT_GE(busiest_forward_flops(p, plan), busiest) << plan.describe();
            if (!(plan.algorithm == Algorithm::ring && plan.layout == LayoutKind::contiguous)) {
              EXPECT_DOUBLE_EQ(busiest_forward_flops(p, plan), busiest) << plan.describe();
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 3000);
}

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

TEST(CostModel, SearchListsEveryCandidateAndSkipsUlyssesWithAReason) {
  Problem p = problem_of(4096, Mask::causal(), 12, 4);
  p.dtype = DType::bf16;
  const PlanSearch search = search_plans(p, 6, preset_machine("h100-ndr", DType::bf16), 8);
  // 4 grids x 2 variants x 2 transposes + ring + allgather-kv + the hybrid at U = 2 (grids 1x3
  // and 3x1); Ulysses cannot (6 does not divide 4), nor the hybrid at U = 3 (grids 1x2, 2x1) and
  // U = 6 (neither divides nor is a multiple of Hkv = 4).
  EXPECT_EQ(search.ranked.size(), 20u);
  ASSERT_EQ(search.skipped.size(), 4u);
  EXPECT_EQ(search.skipped[0].first, "ulysses");
  int hybrids = 0;
  for (const RankedPlan& r : search.ranked) {
    if (r.plan.algorithm != Algorithm::hybrid) continue;
    EXPECT_EQ(r.plan.heads_parallel, 2);
    ++hybrids;
  }
  EXPECT_EQ(hybrids, 2);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(search.skipped[i].first, "hybrid");
    EXPECT_NE(search.skipped[i].second.find("must divide the number of K/V heads (4)"),
              std::string::npos)
        << search.skipped[i].second;
  }
  // Fastest first, but for ties: plans within kPlanTieTolerance of each other rank by memory
  // (test_planner.cpp checks that order).
  for (size_t i = 1; i < search.ranked.size(); ++i) {
    const auto total = [](const RankedPlan& r) {
      return r.prediction.forward_s + r.prediction.backward_s;
    };
    EXPECT_LE(total(search.ranked[i - 1]), total(search.ranked[i]) * (1 + kPlanTieTolerance));
  }
}

TEST(CostModel, MachinesAndCalibrationFiles) {
  EXPECT_THROW(preset_machine("tpu", DType::bf16), Error);
  const std::string file = ::testing::TempDir() + "/a2d-calibration-test.txt";
  std::remove(file.c_str());
  EXPECT_THROW(local_machine(file, 4), Error);
  Calibration c;
  c.ranks = 4;
  c.cores = 2;
  c.kernel_forward_flops = 20e9;
  c.kernel_backward_flops = 15e9;
  c.kernel_forward_causal_flops = 10e9;
  c.kernel_backward_causal_flops = 5e9;
  c.block = 0;  // no kernel-tile model: the causal rates apply to causal problems
  c.latency_s = 2e-6;
  c.bytes_per_s = 3e9;
  save_calibration(file, c);
  c.ranks = 9;
  c.kernel_forward_flops = 7e9;
  save_calibration(file, c);
  const Machine four = local_machine(file, 4), nine = local_machine(file, 9);
  EXPECT_DOUBLE_EQ(four.kernel_forward_flops, 20e9);
  EXPECT_DOUBLE_EQ(nine.kernel_forward_flops, 7e9);
  EXPECT_DOUBLE_EQ(four.intra.bytes_per_s, 3e9);
  EXPECT_EQ(four.shared_cores, 2);
  EXPECT_DOUBLE_EQ(four.kernel_forward_causal_flops, 10e9);
  EXPECT_DOUBLE_EQ(four.kernel_backward_causal_flops, 5e9);
  EXPECT_THROW(local_machine(file, 16), Error);
  // Files from before the synchronisation, sorting and forward-overhead terms: none charged.
  EXPECT_EQ(four.sync_s, 0.0);
  EXPECT_EQ(four.step_sync_s, 0.0);
  EXPECT_EQ(four.permute_bytes_per_s, 0.0);
  EXPECT_EQ(four.kernel_forward_panel_s, 0.0);
  EXPECT_EQ(four.kernel_forward_key_s, 0.0);
  EXPECT_EQ(four.sum_bytes_per_s, 0.0);
  EXPECT_EQ(four.merge_bytes_per_s, 0.0);
  c.ranks = 3;
  c.sync_s = 2e-3;
  c.step_sync_s = 1e-3;
  c.permute_bytes_per_s = 5e9;
  c.kernel_forward_panel_s = 3e-6;
  c.kernel_forward_key_s = 2e-8;
  c.sum_bytes_per_s = 3e9;
  c.merge_bytes_per_s = 1.5e9;
  save_calibration(file, c);
  const Machine three = local_machine(file, 3);
  EXPECT_DOUBLE_EQ(three.sum_bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(three.merge_bytes_per_s, 1.5e9);
  EXPECT_DOUBLE_EQ(three.sync_s, 2e-3);
  EXPECT_DOUBLE_EQ(three.step_sync_s, 1e-3);
  EXPECT_DOUBLE_EQ(three.permute_bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(three.kernel_forward_panel_s, 3e-6);
  EXPECT_DOUBLE_EQ(three.kernel_forward_key_s, 2e-8);

  // A causal problem is charged at the causal rates, a non-causal one at the plain rates.
  Problem problem;
  problem.seq = 4096;
  problem.heads = problem.kv_heads = 8;
  problem.head_dim = 64;
  Plan plan = default_plan(Algorithm::ring, problem, 4);
  const Prediction plain = predict(problem, plan, four, 4);
  EXPECT_DOUBLE_EQ(plain.forward_compute_s, plain.forward_flops / 20e9);
  EXPECT_DOUBLE_EQ(plain.backward_compute_s, plain.backward_flops / 15e9);
  problem.mask = Mask::causal();
  plan = default_plan(Algorithm::ring, problem, 4);
  const Prediction causal = predict(problem, plan, four, 4);
  EXPECT_DOUBLE_EQ(causal.forward_compute_s, causal.forward_flops / 10e9);
  EXPECT_DOUBLE_EQ(causal.backward_compute_s, causal.backward_flops / 5e9);

  // With the calibration block recorded, the CPU kernels' tiles are charged: a non-causal
  // problem whose calls are whole multiples of the tiles costs its FLOPs at the plain rates times
  // the calibration block's own padding, and a causal one at least its unmasked FLOPs.
  c.ranks = 2;
  c.block = 1024;
  save_calibration(file, c);
  const Machine tiled = local_machine(file, 2);
  EXPECT_EQ(tiled.tile_block, 1024);
  problem.mask = Mask::none();
  problem.seq = 2 * 4608;  // 4608 = 96 x 48: every call is whole tiles
  plan = default_plan(Algorithm::ring, problem, 2);
  const Prediction whole = predict(problem, plan, tiled, 2);
  EXPECT_NEAR(whole.backward_compute_s,
              whole.backward_flops / 15e9 / (1056.0 * 1056.0 / (1024.0 * 1024.0)),
              1e-9 * whole.backward_compute_s);
  problem.mask = Mask::causal();
  plan = default_plan(Algorithm::ring, problem, 2);
  const Prediction tiled_causal = predict(problem, plan, tiled, 2);
  EXPECT_GT(tiled_causal.backward_compute_s,
            tiled_causal.backward_flops / 15e9 / (1056.0 * 1056.0 / (1024.0 * 1024.0)));
}

TEST(CostModel, KernelTilesAreCountedAsTheKernelsSkipThem) {
  const auto range = [](int64_t first, int64_t count) {
    std::vector<int64_t> positions(static_cast<size_t>(count));
    std::iota(positions.begin(), positions.end(), first);
    return positions;
  };
  // Non-causal: every tile, padded (1024 rows are 22 query tiles of 48 and 11 key tiles of 96;
  // 43 forward panels of 24).
  const std::vector<int64_t> block = range(0, 1024);
  EXPECT_EQ(backward_tile_entries(Mask::none(), block, block), 1056.0 * 1056.0);
  EXPECT_EQ(forward_tile_entries(Mask::none(), block, block), 1032.0 * 1024.0);
  // A causal diagonal block of one key tile: both query tiles are partly visible, computed whole.
  const std::vector<int64_t> diagonal = range(0, 96);
  EXPECT_EQ(backward_tile_entries(Mask::causal(), diagonal, diagonal), 2.0 * 48 * 96);
  // Forward: 4 panels of 24 rows against one 256-key tile; panel i sees blocks up to its last
  // row, trimmed at the hidden end: 24 * (24, 48, 72, 96) keys.
  EXPECT_EQ(forward_tile_entries(Mask::causal(), diagonal, diagonal), 24.0 * (24 + 48 + 72 + 96));
  // Keys entirely after the queries: nothing.
  EXPECT_EQ(backward_tile_entries(Mask::causal(), range(0, 96), range(96, 96)), 0.0);
  EXPECT_EQ(forward_tile_entries(Mask::causal(), range(0, 96), range(96, 96)), 0.0);
  // A key tile straddling two runs far apart (chunks of 64 keys) is partly visible to every query
  // tile and computed whole, although a third of it is hidden: 96 x 96 entries for the 96 x 64
  // the mask lets through; the second key tile (the rest of the later chunk) is skipped.
  std::vector<int64_t> straddle = range(1000, 64);
  for (const int64_t p : range(5000, 64))
    straddle.push_back(p);
  const std::vector<int64_t> queries = range(2000, 96);
  EXPECT_EQ(backward_tile_entries(Mask::causal(), queries, straddle), 2.0 * 48 * 96);
}

// A machine whose ranks share one core (no overlap), with round numbers.
Machine shared_machine() {
  Machine m;
  m.name = "test";
  m.kernel_forward_flops = m.kernel_backward_flops = 1e9;
  m.intra = m.inter = Link{1e-6, 1e9};
  m.shared_cores = 1;
  return m;
}

GridShape grid_of(int rows, int cols) {
  for (const GridShape& shape : grid_shapes(rows * cols))
    if (shape.rows == rows && shape.cols == cols) return shape;
  ADD_FAILURE() << "no grid " << rows << "x" << cols;
  return {};
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

TEST(CostModel, ForwardPanelsAndKeysAreCountedPerCall) {
  Problem problem;
  problem.seq = 50;
  problem.heads = problem.kv_heads = 2;
  problem.head_dim = 8;
  // One rank: one call of 50 queries (3 panels of 24) against 50 keys, per head.
  const TileEntries one =
      busiest_tile_entries(problem, default_plan(Algorithm::attention2d, problem, 1));
  EXPECT_EQ(one.forward_panels, 2 * 3.0);
  EXPECT_EQ(one.forward_keys, 2 * 50.0);
  // Ring Attention on 2 ranks: two calls of 25 queries (2 panels) against 25 keys, per head.
  const TileEntries ring = busiest_tile_entries(problem, default_plan(Algorithm::ring, problem, 2));
  EXPECT_EQ(ring.forward_panels, 2 * 2 * 2.0);
  EXPECT_EQ(ring.forward_keys, 2 * 2 * 25.0);
  // The model charges them on top of the entries: with the calibration block's own shape the
  // totals agree, and short calls pay more per entry.
  Machine m = shared_machine();
  m.tile_block = 48;
  Machine overheads = m;
  overheads.kernel_forward_panel_s = 1e-6;
  overheads.kernel_forward_key_s = 1e-8;
  const Plan ring_plan = default_plan(Algorithm::ring, problem, 2);
  EXPECT_GT(predict(problem, ring_plan, overheads, 2).forward_compute_s,
            predict(problem, ring_plan, m, 2).forward_compute_s);
}

// a2d bench --calibrate measures before and after its rows and predicts with the average: the
// mean of the two times for every term.
TEST(CostModel, CalibrationsAverageTheirTimes) {
  Calibration a, b;
  a.ranks = b.ranks = 4;
  a.kernel_forward_flops = 10e9;  // 1 s per 10 GFLOP
  b.kernel_forward_flops = 40e9;  // 0.25 s
  a.bytes_per_s = 1e9;
  b.bytes_per_s = 3e9;
  a.permute_bytes_per_s = 2e9;  // b: not measured
  a.merge_bytes_per_s = 1e9;
  b.merge_bytes_per_s = 4e9;
  a.latency_s = 10e-6;
  b.latency_s = 30e-6;
  a.sync_s = 0;
  b.sync_s = 2e-3;
  a.kernel_forward_panel_s = 1e-6;
  b.kernel_forward_panel_s = 3e-6;
  const Calibration c = average_calibrations(a, b);
  EXPECT_DOUBLE_EQ(10e9 / c.kernel_forward_flops, (1.0 + 0.25) / 2);
  EXPECT_DOUBLE_EQ(1 / c.bytes_per_s, (1 / 1e9 + 1 / 3e9) / 2);
  EXPECT_DOUBLE_EQ(c.permute_bytes_per_s, 2e9);
  EXPECT_DOUBLE_EQ(1 / c.merge_bytes_per_s, (1 / 1e9 + 1 / 4e9) / 2);
  EXPECT_DOUBLE_EQ(c.latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(c.sync_s, 1e-3);
  EXPECT_DOUBLE_EQ(c.kernel_forward_panel_s, 2e-6);
  b.ranks = 8;
  EXPECT_THROW(average_calibrations(a, b), Error);
}

// a2d calibrate times the forward on calls of several shapes and fits what a call costs per
// score entry, per 24-row panel and per key: exact times give the costs back; a cost the times
// make negative is dropped and the rest refitted; times that cannot be fitted give none.
TEST(CostModel, ForwardCallCostsAreFittedFromTimedShapes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 256}, {256, 64}, {64, 256},
                                                           {256, 32},  {32, 256}, {64, 64}};
  const auto times = [&](double e, double p, double k) {
    std::vector<double> t;
    for (const auto& [rows, keys] : shapes) {
      std::vector<int64_t> q(static_cast<size_t>(rows)), kv(static_cast<size_t>(keys));
      std::iota(q.begin(), q.end(), int64_t{0});
      std::iota(kv.begin(), kv.end(), int64_t{0});
      t.push_back(e * forward_tile_entries(Mask::none(), q, kv) +
                  p * static_cast<double>((rows + 23) / 24) + k * static_cast<double>(keys));
    }
    return t;
  };
  const ForwardCallCosts exact = fit_forward_call_costs(shapes, times(3e-9, 1.5e-6, 2e-8));
  EXPECT_NEAR(exact.entry_s, 3e-9, 3e-9 * 1e-6);
  EXPECT_NEAR(exact.panel_s, 1.5e-6, 1.5e-6 * 1e-6);
  EXPECT_NEAR(exact.key_s, 2e-8, 2e-8 * 1e-6);
  // Keys that seem to save time: the key cost is dropped, entries and panels refitted.
  const ForwardCallCosts no_keys = fit_forward_call_costs(shapes, times(3e-9, 1.5e-6, -1e-9));
  EXPECT_EQ(no_keys.key_s, 0.0);
  EXPECT_GT(no_keys.entry_s, 0.0);
  EXPECT_GT(no_keys.panel_s, 0.0);
  // Calls that get faster with more work: nothing usable.
  const ForwardCallCosts none = fit_forward_call_costs(shapes, times(-1e-9, 1e-3, 1e-5));
  EXPECT_EQ(none.entry_s, 0.0);
  EXPECT_EQ(none.panel_s, 0.0);
  EXPECT_EQ(none.key_s, 0.0);
  EXPECT_THROW(fit_forward_call_costs(shapes, {1.0, 2.0}), Error);
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

// The message of the a2d::Error `body` throws ("" when it throws none).
std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(CostModel, MachineFilesHoldEveryFieldAndFailLoudly) {
  const std::string file = ::testing::TempDir() + "/a2d-machine-test.txt";
  const auto write = [&](const std::string& text) {
    FILE* out = std::fopen(file.c_str(), "w");
    ASSERT_NE(out, nullptr);
    std::fputs(text.c_str(), out);
    std::fclose(out);
  };
  const std::string required =
      "device = cpu\nranks_per_node = 4\nshared_link = 1\nintra_latency_us = 2\n"
      "intra_bandwidth_gbs = 3\ninter_latency_us = 60   # a comment\n"
      "inter_bandwidth_gbs = 0.0125\nmemory_gib = 1.5\nkernel_forward_gflops = 5\n"
      "kernel_backward_gflops = 4\n";
  write("name = test-cluster\n" + required +
        "kernel_forward_causal_gflops = 3\nkernel_backward_causal_gflops = 2\nblock = 1024\n"
        "kernel_forward_panel_us = 1.5\nkernel_forward_key_us = 0.25\npermute_gbs = 6\n"
        "sum_gbs = 7\nmerge_gbs = 8\ncores = 2\nsync_us = 30\nstep_sync_us = 40\n"
        "cyclic_placement = 1\nkernel_forward_gflops_bf16 = 6\n");
  const Machine m = load_machine_file(file, DType::f32);
  EXPECT_EQ(m.name, "test-cluster");
  EXPECT_FALSE(m.gpu);
  EXPECT_FALSE(machine_file_is_gpu(file));
  EXPECT_EQ(m.ranks_per_node, 4);
  EXPECT_TRUE(m.shared_link);
  EXPECT_EQ(m.memory_bytes, int64_t{3} << 29);
  EXPECT_DOUBLE_EQ(m.intra.latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(m.intra.bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(m.inter.latency_s, 60e-6);
  EXPECT_DOUBLE_EQ(m.inter.bytes_per_s, 12.5e6);
  EXPECT_DOUBLE_EQ(m.kernel_forward_flops, 5e9);
  EXPECT_DOUBLE_EQ(m.kernel_backward_flops, 4e9);
  EXPECT_DOUBLE_EQ(m.kernel_forward_causal_flops, 3e9);
  EXPECT_DOUBLE_EQ(m.kernel_backward_causal_flops, 2e9);
  EXPECT_EQ(m.tile_block, 1024);
  EXPECT_DOUBLE_EQ(m.kernel_forward_panel_s, 1.5e-6);
  EXPECT_DOUBLE_EQ(m.kernel_forward_key_s, 0.25e-6);
  EXPECT_DOUBLE_EQ(m.permute_bytes_per_s, 6e9);
  EXPECT_DOUBLE_EQ(m.sum_bytes_per_s, 7e9);
  EXPECT_DOUBLE_EQ(m.merge_bytes_per_s, 8e9);
  EXPECT_EQ(m.shared_cores, 2);
  EXPECT_DOUBLE_EQ(m.sync_s, 30e-6);
  EXPECT_DOUBLE_EQ(m.step_sync_s, 40e-6);
  EXPECT_TRUE(m.cyclic_placement);
  // Kernel rates per dtype: a dtype's own key over the plain one (which serves every dtype on a
  // CPU machine).
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::bf16).kernel_forward_flops, 6e9);
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::bf16).kernel_backward_flops, 4e9);
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::f16).kernel_forward_flops, 5e9);

  // Every required key, in turn, missing: an error naming it.
  std::istringstream lines(required);
  for (std::string skip; std::getline(lines, skip);) {
    std::string text;
    std::istringstream again(required);
    for (std::string line; std::getline(again, line);)
      if (line != skip) text += line + "\n";
    write(text);
    const std::string key = skip.substr(0, skip.find(' '));
    EXPECT_NE(error_of([&] { load_machine_file(file, DType::f32); }).find("'" + key),
              std::string::npos)
        << "without: " << skip;
  }
  // A required key replaced by a bad value: the message names the line and says why.
  const auto with = [&](const std::string& key, const std::string& value) {
    std::string text;
    std::istringstream again(required);
    for (std::string line; std::getline(again, line);)
      text += (line.rfind(key + " ", 0) == 0 ? key + " = " + value : line) + "\n";
    write(text);
    return error_of([&] { load_machine_file(file, DType::f32); });
  };
  EXPECT_NE(with("ranks_per_node", "8.5").find(":2: 'ranks_per_node' needs a whole number"),
            std::string::npos);
  EXPECT_NE(with("ranks_per_node", "0").find("must be between 1"), std::string::npos);
  EXPECT_NE(with("shared_link", "2").find("'shared_link' must be between 0 and 1"),
            std::string::npos);
  EXPECT_NE(with("inter_bandwidth_gbs", "0").find("must be positive"), std::string::npos);
  EXPECT_NE(with("inter_latency_us", "-1").find("must be >= 0"), std::string::npos);
  EXPECT_NE(with("memory_gib", "lots").find("'memory_gib' needs a number"), std::string::npos);
  EXPECT_NE(with("device", "tpu").find("'device' is gpu or cpu"), std::string::npos);
  // Unknown keys, repeated keys, malformed lines.
  write(required + "inter_bandwidth = 1\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::f32); }).find("unknown key"),
            std::string::npos);
  write(required + "sum_gbs = fast\n");
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);
  write(required + "cyclic_placement = 0.5\n");
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);
  write(required + "shared_link = 0\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::f32); }).find("given twice"),
            std::string::npos);
  write(required + "no equals sign\n");
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);

  // A GPU machine: rates per dtype only (a plain rate is refused), none of the CPU kernels'
  // terms, and a dtype without rates refused by name.
  std::string gpu = required;
  gpu.replace(gpu.find("device = cpu"), 12, "device = gpu");
  gpu.replace(gpu.find("kernel_forward_gflops = 5\nkernel_backward_gflops = 4\n"), 52,
              "kernel_forward_gflops_bf16 = 300\nkernel_backward_gflops_bf16 = 200\n");
  write(gpu);
  EXPECT_TRUE(machine_file_is_gpu(file));
  EXPECT_TRUE(load_machine_file(file, DType::bf16).gpu);
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::bf16).kernel_backward_flops, 200e9);
  EXPECT_NE(error_of([&] {
              load_machine_file(file, DType::f16);
            }).find("gives no 'kernel_forward_gflops_fp16'"),
            std::string::npos);
  write(gpu + "kernel_forward_gflops = 1\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::bf16); }).find("per dtype"),
            std::string::npos);
  write(gpu + "cores = 2\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::bf16); }).find("CPU kernels"),
            std::string::npos);
  std::remove(file.c_str());
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);
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

namespace a2d {
namespace {

// The caller's shards of a test: an even contiguous slice per rank, an uneven cut with rank 1
// empty, zigzag, cyclic and striped(2).
std::vector<TokenLayout> shard_layouts(int64_t seq, int ranks) {
  std::vector<TokenLayout> list = {
      TokenLayout(LayoutKind::contiguous, seq, ranks), TokenLayout(LayoutKind::zigzag, seq, ranks),
      TokenLayout(LayoutKind::cyclic, seq, ranks), TokenLayout(LayoutKind::striped, seq, ranks, 2)};
  std::vector<int64_t> counts(static_cast<size_t>(ranks), 0);
  counts[0] = ranks == 1 ? seq : seq / 3;
  for (int r = 2; r < ranks; ++r)
    counts[static_cast<size_t>(r)] = (seq - counts[0]) / (ranks - 2);
  int64_t total = 0;
  for (const int64_t c : counts)
    total += c;
  counts.back() += seq - total;
  list.push_back(TokenLayout::contiguous_counts(counts));
  return list;
}

TEST(CostModel, RelayoutPhasesChargeTheExchangeOfEveryRank) {
  Machine machine = preset_machine("h100-ndr", DType::bf16);
  machine.sync_s = 3e-6;  // charged once per exchange that sends
  int checked = 0;
  for (const int ranks : {1, 3, 4, 6, 7}) {
    // N odd and divisible by neither P nor 2P; GQA 12:4; bf16 with an odd head dim (records of
    // O and LSE padded to 4 bytes) and fp32.
    for (const DType dtype : {DType::bf16, DType::f32}) {
      Problem p = problem_of(14 * ranks + 5, Mask::causal(), 12, 4);
      p.batch = 1;
      p.head_dim = dtype == DType::bf16 ? 9 : 8;
      p.dtype = dtype;
      std::vector<Plan> plans;
      for (const Algorithm algorithm :
           {Algorithm::attention2d, Algorithm::attention2d_overlap, Algorithm::ring,
            Algorithm::allgather_kv, Algorithm::ulysses, Algorithm::hybrid}) {
        const Plan plan = default_plan(algorithm, p, ranks);
        try {
          check_plan(plan, p, ranks);
          plans.push_back(plan);
        } catch (const Error&) {
        }
      }
      for (const TokenLayout& user : shard_layouts(p.seq, ranks)) {
        for (const RelayoutBackward variant :
             {RelayoutBackward::saved, RelayoutBackward::stateless}) {
          const UserShards shards{user, variant};
          const RelayoutRecords records = relayout_records(p, variant);
          for (const Plan& plan : plans) {
            const std::string what =
                user.describe() + " " + plan.describe() + " " + relayout_backward_name(variant);
            const TokenLayout planned = plan_layout(p, plan);
            const bool nothing = same_assignment(user, planned);
            // Per rank: the four phases are exchange_traffic of the records, each way.
            std::map<std::string, Traffic> worst;
            Traffic forward, backward;
            for (int rank = 0; rank < ranks; ++rank) {
              const auto phases = predict_traffic(p, plan, rank, &shards);
              const auto expect_phase = [&](const char* name, const Traffic& expected) {
                const auto it = phases.find(name);
                if (nothing) {
                  EXPECT_TRUE(it == phases.end()) << what << " " << name;
                  return;
                }
                ASSERT_TRUE(it != phases.end()) << what << " " << name;
                EXPECT_EQ(it->second.bytes, expected.bytes) << what << " " << name << " " << rank;
                EXPECT_EQ(it->second.messages, expected.messages) << what << " " << name;
                worst[name].bytes = std::max(worst[name].bytes, expected.bytes);
                worst[name].messages = std::max(worst[name].messages, expected.messages);
              };
              const Traffic in_f = exchange_traffic(user, planned, rank, records.forward_in);
              const Traffic out_f = exchange_traffic(planned, user, rank, records.forward_out);
              const Traffic in_b = exchange_traffic(user, planned, rank, records.backward_in);
              const Traffic out_b = exchange_traffic(planned, user, rank, records.backward_out);
              expect_phase(kRelayoutForwardIn, in_f);
              expect_phase(kRelayoutForwardOut, out_f);
              expect_phase(kRelayoutBackwardIn, in_b);
              expect_phase(kRelayoutBackwardOut, out_b);
              if (nothing) continue;
              forward.bytes = std::max(forward.bytes, in_f.bytes + out_f.bytes);
              forward.messages = std::max(forward.messages, in_f.messages + out_f.messages);
              backward.bytes = std::max(backward.bytes, in_b.bytes + out_b.bytes);
              backward.messages = std::max(backward.messages, in_b.messages + out_b.messages);
            }
            // predict(): the busiest rank's, per phase and per direction, and their time in
            // forward_s and backward_s.
            const Prediction plain = predict(p, plan, machine, 2);
            const Prediction with = predict(p, plan, machine, 2, &shards);
            EXPECT_EQ(with.relayout_forward.bytes, forward.bytes) << what;
            EXPECT_EQ(with.relayout_forward.messages, forward.messages) << what;
            EXPECT_EQ(with.relayout_backward.bytes, backward.bytes) << what;
            EXPECT_EQ(with.relayout_backward.messages, backward.messages) << what;
            double forward_s = 0, backward_s = 0;
            for (const PhaseCost& phase : with.phases) {
              if (phase.name.find(".relayout_") == std::string::npos) continue;
              EXPECT_EQ(phase.traffic.bytes, worst[phase.name].bytes) << what << phase.name;
              EXPECT_EQ(phase.traffic.messages, worst[phase.name].messages) << what << phase.name;
              // An all-to-all of the world: over the inter-node link once it spans nodes (two
              // ranks per node here), the machine's synchronisation when it sends.
              const bool inter = ranks > 2;
              EXPECT_EQ(phase.inter_node, inter) << what;
              const Link& link = inter ? machine.inter : machine.intra;
              const double seconds = static_cast<double>(phase.traffic.messages) * link.latency_s +
                                     static_cast<double>(phase.traffic.bytes) / link.bytes_per_s +
                                     (phase.traffic.messages > 0 ? machine.sync_s : 0.0);
              EXPECT_NEAR(phase.seconds, seconds, 1e-15) << what << phase.name;
              (phase.name[0] == 'f' ? forward_s : backward_s) += phase.seconds;
            }
            EXPECT_NEAR(with.relayout_forward_s, forward_s, 1e-15) << what;
            EXPECT_NEAR(with.relayout_backward_s, backward_s, 1e-15) << what;
            EXPECT_NEAR(with.forward_s, plain.forward_s + forward_s, 1e-12) << what;
            EXPECT_NEAR(with.backward_s, plain.backward_s + backward_s, 1e-12) << what;
            EXPECT_EQ(nothing, with.relayout_forward.bytes == 0) << what;
            if (nothing) {
              EXPECT_EQ(with.memory_bytes, plain.memory_bytes) << what;
            } else {
              EXPECT_GT(with.memory_bytes, plain.memory_bytes) << what;
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 400);
}

TEST(CostModel, RelayoutOnASharedLinkCarriesTheNodesOffNodeShare) {
  // 16 ranks, 4 per node sharing one link: an all-to-all's node carries 4 * 12/15 of a rank's
  // bytes, as Ulysses' does.
  Machine machine = preset_machine("a100-hdr", DType::bf16);
  machine.shared_link = true;
  const Problem p = problem_of(4099, Mask::causal(), 8, 8);
  const Plan plan = default_plan(Algorithm::attention2d, p, 16);
  const UserShards shards{TokenLayout(LayoutKind::contiguous, 4099, 16), RelayoutBackward::saved};
  const Prediction with = predict(p, plan, machine, 4, &shards);
  int seen = 0;
  for (const PhaseCost& phase : with.phases) {
    if (phase.name.find(".relayout_") == std::string::npos) continue;
    EXPECT_TRUE(phase.inter_node);
    EXPECT_NEAR(
        phase.seconds,
        static_cast<double>(phase.traffic.messages) * machine.inter.latency_s +
            4.0 * 12 / 15 * static_cast<double>(phase.traffic.bytes) / machine.inter.bytes_per_s,
        1e-15);
    ++seen;
  }
  EXPECT_EQ(seen, 4);
}

TEST(CostModel, PlannerWeighsTheExchangeFromTheCallersShards) {
  // 16 H100s, 4 per node, N = 65536, 8 heads on 2 K/V heads (no Ulysses): ATTENTION2D-O is the
  // fastest on its own cyclic layout, but on zigzag shards the exchange in and out costs more than
  // Ring Attention, which runs on zigzag shards as they are.
  Problem p = problem_of(65536, Mask::causal(), 8, 2);
  p.batch = 1;
  p.head_dim = 128;
  p.dtype = DType::bf16;
  const Machine machine = preset_machine("h100-ndr", DType::bf16);
  const PlanSearch plain = search_plans(p, 16, machine, 4);
  EXPECT_EQ(plain.ranked.front().plan.algorithm, Algorithm::attention2d_overlap);
  const UserShards zigzag{TokenLayout(LayoutKind::zigzag, 65536, 16), RelayoutBackward::saved};
  const PlanSearch on_zigzag = search_plans(p, 16, machine, 4, true, false, &zigzag);
  EXPECT_EQ(on_zigzag.ranked.front().plan.algorithm, Algorithm::ring);
  EXPECT_EQ(on_zigzag.ranked.front().plan.layout, LayoutKind::zigzag);
  EXPECT_EQ(on_zigzag.ranked.front().prediction.relayout_forward_s, 0.0);
  // Every plan of another layout pays its exchanges; the same plans are ranked.
  EXPECT_EQ(on_zigzag.ranked.size(), plain.ranked.size());
  for (const RankedPlan& r : on_zigzag.ranked) {
    const bool same = same_assignment(zigzag.layout, plan_layout(p, r.plan));
    EXPECT_EQ(same, r.prediction.relayout_forward_s == 0) << r.plan.describe();
  }
  // Cyclic shards are ATTENTION2D's own: the same choice as without them.
  const UserShards cyclic{TokenLayout(LayoutKind::cyclic, 65536, 16), RelayoutBackward::saved};
  const PlanSearch on_cyclic = search_plans(p, 16, machine, 4, true, false, &cyclic);
  EXPECT_EQ(on_cyclic.ranked.front().plan.describe(), plain.ranked.front().plan.describe());
  // Striped(3) shards: the baselines are also tried in that layout.
  const UserShards striped{TokenLayout(LayoutKind::striped, 65536, 16, 3), RelayoutBackward::saved};
  const PlanSearch on_striped = search_plans(p, 16, machine, 4, true, false, &striped);
  bool ring_striped = false;
  for (const RankedPlan& r : on_striped.ranked) {
    ring_striped = ring_striped ||
                   (r.plan.algorithm == Algorithm::ring && r.plan.layout == LayoutKind::striped &&
                    r.plan.stripe == 3 && r.prediction.relayout_forward_s == 0);
  }
  EXPECT_TRUE(ring_striped);
  // Shards of another size are refused by predict (and skipped with the reason by the search).
  const UserShards wrong{TokenLayout(LayoutKind::zigzag, 65535, 16), RelayoutBackward::saved};
  EXPECT_THROW(predict(p, plain.ranked.front().plan, machine, 4, &wrong), Error);
}

}  // namespace
}  // namespace a2d
