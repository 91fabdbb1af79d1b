// The CUDA backward attention kernel, FlashAttention-2 style: one thread block per (key tile of 64
// keys, K/V head, batch), 4 warps of 16 keys each. The block keeps its keys' dK and dV in fp32
// registers and walks the query tiles (32 rows) of every query head of its group (the GQA sum
// happens in those registers); per visible tile pair, on tensor cores (mma.sync m16n8k16):
//   S^T = K Q^T,  P^T = exp(scale S^T - LSE),  dV += P^T dO,  dP^T = V dO^T,
//   dS^T = P^T * (dP^T - delta),  dK += scale dS^T Q,  dQ += scale dS K (fp32 atomic adds).
// P^T and dS^T are rounded to the inputs' dtype as the second products' operands (as in
// FlashAttention-2); every sum is fp32. Masks as in the forward (per-tile classification by
// position bounds, hidden pairs skipped).
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

constexpr int kWarps = cuda_plan::kBackwardWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileQ = cuda_plan::kBackwardTileQ;  // 32
constexpr int kTileK = cuda_plan::kBackwardTileK;  // 64
constexpr float kLog2e = 1.4426950408889634f;

// acc (the warp's 16 rows x kQTiles n-tiles of 8) = A B^T over D: A's 16 rows from shared `a`
// (this warp's rows), B's kQTiles * 8 rows from shared `b`, both row-major of `stride` elements.
// S^T = K Q^T and dP^T = V dO^T are both this product.
template <typename T, int D, int kQTiles>
__device__ __forceinline__ void warp_product_nt(float (&acc)[kQTiles][4], const T* a, const T* b,
                                                int stride, int warp, int lane) {
  using E = Element<T>;
#pragma unroll
  for (int n = 0; n < kQTiles; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4];
    load_matrix_x4(fa, a + (warp * 16 + lane % 16) * stride + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int n = 0; n < kQTiles; n += 2) {
      uint32_t fb[4];
      load_matrix_x4(
          fb, b + (n * 8 + lane % 8 + 8 * (lane / 16)) * stride + kk * 16 + 8 * ((lane / 8) % 2));
      E::mma(acc[n], fa, fb[0], fb[1]);
      E::mma(acc[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (the warp's 16 rows x D, D / 8 n-tiles of 8) += A B over the tile's 32 queries: A from
// the fp32 fragments p (16 x 32, the layout warp_product_nt leaves), rounded to T; B (32 x D)
// from shared `b` through ldmatrix.trans. dV += P^T dO and dK += dS^T Q are both this product.
template <typename T, int D, int kQTiles>
__device__ __forceinline__ void warp_product_tn(float (&acc)[D / 8][4],
                                                const float (&p)[kQTiles][4], const T* b,
                                                int stride, int lane) {
  using E = Element<T>;
#pragma unroll
  for (int kk = 0; kk < kQTiles / 2; ++kk) {
    const uint32_t a[4] = {E::pack(p[2 * kk][0], p[2 * kk][1]), E::pack(p[2 * kk][2], p[2 * kk][3]),
                           E::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           E::pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t fb[4];
      load_matrix_x4_trans(
          fb, b + (kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * stride + n * 8 + 8 * (lane / 16));
      E::mma(acc[n], a, fb[0], fb[1]);
      E::mma(acc[n + 1], a, fb[2], fb[3]);
    }
  }
}

template <typename T, int D>
// (min 1 block per SM: ptxas may then use up to 255 registers; it otherwise chose 168 for
// D = 80 on sm_90 and spilled.)
__global__ void __launch_bounds__(kThreads, 1)
    backward_kernel(const BackwardParams p, const int64_t q_tiles) {
  using E = Element<T>;
  constexpr int kStride = D + cuda_plan::kRowPadElements;
  constexpr int kSStride = kTileQ + cuda_plan::kRowPadElements;  // dS^T rows (keys) of 32 queries
  constexpr int kDTiles = D / 8;
  constexpr int kQTiles = kTileQ / 8;  // n-tiles of S^T (4)
  extern __shared__ __align__(16) unsigned char shared[];
  T* s_q = reinterpret_cast<T*>(shared);
  T* s_do = s_q + kTileQ * kStride;
  T* s_k = s_do + kTileQ * kStride;
  T* s_v = s_k + kTileK * kStride;
  T* s_ds = s_v + kTileK * kStride;
  float* s_lse = reinterpret_cast<float*>(s_ds + kTileK * kSStride);  // log2 domain
  float* s_delta = s_lse + kTileQ;
  int64_t* s_q_pos = reinterpret_cast<int64_t*>(s_delta + kTileQ);
  int64_t* s_k_pos = s_q_pos + kTileQ;

  const int64_t k_tile = blockIdx.x;
  const int64_t kv_head = blockIdx.y;
  const int64_t batch = blockIdx.z;
  const int64_t group = p.heads / p.kv_heads;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t k0 = k_tile * kTileK;
  const int key_a = warp * 16 + g;  // this thread's two keys: key_a and key_a + 8

  const T* k_base =
      static_cast<const T*>(p.k.data) + batch * p.k.batch_stride + kv_head * p.k.head_stride;
  const T* v_base =
      static_cast<const T*>(p.v.data) + batch * p.v.batch_stride + kv_head * p.v.head_stride;
  load_tile_async<T, kTileK, D, kThreads>(s_k, kStride, k_base, p.k.token_stride, k0, p.kv_tokens);
  load_tile_async<T, kTileK, D, kThreads>(s_v, kStride, v_base, p.v.token_stride, k0, p.kv_tokens);
  copy_async_commit();
  for (int r = threadIdx.x; r < kTileK; r += kThreads) {
    const int64_t row = k0 + r;
    s_k_pos[r] = row < p.kv_tokens ? (p.kv_positions ? p.kv_positions[row] : row) : 0;
  }
  const int64_t k_min = p.kv_bounds[2 * k_tile];
  const int64_t k_max = p.kv_bounds[2 * k_tile + 1];
  const bool k_ragged = k0 + kTileK > p.kv_tokens;
  const float scale_log2 = p.scale * kLog2e;

  float dk[kDTiles][4];
  float dv[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dk[n][e] = dv[n][e] = 0.0f;
  }
  copy_async_wait<0>();
  __syncthreads();
  const int64_t k_pos[2] = {s_k_pos[key_a], s_k_pos[key_a + 8]};
  const bool k_valid[2] = {k0 + key_a < p.kv_tokens, k0 + key_a + 8 < p.kv_tokens};

  for (int64_t head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    const T* q_base =
        static_cast<const T*>(p.q.data) + batch * p.q.batch_stride + head * p.q.head_stride;
    const T* do_base = static_cast<const T*>(p.d_out.data) + batch * p.d_out.batch_stride +
                       head * p.d_out.head_stride;
    for (int64_t q_tile = 0; q_tile < q_tiles; ++q_tile) {
      const int cls =
          classify_tile(p.mask, p.q_bounds[2 * q_tile], p.q_bounds[2 * q_tile + 1], k_min, k_max);
      if (cls == kTileHidden) continue;
      const int64_t q0 = q_tile * kTileQ;
      const bool need_mask = cls == kTilePartial || k_ragged || q0 + kTileQ > p.q_tokens;
      __syncthreads();  // every warp is done with the previous tile's Q, dO, dS, statistics
      load_tile_async<T, kTileQ, D, kThreads>(s_q, kStride, q_base, p.q.token_stride, q0,
                                              p.q_tokens);
      load_tile_async<T, kTileQ, D, kThreads>(s_do, kStride, do_base, p.d_out.token_stride, q0,
                                              p.q_tokens);
      copy_async_commit();
      for (int r = threadIdx.x; r < kTileQ; r += kThreads) {
        const int64_t row = q0 + r;
        const bool valid = row < p.q_tokens;
        // Rows past the end: LSE +inf makes their P 0.
        s_lse[r] = valid ? p.lse[batch * p.lse_rows.batch_stride + head * p.lse_rows.head_stride +
                                 row * p.lse_rows.token_stride] *
                               kLog2e
                         : INFINITY;
        s_delta[r] = valid ? p.delta.data[batch * p.delta.batch_stride +
                                          head * p.delta.head_stride + row * p.delta.token_stride]
                           : 0.0f;
        s_q_pos[r] = valid ? (p.q_positions ? p.q_positions[row] : row) : 0;
      }
      copy_async_wait<0>();
      __syncthreads();
      // Which of this thread's 16 (key, query) pairs the tile shows (bit n * 4 + e: query
      // n * 8 + 2t + (e & 1), key e / 2): all of a full tile but keys past the end; in a partly
      // visible one what the mask shows, tested in a loop kept rolled, so that the mask's tests
      // (searches, for documents and slices) stay out of the unrolled products below. (Query rows
      // past the end have LSE +inf, so P = 0 there whatever the bit.)
      uint32_t seen_bits = ~0u;
      if (need_mask) {
        seen_bits = 0;
#pragma unroll 1
        for (int i = 0; i < kQTiles * 4; ++i) {
          const int query = (i / 4) * 8 + 2 * t + (i & 1);
          const int key = (i % 4) / 2;
          const bool seen =
              k_valid[key] && (cls != kTilePartial || p.mask.visible(s_q_pos[query], k_pos[key]));
          if (seen) seen_bits |= 1u << i;
        }
      }

      // S^T = K Q^T: the warp's 16 keys (A from shared K) x the tile's 32 queries (B from Q).
      float s[kQTiles][4];
      warp_product_nt<T, D, kQTiles>(s, s_k, s_q, kStride, warp, lane);
      // P^T = exp2(S^T scale log2 e - LSE log2 e), 0 where hidden.
#pragma unroll
      for (int n = 0; n < kQTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int query = n * 8 + 2 * t + (e & 1);
          float x = exp2f(s[n][e] * scale_log2 - s_lse[query]);
          if (!((seen_bits >> (n * 4 + e)) & 1u)) x = 0.0f;
          s[n][e] = x;
        }
      }
      // dV += P^T dO (k-dim: the 32 queries; B = dO through ldmatrix.trans).
      warp_product_tn<T, D, kQTiles>(dv, s, s_do, kStride, lane);
      // dP^T = V dO^T.
      float dp[kQTiles][4];
      warp_product_nt<T, D, kQTiles>(dp, s_v, s_do, kStride, warp, lane);
      // dS^T = P^T (dP^T - delta); into shared memory as well, for dQ.
#pragma unroll
      for (int n = 0; n < kQTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int query = n * 8 + 2 * t + (e & 1);
          s[n][e] = s[n][e] * (dp[n][e] - s_delta[query]);
        }
        *reinterpret_cast<uint32_t*>(s_ds + key_a * kSStride + n * 8 + 2 * t) =
            E::pack(s[n][0], s[n][1]);
        *reinterpret_cast<uint32_t*>(s_ds + (key_a + 8) * kSStride + n * 8 + 2 * t) =
            E::pack(s[n][2], s[n][3]);
      }
      // dK += dS^T Q (scaled at the end).
      warp_product_tn<T, D, kQTiles>(dk, s, s_q, kStride, lane);
      __syncthreads();  // dS^T of every warp is in shared memory

      // dQ (32 queries x D) += scale dS K: warp w takes query rows 16 (w % 2).. and the pairs of
      // d n-tiles j with j % 2 == w / 2. A = dS from the stored dS^T through ldmatrix.trans:
      // matrix i holds keys kk*16 + 8 (i / 2).., queries 16 (w % 2) + 8 (i % 2)..
      // (The A fragments are reloaded for every pair: kept in registers next to dK and dV they
      // made the D = 128 kernel spill.)
      const int m0 = 16 * (warp % 2);
      const T* ds_rows =
          s_ds + (lane % 8 + 8 * ((lane / 8) / 2)) * kSStride + m0 + 8 * ((lane / 8) % 2);
      float* dq_base = p.dq.data + batch * p.dq.batch_stride + head * p.dq.head_stride;
      const int64_t rows[2] = {q0 + m0 + g, q0 + m0 + g + 8};
      for (int pair = warp / 2; pair < D / 16; pair += 2) {
        float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          uint32_t a[4];
          load_matrix_x4_trans(a, ds_rows + kk * 16 * kSStride);
          uint32_t b[4];
          load_matrix_x4_trans(b, s_k + (kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * kStride +
                                      pair * 16 + 8 * (lane / 16));
          E::mma(c[0], a, b[0], b[1]);
          E::mma(c[1], a, b[2], b[3]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (rows[half] >= p.q_tokens) continue;
          float* dq = dq_base + rows[half] * p.dq.token_stride + pair * 16 + 2 * t;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            atomicAdd(dq + 8 * j, p.scale * c[j][2 * half]);
            atomicAdd(dq + 8 * j + 1, p.scale * c[j][2 * half + 1]);
          }
        }
      }
    }
  }

  // dK, dV of the block's keys: one block owns them, so plain stores (or adds).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!k_valid[half]) continue;
    const int64_t row = k0 + key_a + 8 * half;
    float* dk_row = p.dk.data + batch * p.dk.batch_stride + row * p.dk.token_stride +
                    kv_head * p.dk.head_stride;
    float* dv_row = p.dv.data + batch * p.dv.batch_stride + row * p.dv.token_stride +
                    kv_head * p.dv.head_stride;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      float2 k_pair = make_float2(p.scale * dk[n][2 * half], p.scale * dk[n][2 * half + 1]);
      float2 v_pair = make_float2(dv[n][2 * half], dv[n][2 * half + 1]);
      float2* k_at = reinterpret_cast<float2*>(dk_row + n * 8 + 2 * t);
      float2* v_at = reinterpret_cast<float2*>(dv_row + n * 8 + 2 * t);
      if (p.accumulate) {
        const float2 k_old = *k_at, v_old = *v_at;
        k_pair.x += k_old.x;
        k_pair.y += k_old.y;
        v_pair.x += v_old.x;
        v_pair.y += v_old.y;
      }
      *k_at = k_pair;
      *v_at = v_pair;
    }
  }
}

template <typename T, int D>
void launch_backward(const cuda_plan::AttentionPlan& plan, const BackwardParams& params,
                     cudaStream_t stream) {
  const auto kernel = backward_kernel<T, D>;
  const int shared = static_cast<int>(plan.launch.shared_bytes);
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
  A2D_REQUIRE(configured == cudaSuccess, "cannot give the backward kernel ", shared,
              " bytes of shared memory: ", cudaGetErrorString(configured));
  const dim3 grid(static_cast<unsigned>(plan.launch.grid_x),
                  static_cast<unsigned>(plan.launch.grid_y),
                  static_cast<unsigned>(plan.launch.grid_z));
  kernel<<<grid, plan.launch.threads, shared, stream>>>(params, plan.q_tiles);
  check_launch("backward kernel");
}

template <typename T>
void dispatch_backward(const cuda_plan::AttentionPlan& plan, const BackwardParams& params,
                       cudaStream_t stream) {
  switch (plan.head_dim) {
    case 64:
      return launch_backward<T, 64>(plan, params, stream);
    case 80:
      return launch_backward<T, 80>(plan, params, stream);
    case 96:
      return launch_backward<T, 96>(plan, params, stream);
    case 128:
      return launch_backward<T, 128>(plan, params, stream);
    default:
      A2D_FAIL("no CUDA backward kernel for head_dim ", plan.head_dim);
  }
}

}  // namespace

void attention_backward(DType dtype, const cuda_plan::AttentionPlan& plan,
                        const BackwardParams& params, void* stream) {
  if (plan.launch.empty()) return;
  auto* s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::bf16) return dispatch_backward<__nv_bfloat16>(plan, params, s);
  if (dtype == DType::f16) return dispatch_backward<__half>(plan, params, s);
  A2D_FAIL("no CUDA backward kernel for ", dtype_name(dtype));
}

}  // namespace a2d::cuda_kernels
