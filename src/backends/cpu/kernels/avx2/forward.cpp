// The AVX2/FMA forward kernel (FlashAttention-2 order, fp32), built from register-blocked
// micro-kernels (simd.hpp). Scores live transposed, so that every vector of the softmax runs over
// 24 query rows:
//
//   work item   (batch, head, query tile of up to 64 panels x 24 rows: as many as keep its Qt
//               and O within kQueryTileBytes, and few enough to give every thread ~4 items)
//   Qt panel    [head_dim][24]      scale * Q, transposed once per item, zero rows as padding
//   key tile    kTileK = 256 keys, copied once per (item, key tile) into contiguous K [256][D]
//               and V [256][Dp] tiles (Dp = D rounded up to 16, zero columns as padding)
//   St          [256][24]           St = K Qt: 4 keys (broadcast from K rows) x 24 queries
//                                   (3 vectors) per micro-kernel call, depth D
//   softmax     column-wise over St: the max, exp and sum of 24 queries are 3 vectors each, no
//               horizontal reductions; P overwrites St
//   O panel     [24][Dp]            O = alpha O + P^T V: 6 queries (broadcast from P) x 16 dims
//                                   (2 vectors of a V row) per call, depth = keys; the rescale by
//                                   alpha rides on the load of O
//
// Why the copies: K and V rows of one token lie head_count * D floats apart, for 8 heads of 128
// dims exactly 4 KiB, so the rows of a key tile all fall into the same few sets of the L1 and L2
// caches and evict each other (and every row sits on its own TLB page). Read from contiguous
// tiles, the two products run near the FMA peak (docs/performance.md).
//
// The running maximum is kept in log2 units (max2 = max * log2 e), so exp(s - max) =
// 2^(s log2 e - max2) is one FMA plus exp2_lanes, and alpha = 2^(max2_old - max2_new) is exactly 1
// when the maximum did not change. Under a mask, a key tile is classified against each panel and
// each block of 4 keys against the panel: hidden blocks at either end are not computed at all,
// hidden blocks inside get -inf, partial blocks get a per-element mask, full blocks no test.
//
// Element types: the copies into Qt and the K and V tiles are where 16-bit inputs become fp32
// (exactly; convert.hpp), chosen once per item or tile, so everything after them is the fp32
// kernel's arithmetic on the widened values. O is rounded to its DType once, at the store.
#include <cmath>
#include <cstdint>
#include <limits>

#include "convert.hpp"
#include "backends/cpu/kernels/paths.hpp"
#include "backends/cpu/kernels/tiles.hpp"
#include "simd.hpp"

