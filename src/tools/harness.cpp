#include "attention2d/tools/harness.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>

#include "attention2d/error.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/session.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/data.hpp"
#include "attention2d/watchdog.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d {
namespace {

// Copies the rows of `tokens` (global indices) between a global [batch, seq, heads, dim] tensor
// and a dense shard [batch, n, heads, dim].
void copy_rows(const Problem& p, int64_t heads, const std::vector<int64_t>& tokens,
               const float* from, float* to, bool global_to_shard) {
  const int64_t row = heads * p.head_dim;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t global = (b * p.seq + tokens[i]) * row;
      const int64_t local = (b * n + i) * row;
      if (global_to_shard) {
        std::copy_n(from + global, row, to + local);
      } else {
        std::copy_n(from + local, row, to + global);
      }
    }
  }
}

// The same for [batch, heads, tokens] statistics.
void copy_stats(const Problem& p, const std::vector<int64_t>& tokens, const float* shard,
                float* global) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < n; ++i)
        global[(b * p.heads + h) * p.seq + tokens[i]] = shard[(b * p.heads + h) * n + i];
}

size_t elements(const Problem& p, int64_t tokens, int64_t heads) {
  return static_cast<size_t>(p.batch * tokens * heads * p.head_dim);
}

}  // namespace

GlobalTensors generate_global(const Problem& p, uint64_t seed, bool with_d_out) {
  GlobalTensors g;
  const GlobalTokens q_shape{p.batch, p.seq, p.heads, p.head_dim};
  const GlobalTokens kv_shape{p.batch, p.seq, p.kv_heads, p.head_dim};
  g.q = generate_tokens(seed, TensorTag::q, q_shape);
  g.k = generate_tokens(seed, TensorTag::k, kv_shape);
  g.v = generate_tokens(seed, TensorTag::v, kv_shape);
  if (with_d_out) g.d_out = generate_tokens(seed, TensorTag::d_out, q_shape);
  if (p.sinks) g.sinks = generate_sinks(seed, p.heads);
  round_inputs(g, p.dtype);
  return g;
}

namespace {
void round_all(std::vector<float>& values, DType dtype) {
  if (dtype == DType::f32) return;
  for (float& x : values)
    x = round_to(dtype, x);
}
}  // namespace

void round_inputs(GlobalTensors& g, DType dtype) {
  round_all(g.q, dtype);
  round_all(g.k, dtype);
  round_all(g.v, dtype);
  round_all(g.d_out, dtype);
}

bool ShardSet::zero_copy() const {
  return backend->host_accessible() && problem.dtype == DType::f32;
}

namespace {
void require_same_dtype(const Problem& shards, const Problem& p) {
  A2D_REQUIRE(p.dtype == shards.dtype, "shards of ", dtype_name(shards.dtype),
              " used for a problem in ", dtype_name(p.dtype));
}
}  // namespace

ForwardShards ShardSet::forward(const Problem& p) {
  require_same_dtype(problem, p);
  const auto q_like = [&](Buffer& b) {
    return dense_token_tensor(b, p.dtype, tokens, p.heads, p.head_dim);
  };
  const auto kv_like = [&](Buffer& b) {
    return dense_token_tensor(b, p.dtype, tokens, p.kv_heads, p.head_dim);
  };
  ForwardShards f{q_like(*buffers_.q), kv_like(*buffers_.k), kv_like(*buffers_.v),
                  q_like(*buffers_.out), dense_row_tensor(*buffers_.lse, p.heads, tokens)};
  if (p.sinks) {
    A2D_REQUIRE(static_cast<int64_t>(sinks.size()) == p.heads, "the shards hold ", sinks.size(),
                " sink logits for ", p.heads, " heads");
    f.sinks = sinks.data();
  }
  return f;
}

