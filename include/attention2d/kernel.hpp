// attention2d: the local (single-process) attention kernels' views and arguments.
//
// The CPU backend's kernels (src/backends/cpu/kernels/cpu_kernels.hpp) and the reference
// (reference.hpp) take these; the distributed algorithms call the kernels through a backend on
// the blocks a rank holds. The kernel
// knows nothing about ranks: each query row and each key row carries its position in the full
// sequence, and the mask is a function of those positions, so cyclic, zigzag, striped and
// gathered layouts all use the same kernel.
//
// Shapes (elements; the head dimension is always contiguous):
//   Q, O, dO, dQ   [batch, q_tokens,  heads,    head_dim]   (TokenView, explicit strides)
//   K, V, dK, dV   [batch, kv_tokens, kv_heads, head_dim]
//   LSE, delta     [batch, heads, q_tokens]                  (RowView, explicit strides)
// Query head h uses K/V head h / (heads / kv_heads) (MHA, GQA, MQA), as FlashAttention and
// PyTorch's repeat_interleave do.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/mask.hpp"
#include "attention2d/problem.hpp"

namespace a2d {

// The maximum the kernels, the merge and the reference use for row maxima: a NaN wins (as in
// IEEE softmax implementations), so a NaN score poisons its row instead of being skipped.
template <typename T>
inline T max_keep_nan(T a, T b) {
  return (b > a || b != b) ? b : a;
}

// A [batch, tokens, heads, head_dim] tensor; strides in elements, the head dimension is dense.
template <typename T>
struct TokenView {
  T* data = nullptr;
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;

  T* at(int64_t batch, int64_t token, int64_t head) const {
    return data + batch * batch_stride + token * token_stride + head * head_stride;
  }
  operator TokenView<const T>() const { return {data, batch_stride, token_stride, head_stride}; }
};

// A per-row statistic [batch, heads, tokens] (LSE, row max, row sum, delta).
template <typename T>
struct RowView {
  T* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;

  T& at(int64_t batch, int64_t head, int64_t token) const {
    return data[batch * batch_stride + head * head_stride + token * token_stride];
  }
  operator RowView<const T>() const { return {data, batch_stride, head_stride, token_stride}; }
};

// Dense row-major [batch, tokens, heads, head_dim].
template <typename T>
TokenView<T> dense_tokens(T* data, int64_t tokens, int64_t heads, int64_t head_dim) {
  return {data, tokens * heads * head_dim, heads * head_dim, head_dim};
}
// Dense row-major [batch, heads, tokens].
template <typename T>
RowView<T> dense_rows(T* data, int64_t heads, int64_t tokens) {
  return {data, heads * tokens, tokens, 1};
}

// A [batch, tokens, heads, head_dim] tensor of any DType, for the kernels' inputs (Const = const)
// and outputs: strides in elements, the head dimension dense. Converts implicitly from an fp32
// TokenView, so fp32 callers pass their views as before.
template <bool Const>
struct TypedTokens {
  using Byte = std::conditional_t<Const, const std::byte, std::byte>;
  using Void = std::conditional_t<Const, const void, void>;
  Void* data = nullptr;
  DType dtype = DType::f32;
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;

  TypedTokens() = default;
  TypedTokens(Void* data_, DType dtype_, int64_t batch_stride_, int64_t token_stride_,
              int64_t head_stride_)
      : data(data_),
        dtype(dtype_),
        batch_stride(batch_stride_),
        token_stride(token_stride_),
        head_stride(head_stride_) {}
  template <typename T>
  requires(std::is_same_v<std::remove_const_t<T>, float> && (Const || !std::is_const_v<T>))
      TypedTokens(
          TokenView<T> view)  // NOLINT(google-explicit-constructor): fp32 views pass as before
      : TypedTokens(view.data, DType::f32, view.batch_stride, view.token_stride, view.head_stride) {
  }
  operator TypedTokens<true>() const  // NOLINT(google-explicit-constructor)
      requires(!Const) {
    return {data, dtype, batch_stride, token_stride, head_stride};
  }