namespace a2d::cpu::avx2 {
namespace {

constexpr int kPanel = static_cast<int>(kCpuForwardPanel);  // 24 query rows per panel
constexpr int kPanelVectors = kPanel / kLanes;
constexpr int64_t kMaxPanelsPerTile = 64;
// Bytes of Qt and O of one query tile (64 panels at D = 128). Every query tile copies every K and
// V tile it sees, and the copies are the kernel's main cost after the products (a row of K or V
// is one 4 KiB page at 8 heads of 128 dims: one TLB miss per row, see docs/performance.md), so
// query tiles are tall. Their state does not need to stay in L2: each panel's Qt and O (24 KiB
// at D = 128) are streamed in once per 256-key tile, against ~200 000 cycles of products.
constexpr int64_t kQueryTileBytes = 1536 << 10;
constexpr int64_t kTileK = kCpuForwardTileK;                    // 256 keys per key tile
constexpr int kKeyStep = static_cast<int>(kCpuForwardKeyStep);  // keys per S call; mask block
constexpr int kValueRows = 6;                                   // queries per P V micro-kernel call
constexpr int kValueVectors = 2;  // 16 head dims per P V micro-kernel call
constexpr int kValueColumns = kValueVectors * kLanes;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLog2eDouble = 1.44269504088896340736;

struct Bounds {
  int64_t min = 0;
  int64_t max = 0;
};

int64_t position(const int64_t* positions, int64_t index) {
  return positions ? positions[index] : index;
}

int64_t smaller(int64_t a, int64_t b) {
  return a < b ? a : b;
}
int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}

// Per-thread memory, in floats, one AlignedFloats slice each (cache-line aligned).
struct Layout {
  // Rows of the V tile and of O are row_stride = Dp + 16 floats apart: at Dp = 128, 512-byte
  // rows would fall into 8 of the 64 L1 sets.
  int64_t padded_dim, row_stride, tile_rows;
  int64_t q_panels, acc, max2, sum, scores, k_tile, v_tile, total;
  // tile_rows: query rows per work item, a multiple of kPanel (see rows_per_tile).
  Layout(int64_t dim, int64_t rows)
      : padded_dim(round_up(dim, kValueColumns)),
        row_stride(padded_dim + kValueColumns),
        tile_rows(rows) {
    const int64_t panels_per_tile = tile_rows / kPanel;
    int64_t offset = 0;
    auto take = [&](int64_t floats) {
      const int64_t at = offset;
      offset += cache_lines_of_floats(floats);
      return at;
    };
    q_panels = take(panels_per_tile * dim * kPanel);
    acc = take(panels_per_tile * kPanel * row_stride);
    max2 = take(tile_rows);
    sum = take(tile_rows);
    scores = take(kTileK * kPanel);
    k_tile = take(kTileK * dim);
    v_tile = take(kTileK * row_stride);
    total = offset;
  }
};

// Query rows per work item: as many as kQueryTileBytes of Qt and O allow (at most 64 panels),
// but no more than gives each of `threads` threads about 4 items to balance, and no more than
// the queries need.
int64_t rows_per_tile(const AttentionShape& shape, int threads) {
  const int64_t padded_dim = round_up(shape.head_dim, kValueColumns);
  const int64_t panel_bytes =
      kPanel * (shape.head_dim + padded_dim + kValueColumns) * static_cast<int64_t>(sizeof(float));
  int64_t panels = smaller(kMaxPanelsPerTile, kQueryTileBytes / panel_bytes);
  const int64_t heads = shape.batch * shape.heads;
  const int64_t tiles_per_head = (4 * static_cast<int64_t>(threads) + heads - 1) / heads;
  const int64_t rows_needed = (shape.q_tokens + tiles_per_head - 1) / tiles_per_head;
  panels = smaller(panels, (rows_needed + kPanel - 1) / kPanel);
  return (panels < 1 ? 1 : panels) * kPanel;
}

// Everything one call shares between its threads (read-only inside the parallel region).
struct Call {
  const ForwardArgs& args;
  const ForwardResult& result;
  const Bounds* key_blocks;  // [ceil(kv_tokens / kKeyStep)] min/max position of 4 keys
  const Bounds* key_tiles;   // [ceil(kv_tokens / kTileK)]
  Layout layout;
  unsigned skip;  // kSkip* flags of a timing experiment; 0 normally
};

// St rows of M keys: out[m][r] = sum_d k[m * k_stride + d] * panel[d * 24 + r], d < dim.
template <int M>
A2D_NOINLINE void score_rows(const float* k, int64_t k_stride, const float* panel, int64_t dim,
                             float* out) {
  Block<M, kPanelVectors> c;
  c.zero();
  multiply<M, kPanelVectors, true>(c, k, k_stride, panel, kPanel, dim);
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 3
    for (int n = 0; n < kPanelVectors; ++n)
      _mm256_store_ps(out + m * kPanel + n * kLanes, c.v[m][n]);
}

// Rows i0..i0+5 of an O panel, 16 dims: out[m][n] = alpha[m] out[m][n] + sum_j prob[j * 24 + m]
// v[j * v_stride + n], j < depth (prob: P as [key][24] from row i0; v: V tile from column d0).
A2D_NOINLINE void value_block(const float* prob, const float* v, int64_t v_stride, int64_t depth,
                              const float* alpha, float* out, int64_t out_stride) {
  Block<kValueRows, kValueVectors> c;
#pragma GCC unroll 6
  for (int m = 0; m < kValueRows; ++m) {
    const __m256 a = _mm256_broadcast_ss(alpha + m);
#pragma GCC unroll 2
    for (int n = 0; n < kValueVectors; ++n) {
      c.v[m][n] = _mm256_mul_ps(a, _mm256_load_ps(out + m * out_stride + n * kLanes));
    }
  }
  multiply<kValueRows, kValueVectors, false>(c, prob, kPanel, v, v_stride, depth);
#pragma GCC unroll 6
  for (int m = 0; m < kValueRows; ++m)
#pragma GCC unroll 2
    for (int n = 0; n < kValueVectors; ++n) {
      _mm256_store_ps(out + m * out_stride + n * kLanes, c.v[m][n]);
    }
}

// Runs `body.template operator()<M>()` for M = count in 1..4 (a compile-time block height).
template <typename Body>
void with_rows(int count, Body&& body) {
  switch (count) {
    case 4:
      body.template operator()<4>();
      break;
    case 3:
      body.template operator()<3>();
      break;
    case 2:
      body.template operator()<2>();
      break;
    default:
      body.template operator()<1>();
      break;
  }
}

// One work item: the state of up to layout.tile_rows query rows while it meets every key tile.
class QueryTile {
 public:
  QueryTile(const Call& call, float* workspace, int64_t batch, int64_t head, int64_t row_begin)
      : call_(call),
        args_(call.args),
        dim_(args_.shape.head_dim),
        batch_(batch),
        head_(head),
        kv_head_(args_.shape.kv_head_of(head)),
        row_begin_(row_begin),
        rows_(smaller(call.layout.tile_rows, args_.shape.q_tokens - row_begin)),
        panels_((rows_ + kPanel - 1) / kPanel),
        q_panels_(workspace + call.layout.q_panels),
        acc_(workspace + call.layout.acc),
        max2_(workspace + call.layout.max2),
        sum_(workspace + call.layout.sum),
        scores_(workspace + call.layout.scores),
        k_tile_(workspace + call.layout.k_tile),
        v_tile_(workspace + call.layout.v_tile),
        padded_dim_(call.layout.padded_dim),
        stride_(call.layout.row_stride),
        k_row_bytes_(dim_ * dtype_bytes(args_.k.dtype)),
        v_row_bytes_(dim_ * dtype_bytes(args_.v.dtype)) {}

