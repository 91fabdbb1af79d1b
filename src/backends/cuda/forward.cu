// The CUDA forward attention kernel, FlashAttention-2 style: one thread block per (query tile of
// 64 rows, query head, batch), 4 warps of 16 query rows each; S = Q K^T and O += P V on tensor
// cores (mma.sync m16n8k16, operands from shared memory through ldmatrix), fp32 scores,
// statistics and accumulators; K/V tiles of 64 keys stream through shared memory with cp.async
// (the next K tile loads while P V runs). Masks by global position: each (query tile, key tile)
// pair is classified by its tiles' position bounds (cuda_plan::classify_tile: the mask's own
// MaskView, as on the CPU); hidden pairs are skipped without loading anything, full pairs take no
// per-element test, partial ones test the band inline or, with documents or slices, each thread's
// pairs once per tile.
//
// NOT YET RUN ON A GPU: compiled for sm_80 and sm_90 by scripts/test.sh, to be checked by
// scripts/gpu/gpu_check.sh (docs/gpu.md).
#include <cuda_runtime.h>

#include <cmath>

#include "attention2d/error.hpp"
#include "attention_kernels.hpp"
#include "device_common.cuh"

namespace a2d::cuda_kernels {
namespace {

using cuda_plan::classify_tile;
using cuda_plan::kTileHidden;
using cuda_plan::kTilePartial;

constexpr int kWarps = cuda_plan::kForwardWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileQ = cuda_plan::kForwardTileQ;
constexpr int kTileK = cuda_plan::kForwardTileK;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__global__ void tile_bounds_kernel(const int64_t* positions, int64_t rows, int64_t tile,
                                   int64_t tiles, int64_t* bounds) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tiles;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t begin = t * tile;
    const int64_t end = min(rows, begin + tile);
    int64_t lo = positions ? positions[begin] : begin;
    int64_t hi = lo;
    if (positions) {
      for (int64_t i = begin + 1; i < end; ++i) {
        lo = min(lo, positions[i]);
        hi = max(hi, positions[i]);
      }
    } else {
      hi = end - 1;
    }
    bounds[2 * t] = lo;
    bounds[2 * t + 1] = hi;
  }
}