  // The first element of row (batch, token, head).
  Byte* at(int64_t batch, int64_t token, int64_t head) const {
    return static_cast<Byte*>(data) +
           (batch * batch_stride + token * token_stride + head * head_stride) * dtype_bytes(dtype);
  }
  // The fp32 view of an fp32 tensor (callers check dtype first).
  TokenView<std::conditional_t<Const, const float, float>> floats() const {
    return {static_cast<std::conditional_t<Const, const float, float>*>(data), batch_stride,
            token_stride, head_stride};
  }
};
using InTokens = TypedTokens<true>;
using OutTokens = TypedTokens<false>;

// Inputs of the forward kernel.
struct ForwardArgs {
  AttentionShape shape;
  Mask mask;
  float scale = 0.0f;  // softmax scale; must be finite and positive
  // Logit softcapping (Gemma 2): each scaled score s becomes softcap * tanh(s / softcap) before
  // the mask and the softmax. 0 = off; otherwise finite and positive.
  float softcap = 0.0f;
  InTokens q, k, v;  // any DType (converted to fp32 as the kernel loads them)
  // Global positions of the q_tokens query rows and kv_tokens key rows; nullptr = 0, 1, 2, ...
  // Any order is allowed; increasing positions let more blocks be skipped.
  const int64_t* q_positions = nullptr;
  const int64_t* kv_positions = nullptr;
  int threads = 1;
  // Called now and then (between work items, from the calling thread only) while the kernel
  // runs: distributed callers let MPI advance transfers in flight and tell the watchdog they are
  // alive. nullptr: not called.
  void (*progress)(void* context) = nullptr;
  void* progress_context = nullptr;
  // A work counter for progress reports, or nullptr: the CPU kernels add the score entries they
  // compute (query rows x keys, per head; a tile the mask hides in part counts whole, as the cost
  // model's tile entries do) as they go, once per key tile of a query tile (relaxed).
  std::atomic<int64_t>* work_done = nullptr;
};

// The online-softmax state of a set of query rows against a subset of the keys:
//   row_max = max_j s_ij  (scaled scores; -inf for a row that has seen no key)
//   row_sum = sum_j exp(s_ij - row_max)
//   acc     = sum_j exp(s_ij - row_max) * v_j   (unnormalised)
template <typename T>
struct PartialState {
  TokenView<T> acc;
  RowView<T> row_max;
  RowView<T> row_sum;
  operator PartialState<const T>() const { return {acc, row_max, row_sum}; }
};
using PartialView = PartialState<float>;
using ConstPartialView = PartialState<const float>;

// Inputs of the backward kernel.
struct BackwardArgs {
  AttentionShape shape;
  Mask mask;
  float scale = 0.0f;
  float softcap = 0.0f;  // as in ForwardArgs (the backward multiplies dS by 1 - tanh^2)
  InTokens q, k, v;      // any DType, as d_out and out
  InTokens d_out;
  RowView<const float> lse;  // from the forward over *all* keys of these rows
  // Either delta = rowsum(dO * O) (distributed callers pass the global one) or out, from which
  // the kernel computes delta. delta takes precedence when its data is not null.
  RowView<const float> delta;
  InTokens out;
  const int64_t* q_positions = nullptr;
  const int64_t* kv_positions = nullptr;
  int threads = 1;
  void (*progress)(void* context) = nullptr;  // as in ForwardArgs
  void* progress_context = nullptr;
  std::atomic<int64_t>* work_done = nullptr;  // as in ForwardArgs (once per key tile and head)
  // false: dq, dk, dv are overwritten; true: the gradients are added to what they hold
  // (distributed callers sum partial gradients).
  bool accumulate = false;
};

}  // namespace a2d