  void run() {
    with_dtype(args_.q.dtype, [&]<DType kType>() { load_queries<kType>(); });
    load_state();
    for (int64_t t = 0; t * kTileK < args_.shape.kv_tokens; ++t) {
      // Every few key tiles the calling thread lets MPI progress (ForwardArgs::progress).
      if (args_.progress && t % 8 == 0 && is_calling_thread())
        args_.progress(args_.progress_context);
      attend_key_tile(t);
    }
    if (call_.result.partial) {
      store_state<DType::f32>();
    } else {
      with_dtype(call_.result.out.dtype, [&]<DType kType>() { store_state<kType>(); });
    }
  }

 private:
  int64_t panel_rows(int64_t p) const { return smaller(kPanel, rows_ - p * kPanel); }

  // Qt panels: q_panels_[p][d][r] = scale * Q[row_begin + 24 p + r][d], zero past the last row
  // (Q of element type kType, widened exactly before the product).
  template <DType kType>
  void load_queries() {
    for (int64_t p = 0; p < panels_; ++p) {
      float* panel = q_panels_ + p * dim_ * kPanel;
      Bounds bounds{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
      for (int64_t r = 0; r < kPanel; ++r) {
        if (r >= panel_rows(p)) {
          for (int64_t d = 0; d < dim_; ++d)
            panel[d * kPanel + r] = 0.0f;
          continue;
        }
        const int64_t row = row_begin_ + p * kPanel + r;
        const std::byte* q = args_.q.at(batch_, row, head_);
        for (int64_t d = 0; d < dim_; ++d)
          panel[d * kPanel + r] = args_.scale * widen1<kType>(q + d * kElementBytes<kType>);
        const int64_t pos = position(args_.q_positions, row);
        bounds.min = pos < bounds.min ? pos : bounds.min;
        bounds.max = pos > bounds.max ? pos : bounds.max;
      }
      panel_bounds_[p] = bounds;
      tile_bounds_.min = p == 0 || bounds.min < tile_bounds_.min ? bounds.min : tile_bounds_.min;
      tile_bounds_.max = p == 0 || bounds.max > tile_bounds_.max ? bounds.max : tile_bounds_.max;
    }
  }

  // Initial state: empty, or the caller's partial triple (converted to the log2 maximum).
  void load_state() {
    const ForwardResult& result = call_.result;
    for (int64_t p = 0; p < panels_; ++p) {
      for (int64_t r = 0; r < kPanel; ++r) {
        float* acc = acc_ + (p * kPanel + r) * stride_;
        float* max2 = max2_ + p * kPanel + r;
        float* sum = sum_ + p * kPanel + r;
        *max2 = kNegInf;
        *sum = 0.0f;
        const bool from_partial = result.accumulate && r < panel_rows(p);
        const int64_t row = row_begin_ + p * kPanel + r;
        const float row_max =
            from_partial ? result.partial->row_max.at(batch_, head_, row) : kNegInf;
        if (row_max == kNegInf) {
          for (int64_t d = 0; d < padded_dim_; ++d)
            acc[d] = 0.0f;
          continue;
        }
        // The triple holds exp(s - row_max); the kernel continues with 2^(s log2 e - max2), so
        // the loaded sums are rescaled by 2^(row_max log2 e - max2), exact up to rounding.
        *max2 = static_cast<float>(row_max * kLog2eDouble);
        const float factor = static_cast<float>(std::exp2(row_max * kLog2eDouble - *max2));
        *sum = factor * result.partial->row_sum.at(batch_, head_, row);
        const float* in = result.partial->acc.at(batch_, row, head_);
        for (int64_t d = 0; d < dim_; ++d)
          acc[d] = factor * in[d];
        for (int64_t d = dim_; d < padded_dim_; ++d)
          acc[d] = 0.0f;
      }
    }
  }

  // The final state: O (of element type kOut) and LSE, or the partial triple (kOut = f32).
  template <DType kOut>
  void store_state() const {
    const ForwardResult& result = call_.result;
    for (int64_t p = 0; p < panels_; ++p) {
      for (int64_t r = 0; r < panel_rows(p); ++r) {
        const float* acc = acc_ + (p * kPanel + r) * stride_;
        const int64_t row = row_begin_ + p * kPanel + r;
        const float max2 = max2_[p * kPanel + r];
        const float sum = sum_[p * kPanel + r];
        const bool empty = sum == 0.0f || max2 == kNegInf;
        if (!result.partial) {
          const float inverse = empty ? 0.0f : 1.0f / sum;
          if constexpr (kOut == DType::f32) {
            float* o = result.out.floats().at(batch_, row, head_);
            for (int64_t d = 0; d < dim_; ++d)
              o[d] = acc[d] * inverse;
          } else {
            narrow_row<kOut>(acc, inverse, result.out.at(batch_, row, head_), dim_);
          }
          result.lse.at(batch_, head_, row) =
              empty ? kNegInf
                    : static_cast<float>((max2 + std::log2(static_cast<double>(sum))) * kLn2);
          continue;
        }
        float* out = result.partial->acc.at(batch_, row, head_);
        if (empty) {
          result.partial->row_max.at(batch_, head_, row) = kNegInf;
          result.partial->row_sum.at(batch_, head_, row) = 0.0f;
          for (int64_t d = 0; d < dim_; ++d)
            out[d] = 0.0f;
          continue;
        }
        // Back to exp(s - row_max) with row_max in natural-log units.
        const float row_max = static_cast<float>(max2 * kLn2);
        const float factor = static_cast<float>(std::exp2(max2 - row_max * kLog2eDouble));
        result.partial->row_max.at(batch_, head_, row) = row_max;
        result.partial->row_sum.at(batch_, head_, row) = factor * sum;
        for (int64_t d = 0; d < dim_; ++d)
          out[d] = factor * acc[d];
      }
    }
  }

  void attend_key_tile(int64_t t) {
    const Bounds& keys = call_.key_tiles[t];
    const Mask& mask = args_.mask;
    if (classify_block(mask, tile_bounds_.min, tile_bounds_.max, keys.min, keys.max) ==
        BlockVisibility::hidden) {
      return;
    }
    const int64_t key_begin = t * kTileK;
    const int64_t cols = smaller(kTileK, args_.shape.kv_tokens - key_begin);
    if (!(call_.skip & kSkipCopies)) {
      with_dtype(args_.k.dtype, [&]<DType kKey>() {
        with_dtype(args_.v.dtype,
                   [&]<DType kValue>() { copy_keys_and_values<kKey, kValue>(key_begin, cols); });
      });
    }
    // While this tile is computed, the next tile's K and V rows are pulled towards the core, one
    // row per 4-key block of S (compute_scores), so that the next copy finds them in L2. Spread
    // out like this, the prefetches do not pile up in the core's queue of outstanding misses.
    prefetch_row_ = key_begin + kTileK;
    prefetch_end_ = smaller(prefetch_row_ + kTileK, args_.shape.kv_tokens);
    for (int64_t p = 0; p < panels_; ++p) {
      const Bounds& rows = panel_bounds_[p];
      const BlockVisibility visibility =
          classify_block(mask, rows.min, rows.max, keys.min, keys.max);
      if (visibility == BlockVisibility::hidden) continue;
      attend_panel(p, key_begin, cols, visibility);
    }
    while (prefetch_row_ < prefetch_end_)
      prefetch_next_row();
  }

  // Prefetches the next pending K and V row into the L2 cache, if any is left.
  void prefetch_next_row() {
    if (prefetch_row_ >= prefetch_end_) return;
    const char* k = reinterpret_cast<const char*>(args_.k.at(batch_, prefetch_row_, kv_head_));
    const char* v = reinterpret_cast<const char*>(args_.v.at(batch_, prefetch_row_, kv_head_));
    if (k_row_bytes_ == v_row_bytes_) {
      for (int64_t byte = 0; byte < k_row_bytes_; byte += 64) {
        _mm_prefetch(k + byte, _MM_HINT_T1);
        _mm_prefetch(v + byte, _MM_HINT_T1);
      }
    } else {
      for (int64_t byte = 0; byte < k_row_bytes_; byte += 64)
        _mm_prefetch(k + byte, _MM_HINT_T1);
      for (int64_t byte = 0; byte < v_row_bytes_; byte += 64)
        _mm_prefetch(v + byte, _MM_HINT_T1);
    }
    ++prefetch_row_;
  }

  // K rows to k_tile_[j][0, D), V rows to v_tile_[j][0, D), widened from their element types;
  // the padding columns of the V tile were zeroed with the workspace and are never written.
  template <DType kKey, DType kValue>
  void copy_keys_and_values(int64_t key_begin, int64_t cols) {
    for (int64_t j = 0; j < cols; ++j) {
      widen_row<kKey>(args_.k.at(batch_, key_begin + j, kv_head_), k_tile_ + j * dim_, dim_);
      widen_row<kValue>(args_.v.at(batch_, key_begin + j, kv_head_), v_tile_ + j * stride_, dim_);
    }
  }

  void attend_panel(int64_t p, int64_t key_begin, int64_t cols, BlockVisibility visibility) {
    const Bounds& rows = panel_bounds_[p];
    const Bounds* blocks = call_.key_blocks + key_begin / kKeyStep;
    const int64_t block_count = (cols + kKeyStep - 1) / kKeyStep;
    // Blocks of 4 keys this panel sees: [first, last), trimmed of hidden blocks at both ends.
    int64_t first = 0, last = block_count;
    if (visibility == BlockVisibility::partial) {
      auto hidden = [&](int64_t blk) {
        return classify_block(args_.mask, rows.min, rows.max, blocks[blk].min, blocks[blk].max) ==
               BlockVisibility::hidden;
      };
      while (first < last && hidden(first))
        ++first;
      while (last > first && hidden(last - 1))
        --last;
      if (first == last) return;
    }
    const int64_t key_first = first * kKeyStep;
    const int64_t key_last = smaller(last * kKeyStep, cols);
    const unsigned skip = call_.skip;
    if (!(skip & kSkipScores)) compute_scores(p, key_begin, first, last, cols, visibility);
    PanelScale scale;
    for (float& alpha : scale.alpha)
      alpha = 1.0f;
    if (!(skip & kSkipSoftmax)) {
      scale = skip & kSkipExp ? softmax<false>(p, key_first, key_last)
                              : softmax<true>(p, key_first, key_last);
    }
    if (!(skip & kSkipValues)) accumulate_values(p, key_first, key_last, scale);
  }

  // St[j][r] = sum_d K[key_begin + j][d] * Qt[d][r] for the blocks [first, last).
  void compute_scores(int64_t p, int64_t key_begin, int64_t first, int64_t last, int64_t cols,
                      BlockVisibility visibility) {
    const float* panel = q_panels_ + p * dim_ * kPanel;
    const Bounds& rows = panel_bounds_[p];
    const Bounds* blocks = call_.key_blocks + key_begin / kKeyStep;
    int64_t doc_first[kPanel], doc_last[kPanel];
    bool have_documents = false;
    for (int64_t blk = first; blk < last; ++blk) {
      prefetch_next_row();
      const int64_t j0 = blk * kKeyStep;
      const int keys = static_cast<int>(smaller(kKeyStep, cols - j0));
      float* out = scores_ + j0 * kPanel;
      const BlockVisibility block_visibility =
          visibility == BlockVisibility::full
              ? BlockVisibility::full
              : classify_block(args_.mask, rows.min, rows.max, blocks[blk].min, blocks[blk].max);
      if (block_visibility == BlockVisibility::hidden) {
        for (int64_t e = 0; e < keys * kPanel; ++e)
          out[e] = kNegInf;
        continue;
      }
      const float* k = k_tile_ + j0 * dim_;
      with_rows(keys, [&]<int M>() { score_rows<M>(k, dim_, panel, dim_, out); });
      if (args_.softcap != 0.0f) {
        const __m256 cap = _mm256_set1_ps(args_.softcap);
        const __m256 inverse = _mm256_set1_ps(1.0f / args_.softcap);
        for (int e = 0; e < keys * kPanel; e += kLanes)
          _mm256_store_ps(out + e, softcap_lanes(_mm256_load_ps(out + e), cap, inverse));
      }
      if (block_visibility == BlockVisibility::partial && !args_.mask.has_documents()) {
        for (int m = 0; m < keys; ++m) {
          const int64_t key_pos = position(args_.kv_positions, key_begin + j0 + m);
          for (int64_t r = 0; r < panel_rows(p); ++r) {
            const int64_t query_pos = position(args_.q_positions, row_begin_ + p * kPanel + r);
            if (!args_.mask.visible(query_pos, key_pos)) out[m * kPanel + r] = kNegInf;
          }
        }
      } else if (block_visibility == BlockVisibility::partial) {
        // Documents: each row's document [first, last] is looked up once per key tile, not per
        // pair.
        if (!have_documents) {
          for (int64_t r = 0; r < panel_rows(p); ++r) {
            const int64_t query_pos = position(args_.q_positions, row_begin_ + p * kPanel + r);
            doc_first[r] = args_.mask.document_first(query_pos);
            doc_last[r] = args_.mask.document_last(query_pos);
          }
          have_documents = true;
        }
        for (int m = 0; m < keys; ++m) {
          const int64_t key_pos = position(args_.kv_positions, key_begin + j0 + m);
          for (int64_t r = 0; r < panel_rows(p); ++r) {
            const int64_t query_pos = position(args_.q_positions, row_begin_ + p * kPanel + r);
            if (key_pos < doc_first[r] || key_pos > doc_last[r] ||
                !args_.mask.visible_by_position(query_pos, key_pos)) {
              out[m * kPanel + r] = kNegInf;
            }
          }
        }
      }
    }
  }

  struct PanelScale {
    alignas(32) float alpha[kPanel];  // 2^(max2_old - max2_new) per query
  };

  // Column-wise online softmax of St rows [key_first, key_last): raises the running maximum,
  // turns scores into P in place and adds them to the running sum. (kExp = false replaces the
  // exp by the identity, for timing experiments only.)
  template <bool kExp>
  PanelScale softmax(int64_t p, int64_t key_first, int64_t key_last) {
    const __m256 negative_infinity = _mm256_set1_ps(kNegInf);
    __m256 column_max[kPanelVectors];
    for (int n = 0; n < kPanelVectors; ++n)
      column_max[n] = negative_infinity;
    for (int64_t j = key_first; j < key_last; ++j) {
      const float* s = scores_ + j * kPanel;
      for (int n = 0; n < kPanelVectors; ++n)
        column_max[n] = _mm256_max_ps(column_max[n], _mm256_load_ps(s + n * kLanes));
    }
    PanelScale scale;
    __m256 offset[kPanelVectors], row_sum[kPanelVectors];
    float* max2 = max2_ + p * kPanel;
    for (int n = 0; n < kPanelVectors; ++n) {
      const __m256 old_max2 = _mm256_load_ps(max2 + n * kLanes);
      const __m256 new_max2 =
          _mm256_max_ps(old_max2, _mm256_mul_ps(column_max[n], _mm256_set1_ps(kLog2e)));
      _mm256_store_ps(max2 + n * kLanes, new_max2);
      // A query that has still seen no key keeps max2 = -inf; it exponentiates against 0
      // instead, which gives P = 0 and alpha = 0 rather than exp(-inf + inf) = NaN.
      const __m256 empty = _mm256_cmp_ps(new_max2, negative_infinity, _CMP_EQ_OQ);
      offset[n] = _mm256_blendv_ps(new_max2, _mm256_setzero_ps(), empty);
      _mm256_store_ps(scale.alpha + n * kLanes, exp2_lanes(_mm256_sub_ps(old_max2, offset[n])));
      row_sum[n] = _mm256_setzero_ps();
    }
    for (int64_t j = key_first; j < key_last; ++j) {
      float* s = scores_ + j * kPanel;
      for (int n = 0; n < kPanelVectors; ++n) {
        const __m256 score = _mm256_load_ps(s + n * kLanes);
        const __m256 prob = kExp ? exp_shifted(score, offset[n]) : score;
        _mm256_store_ps(s + n * kLanes, prob);
        row_sum[n] = _mm256_add_ps(row_sum[n], prob);
      }
    }
    float* sum = sum_ + p * kPanel;
    for (int n = 0; n < kPanelVectors; ++n) {
      const __m256 old_sum = _mm256_load_ps(sum + n * kLanes);
      const __m256 alpha = _mm256_load_ps(scale.alpha + n * kLanes);
      _mm256_store_ps(sum + n * kLanes, _mm256_fmadd_ps(alpha, old_sum, row_sum[n]));
    }
    return scale;
  }

  // O[r][d] = alpha[r] O[r][d] + sum_j P[j][r] V[j][d] over keys [key_first, key_last), for
  // the panel's rows in blocks of 6 (the padding rows of a short last panel are skipped).
  void accumulate_values(int64_t p, int64_t key_first, int64_t key_last, const PanelScale& scale) {
    float* acc = acc_ + p * kPanel * stride_;
    const float* prob = scores_ + key_first * kPanel;
    const float* v = v_tile_ + key_first * stride_;
    const int64_t depth = key_last - key_first;
    // Dims outer: the 16 columns of the V tile a block reads stay in L1 across the panel's rows.
    for (int64_t d0 = 0; d0 < padded_dim_; d0 += kValueColumns) {
      for (int64_t i0 = 0; i0 < panel_rows(p); i0 += kValueRows) {
        value_block(prob + i0, v + d0, stride_, depth, scale.alpha + i0, acc + i0 * stride_ + d0,
                    stride_);
      }
    }
  }

  const Call& call_;
  const ForwardArgs& args_;
  const int64_t dim_, batch_, head_, kv_head_, row_begin_, rows_, panels_;
  float* const q_panels_;
  float* const acc_;
  float* const max2_;
  float* const sum_;
  float* const scores_;
  float* const k_tile_;
  float* const v_tile_;
  const int64_t padded_dim_, stride_;
  const int64_t k_row_bytes_, v_row_bytes_;  // bytes of one K and one V row (prefetches)
  Bounds panel_bounds_[kMaxPanelsPerTile];
  int64_t prefetch_row_ = 0;  // next K/V row to prefetch, and the end of the rows to prefetch
  int64_t prefetch_end_ = 0;
  Bounds tile_bounds_;
};

// min/max position of every run of `block` keys.
void fill_bounds(const int64_t* positions, int64_t count, int64_t block, Bounds* out) {
  for (int64_t begin = 0, b = 0; begin < count; begin += block, ++b) {
    const int64_t end = smaller(count, begin + block);
    Bounds bounds{position(positions, begin), position(positions, begin)};
    for (int64_t i = begin + 1; i < end; ++i) {
      const int64_t pos = position(positions, i);
      bounds.min = pos < bounds.min ? pos : bounds.min;
      bounds.max = pos > bounds.max ? pos : bounds.max;
    }
    out[b] = bounds;
  }
}

int64_t bounds_floats(int64_t count, int64_t block) {
  return (count + block - 1) / block * static_cast<int64_t>(sizeof(Bounds) / sizeof(float));
}

}  // namespace

int64_t forward_workspace_bytes(const AttentionShape& shape, int threads) {
  const int64_t floats = threads * Layout(shape.head_dim, rows_per_tile(shape, threads)).total +
                         cache_lines_of_floats(bounds_floats(shape.kv_tokens, kKeyStep)) +
                         cache_lines_of_floats(bounds_floats(shape.kv_tokens, kTileK));
  return floats * static_cast<int64_t>(sizeof(float));
}

void forward(const ForwardArgs& args, const ForwardResult& result, unsigned skip) {
  const AttentionShape& shape = args.shape;
  const Layout layout(shape.head_dim, rows_per_tile(shape, args.threads));
  const int64_t q_tiles = (shape.q_tokens + layout.tile_rows - 1) / layout.tile_rows;
  const int64_t items = shape.batch * shape.heads * q_tiles;
  if (items == 0) return;

  // Key bounds of every 4-key block and every key tile, shared by all threads.
  const int64_t block_floats = cache_lines_of_floats(bounds_floats(shape.kv_tokens, kKeyStep));
  AlignedFloats tables(block_floats + bounds_floats(shape.kv_tokens, kTileK));
  Bounds* key_blocks = reinterpret_cast<Bounds*>(tables.data());
  Bounds* key_tiles = reinterpret_cast<Bounds*>(tables.data() + block_floats);
  fill_bounds(args.kv_positions, shape.kv_tokens, kKeyStep, key_blocks);
  fill_bounds(args.kv_positions, shape.kv_tokens, kTileK, key_tiles);
  const Call call{args, result, key_blocks, key_tiles, layout, skip};
  const int threads = static_cast<int>(smaller(args.threads, items));

#pragma omp parallel num_threads(threads)
  {
    AlignedFloats workspace(call.layout.total);
    // Zeroed once: the padding columns of the V tile and of O must hold zeros (finite values).
    for (int64_t i = 0; i < call.layout.total; ++i)
      workspace.data()[i] = 0.0f;
      // Items are independent (each writes only its own rows), so a dynamic schedule keeps the
      // results deterministic. Items run head by head, so the K and V of one head stay in the
      // cache while all its query tiles pass over them; within a head the query tiles run last to
      // first: under a causal mask the late tiles carry the most keys, and ending with the
      // smallest ones balances the threads.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t tile = q_tiles - 1 - item % q_tiles;
      const int64_t head = (item / q_tiles) % shape.heads;
      const int64_t batch = item / (q_tiles * shape.heads);
      QueryTile(call, workspace.data(), batch, head, tile * layout.tile_rows).run();
    }
  }
}

}  // namespace a2d::cpu::avx2