BackwardShards ShardSet::backward(const Problem& p) {
  A2D_REQUIRE(with_backward, "these shards were made without the backward's tensors");
  const ForwardShards f = forward(p);
  const auto q_like = [&](Buffer& b) {
    return dense_token_tensor(b, p.dtype, tokens, p.heads, p.head_dim);
  };
  const auto kv_like = [&](Buffer& b) {
    return dense_token_tensor(b, p.dtype, tokens, p.kv_heads, p.head_dim);
  };
  BackwardShards b{f.q,
                   f.k,
                   f.v,
                   f.out,
                   q_like(*buffers_.d_out),
                   f.lse,
                   q_like(*buffers_.dq),
                   kv_like(*buffers_.dk),
                   kv_like(*buffers_.dv)};
  if (p.sinks) {
    dsink.assign(static_cast<size_t>(p.heads), 0.0f);
    b.sinks = f.sinks;
    b.dsink = dsink.data();
  }
  return b;
}

namespace {
// The shape of a token tensor of the shards, and the fp32 LSE's plain copies.
TokenBlock token_block(const Problem& p, int64_t tokens, int64_t heads) {
  return {p.batch, tokens, heads, p.head_dim};
}
void upload_rows(Backend& backend, const std::vector<float>& host, Buffer& buffer) {
  backend.upload(host.data(), Place::in(buffer), static_cast<int64_t>(host.size() * sizeof(float)));
}
void download_rows(Backend& backend, Buffer& buffer, std::vector<float>& host) {
  backend.download(Place::in(buffer), host.data(),
                   static_cast<int64_t>(host.size() * sizeof(float)));
}
}  // namespace

void ShardSet::upload_inputs() {
  const DType t = problem.dtype;
  A2D_REQUIRE(!device_only_, "these shards have no host copies to upload (make_device_shards)");
  if (zero_copy()) return;
  // Conversions to the dtype are the backend's (session.hpp, upload_values).
  const TokenBlock q_shape = token_block(problem, tokens, problem.heads);
  const TokenBlock kv_shape = token_block(problem, tokens, problem.kv_heads);
  upload_values(*backend, q, *buffers_.q, t, q_shape);
  upload_values(*backend, k, *buffers_.k, t, kv_shape);
  upload_values(*backend, v, *buffers_.v, t, kv_shape);
  if (with_backward) {
    upload_values(*backend, d_out, *buffers_.d_out, t, q_shape);
    // O and LSE are the backward's inputs too (a caller may have set them on the host).
    upload_values(*backend, out, *buffers_.out, t, q_shape);
    upload_rows(*backend, lse, *buffers_.lse);
  }
}

void ShardSet::download_outputs() {
  A2D_REQUIRE(!device_only_,
              "these shards have no host copies to download to (make_device_shards)");
  if (zero_copy()) return;
  const DType t = problem.dtype;
  const TokenBlock q_shape = token_block(problem, tokens, problem.heads);
  const TokenBlock kv_shape = token_block(problem, tokens, problem.kv_heads);
  download_values(*backend, *buffers_.out, t, q_shape, out);
  download_rows(*backend, *buffers_.lse, lse);
  if (!with_backward) return;
  download_values(*backend, *buffers_.dq, t, q_shape, dq);
  download_values(*backend, *buffers_.dk, t, kv_shape, dk);
  download_values(*backend, *buffers_.dv, t, kv_shape, dv);
}

int64_t ShardSet::device_bytes() const {
  int64_t bytes = 0;
  for (const auto* b : {&buffers_.q, &buffers_.k, &buffers_.v, &buffers_.d_out, &buffers_.out,
                        &buffers_.lse, &buffers_.dq, &buffers_.dk, &buffers_.dv}) {
    if (*b) bytes += (*b)->bytes();
  }
  return bytes;
}