// The first key tile at or after `tile` that the query tile (q_min, q_max) does not hide
// (kv_tiles when none). Every thread computes the same, so the loop stays uniform.
__device__ __forceinline__ int64_t next_visible_tile(const AttentionParams& p, int64_t tile,
                                                     int64_t kv_tiles, int64_t q_min,
                                                     int64_t q_max) {
  for (; tile < kv_tiles; ++tile) {
    if (classify_tile(p.mask, q_min, q_max, p.kv_bounds[2 * tile], p.kv_bounds[2 * tile + 1]) !=
        kTileHidden) {
      break;
    }
  }
  return tile;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const ForwardParams p, const int64_t kv_tiles) {
  using E = Element<T>;
  constexpr int kStride = D + cuda_plan::kRowPadElements;  // shared row, elements
  constexpr int kSteps = D / 16;                           // k-steps of S = Q K^T
  constexpr int kDTiles = D / 8;                           // n-tiles of O
  constexpr int kKeyTiles = kTileK / 8;                    // n-tiles of S
  extern __shared__ __align__(16) unsigned char shared[];
  T* s_q = reinterpret_cast<T*>(shared);
  T* s_k = s_q + kTileQ * kStride;
  T* s_v = s_k + kTileK * kStride;
  int64_t* s_q_pos = reinterpret_cast<int64_t*>(s_v + kTileK * kStride);
  int64_t* s_k_pos = s_q_pos + kTileQ;

  const int64_t q_tile = blockIdx.x;
  const int64_t head = blockIdx.y;
  const int64_t batch = blockIdx.z;
  const int64_t kv_head = head / (p.heads / p.kv_heads);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t q0 = q_tile * kTileQ;

  const T* q_base =
      static_cast<const T*>(p.q.data) + batch * p.q.batch_stride + head * p.q.head_stride;
  const T* k_base =
      static_cast<const T*>(p.k.data) + batch * p.k.batch_stride + kv_head * p.k.head_stride;
  const T* v_base =
      static_cast<const T*>(p.v.data) + batch * p.v.batch_stride + kv_head * p.v.head_stride;

  // Q tile -> shared -> registers (A fragments of the warp's 16 rows, all k-steps).
  load_tile_async<T, kTileQ, D, kThreads>(s_q, kStride, q_base, p.q.token_stride, q0, p.q_tokens);
  copy_async_commit();
  for (int r = threadIdx.x; r < kTileQ; r += kThreads) {
    const int64_t row = q0 + r;
    s_q_pos[r] = row < p.q_tokens ? (p.q_positions ? p.q_positions[row] : row) : 0;
  }
  copy_async_wait<0>();
  __syncthreads();
  uint32_t q_frag[kSteps][4];
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    // Matrices: rows 0-7 / 8-15 of the warp (lanes 0-7 / 8-15) at cols kk*16, then at +8.
    load_matrix_x4(q_frag[kk], s_q + (warp * 16 + lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
  }
  const int row_a = warp * 16 + g;  // this thread's two rows: row_a and row_a + 8
  const int64_t q_pos[2] = {s_q_pos[row_a], s_q_pos[row_a + 8]};

  // Running statistics in the log2 domain (scores times scale * log2 e); `sum` is this thread's
  // share of the row sum (its columns), reduced over the 4 threads of the row at the end.
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n)
    o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  if (p.partial && p.accumulate) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = q0 + row_a + 8 * half;
      if (row >= p.q_tokens) continue;
      const int64_t stat = batch * p.row_max.batch_stride + head * p.row_max.head_stride +
                           row * p.row_max.token_stride;
      const float m = p.row_max.data[stat];
      row_max[half] = m * kLog2e;  // -inf stays -inf
      row_sum[half] =
          t == 0 ? p.row_sum.data[batch * p.row_sum.batch_stride + head * p.row_sum.head_stride +
                                  row * p.row_sum.token_stride]
                 : 0.0f;
      const float* acc = p.acc.data + batch * p.acc.batch_stride + row * p.acc.token_stride +
                         head * p.acc.head_stride;
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        o[n][2 * half] = acc[n * 8 + 2 * t];
        o[n][2 * half + 1] = acc[n * 8 + 2 * t + 1];
      }
    }
  }

  const int64_t q_min = p.q_bounds[2 * q_tile];
  const int64_t q_max = p.q_bounds[2 * q_tile + 1];
  const float scale_log2 = p.scale * kLog2e;

  int64_t tile = next_visible_tile(p, 0, kv_tiles, q_min, q_max);
  if (tile < kv_tiles) {
    load_tile_async<T, kTileK, D, kThreads>(s_k, kStride, k_base, p.k.token_stride, tile * kTileK,
                                            p.kv_tokens);
  }
  copy_async_commit();
  while (tile < kv_tiles) {
    const int64_t k0 = tile * kTileK;
    load_tile_async<T, kTileK, D, kThreads>(s_v, kStride, v_base, p.v.token_stride, k0,
                                            p.kv_tokens);
    copy_async_commit();
    for (int r = threadIdx.x; r < kTileK; r += kThreads) {
      const int64_t row = k0 + r;
      s_k_pos[r] = row < p.kv_tokens ? (p.kv_positions ? p.kv_positions[row] : row) : 0;
    }
    const int cls =
        classify_tile(p.mask, q_min, q_max, p.kv_bounds[2 * tile], p.kv_bounds[2 * tile + 1]);
    // The next tile to load, found here, where few registers are live.
    const int64_t next = next_visible_tile(p, tile + 1, kv_tiles, q_min, q_max);
    const bool ragged = k0 + kTileK > p.kv_tokens;  // the last tile: keys past the end
    copy_async_wait<1>();                           // K (and Q) arrived; V may be in flight
    __syncthreads();
    // Which of this thread's 32 (row, key) pairs the tile shows (bit n * 4 + e: key
    // n * 8 + 2t + (e & 1), row e / 2): all of a full tile but its keys past the end; in a partly
    // visible one what the mask shows, tested in a loop kept rolled, so that the mask's tests
    // (searches, for documents and slices) stay out of the unrolled softmax below.
    uint32_t seen_bits = ~0u;
    if (cls == kTilePartial || ragged) {
      seen_bits = 0;
#pragma unroll 1
      for (int i = 0; i < kKeyTiles * 4; ++i) {
        const int key = (i / 4) * 8 + 2 * t + (i & 1);
        const bool seen = k0 + key < p.kv_tokens &&
                          (cls != kTilePartial || p.mask.visible(q_pos[(i % 4) / 2], s_k_pos[key]));
        if (seen) seen_bits |= 1u << i;
      }
    }

    // S = Q K^T for the warp's 16 rows and the tile's 64 keys.
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        // Matrices: keys n*8.. at d kk*16, at d +8, keys n*8+8.. at d kk*16, at d +8.
        uint32_t b[4];
        load_matrix_x4(b, s_k + (n * 8 + lane % 8 + 8 * (lane / 16)) * kStride + kk * 16 +
                              8 * ((lane / 8) % 2));
        E::mma(s[n], q_frag[kk], b[0], b[1]);
        E::mma(s[n + 1], q_frag[kk], b[2], b[3]);
      }
    }

    // Mask, scale, online softmax.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * scale_log2;
        if (!((seen_bits >> (n * 4 + e)) & 1u)) x = -INFINITY;
        s[n][e] = x;
        tile_max[e / 2] = max_keep_nan(tile_max[e / 2], x);
      }
    }
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m = tile_max[half];
      m = max_keep_nan(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = max_keep_nan(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float m_new = max_keep_nan(row_max[half], m);
      // A row that has seen no key yet keeps max -inf; subtract 0 then, so that exp2 gives 0
      // instead of NaN.
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      correction[half] = exp2f(row_max[half] - m_use);
      row_max[half] = m_new;
      tile_max[half] = m_use;
    }
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - tile_max[e / 2]);
        tile_sum[e / 2] += s[n][e];
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
      row_sum[half] = row_sum[half] * correction[half] + tile_sum[half];
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      o[n][0] *= correction[0];
      o[n][1] *= correction[0];
      o[n][2] *= correction[1];
      o[n][3] *= correction[1];
    }

    copy_async_wait<0>();  // V arrived
    __syncthreads();       // and every warp is done with K: load the next K tile meanwhile
    if (next < kv_tiles) {
      load_tile_async<T, kTileK, D, kThreads>(s_k, kStride, k_base, p.k.token_stride, next * kTileK,
                                              p.kv_tokens);
    }
    copy_async_commit();

    // O += P V: P from the S accumulators (C layout of key tiles 2kk, 2kk+1 = A layout of k-step
    // kk), V through ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      const uint32_t a[4] = {
          E::pack(s[2 * kk][0], s[2 * kk][1]), E::pack(s[2 * kk][2], s[2 * kk][3]),
          E::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), E::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < kDTiles; n += 2) {
        // Matrices: keys kk*16.. and kk*16+8.. at d n*8, then both at d n*8+8.
        uint32_t b[4];
        load_matrix_x4_trans(b, s_v + (kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * kStride +
                                    n * 8 + 8 * (lane / 16));
        E::mma(o[n], a, b[0], b[1]);
        E::mma(o[n + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with V and the key positions
    tile = next;
  }
  copy_async_wait<0>();

  // The row sums over the 4 threads of each row.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 1);
    row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 2);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = q0 + row_a + 8 * half;
    if (row >= p.q_tokens) continue;
    const float m = row_max[half] == -INFINITY ? -INFINITY : row_max[half] * kLn2;
    if (p.partial) {
      float* acc = p.acc.data + batch * p.acc.batch_stride + row * p.acc.token_stride +
                   head * p.acc.head_stride;
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        *reinterpret_cast<float2*>(acc + n * 8 + 2 * t) =
            make_float2(o[n][2 * half], o[n][2 * half + 1]);
      }
      if (t == 0) {
        p.row_max.data[batch * p.row_max.batch_stride + head * p.row_max.head_stride +
                       row * p.row_max.token_stride] = m;
        p.row_sum.data[batch * p.row_sum.batch_stride + head * p.row_sum.head_stride +
                       row * p.row_sum.token_stride] = row_sum[half];
      }
    } else {
      const float inverse = row_sum[half] > 0.0f ? 1.0f / row_sum[half] : 0.0f;
      T* out = const_cast<T*>(static_cast<const T*>(p.out.data)) + batch * p.out.batch_stride +
               row * p.out.token_stride + head * p.out.head_stride;
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) =
            E::pack(o[n][2 * half] * inverse, o[n][2 * half + 1] * inverse);
      }
      if (t == 0) {
        // NaN sums (NaN scores) give NaN, as on the CPU; empty rows -inf.
        const float lse = row_sum[half] > 0.0f || row_sum[half] != row_sum[half]
                              ? m + logf(row_sum[half])
                              : -INFINITY;
        p.lse.data[batch * p.lse.batch_stride + head * p.lse.head_stride +
                   row * p.lse.token_stride] = lse;
      }
    }
  }
}

