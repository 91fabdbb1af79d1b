// The AVX2/FMA backward kernel (FlashAttention-2 order, fp32): five tile products per block,
// each the 6 x 16 micro-kernel of simd.hpp (6 rows, 2 vectors), on padded tiles so no product
// has an edge case:
//
//   work item  (batch, K/V head, key tile of kTileK = 96 keys); it owns dK and dV of its keys,
//              summed over the group's query heads and every visible query tile
//   per item   Kt = scale K^T [D][96], Vt = V^T [D][96], Ks = scale K [96][Dp] (Dp = D rounded
//              up to 16; padding is zero), dK, dV accumulators [96][Dp]
//   per block  query tile of kTileQ = 48 rows: Q, dO copied to [48][Dp]
//     P  = exp(Q Kt - LSE)     [48][96]  depth D; exp in the micro-kernel's epilogue
//     dS = P * (dO Vt - delta) [48][96]  depth D; dS in the epilogue
//     dV += P^T dO             [96][Dp]  depth 48
//     dK += dS^T Q             [96][Dp]  depth 48 (times scale once at the end of the item)
//     dQ  = dS Ks              [48][Dp]  depth 96, then added row by row into the dq rows
// Rows of the [.][Dp] tiles are kRowStride = Dp + 16 floats apart: with Dp = 128 a stride of
// 512 bytes would put 96 rows of a tile into 8 of the 64 L1 sets. The copies exist for the same
// reason (see forward.cpp): rows of Q, dO, K, V and dQ at their natural stride, 4 KiB for 8
// heads of 128 dims, compete for a few cache sets; every query tile's rows are prefetched while
// the previous block computes (without prefetching, the backward took about 1.3 times as long).
// Padded query rows get LSE = +inf (so P = 0); padded keys and masked pairs get P = 0 in a
// per-element pass that runs only on blocks the mask cuts and on the last, short key tile.
//
// dQ rows receive contributions from every key tile. Thread 0 adds into dq, every other thread
// into its own zeroed buffer, and the buffers are summed in thread order at the end. Items are
// assigned to threads by a fixed rule (a snake over the item list, which balances the causal
// mask's decreasing work per key tile), so the result is deterministic for a thread count.
//
// Element types: the copies into Kt, Vt, Ks (once per item) and into the Q and dO tiles (once per
// block) are where 16-bit inputs become fp32 (exactly; convert.hpp), so everything after them is
// the fp32 kernel's arithmetic on the widened values. dQ, dK and dV are fp32.
#include <cmath>
#include <cstdint>
#include <limits>

#include "convert.hpp"
#include "backends/cpu/kernels/paths.hpp"
#include "backends/cpu/kernels/tiles.hpp"
#include "simd.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace a2d::cpu::avx2 {
namespace {

constexpr int kRows = 6;     // micro-kernel rows
constexpr int kVectors = 2;  // micro-kernel vectors: 16 columns
constexpr int kColumns = kVectors * kLanes;
constexpr int64_t kTileK = kCpuBackwardTileK;  // 96: a multiple of kRows and kColumns
constexpr int64_t kTileQ = kCpuBackwardTileQ;  // 48: a multiple of kRows
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr double kLog2eDouble = 1.44269504088896340736;

int64_t smaller(int64_t a, int64_t b) {
  return a < b ? a : b;
}
int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}
int64_t position(const int64_t* positions, int64_t index) {
  return positions ? positions[index] : index;
}

struct Layout {
  int64_t padded_dim, row_stride;
  int64_t k_t, v_t, k_rows, dk, dv, q_rows, do_rows, dq, prob, d_score, lse_hi, lse_lo, delta,
      slope;
  int64_t total;
  explicit Layout(int64_t dim)
      : padded_dim(round_up(dim, kColumns)), row_stride(padded_dim + kColumns) {
    int64_t offset = 0;
    auto take = [&](int64_t floats) {
      const int64_t at = offset;
      offset += cache_lines_of_floats(floats);
      return at;
    };
    k_t = take(dim * kTileK);
    v_t = take(dim * kTileK);
    k_rows = take(kTileK * row_stride);
    dk = take(kTileK * row_stride);
    dv = take(kTileK * row_stride);
    q_rows = take(kTileQ * row_stride);
    do_rows = take(kTileQ * row_stride);
    dq = take(kTileQ * row_stride);
    prob = take(kTileQ * kTileK);
    d_score = take(kTileQ * kTileK);
    lse_hi = take(kTileQ);
    lse_lo = take(kTileQ);
    delta = take(kTileQ);
    slope = take(kTileQ * kTileK);  // softcap only; last, so the other offsets do not move
    total = offset;
  }
};