ShardSet make_shards(const Problem& p, const TokenLayout& layout, int64_t part, uint64_t seed,
                     bool generate, bool backward, Backend& backend) {
  ShardSet s;
  s.problem = p;
  s.backend = &backend;
  s.with_backward = backward;
  const std::vector<int64_t> tokens = layout.tokens_of(part);
  s.tokens = static_cast<int64_t>(tokens.size());
  s.q.resize(elements(p, s.tokens, p.heads));
  s.k.resize(elements(p, s.tokens, p.kv_heads));
  s.v.resize(s.k.size());
  s.out.resize(s.q.size());
  s.lse.resize(static_cast<size_t>(p.batch * p.heads * s.tokens));
  if (backward) {
    s.d_out.resize(s.q.size());
    s.dq.resize(s.q.size());
    s.dk.resize(s.k.size());
    s.dv.resize(s.k.size());
  }
  const auto buffer_for = [&](std::vector<float>& host, DType dtype) -> std::shared_ptr<Buffer> {
    if (s.zero_copy()) {
      return backend.wrap_host(host.data(), static_cast<int64_t>(host.size() * sizeof(float)));
    }
    return backend.allocate(static_cast<int64_t>(host.size()) * dtype_bytes(dtype));
  };
  const DType t = p.dtype;
  s.buffers_.q = buffer_for(s.q, t);
  s.buffers_.k = buffer_for(s.k, t);
  s.buffers_.v = buffer_for(s.v, t);
  s.buffers_.out = buffer_for(s.out, t);
  s.buffers_.lse = buffer_for(s.lse, DType::f32);
  if (backward) {
    s.buffers_.d_out = buffer_for(s.d_out, t);
    s.buffers_.dq = buffer_for(s.dq, t);
    s.buffers_.dk = buffer_for(s.dk, t);
    s.buffers_.dv = buffer_for(s.dv, t);
  }
  if (p.sinks) s.sinks.assign(static_cast<size_t>(p.heads), 0.0f);
  if (!generate) return s;
  if (p.sinks) s.sinks = generate_sinks(seed, p.heads);
  const GlobalTokens q_shape{p.batch, p.seq, p.heads, p.head_dim};
  const GlobalTokens kv_shape{p.batch, p.seq, p.kv_heads, p.head_dim};
  const int64_t* list = tokens.data();
  fill_generated(seed, TensorTag::q, q_shape, list, s.tokens,
                 dense_tokens(s.q.data(), s.tokens, p.heads, p.head_dim));
  fill_generated(seed, TensorTag::k, kv_shape, list, s.tokens,
                 dense_tokens(s.k.data(), s.tokens, p.kv_heads, p.head_dim));
  fill_generated(seed, TensorTag::v, kv_shape, list, s.tokens,
                 dense_tokens(s.v.data(), s.tokens, p.kv_heads, p.head_dim));
  if (backward) {
    fill_generated(seed, TensorTag::d_out, q_shape, list, s.tokens,
                   dense_tokens(s.d_out.data(), s.tokens, p.heads, p.head_dim));
  }
  s.upload_inputs();
  return s;
}

ShardSet make_device_shards(const Problem& p, const TokenLayout& layout, int64_t part,
                            bool backward, Backend& backend) {
  ShardSet s;
  s.problem = p;
  s.backend = &backend;
  s.with_backward = backward;
  s.device_only_ = true;
  s.tokens = layout.count(part);
  const int64_t q_bytes = p.batch * s.tokens * p.heads * p.head_dim * dtype_bytes(p.dtype);
  const int64_t kv_bytes = p.batch * s.tokens * p.kv_heads * p.head_dim * dtype_bytes(p.dtype);
  s.buffers_.q = backend.allocate(q_bytes);
  s.buffers_.k = backend.allocate(kv_bytes);
  s.buffers_.v = backend.allocate(kv_bytes);
  s.buffers_.out = backend.allocate(q_bytes);
  s.buffers_.lse = backend.allocate(p.batch * p.heads * s.tokens * 4);
  if (backward) {
    s.buffers_.d_out = backend.allocate(q_bytes);
    s.buffers_.dq = backend.allocate(q_bytes);
    s.buffers_.dk = backend.allocate(kv_bytes);
    s.buffers_.dv = backend.allocate(kv_bytes);
  }
  if (p.sinks) s.sinks.assign(static_cast<size_t>(p.heads), 0.0f);
  return s;
}

