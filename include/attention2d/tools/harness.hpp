// attention2d: running a distributed problem end to end, for the command-line program, the
// benchmarks and the tests: generated or loaded inputs, each rank's shard buffers, gathering the
// outputs back in global token order, and comparing them with the fp64 reference.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/layout.hpp"

namespace a2d {

// Dense global tensors: q, out, d_out, dq [batch, seq, heads, head_dim]; k, v, dk, dv
// [batch, seq, kv_heads, head_dim]; lse [batch, heads, seq]. Values are fp32 holding exactly the
// problem's dtype (generated values are rounded to it).
// sinks [heads]: the sink logits of a problem with Problem::sinks (generate_sinks), else empty.
struct GlobalTensors {
  std::vector<float> q, k, v, d_out, sinks;
};
GlobalTensors generate_global(const Problem& problem, uint64_t seed, bool with_d_out);
// Rounds every tensor to `dtype` in place (inputs read from float32 files for a 16-bit run).
void round_inputs(GlobalTensors& tensors, DType dtype);

struct GlobalOutputs {
  std::vector<float> out, lse, dq, dk, dv, dsink;  // dsink [heads] with sinks, else empty
};

// One rank's shards: host copies as fp32 values (dense [batch, tokens, heads, head_dim]; lse
// [batch, heads, tokens]) and the same tensors in buffers of a backend, in the problem's dtype,
// which the algorithms compute on. upload_inputs() copies the host inputs into the buffers (each
// value rounded to the dtype, the host copy too), download_outputs() the outputs back. For fp32
// on a host-accessible backend the buffers are the host copies themselves (nothing is copied).
struct ShardSet {
  Problem problem;
  Backend* backend = nullptr;
  int64_t tokens = 0;
  bool with_backward = false;
  std::vector<float> q, k, v, d_out, out, lse, dq, dk, dv;
  // Host arrays [heads] of Problem::sinks (the same on every rank), else empty.
  std::vector<float> sinks, dsink;

  ShardSet() = default;
  ShardSet(ShardSet&&) = default;  // buffers may be the vectors' memory: moved, never copied
  ShardSet& operator=(ShardSet&&) = default;

  ForwardShards forward(const Problem& problem);
  BackwardShards backward(const Problem& problem);
  void upload_inputs();
  void download_outputs();
  // Bytes of the shards in the backend's memory.
  int64_t device_bytes() const;

 private:
  friend ShardSet make_shards(const Problem&, const TokenLayout&, int64_t, uint64_t, bool, bool,
                              Backend&);
  friend ShardSet make_device_shards(const Problem&, const TokenLayout&, int64_t, bool, Backend&);
  struct Tensors {
    std::shared_ptr<Buffer> q, k, v, d_out, out, lse, dq, dk, dv;
  };
  bool zero_copy() const;
  Tensors buffers_;
  bool device_only_ = false;
};

// Buffers for the shards `part` holds; inputs filled from (seed, global index) and uploaded when
// `generate`.
ShardSet make_shards(const Problem& problem, const TokenLayout& layout, int64_t part, uint64_t seed,
                     bool generate, bool backward, Backend& backend);
// Buffers only, in the backend's memory, with no host copies (the host vectors stay empty and
// upload_inputs / download_outputs refuse): for the simulated device (sim.hpp), whose buffers hold
// no values and where P ranks' host copies would not fit in one machine.
ShardSet make_device_shards(const Problem& problem, const TokenLayout& layout, int64_t part,
                            bool backward, Backend& backend);

// Root holds `global` (ignored elsewhere); every rank receives its shard's inputs and uploads
// them.
void scatter_inputs(Communicator& comm, int root, const Problem& problem, const TokenLayout& layout,
                    const GlobalTensors& global, ShardSet& shards, bool backward);

// Every rank's outputs (downloaded from the backend), in global token order, on `root` (empty
// elsewhere).
GlobalOutputs gather_outputs(Communicator& comm, int root, const Problem& problem,
                             const TokenLayout& layout, ShardSet& shards, bool backward);

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

// The fp64 reference of the problem on `inputs` (already rounded to the dtype). In 16 bits the
// backward's delta = rowsum(dO * O) is taken of O rounded to the dtype: the O a backward receives
// in 16 bits, from which the algorithms compute delta (as every fused attention backward does;
// the rounding moves dQ and dK by a problem-dependent amount, check.hpp's
// kBf16DeltaGradientBound, which is a property of storing O in 16 bits, not of the algorithm).
struct ReferenceOutputs {
  std::vector<double> out, lse, dq, dk, dv, dsink;
};
ReferenceOutputs reference_outputs(const Problem& problem, const GlobalTensors& inputs,
                                   bool backward, int threads);
// The rows reference_outputs has computed in this process so far (it counts every row it computes,
// for progress reports), and the rows one reference_outputs computes.
int64_t reference_rows_done();
double reference_rows(const Problem& problem, bool backward);

// The bounds every output of a distributed run must meet (relative Frobenius errors against the
// fp64 reference on the rounded inputs, check.hpp). O, dQ, dK and dV are computed in fp32 and
// rounded once to the problem's dtype; LSE stays fp32.
// dsink = -sum over rows of P_sink * delta: in fp32 the fp32 bound. In 16 bits with sinks O is
// rounded to the dtype twice (by the algorithm, and again after add_sinks rescales it), so the
// delta the backward takes from it differs from the reference's (O rounded once) by up to one
// more rounding: the bound is two unit roundoffs plus the fp32 bound.
struct OutputBounds {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0, dsink = 0;
  double of(int index) const;  // in the order O, LSE, dQ, dK, dV, dsink
};
OutputBounds output_bounds(DType dtype);

// Relative Frobenius errors (check.hpp) of every output; -1 for outputs not computed.
struct OutputErrors {
  double out = -1, lse = -1, dq = -1, dk = -1, dv = -1, dsink = -1;
  double max() const;
  bool within(const OutputBounds& bounds) const;
};
OutputErrors compare_outputs(const GlobalOutputs& got, const ReferenceOutputs& expected,
                             bool backward);

}  // namespace a2d