struct Tile {
  int64_t begin, size, min, max;
};

Tile make_tile(const int64_t* positions, int64_t count, int64_t begin, int64_t block) {
  Tile tile{begin, smaller(block, count - begin), position(positions, begin),
            position(positions, begin)};
  for (int64_t i = begin + 1; i < begin + tile.size; ++i) {
    const int64_t pos = position(positions, i);
    tile.min = pos < tile.min ? pos : tile.min;
    tile.max = pos > tile.max ? pos : tile.max;
  }
  return tile;
}

void zero(float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    x[i] = 0.0f;
}

// Prefetches `bytes` from `at` into the L2 cache.
void prefetch(const void* at, int64_t bytes) {
  const char* p = reinterpret_cast<const char*>(at);
  for (int64_t b = 0; b < bytes; b += 64)
    _mm_prefetch(p + b, _MM_HINT_T1);
}

// The block products, out of line (see A2D_NOINLINE). Each computes one 6 x 16 block
// C[m][n] = sum_k A(m, k) B(k, n) and differs in A's layout and in what it does with C.

// P[m][n] = 2^(C log2 e - hi[m] - lo[m]), C = Q rows (a, a_stride apart) times Kt columns.
template <bool kExp>
A2D_NOINLINE void probability_block(const float* a, int64_t a_stride, const float* b, int64_t depth,
                                    const float* hi, const float* lo, float* out) {
  Block<kRows, kVectors> c;
  c.zero();
  multiply<kRows, kVectors, true>(c, a, a_stride, b, kTileK, depth);
#pragma GCC unroll 6
  for (int m = 0; m < kRows; ++m) {
    const __m256 h = _mm256_broadcast_ss(hi + m);
    const __m256 l = _mm256_broadcast_ss(lo + m);
#pragma GCC unroll 2
    for (int n = 0; n < kVectors; ++n) {
      const __m256 x = _mm256_sub_ps(_mm256_fmsub_ps(c.v[m][n], _mm256_set1_ps(kLog2e), h), l);
      _mm256_store_ps(out + m * kTileK + n * kLanes, kExp ? exp2_lanes(x) : x);
    }
  }
}

// The same with logit softcapping: s = cap tanh(c / cap) (softcap_lanes) before the exponent,
// and the derivative ds/dc = 1 - (s / cap)^2 stored in `slope` for the score gradients.
A2D_NOINLINE void capped_probability_block(const float* a, int64_t a_stride, const float* b,
                                           int64_t depth, const float* hi, const float* lo,
                                           float cap, float* out, float* slope) {
  Block<kRows, kVectors> c;
  c.zero();
  multiply<kRows, kVectors, true>(c, a, a_stride, b, kTileK, depth);
  const __m256 cap_lanes = _mm256_set1_ps(cap), inverse = _mm256_set1_ps(1.0f / cap);
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int m = 0; m < kRows; ++m) {
    const __m256 h = _mm256_broadcast_ss(hi + m);
    const __m256 l = _mm256_broadcast_ss(lo + m);
    for (int n = 0; n < kVectors; ++n) {
      const __m256 capped = softcap_lanes(c.v[m][n], cap_lanes, inverse);
      const __m256 t = _mm256_mul_ps(capped, inverse);
      const __m256 x = _mm256_sub_ps(_mm256_fmsub_ps(capped, _mm256_set1_ps(kLog2e), h), l);
      _mm256_store_ps(out + m * kTileK + n * kLanes, exp2_lanes(x));
      _mm256_store_ps(slope + m * kTileK + n * kLanes, _mm256_fnmadd_ps(t, t, one));
    }
  }
}