void scatter_inputs(Communicator& comm, int root, const Problem& p, const TokenLayout& layout,
                    const GlobalTensors& global, ShardSet& shards, bool backward) {
  struct Tensor {
    const std::vector<float>* global;
    std::vector<float>* shard;
    int64_t heads;
  };
  std::vector<Tensor> tensors = {{&global.q, &shards.q, p.heads},
                                 {&global.k, &shards.k, p.kv_heads},
                                 {&global.v, &shards.v, p.kv_heads}};
  if (backward) tensors.push_back({&global.d_out, &shards.d_out, p.heads});
  for (const Tensor& t : tensors) {
    for (int part = 0; part < comm.size(); ++part) {
      if (comm.rank() == root) {
        std::vector<float> buffer(elements(p, layout.count(part), t.heads));
        copy_rows(p, t.heads, layout.tokens_of(part), t.global->data(), buffer.data(), true);
        if (part == root) {
          // Into the shard's own storage: its buffer may be that very memory (zero copy).
          std::copy(buffer.begin(), buffer.end(), t.shard->begin());
        } else {
          comm.send_recv(Place::at_host(buffer.data()),
                         static_cast<int64_t>(buffer.size() * sizeof(float)), part, {}, 0, root);
        }
      } else if (comm.rank() == part) {
        comm.send_recv({}, 0, root, Place::at_host(t.shard->data()),
                       static_cast<int64_t>(t.shard->size() * sizeof(float)), root);
      }
    }
  }
  if (p.sinks) {
    if (comm.rank() == root) {
      A2D_REQUIRE(static_cast<int64_t>(global.sinks.size()) == p.heads,
                  "the problem has sinks but ", global.sinks.size(), " sink logits were given for ",
                  p.heads, " heads");
      shards.sinks = global.sinks;
    }
    shards.sinks.resize(static_cast<size_t>(p.heads));
    comm.broadcast(shards.sinks.data(), p.heads * static_cast<int64_t>(sizeof(float)), root);
  }
  shards.upload_inputs();
}

GlobalOutputs gather_outputs(Communicator& comm, int root, const Problem& p,
                             const TokenLayout& layout, ShardSet& shards, bool backward) {
  shards.download_outputs();
  GlobalOutputs g;
  if (backward && p.sinks && comm.rank() == root) g.dsink = shards.dsink;
  struct Tensor {
    const std::vector<float>* shard;
    std::vector<float>* global;
    int64_t heads;
    bool stats;
  };
  std::vector<Tensor> tensors = {{&shards.out, &g.out, p.heads, false},
                                 {&shards.lse, &g.lse, p.heads, true}};
  if (backward) {
    tensors.push_back({&shards.dq, &g.dq, p.heads, false});
    tensors.push_back({&shards.dk, &g.dk, p.kv_heads, false});
    tensors.push_back({&shards.dv, &g.dv, p.kv_heads, false});
  }
  for (const Tensor& t : tensors) {
    if (comm.rank() == root) {
      t.global->resize(t.stats ? static_cast<size_t>(p.batch * p.heads * p.seq)
                               : elements(p, p.seq, t.heads));
    }
    for (int part = 0; part < comm.size(); ++part) {
      const int64_t n = layout.count(part);
      const size_t size =
          t.stats ? static_cast<size_t>(p.batch * p.heads * n) : elements(p, n, t.heads);
      if (comm.rank() == root) {
        std::vector<float> buffer(size);
        if (part == root) {
          buffer = *t.shard;
        } else {
          comm.send_recv({}, 0, part, Place::at_host(buffer.data()),
                         static_cast<int64_t>(size * sizeof(float)), part);
        }
        const std::vector<int64_t> tokens = layout.tokens_of(part);
        if (t.stats) {
          copy_stats(p, tokens, buffer.data(), t.global->data());
        } else {
          copy_rows(p, t.heads, tokens, buffer.data(), t.global->data(), false);
        }
      } else if (comm.rank() == part) {
        comm.send_recv(Place::at_host(t.shard->data()), static_cast<int64_t>(size * sizeof(float)),
                       root, {}, 0, root);
      }
    }
  }
  return g;
}

