// attention2d: what each rank of a plan holds, gathers and computes. Pure functions of
// (problem, plan, rank) with no communication, shared by the algorithms (which run them), the
// cost model (which counts them) and the tests (which check balance over thousands of virtual
// ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "attention2d/attention.hpp"

namespace a2d {

// One rank of an ATTENTION2D plan (both variants). Parts are cyclic parts = world ranks.
struct Attention2DRank {
  int rank = 0;
  int row = 0;
  int col = 0;
  int64_t own_tokens = 0;
  std::vector<int> row_parts;       // Q parts gathered along the row, in row order (by column)
  std::vector<int> col_parts;       // K/V parts gathered along the column, in column order
  std::vector<int64_t> row_counts;  // their token counts
  std::vector<int64_t> col_counts;
  std::vector<int64_t> q_positions;   // global positions of the gathered query rows (N/R)
  std::vector<int64_t> kv_positions;  // ... and of the gathered key rows (N/C)
  int kv_source = 0;                  // world rank whose K/V this rank holds after the transpose
  int kv_dest = 0;                    // world rank that holds this rank's K/V after the transpose

  int64_t q_rows() const;
  int64_t kv_rows() const;
};

// with_positions = false leaves q_positions and kv_positions empty (counts only: what the cost
// model needs, in O(R + C) instead of O(N/R + N/C)).
Attention2DRank attention2d_rank(const Problem& problem, const Plan& plan, int rank,
                                 bool with_positions = true);

// Unmasked (query, key) score entries a rank computes, per batch and head: the load-balance
// measure of docs/attention2d.md.
int64_t attention2d_unmasked_pairs(const Problem& problem, const Plan& plan, int rank);

// ---- What goes on the wire -------------------------------------------------------------------
//
// Bytes per record of what the algorithms send (src/algorithms/records.hpp); e = the element
// size of the problem's dtype. Tensors of the dtype travel in it; row statistics, partial
// results and partial gradient sums travel in fp32 (dtype.hpp). Shared by the algorithms and the
// cost model, so that the model charges what is sent; docs/cost-model.md lists them.
struct WireRecords {
  // per (token, batch, head):
  int64_t q = 0;           // [q(D)]                          D e
  int64_t kv = 0;          // [k(D) v(D)]                     2 D e
  int64_t partial = 0;     // [row max, row sum, acc(D)]      4 (D + 2)
  int64_t q_backward = 0;  // [lse, delta, q(D), dO(D)]       8 + 2 D e
  int64_t dq = 0;          // partial dQ sums [dq(D)]         4 D
  int64_t dkv = 0;         // partial dK, dV sums [dk dv]     8 D
  int64_t dkv_final = 0;   // summed dK, dV, rounded [dk dv]  2 D e
  // Ulysses, per (token, batch), for hq query and hkv K/V heads of one rank's group:
  int64_t ulysses_in = 0;            // [q k v]                        (hq + 2 hkv) D e
  int64_t ulysses_out = 0;           // [lse(hq) o]   rounded up to 4  4 hq + hq D e
  int64_t ulysses_backward_in = 0;   // [lse delta q dO k v]           8 hq + (2 hq + 2 hkv) D e
  int64_t ulysses_backward_out = 0;  // [dq dk dv]                     (hq + 2 hkv) D e
};
// ulysses_ranks: the group size P for the Ulysses records (0 = leave them 0).
WireRecords wire_records(const Problem& problem, int ulysses_ranks = 0);

// ---- Baselines (docs/baselines.md) ----------------------------------------------------------
//
// Ring Attention, all-gather K/V and Ulysses run on all P ranks as one group, with the tokens of
// Q, K, V (and O, the gradients) in the plan's layout. Part i = the shard of world rank i.

// The parts of the plan's layout in rank order: the order in which Ring Attention's K/V blocks
// visit a rank and in which the all-gather and Ulysses' all-to-all concatenate them.
struct SequenceParts {
  std::vector<int64_t> counts;     // tokens of part i (P entries)
  std::vector<int64_t> offsets;    // offset of part i in the concatenation (P + 1 entries; N last)
  std::vector<int64_t> positions;  // global positions of part 0's tokens, then part 1's, ... (N)