// dS[m][n] = P[m][n] (C - delta[m]), C = dO rows times Vt columns.
A2D_NOINLINE void score_gradient_block(const float* a, int64_t a_stride, const float* b,
                                       int64_t depth, const float* delta, const float* prob,
                                       float* out) {
  Block<kRows, kVectors> c;
  c.zero();
  multiply<kRows, kVectors, true>(c, a, a_stride, b, kTileK, depth);
#pragma GCC unroll 6
  for (int m = 0; m < kRows; ++m) {
    const __m256 d = _mm256_broadcast_ss(delta + m);
#pragma GCC unroll 2
    for (int n = 0; n < kVectors; ++n) {
      const __m256 p = _mm256_load_ps(prob + m * kTileK + n * kLanes);
      _mm256_store_ps(out + m * kTileK + n * kLanes, _mm256_mul_ps(p, _mm256_sub_ps(c.v[m][n], d)));
    }
  }
}

// dS[i][j] *= slope[i][j] (softcapping's chain rule), over rows x columns of a tile.
void apply_slope(const float* slope, float* d_score, int64_t rows, int64_t columns) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < columns; j += kLanes) {
      const int64_t at = i * kTileK + j;
      _mm256_store_ps(d_score + at,
                      _mm256_mul_ps(_mm256_load_ps(d_score + at), _mm256_load_ps(slope + at)));
    }
}

// out[m][n] += sum_i a[i * kTileK + m] b[i * b_step + n]: dV += P^T dO and dK += dS^T Q.
A2D_NOINLINE void update_block(const float* a, const float* b, int64_t b_step, int64_t depth,
                               float* out, int64_t out_stride) {
  Block<kRows, kVectors> c;
#pragma GCC unroll 6
  for (int m = 0; m < kRows; ++m)
#pragma GCC unroll 2
    for (int n = 0; n < kVectors; ++n)
      c.v[m][n] = _mm256_load_ps(out + m * out_stride + n * kLanes);
  multiply<kRows, kVectors, false>(c, a, kTileK, b, b_step, depth);
#pragma GCC unroll 6
  for (int m = 0; m < kRows; ++m)
#pragma GCC unroll 2
    for (int n = 0; n < kVectors; ++n)
      _mm256_store_ps(out + m * out_stride + n * kLanes, c.v[m][n]);
}

// out[m][n] = sum_j a[m * kTileK + j] b[j * b_step + n]: dQ = dS Ks.
A2D_NOINLINE void product_block(const float* a, const float* b, int64_t b_step, int64_t depth,
                                float* out, int64_t out_stride) {
  Block<kRows, kVectors> c;
  c.zero();
  multiply<kRows, kVectors, true>(c, a, kTileK, b, b_step, depth);
#pragma GCC unroll 6
  for (int m = 0; m < kRows; ++m)
#pragma GCC unroll 2
    for (int n = 0; n < kVectors; ++n)
      _mm256_store_ps(out + m * out_stride + n * kLanes, c.v[m][n]);
}

class KeyTile {
 public:
  KeyTile(const BackwardInputs& in, const Layout& layout, float* workspace, TokenView<float> dq,
          int64_t batch, int64_t kv_head, const Tile& keys, unsigned skip)
      : args_(*in.args),
        delta_(in.delta),
        skip_(skip),
        dim_(args_.shape.head_dim),
        padded_dim_(layout.padded_dim),
        stride_(layout.row_stride),
        batch_(batch),
        kv_head_(kv_head),
        keys_(keys),
        dq_(dq),
        k_t_(workspace + layout.k_t),
        v_t_(workspace + layout.v_t),
        k_rows_(workspace + layout.k_rows),
        dk_(workspace + layout.dk),
        dv_(workspace + layout.dv),
        q_rows_(workspace + layout.q_rows),
        do_rows_(workspace + layout.do_rows),
        dq_tile_(workspace + layout.dq),
        prob_(workspace + layout.prob),
        d_score_(workspace + layout.d_score),
        lse_hi_(workspace + layout.lse_hi),
        lse_lo_(workspace + layout.lse_lo),
        row_delta_(workspace + layout.delta),
        slope_(workspace + layout.slope) {}

