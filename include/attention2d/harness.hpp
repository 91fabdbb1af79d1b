// attention2d: running a distributed problem end to end, for the command-line program, the
// benchmarks and the tests: generated or loaded inputs, each rank's shard buffers, gathering the
// outputs back in global token order, and comparing them with the fp64 reference.
#pragma once

#include <cstdint>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/layout.hpp"

namespace a2d {

// Dense global tensors: q, out, d_out, dq [batch, seq, heads, head_dim]; k, v, dk, dv
// [batch, seq, kv_heads, head_dim]; lse [batch, heads, seq].
struct GlobalTensors {
  std::vector<float> q, k, v, d_out;
};
GlobalTensors generate_global(const Problem& problem, uint64_t seed, bool with_d_out);

struct GlobalOutputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// One rank's shards (dense [batch, tokens, heads, head_dim]; lse [batch, heads, tokens]).
struct ShardSet {
  int64_t tokens = 0;
  std::vector<float> q, k, v, d_out, out, lse, dq, dk, dv;

  ForwardShards forward(const Problem& problem);
  BackwardShards backward(const Problem& problem);
};

// Buffers for the shards `part` holds; inputs filled from (seed, global index) when `generate`.
ShardSet make_shards(const Problem& problem, const TokenLayout& layout, int64_t part, uint64_t seed,
                     bool generate, bool backward);

// Root holds `global` (ignored elsewhere); every rank receives its shard's inputs.
void scatter_inputs(Communicator& comm, int root, const Problem& problem, const TokenLayout& layout,
                    const GlobalTensors& global, ShardSet& shards, bool backward);

// Every rank's outputs, in global token order, on `root` (empty elsewhere).
GlobalOutputs gather_outputs(Communicator& comm, int root, const Problem& problem,
                             const TokenLayout& layout, const ShardSet& shards, bool backward);

// The first non-finite input element in global order (Q, then K, V and dO; within a tensor by
// global index), over every rank's shards, and the rank that holds it. Collective.
struct NonFiniteInput {
  bool found = false;
  std::string tensor;  // "Q", "K", "V" or "dO"
  int64_t batch = 0, token = 0, head = 0, dim = 0;
  int rank = -1;
  double value = 0;
  std::string describe() const;
};
NonFiniteInput find_nonfinite(Communicator& comm, const Problem& problem, const TokenLayout& layout,
                              const ShardSet& shards, bool backward);

struct ReferenceOutputs {
  std::vector<double> out, lse, dq, dk, dv;
};
ReferenceOutputs reference_outputs(const Problem& problem, const GlobalTensors& inputs,
                                   bool backward, int threads);

// Relative Frobenius errors (check.hpp) of every output; -1 for outputs not computed.
struct OutputErrors {
  double out = -1, lse = -1, dq = -1, dk = -1, dv = -1;
  double max() const;
};
OutputErrors compare_outputs(const GlobalOutputs& got, const ReferenceOutputs& expected,
                             bool backward);

}  // namespace a2d
