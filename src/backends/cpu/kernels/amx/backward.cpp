// The AMX backward kernel: FlashAttention-2's backward for bf16 Q, K, V and dO, its five products
// on AMX tiles (tiles.hpp) with fp32 sums, the elementwise part on AVX-512 vectors. Scores are
// kept transposed (keys in rows, queries in columns), so that every product's operand is either
// a packed input or a row-major bf16 array the kernel writes, and no computed array is ever
// transposed:
//
//   per K/V head  K and V rows as A tiles (bf16 [keys][Dp], Dp = head dim rounded up to 32) and
//                 K^T as A tiles per 32-key chunk (bf16 [Dp][32])
//   per query     Q and dO as B tiles twice: pairs of dims (for S^T = K Q^T, dP^T = V dO^T) and
//   head          pairs of query rows (for dK += dS^T Q, dV += P^T dO); LSE log2 e and delta per row
//   work item     (query head, 32 keys); its dK and dV in fp32 [32][Dp], over 32 queries a step:
//                   S^T, dP^T   2 x 2 C tiles each, depth Dp
//                   P^T = 2^(S^T scale log2 e - LSE log2 e), dS^T = scale P^T (dP^T - delta), on
//                   16 queries a vector, rounded to bf16 (as on tensor cores)
//                   dV += P^T dO, dK += dS^T Q       C tiles loaded from and stored to dK, dV
//                   dQ^T += K^T dS^T                 into this thread's own dQ^T [Dp][queries]
//   query heads   one at a time; the threads' dQ^T are summed into dQ in a fixed order after each
//
// Numerics: as the forward's, the products of bf16 values are exact and summed in fp32; P and dS
// are rounded once to bf16 before the products that take them (check.hpp's tensor-core bounds).
// Softcapped calls take the avx512 backward (dispatch.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/avx512/simd.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "backends/cpu/kernels/paths.hpp"
#include "backends/cpu/kernels/tiles.hpp"
#include "tiles.hpp"

namespace a2d::cpu::amx {
namespace {

using avx512::Vec;
using avx512::vload;
using avx512::vset;
using avx512::vstore;

constexpr int kChunk = 32;  // keys per work item; queries per step
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kInf = std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}
int64_t smaller(int64_t a, int64_t b) {
  return a < b ? a : b;
}
int64_t position(const int64_t* positions, int64_t index) {
  return positions ? positions[index] : index;
}

// 2^x for x <= 0 (and -inf): the forward's exp2_nonpositive.
A2D_INLINE Vec exp2_nonpositive(Vec x) {
  x = _mm512_max_ps(vset(-200.0f), x);
  const Vec n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec f = _mm512_sub_ps(x, n);
  Vec p = vset(1.5461444854736328e-4f);
  p = _mm512_fmadd_ps(p, f, vset(1.3400427997112274e-3f));
  p = _mm512_fmadd_ps(p, f, vset(9.618056938052177e-3f));
  p = _mm512_fmadd_ps(p, f, vset(5.550327152013779e-2f));
  p = _mm512_fmadd_ps(p, f, vset(0.24022650718688965f));
  p = _mm512_fmadd_ps(p, f, vset(0.6931471824645996f));
  p = _mm512_fmadd_ps(p, f, vset(1.0f));
  return _mm512_scalef_ps(p, n);
}

struct Bounds {
  int64_t min = 0;
  int64_t max = 0;
};

Bounds bounds_of(const int64_t* positions, int64_t begin, int64_t end) {
  Bounds b{position(positions, begin), position(positions, begin)};
  for (int64_t i = begin + 1; i < end; ++i) {
    const int64_t pos = position(positions, i);
    b.min = pos < b.min ? pos : b.min;
    b.max = pos > b.max ? pos : b.max;
  }
  return b;
}

// The call's shared arrays (one K/V head and one of its query heads at a time).
struct Shared {
  int64_t dim, dp, k_chunks, q_chunks, q_pad;
  uint16_t* k_rows;    // [k_chunks * 32][Dp]
  uint16_t* v_rows;    // [k_chunks * 32][Dp]
  uint16_t* k_t;       // [k_chunks][Dp][32]
  uint16_t* q_dims;    // [q_chunks * 2][Dp / 32][512]   pairs of dims
  uint16_t* do_dims;   // [q_chunks * 2][Dp / 32][512]
  uint16_t* q_rows;    // [q_chunks][Dp / 16][512]       pairs of query rows
  uint16_t* do_rows;   // [q_chunks][Dp / 16][512]
  float* lse2;         // [q_pad]  LSE log2 e; +inf for a row without keys and for padding
  float* delta;        // [q_pad]  delta; 0 for padding
  Bounds* key_bounds;  // [k_chunks]
  Bounds* q_bounds;    // [q_chunks]
  float* dq_t;         // [threads][Dp][q_pad]
};

// Rows [32 c, 32 c + 32) of x (batch, head) into `rows` (bf16 [32][Dp], zeros past the last row
// and the head dim).
void copy_rows(InTokens x, int64_t batch, int64_t head, int64_t tokens, int64_t c, int64_t dim,
               int64_t dp, uint16_t* rows) {
  std::memset(rows, 0, sizeof(uint16_t) * kChunk * dp);
  for (int64_t j = 0; j < kChunk && c * kChunk + j < tokens; ++j)
    std::memcpy(rows + j * dp, x.at(batch, c * kChunk + j, head), sizeof(uint16_t) * dim);
}

class Backward {
 public:
  Backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk, TokenView<float> dv,
           const Shared& shared, int threads)
      : args_(*in.args), delta_(in.delta), dq_(dq), dk_(dk), dv_(dv), s_(shared),
        threads_(threads), mask_(args_.mask.view()) {}