  void run(TokenView<float> dk_out, TokenView<float> dv_out) {
    if (!(skip_ & kSkipCopies)) {
      with_dtype(args_.k.dtype, [&]<DType kKey>() {
        with_dtype(args_.v.dtype, [&]<DType kValue>() { load_keys<kKey, kValue>(); });
      });
    }
    const AttentionShape& shape = args_.shape;
    const int64_t group = shape.group_size();
    for (int64_t head = kv_head_ * group; head < (kv_head_ + 1) * group; ++head) {
      for (int64_t begin = 0; begin < shape.q_tokens; begin += kTileQ) {
        // Every few query tiles the calling thread lets MPI progress (BackwardArgs::progress).
        if (args_.progress && begin % (8 * kTileQ) == 0 && is_calling_thread()) {
          args_.progress(args_.progress_context);
        }
        const Tile queries = make_tile(args_.q_positions, shape.q_tokens, begin, kTileQ);
        const BlockVisibility visibility =
            classify_block(args_.mask, queries.min, queries.max, keys_.min, keys_.max);
        if (visibility == BlockVisibility::hidden) continue;
        block(head, queries, visibility);
      }
    }
    const float scale = args_.scale;
    for (int64_t j = 0; j < keys_.size; ++j) {
      float* dk = dk_out.at(batch_, keys_.begin + j, kv_head_);
      float* dv = dv_out.at(batch_, keys_.begin + j, kv_head_);
      const float* dk_acc = dk_ + j * stride_;
      const float* dv_acc = dv_ + j * stride_;
      for (int64_t d = 0; d < dim_; ++d) {
        dk[d] = (args_.accumulate ? dk[d] : 0.0f) + scale * dk_acc[d];
        dv[d] = (args_.accumulate ? dv[d] : 0.0f) + dv_acc[d];
      }
    }
  }

 private:
  // Kt, Vt and Ks of the item's keys (K of element type kKey, V of kValue), zero past the last.
  template <DType kKey, DType kValue>
  void load_keys() {
    const float scale = args_.scale;
    for (int64_t j = 0; j < kTileK; ++j) {
      float* k_row = k_rows_ + j * stride_;
      if (j >= keys_.size) {
        for (int64_t d = 0; d < dim_; ++d)
          k_t_[d * kTileK + j] = v_t_[d * kTileK + j] = 0.0f;
        zero(k_row, padded_dim_);
        continue;
      }
      const std::byte* k = args_.k.at(batch_, keys_.begin + j, kv_head_);
      const std::byte* v = args_.v.at(batch_, keys_.begin + j, kv_head_);
      for (int64_t d = 0; d < dim_; ++d) {
        const float key = scale * widen1<kKey>(k + d * kElementBytes<kKey>);
        k_t_[d * kTileK + j] = key;
        v_t_[d * kTileK + j] = widen1<kValue>(v + d * kElementBytes<kValue>);
        k_row[d] = key;
      }
      zero(k_row + dim_, padded_dim_ - dim_);
    }
    for (int64_t j = 0; j < kTileK; ++j) {
      zero(dk_ + j * stride_, padded_dim_);
      zero(dv_ + j * stride_, padded_dim_);
    }
  }

  // Q and dO rows of the block, zero-padded to kRows-row blocks and padded_dim columns, and the
  // per-row constants: LSE in log2 units as a hi + lo pair (so exp(s - LSE) keeps fp32 accuracy
  // when |LSE| is large) and delta.
  int64_t load_queries(int64_t head, const Tile& queries) {
    const int64_t padded_rows = round_up(queries.size, kRows);
    for (int64_t i = 0; i < padded_rows; ++i) {
      float* q_row = q_rows_ + i * stride_;
      float* do_row = do_rows_ + i * stride_;
      if (i >= queries.size) {
        zero(q_row, padded_dim_);
        zero(do_row, padded_dim_);
        lse_hi_[i] = kPosInf;  // P = 2^(s - inf) = 0
        lse_lo_[i] = 0.0f;
        row_delta_[i] = 0.0f;
        continue;
      }
      const int64_t row = queries.begin + i;
      // One switch per row: fp32 rows are copied, 16-bit rows widened 8 lanes at a time.
      widen_row(args_.q.dtype, args_.q.at(batch_, row, head), q_row, dim_);
      widen_row(args_.d_out.dtype, args_.d_out.at(batch_, row, head), do_row, dim_);
      zero(q_row + dim_, padded_dim_ - dim_);
      zero(do_row + dim_, padded_dim_ - dim_);
      const float lse = args_.lse.at(batch_, head, row);
      if (lse == kNegInf) {  // the row saw no key at all: no probability anywhere
        lse_hi_[i] = kPosInf;
        lse_lo_[i] = 0.0f;
      } else {
        const double lse2 = lse * kLog2eDouble;
        lse_hi_[i] = static_cast<float>(lse2);
        lse_lo_[i] = static_cast<float>(lse2 - lse_hi_[i]);
      }
      row_delta_[i] = delta_.at(batch_, head, row);
    }
    return padded_rows;
  }