NonFiniteInput find_nonfinite(Communicator& comm, const Problem& p, const TokenLayout& layout,
                              const ShardSet& shards, bool backward) {
  struct Tensor {
    const char* name;
    const std::vector<float>* shard;
    int64_t heads;
  };
  std::vector<Tensor> tensors = {
      {"Q", &shards.q, p.heads}, {"K", &shards.k, p.kv_heads}, {"V", &shards.v, p.kv_heads}};
  if (backward) tensors.push_back({"dO", &shards.d_out, p.heads});
  const std::vector<int64_t> tokens = layout.tokens_of(comm.rank());
  const int64_t n = static_cast<int64_t>(tokens.size());
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  for (const Tensor& t : tensors) {
    // The smallest global index [batch, seq, heads, head_dim] of a non-finite element here.
    const int64_t row = t.heads * p.head_dim;
    int64_t first = kNone;
    double value = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t i = 0; i < n; ++i) {
        const float* x = t.shard->data() + (b * n + i) * row;
        for (int64_t e = 0; e < row; ++e) {
          if (std::isfinite(x[e])) continue;
          const int64_t global = (b * p.seq + tokens[i]) * row + e;
          if (global < first) first = global, value = x[e];
          break;  // later elements of this row have larger indices
        }
      }
    }
    int64_t global_first = -first;  // max of the negation = min
    comm.all_reduce(&global_first, 1, Reduction::max);
    global_first = -global_first;
    if (global_first == kNone) continue;
    int64_t owner = first == global_first ? comm.rank() : -1;
    comm.all_reduce(&owner, 1, Reduction::max);
    comm.broadcast(&value, sizeof value, static_cast<int>(owner));
    NonFiniteInput found;
    found.found = true;
    found.tensor = t.name;
    found.dim = global_first % p.head_dim;
    found.head = (global_first / p.head_dim) % t.heads;
    found.token = (global_first / row) % p.seq;
    found.batch = global_first / (row * p.seq);
    found.rank = static_cast<int>(owner);
    found.value = value;
    return found;
  }
  return {};
}

std::string NonFiniteInput::describe() const {
  if (!found) return "all inputs are finite";
  std::ostringstream out;
  out << "non-finite value " << value << " in " << tensor << " at (batch " << batch << ", token "
      << token << ", head " << head << ", dim " << dim << "), held by rank " << rank;
  return out.str();
}