  // Inside the parallel region: every thread runs this.
  void run(uint16_t* rows, float* workspace) {
    const AttentionShape& shape = args_.shape;
    const int64_t group = shape.heads / shape.kv_heads;
    const int thread = omp_thread();
    float* own_dq_t = s_.dq_t + thread * s_.dp * s_.q_pad;
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < s_.k_chunks; ++c)
          pack_keys(b, kv_head, c);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t head = kv_head * group + g;
#pragma omp for schedule(static)
          for (int64_t c = 0; c < s_.q_chunks; ++c)
            pack_queries(b, head, c, rows);
          std::memset(own_dq_t, 0, sizeof(float) * s_.dp * s_.q_pad);
#pragma omp barrier
          // Late key chunks first: under a causal mask the early ones carry the most queries.
#pragma omp for schedule(dynamic, 1)
          for (int64_t item = 0; item < s_.k_chunks; ++item) {
            const int64_t c = s_.k_chunks - 1 - item;
            key_chunk(b, kv_head, c, /*add=*/args_.accumulate || g > 0, own_dq_t, workspace);
          }
          // dQ += the threads' dQ^T, in thread order.
#pragma omp for schedule(static)
          for (int64_t c = 0; c < s_.q_chunks; ++c)
            add_dq(b, head, c);
        }
      }
    }
  }

 private:
  static int omp_thread() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
  }

  void pack_keys(int64_t b, int64_t kv_head, int64_t c) const {
    const int64_t dp = s_.dp, kv = args_.shape.kv_tokens;
    copy_rows(args_.k, b, kv_head, kv, c, s_.dim, dp, s_.k_rows + c * kChunk * dp);
    copy_rows(args_.v, b, kv_head, kv, c, s_.dim, dp, s_.v_rows + c * kChunk * dp);
    const uint16_t* k = s_.k_rows + c * kChunk * dp;
    uint16_t* k_t = s_.k_t + c * dp * kChunk;
    for (int64_t j = 0; j < kChunk; ++j)
      for (int64_t d = 0; d < dp; ++d)
        k_t[d * kChunk + j] = k[j * dp + d];
    s_.key_bounds[c] = bounds_of(args_.kv_positions, c * kChunk, smaller(kv, (c + 1) * kChunk));
  }

  void pack_queries(int64_t b, int64_t head, int64_t c, uint16_t* rows) const {
    const int64_t dp = s_.dp, nq = args_.shape.q_tokens;
    for (const bool is_q : {true, false}) {
      copy_rows(is_q ? args_.q : args_.d_out, b, head, nq, c, s_.dim, dp, rows);
      uint16_t* dims = (is_q ? s_.q_dims : s_.do_dims) + c * 2 * (dp / 32) * kTileElements;
      pack_pairs_of_dims(rows, dp, dims);
      pack_pairs_of_dims(rows + kTileRows * dp, dp, dims + (dp / 32) * kTileElements);
      pack_pairs_of_rows(rows, dp, (is_q ? s_.q_rows : s_.do_rows) + c * (dp / 16) * kTileElements);
    }
    for (int64_t r = c * kChunk; r < (c + 1) * kChunk; ++r) {
      if (r >= nq) {
        s_.lse2[r] = kInf;
        s_.delta[r] = 0.0f;
        continue;
      }
      const float lse = args_.lse.at(b, head, r);
      s_.lse2[r] = lse == -kInf ? kInf : lse * kLog2e;
      s_.delta[r] = delta_.at(b, head, r);
    }
    s_.q_bounds[c] = bounds_of(args_.q_positions, c * kChunk, smaller(nq, (c + 1) * kChunk));
  }

  // Workspace (floats): S^T, dP^T [32][32] fp32; P^T, dS^T [32][32] bf16; dS^T as B tiles (2 KiB);
  // dK, dV [32][Dp] fp32.
  void key_chunk(int64_t b, int64_t kv_head, int64_t c, bool add, float* dq_t,
                 float* workspace) const {
    const int64_t dp = s_.dp;
    float* s_t = workspace;
    float* dp_t = s_t + kChunk * kChunk;
    auto* p_t = reinterpret_cast<uint16_t*>(dp_t + kChunk * kChunk);
    uint16_t* ds_t = p_t + kChunk * kChunk;
    uint16_t* ds_tiles = ds_t + kChunk * kChunk;
    float* dk_acc = reinterpret_cast<float*>(ds_tiles + kChunk * kChunk);
    float* dv_acc = dk_acc + kChunk * dp;
    std::memset(dk_acc, 0, sizeof(float) * 2 * kChunk * dp);
    const Bounds& keys = s_.key_bounds[c];
    int64_t entries = 0;
    for (int64_t qc = 0; qc < s_.q_chunks; ++qc) {
      if (args_.progress && qc % 16 == 0 && is_calling_thread())
        args_.progress(args_.progress_context);
      const Bounds& rows = s_.q_bounds[qc];
      const BlockVisibility visibility = mask_.classify(rows.min, rows.max, keys.min, keys.max);
      if (visibility == BlockVisibility::hidden) continue;
      products_t(s_.k_rows + c * kChunk * dp, s_.q_dims, qc, s_t);
      products_t(s_.v_rows + c * kChunk * dp, s_.do_dims, qc, dp_t);
      probabilities(c, qc, visibility == BlockVisibility::partial, s_t, dp_t, p_t, ds_t);
      pack_pairs_of_rows(ds_t, kChunk, ds_tiles);
      accumulate(p_t, s_.do_rows + qc * (dp / 16) * kTileElements, dv_acc);
      accumulate(ds_t, s_.q_rows + qc * (dp / 16) * kTileElements, dk_acc);
      accumulate_dq_t(c, qc, ds_tiles, dq_t);
      entries += kChunk * kChunk;
    }
    if (args_.work_done) args_.work_done->fetch_add(entries, std::memory_order_relaxed);
    // The chunk's rows of dK and dV (written, or added to).
    const int64_t kv = args_.shape.kv_tokens;
    for (int64_t j = 0; j < kChunk && c * kChunk + j < kv; ++j) {
      float* dk = dk_.at(b, c * kChunk + j, kv_head);
      float* dv = dv_.at(b, c * kChunk + j, kv_head);
      for (int64_t d = 0; d < s_.dim; ++d) {
        dk[d] = (add ? dk[d] : 0.0f) + dk_acc[j * dp + d];
        dv[d] = (add ? dv[d] : 0.0f) + dv_acc[j * dp + d];
      }
    }
  }

  // out[32 keys][32 queries] = rows (A: 32 key rows of Dp) x the B tiles of query chunk qc.
  void products_t(const uint16_t* a_rows, const uint16_t* b_dims, int64_t qc, float* out) const {
    const int64_t dp = s_.dp, chunks = dp / 32;
    const uint16_t* b0 = b_dims + qc * 2 * chunks * kTileElements;
    const uint16_t* b1 = b0 + chunks * kTileElements;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t dc = 0; dc < chunks; ++dc) {
      _tile_loadd(4, a_rows + dc * 32, dp * 2);
      _tile_loadd(5, a_rows + kTileRows * dp + dc * 32, dp * 2);
      _tile_loadd(6, b0 + dc * kTileElements, 64);
      _tile_loadd(7, b1 + dc * kTileElements, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    constexpr int64_t stride = kChunk * 4;
    _tile_stored(0, out, stride);
    _tile_stored(1, out + kTileRows, stride);
    _tile_stored(2, out + kTileRows * kChunk, stride);
    _tile_stored(3, out + kTileRows * kChunk + kTileRows, stride);
  }

  // P^T and dS^T of key chunk c and query chunk qc, in bf16; a partial block hides pairs the
  // mask hides (P = 0).
  void probabilities(int64_t c, int64_t qc, bool partial, const float* s_t, const float* dp_t,
                     uint16_t* p_t, uint16_t* ds_t) const {
    const Vec factor = vset(args_.scale * kLog2e);
    const Vec scale = vset(args_.scale);
    const float* lse2 = s_.lse2 + qc * kChunk;
    const float* delta = s_.delta + qc * kChunk;
    const Vec lse_low = _mm512_loadu_ps(lse2), lse_high = _mm512_loadu_ps(lse2 + 16);
    const Vec delta_low = _mm512_loadu_ps(delta), delta_high = _mm512_loadu_ps(delta + 16);
    alignas(64) float hidden[kChunk];  // per query of the chunk: 0 visible, -inf hidden
    MaskRow mask_rows[kChunk];
    const int64_t nq = args_.shape.q_tokens, kv = args_.shape.kv_tokens;
    if (partial) {
      for (int64_t r = 0; r < kChunk && qc * kChunk + r < nq; ++r)
        mask_rows[r] = mask_.row(position(args_.q_positions, qc * kChunk + r));
    }
    for (int64_t j = 0; j < kChunk; ++j) {
      Vec s_low = vload(s_t + j * kChunk), s_high = vload(s_t + j * kChunk + 16);
      if (partial) {
        const int64_t key = c * kChunk + j;
        const int64_t key_pos = key < kv ? position(args_.kv_positions, key) : 0;
        for (int64_t r = 0; r < kChunk; ++r) {
          const bool visible = qc * kChunk + r < nq && key < kv && mask_rows[r].visible(key_pos);
          hidden[r] = visible ? 0.0f : -kInf;
        }
        s_low = _mm512_add_ps(s_low, vload(hidden));
        s_high = _mm512_add_ps(s_high, vload(hidden + 16));
      }
      const Vec p_low = exp2_nonpositive(_mm512_fmsub_ps(s_low, factor, lse_low));
      const Vec p_high = exp2_nonpositive(_mm512_fmsub_ps(s_high, factor, lse_high));
      const Vec ds_low =
          _mm512_mul_ps(_mm512_mul_ps(p_low, scale),
                        _mm512_sub_ps(vload(dp_t + j * kChunk), delta_low));
      const Vec ds_high =
          _mm512_mul_ps(_mm512_mul_ps(p_high, scale),
                        _mm512_sub_ps(vload(dp_t + j * kChunk + 16), delta_high));
      _mm512_store_si512(p_t + j * kChunk, (__m512i)_mm512_cvtne2ps_pbh(p_high, p_low));
      _mm512_store_si512(ds_t + j * kChunk, (__m512i)_mm512_cvtne2ps_pbh(ds_high, ds_low));
    }
  }

  // acc[32 keys][Dp] += a (bf16 [32 keys][32 queries]) x the query chunk's B tiles (pairs of
  // query rows, one per 16 dims).
  void accumulate(const uint16_t* a, const uint16_t* b_tiles, float* acc) const {
    const int64_t dp = s_.dp, stride = dp * 4;
    _tile_loadd(4, a, kChunk * 2);
    _tile_loadd(5, a + kTileRows * kChunk, kChunk * 2);
    for (int64_t dt = 0; dt < dp / 16; dt += 2) {
      float* o = acc + dt * kTileRows;
      _tile_loadd(0, o, stride);
      _tile_loadd(1, o + kTileRows, stride);
      _tile_loadd(2, o + kTileRows * dp, stride);
      _tile_loadd(3, o + kTileRows * dp + kTileRows, stride);
      _tile_loadd(6, b_tiles + dt * kTileElements, 64);
      _tile_loadd(7, b_tiles + (dt + 1) * kTileElements, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
      _tile_stored(0, o, stride);
      _tile_stored(1, o + kTileRows, stride);
      _tile_stored(2, o + kTileRows * dp, stride);
      _tile_stored(3, o + kTileRows * dp + kTileRows, stride);
    }
  }

  // dQ^T[:, 32 qc ..] += K^T (A: [Dp][32 keys] of chunk c) x dS^T (B: pairs of key rows).
  void accumulate_dq_t(int64_t c, int64_t qc, const uint16_t* ds_tiles, float* dq_t) const {
    const int64_t dp = s_.dp, stride = s_.q_pad * 4;
    const uint16_t* k_t = s_.k_t + c * dp * kChunk;
    _tile_loadd(6, ds_tiles, 64);
    _tile_loadd(7, ds_tiles + kTileElements, 64);
    for (int64_t dt = 0; dt < dp / 16; dt += 2) {
      float* o = dq_t + dt * kTileRows * s_.q_pad + qc * kChunk;
      _tile_loadd(0, o, stride);
      _tile_loadd(1, o + kTileRows, stride);
      _tile_loadd(2, o + kTileRows * s_.q_pad, stride);
      _tile_loadd(3, o + kTileRows * s_.q_pad + kTileRows, stride);
      _tile_loadd(4, k_t + dt * kTileRows * kChunk, kChunk * 2);
      _tile_loadd(5, k_t + (dt + 1) * kTileRows * kChunk, kChunk * 2);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
      _tile_stored(0, o, stride);
      _tile_stored(1, o + kTileRows, stride);
      _tile_stored(2, o + kTileRows * s_.q_pad, stride);
      _tile_stored(3, o + kTileRows * s_.q_pad + kTileRows, stride);
    }
  }

  // dQ rows of query chunk c += the sum of every thread's dQ^T columns.
  void add_dq(int64_t b, int64_t head, int64_t c) const {
    const int64_t nq = args_.shape.q_tokens;
    for (int64_t r = c * kChunk; r < (c + 1) * kChunk && r < nq; ++r) {
      float* dq = dq_.at(b, r, head);
      for (int t = 0; t < threads_; ++t) {
        const float* column = s_.dq_t + t * s_.dp * s_.q_pad + r;
        for (int64_t d = 0; d < s_.dim; ++d)
          dq[d] += column[d * s_.q_pad];
      }
    }
  }

  const BackwardArgs& args_;
  const RowView<const float> delta_;
  const TokenView<float> dq_, dk_, dv_;
  const Shared& s_;
  const int threads_;
  const MaskView mask_;
};

int64_t workspace_floats(int64_t dp) {
  // S^T, dP^T (fp32), P^T, dS^T, dS^T tiles (bf16: 3 x 32 x 32 / 2 floats), dK, dV.
  return cache_lines_of_floats(2 * kChunk * kChunk + 3 * kChunk * kChunk / 2 + 2 * kChunk * dp);
}

struct Sizes {
  int64_t dp, k_chunks, q_chunks, q_pad, shared_floats;
  Sizes(const AttentionShape& shape, int threads) {
    dp = round_up(shape.head_dim, 32);
    k_chunks = (shape.kv_tokens + kChunk - 1) / kChunk;
    q_chunks = (shape.q_tokens + kChunk - 1) / kChunk;
    q_pad = q_chunks * kChunk;
    const int64_t keys = k_chunks * kChunk;
    shared_floats = 3 * cache_lines_of_floats(keys * dp / 2) +     // K rows, V rows, K^T
                    4 * cache_lines_of_floats(q_pad * dp / 2) +    // Q, dO twice
                    2 * cache_lines_of_floats(q_pad) +             // LSE, delta
                    cache_lines_of_floats(4 * (k_chunks + q_chunks)) +  // bounds
                    int64_t{threads} * dp * q_pad;                 // dQ^T per thread
  }
};

}  // namespace