  // While a block computes, the rows the next block of this head reads (Q, dO) and the dq rows
  // this block adds to are pulled towards the core, one row of each per micro-kernel call of
  // the first two products: spread out like this, the prefetches do not pile up in the core's
  // queue of outstanding misses (a burst at the start of the block did, and gained less).
  void plan_prefetch(int64_t head, const Tile& queries) {
    prefetch_head_ = head;
    next_row_ = queries.begin + kTileQ;
    next_end_ = smaller(next_row_ + kTileQ, args_.shape.q_tokens);
    dq_row_ = queries.begin;
    dq_end_ = queries.begin + queries.size;
  }
  void prefetch_next_query_row() {
    if (next_row_ >= next_end_) return;
    prefetch(args_.q.at(batch_, next_row_, prefetch_head_), dim_ * dtype_bytes(args_.q.dtype));
    prefetch(args_.d_out.at(batch_, next_row_, prefetch_head_),
             dim_ * dtype_bytes(args_.d_out.dtype));
    ++next_row_;
  }
  void prefetch_next_dq_row() {
    if (dq_row_ >= dq_end_) return;
    prefetch(dq_.at(batch_, dq_row_, prefetch_head_), dim_ * static_cast<int64_t>(sizeof(float)));
    ++dq_row_;
  }

  void block(int64_t head, const Tile& queries, BlockVisibility visibility) {
    const int64_t rows =
        skip_ & kSkipCopies ? round_up(queries.size, kRows) : load_queries(head, queries);
    plan_prefetch(head, queries);
    const int64_t columns = round_up(keys_.size, kColumns);
    if (!(skip_ & kSkipScores)) {
      if (args_.softcap != 0.0f) {
        capped_probabilities(rows, columns);
      } else if (skip_ & kSkipExp) {
        probabilities<false>(rows, columns);
      } else {
        probabilities<true>(rows, columns);
      }
    }
    if (visibility == BlockVisibility::partial || keys_.size < kTileK) {
      mask(queries, rows, visibility);
    }
    if (!(skip_ & kSkipScoreGradients)) score_gradients(rows, columns);
    if (!(skip_ & kSkipKeyValueGradients)) key_value_gradients(rows);
    if (!(skip_ & kSkipQueryGradients)) query_gradients(head, queries);
    while (next_row_ < next_end_)
      prefetch_next_query_row();
  }

