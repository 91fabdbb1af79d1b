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
//   work item     (query head, 128 keys = 4 chunks of 32); their dK and dV in fp32 [32][Dp] per
//                 chunk, over 32 queries a step, per chunk the queries see:
//                   S^T, dP^T   2 x 2 C tiles each, depth Dp
//                   P^T = 2^(S^T scale log2 e - LSE log2 e), dS^T = scale P^T (dP^T - delta), on
//                   16 queries a vector, rounded to bf16 (as on tensor cores)
//                   dV += P^T dO, dK += dS^T Q       C tiles loaded from and stored to dK, dV
//                 then dQ^T += K^T dS^T over the item's chunks (one load and store of the C tiles)
//                 into this thread's own dQ^T ([Dp][32] per query chunk)
//   query heads   one at a time; the threads' dQ^T are summed into dQ in a fixed order after each
//
// Numerics: as the forward's, the products of bf16 values are exact and summed in fp32; P and dS
// are rounded once to bf16 before the products that take them (check.hpp's tensor-core bounds).
// Softcapping (s' = cap tanh(s scale / cap)) multiplies dS by 1 - (s' / cap)^2.
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

constexpr int kChunk = 32;      // keys per chunk; queries per step
constexpr int kItemChunks = 4;  // key chunks per work item
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kInf = std::numeric_limits<float>::infinity();

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
  float* dq_t;         // [threads][q_chunks][Dp][32]
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
          const int64_t items = (s_.k_chunks + kItemChunks - 1) / kItemChunks;
