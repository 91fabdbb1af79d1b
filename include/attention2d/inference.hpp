// attention2d: inference. A prompt's forward (prefill) leaves every rank its K/V shard as a
// distributed KV cache; each decode step then appends T new tokens to the cache and computes
// their attention over the whole cache where the cache lies (docs/inference.md).
//
//   prefill   the planned forward (make_attention) over the N prompt tokens, in the plan's
//             layout; each rank then keeps its K and V shard, in the layout's token order, as its
//             part of the cache.
//   step      T >= 1 new tokens at positions L .. L+T-1 (L = tokens cached so far over all
//             ranks). Each goes to the rank with the fewest cached tokens (lowest rank on ties:
//             append_owners), which appends its K and V. Each rank passes the Q, K, V of the new
//             tokens it owns and receives their O and LSE:
//               1. all-gather Q of the T tokens (parts in rank order)            T H D e bytes
//               2. every rank: the partial softmax state of the T queries over its cached keys
//                  (causal by position, so also causal within the T new tokens)
//               3. reduce-scatter the partial states, merged as attention partials, to the
//                  tokens' owners (the split-KV reduction)                      T H 4(D+2) bytes
//               4. each owner finalises O and LSE of its new tokens
//             Per step and rank r (B = batch, H = query heads, e = bytes per element, c_j the new
//             tokens owned by rank j, P > 1):
//               bytes    = B H [ (T - c_{(r+1) mod P}) D e + (T - c_r) 4 (D + 2) ]
//               messages = #{j != r+1 : c_j > 0} + #{j != r : c_j > 0}
//             and nothing at P = 1: independent of the cache length (decode_step_traffic).
//
// The cache of a rank is one buffer of [k(D) v(D)] records, token-major ([tokens, batch,
// kv_heads, 2D] in the problem's dtype), with the positions of its tokens (increasing) beside
// it. It grows by doubling its capacity, so a step reallocates only when the rank's cache is
// full (O(log L) reallocations over a whole generation).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/cost_model.hpp"

namespace a2d {

// Throws a2d::Error unless `problem` can be decoded: a mask a new token extends
// (Mask::extends_causally: causal, plain or windowed; it sees only keys at or before its
// position), without packed documents; a two-sided window and a range mask are refused, saying
// why.
void check_decodable(const Problem& problem);

// The owners of `tokens` appended tokens, in order, given each rank's cached token counts: each
// goes to the rank holding the fewest (lowest rank on ties), whose count then grows by one. A
// cyclic prompt stays cyclic (token t on rank t mod P) forever.
std::vector<int> append_owners(std::vector<int64_t> cached_counts, int64_t tokens);

// One step's assignment: which rank owns each of the T new tokens.
struct DecodeStep {
  int64_t first_position = 0;      // L: the tokens cached before the step
  int64_t tokens = 0;              // T
  std::vector<int> owners;         // owner of position L + i
  std::vector<int64_t> counts;     // new tokens per rank (P entries)
  std::vector<int64_t> positions;  // the new positions grouped by owner, ranks in order
  std::vector<int64_t> offsets;    // offset of rank j's tokens in `positions` (P + 1 entries)

  // The positions rank j owns (increasing): the rows of its DecodeShards.
  std::vector<int64_t> positions_of(int rank) const;
};
DecodeStep plan_decode_step(const std::vector<int64_t>& cached_counts, int64_t tokens);

// What rank `rank` sends in one step (the formula above), by phase: "decode.q_allgather" and
// "decode.merge".
struct DecodeTraffic {
  Traffic q_allgather, merge;
  Traffic total() const {
    return {q_allgather.bytes + merge.bytes, q_allgather.messages + merge.messages};
  }
};
DecodeTraffic decode_step_traffic(const Problem& problem, const std::vector<int64_t>& step_counts,
                                  int rank);

// One step's shards on one rank: the Q, K, V of the new tokens it owns ([batch, own, heads or
// kv_heads, head_dim], in the problem's dtype, in the order DecodeStep::positions_of lists them)
// and their O and LSE, written. A rank that owns none of the step's tokens may leave them unset.
// With Problem::sinks, `sinks` holds the sink logits [heads] on every rank.
struct DecodeShards {
  TokenTensor q, k, v;
  TokenTensor out;
  RowTensor lse;
  const float* sinks = nullptr;
};

class DistributedDecoder {
 public:
  virtual ~DistributedDecoder() = default;
  DistributedDecoder() = default;
  DistributedDecoder(const DistributedDecoder&) = delete;
  DistributedDecoder& operator=(const DistributedDecoder&) = delete;

  // The prompt's problem (seq = N) and the plan of its forward.
  virtual const Problem& problem() const = 0;
  virtual const Plan& plan() const = 0;
  virtual const TokenLayout& prompt_layout() const = 0;
  virtual Backend& backend() const = 0;

  // Collective, once: the forward over the prompt (shards in prompt_layout()), which then
  // becomes the cache.
  virtual void prefill(const ForwardShards& shards) = 0;
  // The assignment of the next step of `tokens` tokens (the same on every rank; no
  // communication).
  virtual DecodeStep next_step(int64_t tokens) const = 0;
  // Collective, after prefill: one step of `tokens` new tokens (the same on every rank).
  virtual void step(int64_t tokens, const DecodeShards& shards) = 0;

  virtual int64_t sequence() const = 0;                       // tokens cached over all ranks (L)
  virtual std::vector<int64_t> cached_counts() const = 0;     // per rank
  virtual const std::vector<int64_t>& positions() const = 0;  // this rank's, increasing
  virtual int64_t capacity() const = 0;                       // this rank's cache, in tokens
  virtual int64_t reallocations() const = 0;                  // times this rank's cache grew
};

// Collective over `world` (as make_attention, which it calls for the prefill: every rank
// validates the problem and plan, including check_decodable, and all agree, before any data
// moves). `capacity` reserves room for this many cached tokens per rank (0: the prompt's shard;
// the cache doubles as it fills).
std::unique_ptr<DistributedDecoder> make_decoder(const Problem& prompt, const Plan& plan,
                                                 Communicator& world, Backend& backend,
                                                 int64_t capacity = 0);

// ---- the cost model of decode (docs/inference.md) ---------------------------------------------

// One step at cache length L (tokens cached before it) on `ranks` ranks, the cache grown by
// append_owners from the prompt's plan layout.
struct DecodePrediction {
  double step_s = 0;         // the busiest rank's: Q gather + kernel + merge
  double kernel_s = 0;       // its kernel
  double comm_s = 0;         // its two collectives
  Traffic traffic;           // of the rank that sends the most
  int64_t cache_tokens = 0;  // the largest rank's cache before the step
  int64_t cache_bytes = 0;   // its K/V bytes (capacity not counted)
};
DecodePrediction predict_decode_step(const Problem& prompt, const Plan& plan,
                                     const Machine& machine, int ranks_per_node,
                                     int64_t cached_tokens, int64_t tokens_per_step);

}  // namespace a2d