int64_t backward_workspace_bytes(const AttentionShape& shape, int threads) {
  const Sizes sizes(shape, threads);
  return (sizes.shared_floats +
          threads * (workspace_floats(sizes.dp) + cache_lines_of_floats(kChunk * sizes.dp / 2))) *
         static_cast<int64_t>(sizeof(float));
}

void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv) {
  const AttentionShape& shape = in.args->shape;
  if (shape.batch * shape.heads == 0 || shape.kv_tokens == 0) return;
  if (shape.q_tokens == 0) {
    // No query sees the keys: their gradients are 0 (or unchanged when added to).
    if (!in.args->accumulate) {
      for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t j = 0; j < shape.kv_tokens; ++j)
          for (int64_t h = 0; h < shape.kv_heads; ++h) {
            std::memset(dk.at(b, j, h), 0, sizeof(float) * shape.head_dim);
            std::memset(dv.at(b, j, h), 0, sizeof(float) * shape.head_dim);
          }
    }
    return;
  }
  const int threads = static_cast<int>(smaller(in.args->threads, (shape.kv_tokens + 31) / 32));
  const Sizes sizes(shape, threads);
  AlignedFloats memory(sizes.shared_floats);
  float* at = memory.data();
  auto take = [&](int64_t floats) {
    float* p = at;
    at += cache_lines_of_floats(floats);
    return p;
  };
  const int64_t keys = sizes.k_chunks * kChunk, dp = sizes.dp;
  Shared s;
  s.dim = shape.head_dim;
  s.dp = dp;
  s.k_chunks = sizes.k_chunks;
  s.q_chunks = sizes.q_chunks;
  s.q_pad = sizes.q_pad;
  s.k_rows = reinterpret_cast<uint16_t*>(take(keys * dp / 2));
  s.v_rows = reinterpret_cast<uint16_t*>(take(keys * dp / 2));
  s.k_t = reinterpret_cast<uint16_t*>(take(keys * dp / 2));
  s.q_dims = reinterpret_cast<uint16_t*>(take(sizes.q_pad * dp / 2));
  s.do_dims = reinterpret_cast<uint16_t*>(take(sizes.q_pad * dp / 2));
  s.q_rows = reinterpret_cast<uint16_t*>(take(sizes.q_pad * dp / 2));
  s.do_rows = reinterpret_cast<uint16_t*>(take(sizes.q_pad * dp / 2));
  s.lse2 = take(sizes.q_pad);
  s.delta = take(sizes.q_pad);
  auto* bounds = reinterpret_cast<Bounds*>(take(4 * (sizes.k_chunks + sizes.q_chunks)));
  s.key_bounds = bounds;
  s.q_bounds = bounds + sizes.k_chunks;
  s.dq_t = at;
  Backward kernel(in, dq, dk, dv, s, threads);

#pragma omp parallel num_threads(threads)
  {
    AlignedFloats own(workspace_floats(dp) + cache_lines_of_floats(kChunk * dp / 2));
    const TileScope tiles;
    kernel.run(reinterpret_cast<uint16_t*>(own.data() + workspace_floats(dp)), own.data());
  }
}

}  // namespace a2d::cpu::amx