#pragma omp for schedule(dynamic, 1)
          for (int64_t item = 0; item < items; ++item) {
            const int64_t first = (items - 1 - item) * kItemChunks;
            key_chunks(b, kv_head, first, smaller(first + kItemChunks, s_.k_chunks),
                       /*add=*/args_.accumulate || g > 0, own_dq_t, workspace);
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

  // Key chunks [first, last) (at most 4). Workspace (floats): S^T, dP^T [32][32] fp32; P^T, dS^T
  // [32][32] bf16; per chunk dS^T as B tiles (2 KiB) and dK, dV [32][Dp] fp32.
  void key_chunks(int64_t b, int64_t kv_head, int64_t first, int64_t last, bool add, float* dq_t,
                  float* workspace) const {
    const int64_t dp = s_.dp, count = last - first;
    float* s_t = workspace;
    float* dp_t = s_t + kChunk * kChunk;
    auto* p_t = reinterpret_cast<uint16_t*>(dp_t + kChunk * kChunk);
    uint16_t* ds_t = p_t + kChunk * kChunk;
    uint16_t* ds_tiles = ds_t + kChunk * kChunk;  // [4][2 tiles]
    float* dk_acc = reinterpret_cast<float*>(ds_tiles + kItemChunks * kChunk * kChunk);
    float* dv_acc = dk_acc + kItemChunks * kChunk * dp;
    std::memset(dk_acc, 0, sizeof(float) * 2 * kItemChunks * kChunk * dp);
    int64_t entries = 0;
    bool seen[kItemChunks];
    for (int64_t qc = 0; qc < s_.q_chunks; ++qc) {
      if (args_.progress && qc % 16 == 0 && is_calling_thread())
        args_.progress(args_.progress_context);
      const Bounds& rows = s_.q_bounds[qc];
      bool any = false;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t c = first + i;
        const Bounds& keys = s_.key_bounds[c];
        const BlockVisibility visibility = mask_.classify(rows.min, rows.max, keys.min, keys.max);
        seen[i] = visibility != BlockVisibility::hidden;
        if (!seen[i]) continue;
        any = true;
        products_t(s_.k_rows + c * kChunk * dp, s_.q_dims, qc, s_t);
        products_t(s_.v_rows + c * kChunk * dp, s_.do_dims, qc, dp_t);
        probabilities(c, qc, visibility == BlockVisibility::partial, s_t, dp_t, p_t, ds_t);
        pack_pairs_of_rows(ds_t, kChunk, ds_tiles + i * kChunk * kChunk);
        accumulate(p_t, s_.do_rows + qc * (dp / 16) * kTileElements, dv_acc + i * kChunk * dp);
        accumulate(ds_t, s_.q_rows + qc * (dp / 16) * kTileElements, dk_acc + i * kChunk * dp);
        entries += kChunk * kChunk;
      }
      if (any) accumulate_dq_t(first, count, seen, qc, ds_tiles, dq_t);
    }
    if (args_.work_done) args_.work_done->fetch_add(entries, std::memory_order_relaxed);
    // The chunks' rows of dK and dV (written, or added to).
    const int64_t kv = args_.shape.kv_tokens;
    for (int64_t j = 0; j < count * kChunk && first * kChunk + j < kv; ++j) {
      float* dk = dk_.at(b, first * kChunk + j, kv_head);
      float* dv = dv_.at(b, first * kChunk + j, kv_head);
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
    zero_c_block();
    for (int64_t dc = 0; dc < chunks; ++dc)
      multiply_block(a_rows + dc * 32, dp, b0 + dc * kTileElements, b1 + dc * kTileElements);
    store_c_block(out, kChunk);
  }

  // P^T and dS^T of key chunk c and query chunk qc, in bf16; a partial block hides pairs the
  // mask hides (P = 0).
  void probabilities(int64_t c, int64_t qc, bool partial, const float* s_t, const float* dp_t,
                     uint16_t* p_t, uint16_t* ds_t) const {
    const bool softcap = args_.softcap != 0.0f;
    const Vec scale = vset(args_.scale);
    const Vec log2e = vset(kLog2e);
    const Vec cap = vset(args_.softcap), inverse = vset(softcap ? 1.0f / args_.softcap : 0.0f);
    // Scores to log2 units: s scale log2 e, or (softcapped, already in log2 units) s.
    const Vec s_factor = softcap ? vset(1.0f) : vset(args_.scale * kLog2e);
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
      Vec p_scale_low = scale, p_scale_high = scale;
      if (softcap) {
        // s' = cap tanh(s scale / cap) (-inf stays -inf: masked), and dS gains ds'/ds / scale =
        // 1 - (s' / cap)^2.
        const Vec capped_low = avx512::softcap_lanes(_mm512_mul_ps(s_low, scale), cap, inverse);
        const Vec capped_high = avx512::softcap_lanes(_mm512_mul_ps(s_high, scale), cap, inverse);
        const Vec t_low = _mm512_mul_ps(capped_low, inverse);
        const Vec t_high = _mm512_mul_ps(capped_high, inverse);
        p_scale_low = _mm512_mul_ps(scale, _mm512_fnmadd_ps(t_low, t_low, vset(1.0f)));
        p_scale_high = _mm512_mul_ps(scale, _mm512_fnmadd_ps(t_high, t_high, vset(1.0f)));
        const Vec minus_infinity = vset(-kInf);
        s_low = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s_low, minus_infinity, _CMP_EQ_OQ),
                                     _mm512_mul_ps(capped_low, log2e), minus_infinity);
        s_high = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s_high, minus_infinity, _CMP_EQ_OQ),
                                      _mm512_mul_ps(capped_high, log2e), minus_infinity);
      }
      const Vec p_low = exp2_nonpositive(_mm512_fmsub_ps(s_low, s_factor, lse_low));
      const Vec p_high = exp2_nonpositive(_mm512_fmsub_ps(s_high, s_factor, lse_high));
      const Vec ds_low =
          _mm512_mul_ps(_mm512_mul_ps(p_low, p_scale_low),
                        _mm512_sub_ps(vload(dp_t + j * kChunk), delta_low));
      const Vec ds_high =
          _mm512_mul_ps(_mm512_mul_ps(p_high, p_scale_high),
                        _mm512_sub_ps(vload(dp_t + j * kChunk + 16), delta_high));
      _mm512_store_si512(p_t + j * kChunk, (__m512i)_mm512_cvtne2ps_pbh(p_high, p_low));
      _mm512_store_si512(ds_t + j * kChunk, (__m512i)_mm512_cvtne2ps_pbh(ds_high, ds_low));
    }
  }

  // acc[32 keys][Dp] += a (bf16 [32 keys][32 queries]) x the query chunk's B tiles (pairs of
  // query rows, one per 16 dims).
  void accumulate(const uint16_t* a, const uint16_t* b_tiles, float* acc) const {
    const int64_t dp = s_.dp;
    for (int64_t dt = 0; dt < dp / 16; dt += 2) {
      float* o = acc + dt * kTileRows;
      load_c_block(o, dp);
      multiply_block(a, kChunk, b_tiles + dt * kTileElements, b_tiles + (dt + 1) * kTileElements);
      store_c_block(o, dp);
    }
  }

  // dQ^T of query chunk qc ([Dp][32], contiguous) += K^T (A: [Dp][32 keys] per key chunk) x dS^T
  // (B: pairs of key rows), over the `count` key chunks from `first` that the queries see.
  void accumulate_dq_t(int64_t first, int64_t count, const bool* seen, int64_t qc,
                       const uint16_t* ds_tiles, float* dq_t) const {
    const int64_t dp = s_.dp;
    for (int64_t dt = 0; dt < dp / 16; dt += 2) {
      float* o = dq_t + qc * dp * kChunk + dt * kTileRows * kChunk;
      load_c_block(o, kChunk);
      for (int64_t i = 0; i < count; ++i) {
        if (!seen[i]) continue;
        const uint16_t* k_t = s_.k_t + (first + i) * dp * kChunk + dt * kTileRows * kChunk;
        const uint16_t* tiles = ds_tiles + i * kChunk * kChunk;
        multiply_block(k_t, kChunk, tiles, tiles + kTileElements);
      }
      store_c_block(o, kChunk);
    }
  }

  // dQ rows of query chunk c += the sum of every thread's dQ^T columns.
  void add_dq(int64_t b, int64_t head, int64_t c) const {
    const int64_t nq = args_.shape.q_tokens;
    for (int64_t r = c * kChunk; r < (c + 1) * kChunk && r < nq; ++r) {
      float* dq = dq_.at(b, r, head);
      for (int t = 0; t < threads_; ++t) {
        const float* column = s_.dq_t + t * s_.dp * s_.q_pad + c * s_.dp * kChunk + r % kChunk;
        for (int64_t d = 0; d < s_.dim; ++d)
          dq[d] += column[d * kChunk];
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
  // S^T, dP^T (fp32), P^T, dS^T (bf16), dS^T tiles per chunk (bf16), dK, dV per chunk (fp32).
  return cache_lines_of_floats(2 * kChunk * kChunk + (2 + kItemChunks) * kChunk * kChunk / 2 +
                               2 * kItemChunks * kChunk * dp);
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