namespace {
std::atomic<int64_t> g_reference_rows{0};
// Each row of the reference: the watchdog sees it progress, the progress lines count it.
void reference_row_done() {
  Watchdog::heartbeat();
  g_reference_rows.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

int64_t reference_rows_done() {
  return g_reference_rows.load(std::memory_order_relaxed);
}

double reference_rows(const Problem& p, bool backward) {
  const double query_rows = static_cast<double>(p.batch * p.heads * p.seq);
  return backward ? 2 * query_rows + static_cast<double>(p.batch * p.kv_heads * p.seq) : query_rows;
}

ReferenceOutputs reference_outputs(const Problem& p, const GlobalTensors& in, bool backward,
                                   int threads) {
  const std::vector<double> q(in.q.begin(), in.q.end()), k(in.k.begin(), in.k.end()),
      v(in.v.begin(), in.v.end());
  const std::vector<double> sinks(in.sinks.begin(), in.sinks.end());
  A2D_REQUIRE(!p.sinks || static_cast<int64_t>(sinks.size()) == p.heads,
              "the reference of a problem with sinks needs ", p.heads, " sink logits");
  reference::Inputs inputs{p.local_shape(p.seq, p.seq),
                           p.mask,
                           static_cast<double>(p.softmax_scale()),
                           q.data(),
                           k.data(),
                           v.data(),
                           nullptr,
                           nullptr,
                           threads,
                           static_cast<double>(p.softcap),
                           p.sinks ? sinks.data() : nullptr};
  inputs.progress = &reference_row_done;  // minutes at long sequences: the watchdog sees them
  ReferenceOutputs r;
  r.out.resize(q.size());
  r.lse.resize(static_cast<size_t>(p.batch * p.heads * p.seq));
  reference::forward(inputs, r.out.data(), r.lse.data());
  if (backward) {
    A2D_REQUIRE(in.d_out.size() == in.q.size(), "the backward reference needs dO");
    const std::vector<double> d_out(in.d_out.begin(), in.d_out.end());
    r.dq.resize(q.size());
    r.dk.resize(k.size());
    r.dv.resize(v.size());
    // In 16 bits the backward receives O rounded to the dtype and computes delta from it; the
    // reference takes the same O (harness.hpp).
    std::vector<double> stored_out;
    if (p.dtype != DType::f32) {
      stored_out.resize(r.out.size());
      for (size_t i = 0; i < r.out.size(); ++i)
        stored_out[i] = round_to(p.dtype, static_cast<float>(r.out[i]));
    }
    if (p.sinks) r.dsink.resize(static_cast<size_t>(p.heads));
    reference::backward(inputs, d_out.data(), r.dq.data(), r.dk.data(), r.dv.data(),
                        stored_out.empty() ? nullptr : stored_out.data(),
                        p.sinks ? r.dsink.data() : nullptr);
  }
  return r;
}

double OutputErrors::max() const {
  return std::max({out, lse, dq, dk, dv, dsink});
}

bool OutputErrors::within(const OutputBounds& b) const {
  return out <= b.out && lse <= b.lse && dq <= b.dq && dk <= b.dk && dv <= b.dv && dsink <= b.dsink;
}

double OutputBounds::of(int index) const {
  const double all[6] = {out, lse, dq, dk, dv, dsink};
  return all[index];
}

OutputBounds output_bounds(DType dtype) {
  // A tensor stored in 16 bits is its fp32 value rounded once: at most the unit roundoff u away
  // (kBf16OutputBound = u + the fp32 bound), the gradients against the reference that computes
  // delta from the same 16-bit O (reference_outputs). Kernels that round as tensor cores do (the
  // CPU's amx and avx512bf16 paths) add one more u to O and to dV (kTensorCoreBf16OutputBound); their O is then
  // no longer the reference's rounded O, and dQ and dK take the difference through delta with the
  // problem's delta-gradient gain, and dS's rounding (check.hpp): the tensor-core delta-gradient
  // bound.
  switch (dtype) {
    case DType::f32:
      break;
    case DType::bf16:
      if (bf16_kernels_round_like_tensor_cores()) {
        // dV: P's rounding (kTensorCoreBf16ValueGradientBound) and dV's own, once.
        return {kTensorCoreBf16OutputBound,        kFp32RelativeBound,
                kTensorCoreBf16DeltaGradientBound, kTensorCoreBf16DeltaGradientBound,
                kTensorCoreBf16OutputBound,        2 * 0x1p-8 + kFp32RelativeBound};
      }
      return {kBf16OutputBound, kFp32RelativeBound, kBf16OutputBound,
              kBf16OutputBound, kBf16OutputBound,   2 * 0x1p-8 + kFp32RelativeBound};
    case DType::f16:
      return {kF16OutputBound, kFp32RelativeBound, kF16OutputBound,
              kF16OutputBound, kF16OutputBound,    2 * 0x1p-11 + kFp32RelativeBound};
  }
  return {kFp32RelativeBound, kFp32RelativeBound, kFp32RelativeBound,
          kFp32RelativeBound, kFp32RelativeBound, kFp32RelativeBound};
}

OutputErrors compare_outputs(const GlobalOutputs& got, const ReferenceOutputs& expected,
                             bool backward) {
  auto error = [](const std::vector<float>& g, const std::vector<double>& e) {
    A2D_REQUIRE(g.size() == e.size(), "output of ", g.size(), " elements compared with ", e.size());
    return relative_error(g.data(), e.data(), static_cast<int64_t>(g.size()));
  };
  OutputErrors errors;
  errors.out = error(got.out, expected.out);
  errors.lse = error(got.lse, expected.lse);
  if (backward) {
    errors.dq = error(got.dq, expected.dq);
    errors.dk = error(got.dk, expected.dk);
    errors.dv = error(got.dv, expected.dv);
    if (!expected.dsink.empty()) errors.dsink = error(got.dsink, expected.dsink);
  }
  return errors;
}

}  // namespace a2d