  // P[i][j] = exp(scale q_i . k_j - LSE_i) = 2^(s log2 e - lse2_i). (kExp = false stores the
  // exponent instead, for timing experiments only.)
  // Keys outer: the 16 columns of Kt a block reads stay in L1 across all query rows.
  template <bool kExp>
  void probabilities(int64_t rows, int64_t columns) {
    for (int64_t j0 = 0; j0 < columns; j0 += kColumns) {
      for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
        prefetch_next_query_row();
        probability_block<kExp>(q_rows_ + i0 * stride_, stride_, k_t_ + j0, dim_, lse_hi_ + i0,
                                lse_lo_ + i0, prob_ + i0 * kTileK + j0);
      }
    }
  }

  // P = 0 for masked pairs and for the padding keys of a short last tile.
  void mask(const Tile& queries, int64_t rows, BlockVisibility visibility) {
    for (int64_t i = 0; i < rows; ++i) {
      float* p = prob_ + i * kTileK;
      for (int64_t j = keys_.size; j < kTileK; ++j)
        p[j] = 0.0f;
      if (visibility != BlockVisibility::partial || i >= queries.size) continue;
      const int64_t query_pos = position(args_.q_positions, queries.begin + i);
      if (args_.mask.has_documents()) {
        // The row's document [first, last], looked up once per row, not per pair.
        const int64_t first = args_.mask.document_first(query_pos);
        const int64_t last = args_.mask.document_last(query_pos);
        for (int64_t j = 0; j < keys_.size; ++j) {
          const int64_t key_pos = position(args_.kv_positions, keys_.begin + j);
          if (key_pos < first || key_pos > last ||
              !args_.mask.visible_by_position(query_pos, key_pos)) {
            p[j] = 0.0f;
          }
        }
        continue;
      }
      for (int64_t j = 0; j < keys_.size; ++j) {
        if (!args_.mask.visible(query_pos, position(args_.kv_positions, keys_.begin + j))) {
          p[j] = 0.0f;
        }
      }
    }
  }

  void capped_probabilities(int64_t rows, int64_t columns) {
    for (int64_t j0 = 0; j0 < columns; j0 += kColumns) {
      for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
        prefetch_next_query_row();
        const int64_t at = i0 * kTileK + j0;
        capped_probability_block(q_rows_ + i0 * stride_, stride_, k_t_ + j0, dim_, lse_hi_ + i0,
                                 lse_lo_ + i0, args_.softcap, prob_ + at, slope_ + at);
      }
    }
  }

  // dS[i][j] = P[i][j] (dO_i . v_j - delta_i) (times 1 - tanh^2 under softcapping).
  void score_gradients(int64_t rows, int64_t columns) {
    for (int64_t j0 = 0; j0 < columns; j0 += kColumns) {
      for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
        prefetch_next_dq_row();
        const int64_t at = i0 * kTileK + j0;
        score_gradient_block(do_rows_ + i0 * stride_, stride_, v_t_ + j0, dim_, row_delta_ + i0,
                             prob_ + at, d_score_ + at);
      }
    }
    if (args_.softcap != 0.0f) apply_slope(slope_, d_score_, rows, columns);
  }

  // dV[j][d] += sum_i P[i][j] dO[i][d] and dK[j][d] += sum_i dS[i][j] Q[i][d].
  void key_value_gradients(int64_t rows) {
    // Dims outer: the 16 columns of Q and dO a block reads stay in L1 across all key rows.
    const int64_t key_rows = round_up(keys_.size, kRows);
    for (int64_t d0 = 0; d0 < padded_dim_; d0 += kColumns) {
      for (int64_t j0 = 0; j0 < key_rows; j0 += kRows) {
        update_block(prob_ + j0, do_rows_ + d0, stride_, rows, dv_ + j0 * stride_ + d0, stride_);
        update_block(d_score_ + j0, q_rows_ + d0, stride_, rows, dk_ + j0 * stride_ + d0, stride_);
      }
    }
  }

  // dQ[i][d] += sum_j dS[i][j] Ks[j][d]: the block's dQ tile, then added into the dq rows.
  void query_gradients(int64_t head, const Tile& queries) {
    // Exactly the tile's keys: dS of padding keys is never computed.
    const int64_t depth = keys_.size;
    // Dims outer: the 16 columns of Ks a block reads stay in L1 across all query rows.
    for (int64_t d0 = 0; d0 < dim_; d0 += kColumns) {
      for (int64_t i0 = 0; i0 < queries.size; i0 += kRows) {
        product_block(d_score_ + i0 * kTileK, k_rows_ + d0, stride_, depth,
                      dq_tile_ + i0 * stride_ + d0, stride_);
      }
    }
    for (int64_t i = 0; i < queries.size; ++i) {
      float* dq = dq_.at(batch_, queries.begin + i, head);
      const float* add = dq_tile_ + i * stride_;
      int64_t d = 0;
      for (; d + kLanes <= dim_; d += kLanes) {
        _mm256_storeu_ps(dq + d, _mm256_add_ps(_mm256_loadu_ps(dq + d), _mm256_load_ps(add + d)));
      }
      for (; d < dim_; ++d)
        dq[d] += add[d];
    }
  }

  const BackwardArgs& args_;
  const RowView<const float> delta_;
  const unsigned skip_;
  const int64_t dim_, padded_dim_, stride_, batch_, kv_head_;
  const Tile keys_;
  const TokenView<float> dq_;
  float* const k_t_;
  float* const v_t_;
  float* const k_rows_;
  float* const dk_;
  float* const dv_;
  float* const q_rows_;
  float* const do_rows_;
  float* const dq_tile_;
  float* const prob_;
  float* const d_score_;
  float* const lse_hi_;
  float* const lse_lo_;
  float* const row_delta_;
  float* const slope_;
  int64_t prefetch_head_ = 0;  // the pending prefetches: rows [next_row_, next_end_) of Q and
  int64_t next_row_ = 0;       // dO, rows [dq_row_, dq_end_) of dq, all of prefetch_head_
  int64_t next_end_ = 0;
  int64_t dq_row_ = 0;
  int64_t dq_end_ = 0;
};

