// The CPU backend's kernels on host memory: the local attention forward and backward, the merge
// of partial results, sinks and delta, the permutation of token rows, the kernel-path switch, the
// tile constants and the workspace sizes. The views and arguments they take are
// include/attention2d/kernel.hpp's; the distributed algorithms reach these only through a backend
// (src/backends/host/host_backend.cpp). docs/kernels.md describes how they compute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attention2d/dtype.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/problem.hpp"

namespace a2d {

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

// `count` elements of `dtype` at `row` -> fp32 at `to`, times `scale` (widening is exact; with
// scale != 1 each element is one fp32 product), and `count` fp32 values -> `dtype` at `row`
// (rounded to nearest even, as from_float in dtype.hpp). The portable kernels convert rows with
// these; the AVX2 kernels convert inside their tile copies, to the same bits.
void load_row(const std::byte* row, DType dtype, int64_t count, float* to, float scale = 1.0f);
void store_row(const float* from, int64_t count, std::byte* row, DType dtype);

// O = softmax(scale Q K^T + mask) V and LSE = log sum_j exp(s_ij) (natural log). A row that sees
// no key gets O = 0 and LSE = -inf.
// O is written in its own DType (rounded once, from the fp32 result).
void attention_forward(const ForwardArgs& args, OutTokens out, RowView<float> lse);

// The partial triple for merging. With accumulate = false the state is overwritten; with
// accumulate = true the kernel continues from the state already in `partial` (equivalent to
// merging its own result into it).
void attention_forward_partial(const ForwardArgs& args, const PartialView& partial,
                               bool accumulate);

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
//   avx512bf16  avx512, except that the forward and backward of bf16 Q, K, V (and dO) multiply
//             bf16 pairs with AVX512-BF16's VDPBF16PS (bf16 products, fp32 sums; P and dS rounded
//             to bf16 before the products that take them, as on GPU tensor cores, so the outputs
//             meet check.hpp's tensor-core bounds); needs AVX512-BF16 besides what avx512 needs
//   amx       the same bf16 kernels on AMX tiles (TDPBF16PS); needs AMX-TILE, AMX-BF16 and
//             AVX512-BF16 besides what avx512 needs, and Linux's grant of the tile state
//             (arch_prctl ARCH_REQ_XCOMP_PERM), asked for when first tested
// The process starts on the path named by the environment variable A2D_KERNEL_PATH (auto,
// portable, avx2, avx512, avx512bf16 or amx; auto = unset = the fastest path this CPU supports:
// amx, avx512bf16, avx512, avx2, then portable) and set_kernel_path
// changes it. The choice applies to attention_forward, attention_forward_partial and
// attention_backward; the merge functions have one implementation.
enum class KernelPath { portable, avx2, avx512, avx512bf16, amx };

KernelPath kernel_path();                       // the path the kernels use now
void set_kernel_path(KernelPath path);          // throws a2d::Error if the path is unsupported
bool kernel_path_supported(KernelPath path);    // built in and runnable on this CPU
KernelPath best_kernel_path();                  // the fastest supported path
// "portable", "avx2", "avx512", "avx512bf16", "amx"
const char* kernel_path_name(KernelPath path);
// One of those names or "auto" (= best_kernel_path()); anything else throws a2d::Error.
KernelPath parse_kernel_path(const std::string& name);
// True when the kernels of bf16 inputs round as tensor cores do (the avx512bf16 and amx paths): P
// to bf16 before P V in the forward, and P and dS before the products that take them in the
// backward. Their outputs then meet check.hpp's tensor-core bounds (harness.hpp's output_bounds
// and `a2d kernel --check` apply the ones that hold).
bool bf16_kernels_round_like_tensor_cores();

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

// Reorders `count` tokens of `token_bytes` bytes in place: out[i] = in[from[i]] (`from` a
// permutation of [0, count)). One cycle at a time with one token of scratch, so no second copy of
// the buffer is made. The CPU backends sort gathered rows by position with it; `a2d calibrate`
// times it.
void permute_tokens(void* rows, int64_t token_bytes, const int64_t* from, int64_t count);

}  // namespace a2d