template <typename T, int D>
void launch_forward(const cuda_plan::AttentionPlan& plan, const ForwardParams& params,
                    cudaStream_t stream) {
  const auto kernel = forward_kernel<T, D>;
  const int shared = static_cast<int>(plan.launch.shared_bytes);
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
  A2D_REQUIRE(configured == cudaSuccess, "cannot give the forward kernel ", shared,
              " bytes of shared memory: ", cudaGetErrorString(configured));
  const dim3 grid(static_cast<unsigned>(plan.launch.grid_x),
                  static_cast<unsigned>(plan.launch.grid_y),
                  static_cast<unsigned>(plan.launch.grid_z));
  kernel<<<grid, plan.launch.threads, shared, stream>>>(params, plan.kv_tiles);
  check_launch("forward kernel");
}

template <typename T>
void dispatch_forward(const cuda_plan::AttentionPlan& plan, const ForwardParams& params,
                      cudaStream_t stream) {
  switch (plan.head_dim) {
    case 64:
      return launch_forward<T, 64>(plan, params, stream);
    case 80:
      return launch_forward<T, 80>(plan, params, stream);
    case 96:
      return launch_forward<T, 96>(plan, params, stream);
    case 128:
      return launch_forward<T, 128>(plan, params, stream);
    default:
      A2D_FAIL("no CUDA forward kernel for head_dim ", plan.head_dim);
  }
}

}  // namespace

void tile_bounds(const int64_t* positions, int64_t rows, int64_t tile, int64_t* bounds,
                 void* stream) {
  const int64_t tiles = (rows + tile - 1) / tile;
  if (tiles == 0) return;
  const cuda_plan::Launch launch = cuda_plan::plan_elementwise(tiles);
  tile_bounds_kernel<<<static_cast<unsigned>(launch.grid_x), launch.threads, 0,
                       static_cast<cudaStream_t>(stream)>>>(positions, rows, tile, tiles, bounds);
  check_launch("tile bounds kernel");
}

void attention_forward(DType dtype, const cuda_plan::AttentionPlan& plan,
                       const ForwardParams& params, void* stream) {
  if (plan.launch.empty()) return;
  auto* s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::bf16) return dispatch_forward<__nv_bfloat16>(plan, params, s);
  if (dtype == DType::f16) return dispatch_forward<__half>(plan, params, s);
  A2D_FAIL("no CUDA forward kernel for ", dtype_name(dtype));
}

}  // namespace a2d::cuda_kernels
