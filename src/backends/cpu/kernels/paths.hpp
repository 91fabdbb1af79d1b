// Internal: the implementations behind the public kernel functions, one set per KernelPath.
// dispatch.cpp checks the arguments, picks the path and calls one of these.
#pragma once

#include <cstdint>

#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::cpu {

// Where the forward kernel leaves its result: either (O, LSE), or the online-softmax triple
// `partial` (continuing from what it holds when `accumulate` is true).
struct ForwardResult {
  OutTokens out;  // any DType
  RowView<float> lse;
  const PartialView* partial = nullptr;
  bool accumulate = false;
};

// The backward's inputs after dispatch.cpp resolved delta (always set here).
struct BackwardInputs {
  const BackwardArgs* args = nullptr;
  RowView<const float> delta;
};

namespace portable {
void forward(const ForwardArgs& args, const ForwardResult& result);
void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv);
int64_t forward_workspace_bytes(const AttentionShape& shape, int threads);
int64_t backward_workspace_bytes(const AttentionShape& shape, int threads);
}  // namespace portable

#if A2D_HAVE_AVX2_PATH || A2D_HAVE_AVX512_PATH
// Parts of the fast (AVX2, AVX-512) kernels that a timing experiment can switch off
// (bench/kernel_parts.cpp measures what each part costs); the results are then wrong. The kernels
// test the flags once per tile, outside every inner loop.
enum Skip : unsigned {
  kSkipNothing = 0,
  kSkipExp = 1u << 0,                // P = S instead of exp(S - max); max and sums still run
  kSkipSoftmax = 1u << 1,            // forward: no max, exp, sum or rescale at all
  kSkipCopies = 1u << 2,             // forward: the V tile; backward: K, V, Q, dO tiles
  kSkipScores = 1u << 3,             // S = Q K^T (backward: with its exp)
  kSkipValues = 1u << 4,             // forward: O += P V
  kSkipScoreGradients = 1u << 5,     // backward: dS = P (dO V^T - delta)
  kSkipKeyValueGradients = 1u << 6,  // backward: dV += P^T dO and dK += dS^T Q
  kSkipQueryGradients = 1u << 7,     // backward: dQ += dS K
};
#endif

// The fast paths: simd/forward.inc and simd/backward.inc compiled once per vector layer.
#if A2D_HAVE_AVX2_PATH
namespace avx2 {
void forward(const ForwardArgs& args, const ForwardResult& result, unsigned skip = kSkipNothing);
void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv, unsigned skip = kSkipNothing);
int64_t forward_workspace_bytes(const AttentionShape& shape, int threads);
int64_t backward_workspace_bytes(const AttentionShape& shape, int threads);
float fma_chains(int64_t iterations);  // the AVX2 loop of measure_fma_peak
}  // namespace avx2
#endif

#if A2D_HAVE_AVX512_PATH
namespace avx512 {
void forward(const ForwardArgs& args, const ForwardResult& result, unsigned skip = kSkipNothing);
void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv, unsigned skip = kSkipNothing);
int64_t forward_workspace_bytes(const AttentionShape& shape, int threads);
int64_t backward_workspace_bytes(const AttentionShape& shape, int threads);
float fma_chains(int64_t iterations);  // the AVX-512 loop of measure_fma_peak (12 zmm chains)
}  // namespace avx512
#endif

// The bf16 kernels (bf16/*.inc) on AMX tiles (amx/) and on AVX512-BF16 (avx512bf16/): bf16 Q, K, V
// (and dO) only; those paths' other calls run avx512.
#if A2D_HAVE_AVX512BF16_PATH
namespace avx512bf16 {
void forward(const ForwardArgs& args, const ForwardResult& result);
int64_t forward_workspace_bytes(const AttentionShape& shape, int threads);
void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv);
int64_t backward_workspace_bytes(const AttentionShape& shape, int threads);
float dot_chains(int64_t iterations);  // the loop of measure_product_peak (12 zmm, VDPBF16PS)
}  // namespace avx512bf16
#endif

#if A2D_HAVE_AMX_PATH
namespace amx {
void forward(const ForwardArgs& args, const ForwardResult& result);
int64_t forward_workspace_bytes(const AttentionShape& shape, int threads);
void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv);
int64_t backward_workspace_bytes(const AttentionShape& shape, int threads);
float tile_chains(int64_t iterations);  // the loop of measure_tile_peak (4 C tiles, TDPBF16PS)
}  // namespace amx
#endif

}  // namespace a2d::cpu
