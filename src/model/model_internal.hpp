// Internal: what the cost model's files share with the entries of the table of algorithms
// (src/table/), which hold each algorithm's part of the model: its traffic, FLOPs, memory, kernel
// calls and critical path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/layout.hpp"

namespace a2d::model {

// ---- Traffic (traffic.cpp) ---------------------------------------------------------------------

// Each count times `per_token`.
std::vector<int64_t> times(const std::vector<int64_t>& tokens, int64_t per_token);
// Ring charges of blocks counted in bytes.
inline Traffic ring(const RingCharge& charge) {
  return {charge.elements, charge.messages};
}
inline Traffic point_to_point(int64_t bytes, bool to_self) {
  if (to_self || bytes == 0) return {0, 0};
  return {bytes, 1};
}
inline Traffic add(const Traffic& a, const Traffic& b) {
  return {a.bytes + b.bytes, a.messages + b.messages};
}

// Ring Attention and all-gather K/V: the K/V parts sent once around, and the dK/dV parts back.
struct SequenceBlocks {
  Traffic kv, dkv;
};
SequenceBlocks sequence_parallel_blocks(const Problem& p, const Plan& plan, int rank);

// ---- Unmasked pairs (flops.cpp) ----------------------------------------------------------------

// 128-bit sums: pair counts reach N^2 ~ 2^80 before the division by P.
__extension__ typedef __int128 Wide;

inline Wide ceil_div(Wide a, Wide b) {
  return a <= 0 ? 0 : (a + b - 1) / b;
}
// sum_{i=0}^{n-1} floor((a i + b) / m) for n >= 0, m >= 1, a >= 0, b >= 0 (flops.cpp).
Wide floor_sum(Wide n, Wide m, Wide a, Wide b);
// Queries q = first + i * step (i < count), keys t = key_class (mod modulus), 0 <= t < n_tokens:
// the visible (q, k) pairs.
Wide progression_vs_class(const Mask& mask, Wide n_tokens, Wide first, Wide step, Wide count,
                          Wide key_class, Wide modulus);
// Queries q = first + i * step (i < count) against all keys 0 .. n_tokens - 1.
Wide progression_vs_all(const Mask& mask, Wide n_tokens, Wide first, Wide step, Wide count);
// A layout part as arithmetic progressions of positions (first, step, count).
struct Progression {
  Wide first, step, count;
};
std::vector<Progression> part_progressions(const TokenLayout& layout, int64_t part);
// Forward FLOPs of `pairs_all_heads` visible pairs summed over the heads (per batch: x B).
double flops(const Problem& p, Wide pairs_all_heads);
// Visible pairs of the whole sequence, one head.
Wide total_pairs(const Problem& p);
// Forward FLOPs of a rank of a 1 x P algorithm whose rank attends its own queries to every key
// (Ring Attention, all-gather K/V): its part of the plan's layout against all keys.
double sequence_rank_flops(const Problem& p, const Plan& plan, int rank);

// ---- Memory (memory.cpp) ----------------------------------------------------------------------

// The terms every algorithm's transient buffers are written in: B, H, Hkv, D, the dtype's element
// size e and fp32's f, whether fp32 sums go through a rounded copy (narrow), the ranks, the most
// tokens a rank owns (n), N, and the elements of one [k v] row and of one query row.
struct MemoryTerms {
  double b, h, hkv, d, e, f;
  bool narrow;
  int ranks;
  double n, big_n, kv_row, q_row;
};
// Bytes of the shards a rank of `tokens` tokens keeps: Q, O, K, V in the dtype and LSE in fp32,
// and with the backward dO, dQ, dK, dV in the dtype too.
double shard_bytes(const Problem& p, double tokens, bool with_backward);
// Bytes of the forward's and the backward's transient buffers on the busiest rank.
struct Transient {
  double forward = 0;
  double backward = 0;
};

// ---- Kernel calls (kernel_tiles.cpp) -----------------------------------------------------------

// The kernel calls of a rank in one direction (query positions, key positions, in the order the
// algorithm passes them), per batch and query head; `heads` = the query heads the rank attends.
struct Calls {
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> calls;
  int64_t heads = 0;
};
std::vector<int64_t> sorted(std::vector<int64_t> positions);
std::vector<int64_t> slice(const std::vector<int64_t>& positions, int64_t begin, int64_t count);

// ---- Critical path (predict.cpp) ---------------------------------------------------------------

// What an algorithm's forward and backward times are composed of: its phases' seconds (the most
// any rank sends in each, with the part its reductions take), the busiest rank's kernel seconds,
// and whether computation hides communication.
struct PhaseTimes {
  const std::map<std::string, double>& seconds;
  const std::map<std::string, double>& reducing;
  const std::map<std::string, Traffic>& phases;
  double forward_compute = 0;   // C_f
  double backward_compute = 0;  // C_b
  bool can_overlap = true;
  double step_sync_s = 0;
  int rows = 1, cols = 1, ranks = 1;

  // A phase's seconds and the part of them its reductions take; 0 for a phase the plan lacks.
  double t(const std::string& name) const { return lookup(seconds, name); }
  double reduced(const std::string& name) const { return lookup(reducing, name); }
  // Per message of a ring phase: its transfer time divided over its messages (the formulas
  // charge a ring's reductions once, as they happen: one per received block).
  double per_step(const std::string& name) const {
    const auto it = phases.find(name);
    const int64_t m = it == phases.end() ? int64_t{0} : it->second.messages;
    return m > 0 ? (t(name) - reduced(name)) / static_cast<double>(m) : 0.0;
  }
  // Overlap hides the shorter of computation and communication, unless the ranks share cores
  // that are all busy (then the CPU does both, one after the other).
  double overlapped(double compute, double comm) const {
    if (can_overlap) return std::max(compute, comm);
    return compute + comm + (comm > 0 ? step_sync_s : 0.0);
  }

 private:
  static double lookup(const std::map<std::string, double>& of, const std::string& name) {
    const auto it = of.find(name);
    return it == of.end() ? 0.0 : it->second;
  }
};
struct CriticalPath {
  double forward_s = 0;
  double backward_s = 0;
};

// The communicator a phase uses.
enum class Group { pair, row, column, world };

}  // namespace a2d::model
