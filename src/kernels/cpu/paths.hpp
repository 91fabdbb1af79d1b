// Internal: the implementations behind the public kernel functions, one set per KernelPath.
// dispatch.cpp checks the arguments, picks the path and calls one of these.
#pragma once

#include <cstdint>

#include "attention2d/kernel.hpp"

namespace a2d::cpu {

// Where the forward kernel leaves its result: either (O, LSE), or the online-softmax triple
// `partial` (continuing from what it holds when `accumulate` is true).
struct ForwardResult {
  TokenView<float> out;
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

#if A2D_HAVE_AVX2_PATH
namespace avx2 {
void forward(const ForwardArgs& args, const ForwardResult& result);
void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv);
int64_t forward_workspace_bytes(const AttentionShape& shape, int threads);
int64_t backward_workspace_bytes(const AttentionShape& shape, int threads);
float fma_chains(int64_t iterations);  // the AVX2 loop of measure_fma_peak
}  // namespace avx2
#endif

}  // namespace a2d::cpu
