// attention2d: distributed attention, the entry points a training framework calls.
//
//   Problem  the global attention problem (batch, heads, K/V heads, sequence, head dim, mask,
//            scale): identical on every rank. A plain value (problem.hpp).
//   Plan     how to distribute it (algorithm, grid R x C, token layout, kernel threads). A plain
//            value (plan.hpp).
//   DistributedAttention
//            built collectively from both; its layout() says which global tokens each rank's
//            shards hold. forward() takes this rank's Q, K, V shards and returns its O and LSE
//            shards; backward() takes Q, K, V, O, LSE and dO shards and returns dQ, dK, dV.
//            Between the two only these N/P-sized shards are kept (by the caller).
//
// Shards are tensors in buffers of the backend the attention was made with:
// [batch, local tokens, heads, head_dim] (TokenTensor, in the problem's dtype, any strides) and
// LSE [batch, heads, local tokens] (RowTensor, fp32), with the local tokens in the order layout()
// lists them. The algorithms touch them only through the backend's operations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/plan.hpp"
#include "attention2d/problem.hpp"

namespace a2d {

// With Problem::sinks, `sinks` is a host array of the sinks' logits [heads] (fp32, the same on
// every rank), and the backward writes the sinks' gradient [heads] to the host array `dsink`:
// the sum over all ranks' rows, the same on every rank.
struct ForwardShards {
  TokenTensor q, k, v;  // read
  TokenTensor out;      // written
  RowTensor lse;        // written
  const float* sinks = nullptr;
};

struct BackwardShards {
  TokenTensor q, k, v, out, d_out;  // read
  RowTensor lse;                    // read
  TokenTensor dq, dk, dv;           // written
  const float* sinks = nullptr;
  float* dsink = nullptr;  // written
};

// Throws unless every shard tensor lies in a buffer of `backend`, holds the problem's dtype and
// [batch, tokens, heads (K, V, dK, dV: kv_heads), head_dim] elements (LSE: [batch, heads, tokens])
// inside that buffer, no two of them at one address, and the sinks' arrays are there where the
// problem has sinks. `tokens` is this rank's count in layout(). Every attention's forward and
// backward run it on every rank together before any data moves: a bad argument on one rank
// raises the same CollectiveError on all of them.
void check_shards(const Problem& problem, const Backend& backend, int64_t tokens,
                  const ForwardShards& shards);
void check_shards(const Problem& problem, const Backend& backend, int64_t tokens,
                  const BackwardShards& shards);

// The phases the per-call check_shards of every made attention charges its all-reduce to.
inline constexpr const char* kCheckForwardPhase = "check.forward";
inline constexpr const char* kCheckBackwardPhase = "check.backward";

class DistributedAttention {
 public:
  virtual ~DistributedAttention() = default;
  DistributedAttention() = default;
  DistributedAttention(const DistributedAttention&) = delete;
  DistributedAttention& operator=(const DistributedAttention&) = delete;

  virtual const Problem& problem() const = 0;
  virtual const Plan& plan() const = 0;
  // Which global tokens each world rank's shards hold (parts = world ranks).
  virtual const TokenLayout& layout() const = 0;
  virtual Backend& backend() const = 0;
  virtual void forward(const ForwardShards& shards) = 0;
  virtual void backward(const BackwardShards& shards) = 0;
};

// Collective over `world`. Before any data moves, every rank validates its problem and plan and
// all ranks check that they agree (check_agreement); any failure raises the same CollectiveError
// on every rank. The attention computes with `backend` (which must outlive it); where the
// backend's memory is not host-accessible, its communicators stage transfers through host memory
// (make_staged_communicator).
std::unique_ptr<DistributedAttention> make_attention(const Problem& problem, const Plan& plan,
                                                     Communicator& world, Backend& backend);

// Collective: throws CollectiveError on every rank, naming each field and the ranks that hold
// each value, unless all ranks pass the same problem and plan (kernel threads may differ).
void check_agreement(Communicator& world, const Problem& problem, const Plan& plan);

}  // namespace a2d
