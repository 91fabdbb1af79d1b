// Internal: the launch functions of the CUDA attention kernels (forward.cu, backward.cu), called
// by the CUDA backend with device addresses it has checked (cuda_plan.hpp). Strides are in
// elements. NOT YET RUN ON A GPU (docs/gpu.md).
#pragma once

#include <cstdint>

#include "attention2d/dtype.hpp"
#include "cuda_plan.hpp"

namespace a2d::cuda_kernels {

struct DeviceTokens {
  const void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};
struct DeviceRows {
  float* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;
};
struct DeviceFloats {  // fp32 [batch, tokens, heads, head_dim]
  float* data = nullptr;
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// Common to both kernels.
struct AttentionParams {
  int64_t batch = 1, heads = 1, kv_heads = 1, q_tokens = 0, kv_tokens = 0;
  DeviceTokens q, k, v;
  const int64_t* q_positions = nullptr;  // nullptr: 0, 1, 2, ...
  const int64_t* kv_positions = nullptr;
  // (min, max) position pairs of the kernel's query tiles and key tiles (tile_bounds()).
  const int64_t* q_bounds = nullptr;
  const int64_t* kv_bounds = nullptr;
  MaskView mask;  // its arrays in GPU memory (the backend's copies)
  float scale = 0.0f;
};

struct ForwardParams : AttentionParams {
  // final (partial == false): O in the inputs' dtype and LSE; partial: acc, row max, row sum,
  // continued from their contents when accumulate.
  bool partial = false;
  bool accumulate = false;
  DeviceTokens out;  // data written through a const_cast: the output
  DeviceRows lse;
  DeviceFloats acc;
  DeviceRows row_max, row_sum;
};

struct BackwardParams : AttentionParams {
  DeviceTokens d_out;
  const float* lse = nullptr;  // with the strides of lse_rows
  DeviceRows lse_rows;
  DeviceRows delta;  // given or computed by the backend before the call
  DeviceFloats dq, dk, dv;
  bool accumulate = false;  // dk, dv: add instead of overwrite (dq is always added to)
};

// Per-tile (min, max) of `rows` positions (nullptr: the indices) in tiles of `tile` rows, into
// `bounds` (2 int64 per tile).
void tile_bounds(const int64_t* positions, int64_t rows, int64_t tile, int64_t* bounds,
                 void* stream);

void attention_forward(DType dtype, const cuda_plan::AttentionPlan& plan,
                       const ForwardParams& params, void* stream);
void attention_backward(DType dtype, const cuda_plan::AttentionPlan& plan,
                        const BackwardParams& params, void* stream);

}  // namespace a2d::cuda_kernels
