// attention2d: the local (single-process) attention kernel interface.
//
// Every distributed algorithm calls these functions on the blocks a rank holds. The kernel
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

namespace a2d {

// Document lengths from text: "100,3000,17", "@file" (lengths separated by commas, spaces or
// newlines), or a generated mix of `seq` tokens: "skewed[:SEED]" or "heavy[:SEED]" (seed 1 by
// default; generated_document_lengths). Throws a2d::Error naming the bad entry.
std::vector<int64_t> parse_document_lengths(const std::string& text, int64_t seq);
std::vector<int64_t> generated_document_lengths(const std::string& kind, int64_t seq,
                                                uint64_t seed);

// The maximum the kernels, the merge and the reference use for row maxima: a NaN wins (as in
// IEEE softmax implementations), so a NaN score poisons its row instead of being skipped.
template <typename T>
inline T max_keep_nan(T a, T b) {
  return (b > a || b != b) ? b : a;
}

// Tiles of the CPU (AVX2) backward kernel: a work item holds kCpuBackwardTileK keys and visits the
// queries kCpuBackwardTileQ rows at a time, skipping a pair of tiles only when the mask hides it
// whole (the cost model counts these tiles, docs/cost-model.md).
inline constexpr int64_t kCpuBackwardTileQ = 48;
inline constexpr int64_t kCpuBackwardTileK = 96;
// The forward's: panels of kCpuForwardPanel query rows against key tiles of kCpuForwardTileK,
// a partly visible pair trimmed to the kCpuForwardKeyStep-key blocks between its first and last
// visible block.
inline constexpr int64_t kCpuForwardPanel = 24;
inline constexpr int64_t kCpuForwardTileK = 256;
inline constexpr int64_t kCpuForwardKeyStep = 4;

// How a block of queries (positions in [q_min, q_max]) relates to a block of keys
// (MaskView::classify).
inline BlockVisibility classify_block(const Mask& mask, int64_t q_min, int64_t q_max, int64_t k_min,
                                      int64_t k_max) {
  return mask.view().classify(q_min, q_max, k_min, k_max);
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

// `count` elements of `dtype` at `row` -> fp32 at `to`, times `scale` (widening is exact; with
// scale != 1 each element is one fp32 product), and `count` fp32 values -> `dtype` at `row`
// (rounded to nearest even, as from_float in dtype.hpp). The portable kernels convert rows with
// these; the AVX2 kernels convert inside their tile copies, to the same bits.
void load_row(const std::byte* row, DType dtype, int64_t count, float* to, float scale = 1.0f);
void store_row(const float* from, int64_t count, std::byte* row, DType dtype);

struct AttentionShape {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t q_tokens = 0;
  int64_t kv_tokens = 0;
  int64_t head_dim = 0;

  int64_t group_size() const { return heads / kv_heads; }  // query heads per K/V head
  int64_t kv_head_of(int64_t head) const { return head / group_size(); }
  // Zero tokens are allowed (a rank may own nothing); everything else must be positive and
  // heads a multiple of kv_heads.
  void validate() const;
  std::string describe() const;
};

float default_scale(int64_t head_dim);  // 1 / sqrt(head_dim)

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

// O = softmax(scale Q K^T + mask) V and LSE = log sum_j exp(s_ij) (natural log). A row that sees
// no key gets O = 0 and LSE = -inf.
// O is written in its own DType (rounded once, from the fp32 result).
void attention_forward(const ForwardArgs& args, OutTokens out, RowView<float> lse);

// The partial triple for merging. With accumulate = false the state is overwritten; with
// accumulate = true the kernel continues from the state already in `partial` (equivalent to
// merging its own result into it).
void attention_forward_partial(const ForwardArgs& args, const PartialView& partial,
                               bool accumulate);

// Shape of a set of rows for the merge functions: [batch, tokens, heads, head_dim].
struct RowsShape {
  int64_t batch = 1;
  int64_t tokens = 0;
  int64_t heads = 1;
  int64_t head_dim = 0;
};

// into <- merge(into, from). Associative and commutative; rows with no key never produce NaN.
void merge_partial(const RowsShape& rows, const PartialView& into, const ConstPartialView& from);
// The same merge on flat records [row max, row sum, acc(record - 2)], `count` of them: the wire
// format of partial results in the distributed algorithms.
void merge_partial_records(float* into, const float* from, int64_t count, int64_t record);
// O = acc / row_sum, LSE = row_max + log(row_sum); empty rows give O = 0, LSE = -inf.
void finalize_partial(const RowsShape& rows, const ConstPartialView& partial, OutTokens out,
                      RowView<float> lse);
// The same merge in (O, LSE) form: out_a, lse_a <- merge((out_a, lse_a), (out_b, lse_b)).
void merge_output(const RowsShape& rows, TokenView<float> out_a, RowView<float> lse_a,
                  TokenView<const float> out_b, RowView<const float> lse_b);

// Attention sinks (gpt-oss): per query head h a logit sinks[h] that joins every row's softmax
// denominator as one more column with value 0, so that O = sum_j p_j v_j with
// p_j = exp(s_j - LSE) and LSE = log(sum_j exp(s_j) + exp(sinks[h])). add_sinks turns the O and
// LSE of the scores alone into those: LSE' = logaddexp(LSE, sink), O' = O * exp(LSE - LSE'), the
// sink joining each row exactly once (a row that saw no key gets O = 0, LSE = sink). `first_head`
// is the global index of the rows' head 0 (a caller holding a slice of the heads).
void add_sinks(const RowsShape& rows, const float* sinks, int64_t first_head, OutTokens out,
               RowView<float> lse);
// The sinks' gradient of sum(O * dO): dsink[h] += -sum over rows of P_sink * delta, with
// P_sink = exp(sinks[h] - LSE) (the LSE with the sink) and delta = rowsum(dO * O). Summed in
// double; dsink holds rows.heads values.
void add_sink_gradient(const RowsShape& rows, const float* sinks, int64_t first_head,
                       RowView<const float> lse, RowView<const float> delta, double* dsink);

// delta = rowsum(dO * O), the backward's per-row correction, in [batch, heads, tokens].
void compute_delta(const RowsShape& rows, InTokens out, InTokens d_out, RowView<float> delta);

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

// dQ, dK, dV of sum(O * dO). For GQA, dK and dV sum over the query heads sharing a K/V head.
// dq, dk and dv are fp32 whatever the DType of the inputs: they are partial gradient sums, which
// callers accumulate (across key blocks and ranks) and round to the problem's DType once, at the
// end.
void attention_backward(const BackwardArgs& args, TokenView<float> dq, TokenView<float> dk,
                        TokenView<float> dv);

// Which implementation of the CPU kernels runs. Every path computes the same function within
// kFp32RelativeBound of the fp64 reference (docs/kernels.md):
//   portable  plain C++ loops the compiler vectorises for the build's baseline ISA
//   avx2      register-blocked AVX2/FMA micro-kernels and a vectorised exp; needs a CPU with
//             AVX2, FMA and F16C (checked at run time; F16C converts fp16 inputs) and an x86-64
//             build
//   avx512    the same kernels on 16-lane AVX-512 vectors with larger register blocks; needs
//             AVX-512 F, BW, DQ and VL besides what avx2 needs, and an x86-64 build
// The process starts on the path named by the environment variable A2D_KERNEL_PATH (auto,
// portable, avx2 or avx512; auto = unset = the fastest path this CPU supports: avx512, then
// avx2, then portable) and set_kernel_path
// changes it. The choice applies to attention_forward, attention_forward_partial and
// attention_backward; the merge functions have one implementation.
enum class KernelPath { portable, avx2, avx512 };

KernelPath kernel_path();                       // the path the kernels use now
void set_kernel_path(KernelPath path);          // throws a2d::Error if the path is unsupported
bool kernel_path_supported(KernelPath path);    // built in and runnable on this CPU
KernelPath best_kernel_path();                  // the fastest supported path
const char* kernel_path_name(KernelPath path);  // "portable", "avx2", "avx512"
// "portable", "avx2", "avx512" or "auto" (= best_kernel_path()); anything else throws a2d::Error.
KernelPath parse_kernel_path(const std::string& name);

// Bytes the forward kernel allocates besides its inputs and outputs, on the current path, for
// this shape and thread count: per-thread tiles plus per-call tables of key positions. It does not
// grow with q_tokens, and grows with kv_tokens only by 16 bytes per 4 keys (the table of key
// micro-block positions), so the forward never needs memory of the order of Nq x Nk. Counted for
// fp32 inputs: the AVX2 path converts 16-bit inputs inside its tiles (no extra memory), the
// portable path into per-thread fp32 K and V rows of one key tile (2 x 64 x head_dim floats per
// thread more).
int64_t forward_workspace_bytes(const AttentionShape& shape, int threads);
// The same for the backward: per-thread tiles, threads - 1 private dQ buffers (dQ rows get
// contributions from every key tile; the buffers keep the sum deterministic) and, when delta is
// computed from O (BackwardArgs::delta not set), the delta rows. Counted for fp32 inputs: with
// 16-bit inputs the portable path adds per-thread fp32 rows of one key tile (K, V) and one query
// tile (Q, dO), 4 x 64 x head_dim floats per thread; the AVX2 path nothing.
int64_t backward_workspace_bytes(const AttentionShape& shape, int threads, bool delta_from_out);

// Number of (query, key) pairs the mask leaves visible, per batch and head. This is what the
// FLOP counts use: forward 4 * pairs * head_dim per head, backward 2.5 times that.
int64_t count_visible_pairs(const Mask& mask, const int64_t* q_positions, int64_t q_tokens,
                            const int64_t* kv_positions, int64_t kv_tokens);

}  // namespace a2d