  int parts() const { return static_cast<int>(counts.size()); }
  const int64_t* positions_of(int part) const;
};
SequenceParts sequence_parts(const Problem& problem, const Plan& plan,
                             bool with_positions = true);  // false: counts and offsets only

// Ring Attention: the K/V part that `rank` attends to at step `step` (0 .. P-1). K/V blocks
// travel to rank + 1, so step s brings the part of rank - s; step 0 is the rank's own.
int ring_part_at(int ranks, int rank, int step);

// Unmasked score entries per batch and head that `rank` computes at ring step `step`: its own
// queries against part ring_part_at(P, rank, step).
int64_t ring_step_unmasked_pairs(const Problem& problem, const Plan& plan, int rank, int step);
// The same over all steps: the rank's queries against every key. This is also the work of an
// all-gather K/V rank, which computes the same pairs in one call.
int64_t sequence_parallel_unmasked_pairs(const Problem& problem, const Plan& plan, int rank);
// The ring's critical path under a step-synchronous schedule: sum over steps of the busiest
// rank's entries at that step. Neighbours are coupled every step (the exchange with both must
// complete; in the backward a dK, dV accumulator is ready only when rank - 1 has finished the
// previous step), so per-step imbalance is not absorbed by later steps.
int64_t ring_critical_path_pairs(const Problem& problem, const Plan& plan);

// Ulysses: the heads a rank attends to after the all-to-all. Rank j gets K/V heads
// [j Hkv/P, (j+1) Hkv/P) and the query heads of those groups, [j H/P, (j+1) H/P); each K/V head
// goes to one rank only (GQA and MQA are not expanded). Requires P | Hkv (check_plan).
struct UlyssesHeads {
  int64_t first_head = 0;
  int64_t heads = 0;
  int64_t first_kv_head = 0;
  int64_t kv_heads = 0;
};
UlyssesHeads ulysses_heads(const Problem& problem, int ranks, int rank);

// ---- Hybrid: heads x ATTENTION2D (docs/attention2d.md, "Heads x ATTENTION2D") ---------------
//
// P = U x R x C, S = R C. World rank w = s + S u is rank s of heads group u (the ATTENTION2D grid
// of world ranks S u .. S u + S - 1) and member u of sequence group s (the U ranks s, s + S, ...,
// s + S (U - 1), between which the all-to-all runs). The shards are cyclic over the P world ranks,
// so sequence group s holds exactly the tokens t = s (mod S): grid rank s's cyclic shard of the
// R x C grid.
struct HybridRank {
  int heads_group = 0;     // u
  int sequence_group = 0;  // s: the rank in the group's grid
};
HybridRank hybrid_rank(const Plan& plan, int rank);
int hybrid_world_rank(const Plan& plan, int heads_group, int sequence_group);

// The heads of group u: query heads [u H/U, (u+1) H/U) and, when U divides Hkv, K/V heads
// [u Hkv/U, (u+1) Hkv/U); when Hkv divides U, the one K/V head u / (U/Hkv) those queries use,
// which U/Hkv groups then share (K/V heads replicated, as InternEvo does). check_plan refuses any
// other U.
UlyssesHeads hybrid_heads(const Problem& problem, int heads_parallel, int group);
// How many groups share each K/V head (1 unless U > Hkv).
int64_t hybrid_kv_replication(const Problem& problem, int heads_parallel);
// What runs inside every heads group: ATTENTION2D (no-overlap, the plan's grid and K/V transpose)
// on the whole sequence with the group's heads and no sinks (the hybrid adds them over the world).
Problem hybrid_group_problem(const Problem& problem, const Plan& plan);
Plan hybrid_group_plan(const Plan& plan);
// Tokens of every member of sequence group s (its U world ranks' cyclic shards), in member order.
std::vector<int64_t> hybrid_member_counts(const Problem& problem, const Plan& plan,
                                          int sequence_group);
// Every hybrid plan of `ranks` with U > 1: each U dividing P and each grid R x C of P / U, in
// increasing U (U = P, grid 1 x 1, last), whether or not the heads allow it (check_plan says).
std::vector<Plan> hybrid_plans(const Problem& problem, int ranks);
// The Ulysses records (WireRecords::ulysses_*) for a group of hq query and hkv K/V heads.
void set_heads_records(WireRecords& wire, const Problem& problem, const UlyssesHeads& group);

}  // namespace a2d