// The thread that runs `item` when `threads` threads deal items in a snake: 0, 1, ..., T-1,
// T-1, ..., 1, 0, 0, 1, ... Under a causal mask the work per key tile falls linearly along the
// item list, and the snake evens it out; it is a fixed rule, so sums stay deterministic.
int owner(int64_t item, int threads) {
  const int64_t round = item / threads;
  const int64_t place = item % threads;
  return static_cast<int>(round % 2 == 0 ? place : threads - 1 - place);
}

}  // namespace

int64_t backward_workspace_bytes(const AttentionShape& shape, int threads) {
  const int64_t dq = shape.batch * shape.q_tokens * shape.heads * shape.head_dim;
  return (threads * Layout(shape.head_dim).total + cache_lines_of_floats((threads - 1) * dq)) *
         static_cast<int64_t>(sizeof(float));
}

void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv, unsigned skip) {
  const BackwardArgs& args = *in.args;
  const AttentionShape& shape = args.shape;
  const int64_t key_tiles = (shape.kv_tokens + kTileK - 1) / kTileK;
  const int64_t items = shape.batch * shape.kv_heads * key_tiles;
  if (items == 0) return;
  const Layout layout(shape.head_dim);
  const int threads = static_cast<int>(smaller(args.threads, items));
  const int64_t dq_floats = shape.batch * shape.q_tokens * shape.heads * shape.head_dim;
  // Threads 1..T-1 each get a private dense dQ; thread 0 adds into dq itself.
  AlignedFloats private_dq((threads - 1) * dq_floats);
  int team = 1;

#pragma omp parallel num_threads(threads)
  {
    int thread = 0;
#ifdef _OPENMP
    thread = omp_get_thread_num();
#pragma omp single
    team = omp_get_num_threads();
#endif
    TokenView<float> my_dq = dq;
    if (thread > 0) {
      float* mine = private_dq.data() + (thread - 1) * dq_floats;
      zero(mine, dq_floats);
      my_dq = dense_tokens(mine, shape.q_tokens, shape.heads, shape.head_dim);
    }
    AlignedFloats workspace(layout.total);
    // Zeroed once so that the unused corners of the tiles (columns past a short key tile) hold
    // finite values; they are multiplied only into rows that are never written out.
    zero(workspace.data(), layout.total);
    for (int64_t item = 0; item < items; ++item) {
      if (owner(item, team) != thread) continue;
      const int64_t t = item % key_tiles;
      const int64_t kv_head = (item / key_tiles) % shape.kv_heads;
      const int64_t batch = item / (key_tiles * shape.kv_heads);
      const Tile keys = make_tile(args.kv_positions, shape.kv_tokens, t * kTileK, kTileK);
      KeyTile(in, layout, workspace.data(), my_dq, batch, kv_head, keys, skip).run(dk, dv);
    }
  }

  if (team == 1) return;
  // dq += the private buffers, in thread order, each row by one thread.
  const int64_t rows = shape.batch * shape.q_tokens * shape.heads;
  const int64_t dim = shape.head_dim;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t head = row % shape.heads;
    const int64_t token = (row / shape.heads) % shape.q_tokens;
    const int64_t batch = row / (shape.heads * shape.q_tokens);
    float* out = dq.at(batch, token, head);
    for (int t = 1; t < team; ++t) {
      const float* mine = private_dq.data() + (t - 1) * dq_floats + row * dim;
      for (int64_t d = 0; d < dim; ++d)
        out[d] += mine[d];
    }
  }
}

}  // namespace a2d::cpu::avx2
