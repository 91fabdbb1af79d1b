// The AMX forward kernel (Intel Sapphire Rapids and later: AMX-TILE, AMX-BF16): both products of
// FlashAttention-2 on bf16 tiles with fp32 sums, the online softmax on AVX-512 vectors between
// them. It runs when Q, K and V are all bf16 on the amx kernel path (dispatch.cpp); every other
// input takes the AVX-512 kernel.
//
//   tiles       eight tile registers of 16 rows x 64 bytes: four fp32 C tiles (16 x 16), two A
//               tiles (16 rows x 32 bf16) and two B tiles (16 pairs of rows x 16 columns x 2 bf16,
//               the "VNNI" layout TDPBF16PS reads), configured once per thread
//   K/V heads   one K/V head at a time is packed into B tiles (pack_head): K as [16-key tile]
//               [32-dim chunk][1 KiB], V as [32-key chunk][16-dim tile][1 KiB], zeros past the
//               last key and dim. The query heads that share it (GQA) then run over it.
//   work item   (query head, 32 query rows: two A tiles of Q, zero rows as padding)
//   key block   256 keys = 8 chunks of 32. Per chunk, S = Q K^T as 2 x 2 C tiles (depth = the
//               head dim in steps of 32), stored to S[32][256] (softcapped there, if asked), then
//               the mask: chunks it hides entirely are trimmed at both ends of the block or set
//               to -inf inside it, partial chunks get a per-element test
//   softmax     row-wise over the block: max, then for 16 rows at once the new maxima and alpha =
//               2^(max2_old - max2_new), then P = 2^(s scale log2 e - max2) in fp32 (one FMA
//               before the exp), summed in fp32 and rounded once to bf16 (P[32][256])
//   O           fp32 [32][Dp] in memory (Dp = head dim rounded up to 32): rows rescaled by alpha
//               where it is not 1, then O += P V as 2 x 2 C tiles loaded from O and stored back,
//               depth = the block's keys
//
// Numerics: the products of bf16 values are exact in fp32 and summed in fp32, so S, the softmax
// statistics and LSE are those of the fp32 kernels within fp32 rounding; P is rounded to bf16
// before P V, as on the GPU's tensor cores (check.hpp: kTensorCoreBf16OutputBound), so O moves by
// at most one more bf16 rounding. TDPBF16PS treats bf16 subnormal inputs as zero and flushes
// subnormal results: only values below 1.2e-38 are affected.
//
// Include order: the AVX-512 vector layer (exp2, softcap, conversions) is reused as it is.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/avx512/convert.hpp"
#include "backends/cpu/kernels/avx512/simd.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "backends/cpu/kernels/paths.hpp"
#include "backends/cpu/kernels/tiles.hpp"
#include "tiles.hpp"

namespace a2d::cpu::amx {
namespace {

using avx512::kLanes;
using avx512::softcap_lanes;
using avx512::Vec;
using avx512::vload;
using avx512::vmax;
using avx512::vset;
using avx512::vstore;

constexpr int kQueryRows = 2 * kTileRows;      // query rows per work item (two A tiles)
constexpr int kChunk = 32;                     // keys per chunk: the bf16 depth of one A tile
constexpr int kBlockChunks = 8;                // chunks per softmax block
constexpr int kBlockKeys = kBlockChunks * kChunk;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLog2eDouble = 1.44269504088896340736;
constexpr float kLog2e = 1.44269504088896340736f;


// What one call shares between its threads.
struct Call {
  const ForwardArgs& args;
  const ForwardResult& result;
  MaskView mask;
  int64_t dim, padded_dim, dim_chunks, dim_tiles;  // Dp = padded_dim = 32 dim_chunks = 16 dim_tiles
  int64_t chunks;                                  // 32-key chunks of the keys
  const Bounds* chunk_bounds;                      // [chunks] min/max key position
  uint16_t* packed_k;                              // one K/V head: [chunks * 2][dim_chunks][512]
  uint16_t* packed_v;                              //               [chunks][dim_tiles][512]
};

// Packs chunks [first, last) of K/V head (batch, kv_head) into the B-tile layouts (see the top).
// Each key row is first copied into `rows` (Dp bf16, zeros past the head dim), then packed
// (tiles.hpp).
void pack_chunks(const Call& call, int64_t batch, int64_t kv_head, int64_t first, int64_t last,
                 uint16_t* rows) {
  const ForwardArgs& args = call.args;
  const int64_t kv_tokens = args.shape.kv_tokens;
  const int64_t dp = call.padded_dim;
  for (int64_t c = first; c < last; ++c) {
    // rows: K [32][Dp] then V [32][Dp], zero past the last key and the head dim.
    std::memset(rows, 0, sizeof(uint16_t) * 2 * kChunk * dp);
    for (int64_t j = 0; j < kChunk && c * kChunk + j < kv_tokens; ++j) {
      std::memcpy(rows + j * dp, args.k.at(batch, c * kChunk + j, kv_head),
                  sizeof(uint16_t) * call.dim);
      std::memcpy(rows + (kChunk + j) * dp, args.v.at(batch, c * kChunk + j, kv_head),
                  sizeof(uint16_t) * call.dim);
    }
    uint16_t* k_out = call.packed_k + c * 2 * call.dim_chunks * kTileElements;
    pack_pairs_of_dims(rows, dp, k_out);
    pack_pairs_of_dims(rows + kTileRows * dp, dp, k_out + call.dim_chunks * kTileElements);
    pack_pairs_of_rows(rows + kChunk * dp, dp, call.packed_v + c * call.dim_tiles * kTileElements);
  }
}

// One work item's memory (per thread, 64-byte aligned slices of one AlignedFloats).
struct Workspace {
  uint16_t* q;      // [32][Dp] bf16
  float* scores[2];  // [32][256] fp32 each: one block's softmax reads one while the next block's
                     // scores are computed into the other
  uint16_t* probs;  // [32][256] bf16
  float* acc;       // [32][Dp] fp32
  float* max2;      // [32] running maximum, log2 units
  float* sum;       // [32]
  float* alpha;     // [32]

  static int64_t floats(int64_t padded_dim) {
    return cache_lines_of_floats(kQueryRows * padded_dim / 2) +
           2 * cache_lines_of_floats(kQueryRows * kBlockKeys) +
           cache_lines_of_floats(kQueryRows * kBlockKeys / 2) +
           cache_lines_of_floats(kQueryRows * padded_dim) + 3 * cache_lines_of_floats(kQueryRows);
  }
  Workspace(float* base, int64_t padded_dim) {
    int64_t offset = 0;
    auto take = [&](int64_t count) {
      float* at = base + offset;
      offset += cache_lines_of_floats(count);
      return at;
    };
    q = reinterpret_cast<uint16_t*>(take(kQueryRows * padded_dim / 2));
    scores[0] = take(kQueryRows * kBlockKeys);
    scores[1] = take(kQueryRows * kBlockKeys);
    probs = reinterpret_cast<uint16_t*>(take(kQueryRows * kBlockKeys / 2));
    acc = take(kQueryRows * padded_dim);
    max2 = take(kQueryRows);
    sum = take(kQueryRows);
    alpha = take(kQueryRows);
  }
};

// 32 query rows of one head against every key of the packed K/V head.
class QueryBlock {
 public:
  QueryBlock(const Call& call, const Workspace& w, int64_t batch, int64_t head, int64_t row_begin)
      : call_(call),
        args_(call.args),
        w_(w),
        batch_(batch),
        head_(head),
        row_begin_(row_begin),
        rows_(smaller(kQueryRows, args_.shape.q_tokens - row_begin)) {}

  // Blocks of keys one after the other; while the softmax of one block runs on the vector units,
  // the tile unit computes the next block's scores (its instructions are issued between the
  // softmax's rows, see ScoreJob), then P V of the block follows.
  int64_t run() {
    load_queries();
    load_state();
    int64_t entries = 0, blocks = 0;
    KeyBlock current = next_block(0);
    if (!current.empty()) {
      ScoreJob first(*this, current, w_.scores[0]);
      first.drain();
      finish_scores(current, w_.scores[0]);
    }
    for (int buffer = 0; !current.empty(); buffer ^= 1, ++blocks) {
      if (args_.progress && blocks % 16 == 0 && is_calling_thread())
        args_.progress(args_.progress_context);
      const KeyBlock next = next_block(current.c1);
      ScoreJob job(*this, next, w_.scores[buffer ^ 1]);
      softmax(current, w_.scores[buffer], job);
      job.drain();
      accumulate_values(current);
      entries += rows_ * (smaller(current.last * kChunk, args_.shape.kv_tokens) -
                          current.first * kChunk);
      if (!next.empty()) finish_scores(next, w_.scores[buffer ^ 1]);
      current = next;
    }
    store_state();
    return entries;
  }

 private:
  // Chunks [c0, c1) of keys (at most 8), of which [first, last) are visible to some row of the
  // block: trimmed of the chunks the mask hides at both ends. Empty: no block left.
  struct KeyBlock {
    int64_t c0 = 0, c1 = 0, first = 0, last = 0;
    BlockVisibility visibility[kBlockChunks] = {};
    bool empty() const { return first == last; }
    int64_t column(int64_t c) const { return (c - c0) * kChunk; }
  };

  // The first block from chunk `from` on that this query block sees.
  KeyBlock next_block(int64_t from) const {
    const MaskView& mask = call_.mask;
    const int64_t kv_tokens = args_.shape.kv_tokens;
    for (int64_t c0 = from; c0 < call_.chunks; c0 += kBlockChunks) {
      KeyBlock b;
      b.c0 = c0;
      b.c1 = smaller(c0 + kBlockChunks, call_.chunks);
      for (int64_t c = b.c0; c < b.c1; ++c) {
        const Bounds& keys = call_.chunk_bounds[c];
        BlockVisibility v = mask.classify(bounds_.min, bounds_.max, keys.min, keys.max);
        // A chunk that runs past the last key is tested per element (its padding gets -inf).
        if (v == BlockVisibility::full && (c + 1) * kChunk > kv_tokens) v = BlockVisibility::partial;
        b.visibility[c - c0] = v;
      }
      b.first = b.c0;
      b.last = b.c1;
      while (b.first < b.last && b.visibility[b.first - c0] == BlockVisibility::hidden)
        ++b.first;
      while (b.last > b.first && b.visibility[b.last - 1 - c0] == BlockVisibility::hidden)
        --b.last;
      if (!b.empty()) return b;
    }
    return {};
  }

  // The tile instructions of one block's S = Q K^T, chunk by chunk: pump() stores the chunk issued
  // last time (its products are done by then) and issues the next; drain() finishes the block.
  // Chunks the mask hides are skipped (finish_scores fills them).
  class ScoreJob {
   public:
    ScoreJob(const QueryBlock& owner, const KeyBlock& block, float* scores)
        : owner_(owner), block_(block), scores_(scores), next_(block.first) {}
    ~ScoreJob() = default;
    ScoreJob(const ScoreJob&) = delete;
    ScoreJob& operator=(const ScoreJob&) = delete;

    void pump() {
      store_pending();
      while (next_ < block_.last &&
             block_.visibility[next_ - block_.c0] == BlockVisibility::hidden)
        ++next_;
      if (next_ >= block_.last) return;
      issue(next_);
      pending_ = next_++;
    }
    void drain() {
      while (next_ < block_.last || pending_ >= 0)
        pump();
    }

   private:
    void issue(int64_t c) const {
      const Call& call = owner_.call_;
      const int64_t dp = call.padded_dim;
      const uint16_t* k0 = call.packed_k + (2 * c) * call.dim_chunks * kTileElements;
      const uint16_t* k1 = k0 + call.dim_chunks * kTileElements;
      const uint16_t* q = owner_.w_.q;
      zero_c_block();
      for (int64_t dc = 0; dc < call.dim_chunks; ++dc)
        multiply_block(q + dc * 32, dp, k0 + dc * kTileElements, k1 + dc * kTileElements);
    }
    void store_pending() {
      if (pending_ < 0) return;
      store_c_block(scores_ + block_.column(pending_), kBlockKeys);
      pending_ = -1;
    }

    const QueryBlock& owner_;
    const KeyBlock& block_;
    float* const scores_;
    int64_t next_;
    int64_t pending_ = -1;
  };

  // After the products: hidden chunks to -inf, softcapping, the per-element mask.
  void finish_scores(const KeyBlock& block, float* scores) const {
    for (int64_t c = block.first; c < block.last; ++c) {
      float* s = scores + block.column(c);
      const BlockVisibility v = block.visibility[c - block.c0];
      if (v == BlockVisibility::hidden) {
        hide_chunk(s);
        continue;
      }
      if (args_.softcap != 0.0f) softcap_chunk(s);
      if (v == BlockVisibility::partial) mask_chunk(c, s);
    }
  }

  // Softcapped scores in log2 units: softcap tanh(s scale / softcap) log2 e (softmax() then takes
  // them as they are; without softcapping it scales the raw scores itself).
  void softcap_chunk(float* s) const {
    const Vec log2e = vset(kLog2e);
    const Vec scale = vset(args_.scale);
    const Vec cap = vset(args_.softcap), inverse = vset(1.0f / args_.softcap);
    for (int r = 0; r < kQueryRows; ++r) {
      float* row = s + r * kBlockKeys;
      for (int v = 0; v < kChunk; v += kLanes) {
        const Vec x = _mm512_mul_ps(vload(row + v), scale);
        vstore(row + v, _mm512_mul_ps(softcap_lanes(x, cap, inverse), log2e));
      }
    }
  }

  static void hide_chunk(float* s) {
    const Vec minus_infinity = vset(kNegInf);
    for (int r = 0; r < kQueryRows; ++r)
      for (int v = 0; v < kChunk; v += kLanes)
        vstore(s + r * kBlockKeys + v, minus_infinity);
  }

  // -inf where the mask hides the pair, and for keys past the last.
  void mask_chunk(int64_t c, float* s) const {
    const int64_t kv_tokens = args_.shape.kv_tokens;
    for (int64_t j = 0; j < kChunk; ++j) {
      const int64_t key = c * kChunk + j;
      if (key >= kv_tokens) {
        for (int r = 0; r < kQueryRows; ++r)
          s[r * kBlockKeys + j] = kNegInf;
        continue;
      }
      const int64_t key_pos = position(args_.kv_positions, key);
      for (int64_t r = 0; r < rows_; ++r) {
        if (!mask_rows_[r].visible(key_pos)) s[r * kBlockKeys + j] = kNegInf;
      }
    }
  }

  // Row-wise online softmax of one block's S: the new maxima, alpha, P in bf16 (columns
  // [first, last) of the block; P's columns start at 0). S holds raw scores (log2 units after
  // softcapping), which `factor` takes to log2 units; the maximum commutes with it (factor > 0),
  // so the maxima are taken on S as it is. Between rows it pumps `job`, the next block's scores.
  void softmax(const KeyBlock& block, const float* scores, ScoreJob& job) {
    const int64_t begin = block.column(block.first), end = block.column(block.last);
    const float factor = args_.softcap != 0.0f ? 1.0f : args_.scale * kLog2e;
    alignas(64) float block_max[kQueryRows];
    alignas(64) float offset[kQueryRows];
    alignas(64) float block_sum[kQueryRows];
    for (int r = 0; r < kQueryRows; ++r) {
      const float* s = scores + r * kBlockKeys;
      Vec column_max = vset(kNegInf);
      for (int64_t v = begin; v < end; v += kLanes)
        column_max = vmax(column_max, vload(s + v));
      block_max[r] = _mm512_reduce_max_ps(column_max);
    }
    // 16 rows at a time: the new maxima and alpha = 2^(max2_old - max2_new). A row that has still
    // seen no key exponentiates against 0 instead: P = 0 and alpha = 0.
    const Vec minus_infinity = vset(kNegInf);
    for (int g = 0; g < kQueryRows; g += kLanes) {
      const Vec old_max2 = vload(w_.max2 + g);
      const Vec new_max2 = vmax(old_max2, _mm512_mul_ps(vload(block_max + g), vset(factor)));
      const Vec shift = avx512::vselect_equal(new_max2, minus_infinity, avx512::vzero(), new_max2);
      vstore(w_.max2 + g, new_max2);
      vstore(offset + g, shift);
      vstore(w_.alpha + g, exp2_nonpositive(_mm512_sub_ps(old_max2, shift)));
    }
    const Vec scale = vset(factor);
    for (int r = 0; r < kQueryRows; ++r) {
      if (r % 4 == 0) job.pump();
      const float* s = scores + r * kBlockKeys;
      const Vec shift = vset(offset[r]);
      Vec total = _mm512_setzero_ps();
      uint16_t* p = w_.probs + r * kBlockKeys - begin;
      for (int64_t v = begin; v < end; v += 2 * kLanes) {
        const Vec low = exp2_nonpositive(_mm512_fmsub_ps(vload(s + v), scale, shift));
        const Vec high = exp2_nonpositive(_mm512_fmsub_ps(vload(s + v + kLanes), scale, shift));
        total = _mm512_add_ps(total, _mm512_add_ps(low, high));
        _mm512_store_si512(p + v, (__m512i)_mm512_cvtne2ps_pbh(high, low));
      }
      block_sum[r] = _mm512_reduce_add_ps(total);
    }
    for (int g = 0; g < kQueryRows; g += kLanes) {
      vstore(w_.sum + g, _mm512_fmadd_ps(vload(w_.alpha + g), vload(w_.sum + g),
                                         vload(block_sum + g)));
    }
  }

  // Q rows to the A layout (bf16 [32][Dp], zeros past the last row and dim); their positions'
  // bounds and, for the per-element mask, each row's visible keys.
  void load_queries() {
    const int64_t dp = call_.padded_dim;
    std::memset(w_.q, 0, sizeof(uint16_t) * kQueryRows * dp);
    bounds_ = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
    for (int64_t r = 0; r < rows_; ++r) {
      const std::byte* q = args_.q.at(batch_, row_begin_ + r, head_);
      std::memcpy(w_.q + r * dp, q, sizeof(uint16_t) * call_.dim);
      const int64_t pos = position(args_.q_positions, row_begin_ + r);
      bounds_.min = pos < bounds_.min ? pos : bounds_.min;
      bounds_.max = pos > bounds_.max ? pos : bounds_.max;
      mask_rows_[r] = call_.mask.row(pos);
    }
  }

  // The caller's partial triple, converted to the log2 maximum (as simd/forward.inc does).
  void load_state() {
    const ForwardResult& result = call_.result;
    const int64_t dp = call_.padded_dim;
    std::memset(w_.acc, 0, sizeof(float) * kQueryRows * dp);
    for (int64_t r = 0; r < kQueryRows; ++r) {
      w_.max2[r] = kNegInf;
      w_.sum[r] = 0.0f;
      if (!result.accumulate || r >= rows_) continue;
      const int64_t row = row_begin_ + r;
      const float row_max = result.partial->row_max.at(batch_, head_, row);
      if (row_max == kNegInf) continue;
      w_.max2[r] = static_cast<float>(row_max * kLog2eDouble);
      const float factor = static_cast<float>(std::exp2(row_max * kLog2eDouble - w_.max2[r]));
      w_.sum[r] = factor * result.partial->row_sum.at(batch_, head_, row);
      const float* in = result.partial->acc.at(batch_, row, head_);
      for (int64_t d = 0; d < call_.dim; ++d)
        w_.acc[r * dp + d] = factor * in[d];
    }
  }

  void store_state() const {
    const ForwardResult& result = call_.result;
    const int64_t dp = call_.padded_dim;
    for (int64_t r = 0; r < rows_; ++r) {
      const float* acc = w_.acc + r * dp;
      const int64_t row = row_begin_ + r;
      const float max2 = w_.max2[r];
      const float sum = w_.sum[r];
      const bool empty = sum == 0.0f || max2 == kNegInf;
      if (!result.partial) {
        const float inverse = empty ? 0.0f : 1.0f / sum;
        avx512::with_dtype(result.out.dtype, [&]<DType kOut>() {
          avx512::narrow_row<kOut>(acc, inverse, result.out.at(batch_, row, head_), call_.dim);
        });
        result.lse.at(batch_, head_, row) =
            empty ? kNegInf
                  : static_cast<float>((max2 + std::log2(static_cast<double>(sum))) * kLn2);
        continue;
      }
      float* out = result.partial->acc.at(batch_, row, head_);
      if (empty) {
        result.partial->row_max.at(batch_, head_, row) = kNegInf;
        result.partial->row_sum.at(batch_, head_, row) = 0.0f;
        for (int64_t d = 0; d < call_.dim; ++d)
          out[d] = 0.0f;
        continue;
      }
      const float row_max = static_cast<float>(max2 * kLn2);
      const float factor = static_cast<float>(std::exp2(max2 - row_max * kLog2eDouble));
      result.partial->row_max.at(batch_, head_, row) = row_max;
      result.partial->row_sum.at(batch_, head_, row) = factor * sum;
      for (int64_t d = 0; d < call_.dim; ++d)
        out[d] = factor * acc[d];
    }
  }

  // O = alpha O + P V over the block's chunks [first, last) (P from column 0 on).
  void accumulate_values(const KeyBlock& block) {
    const int64_t dp = call_.padded_dim;
    for (int r = 0; r < kQueryRows; ++r) {
      const float alpha = w_.alpha[r];
      if (alpha == 1.0f) continue;
      const Vec a = vset(alpha);
      float* acc = w_.acc + r * dp;
      for (int64_t d = 0; d < dp; d += kLanes)
        vstore(acc + d, _mm512_mul_ps(a, vload(acc + d)));
    }
    for (int64_t dt = 0; dt < call_.dim_tiles; dt += 2) {
      float* o = w_.acc + dt * kTileRows;
      load_c_block(o, dp);
      for (int64_t c = block.first; c < block.last; ++c) {
        const uint16_t* v = call_.packed_v + (c * call_.dim_tiles + dt) * kTileElements;
        multiply_block(w_.probs + (c - block.first) * kChunk, kBlockKeys, v, v + kTileElements);
      }
      store_c_block(o, dp);
    }
  }

  const Call& call_;
  const ForwardArgs& args_;
  const Workspace& w_;
  const int64_t batch_, head_, row_begin_, rows_;
  Bounds bounds_;
  MaskRow mask_rows_[kQueryRows];
};

int64_t packed_floats(int64_t kv_tokens, int64_t padded_dim) {
  // K and V: chunks x 32 keys x Dp bf16 each.
  return 2 * cache_lines_of_floats((kv_tokens + kChunk - 1) / kChunk * kChunk * padded_dim / 2);
}

}  // namespace

int64_t forward_workspace_bytes(const AttentionShape& shape, int threads) {
  const int64_t dp = round_up(shape.head_dim, 32);
  const int64_t chunks = (shape.kv_tokens + kChunk - 1) / kChunk;
  const int64_t floats = threads * (Workspace::floats(dp) + cache_lines_of_floats(kChunk * dp)) +
                         packed_floats(shape.kv_tokens, dp) +
                         cache_lines_of_floats(chunks * 4);
  return floats * static_cast<int64_t>(sizeof(float));
}

void forward(const ForwardArgs& args, const ForwardResult& result) {
  const AttentionShape& shape = args.shape;
  if (shape.q_tokens == 0 || shape.batch * shape.heads == 0) return;
  const int64_t dp = round_up(shape.head_dim, 32);
  const int64_t chunks = (shape.kv_tokens + kChunk - 1) / kChunk;
  const int64_t q_blocks = (shape.q_tokens + kQueryRows - 1) / kQueryRows;
  const int64_t group = shape.heads / shape.kv_heads;

  AlignedFloats shared(packed_floats(shape.kv_tokens, dp) + cache_lines_of_floats(chunks * 4));
  const int64_t half = packed_floats(shape.kv_tokens, dp) / 2;
  auto* chunk_bounds = reinterpret_cast<Bounds*>(shared.data() + 2 * half);
  for (int64_t c = 0; c < chunks; ++c) {
    chunk_bounds[c] =
        bounds_of(args.kv_positions, c * kChunk, smaller(shape.kv_tokens, (c + 1) * kChunk));
  }
  const Call call{args,
                  result,
                  args.mask.view(),
                  shape.head_dim,
                  dp,
                  dp / 32,
                  dp / 16,
                  chunks,
                  chunk_bounds,
                  reinterpret_cast<uint16_t*>(shared.data()),
                  reinterpret_cast<uint16_t*>(shared.data() + half)};
  const int64_t items = group * q_blocks;
  const int threads = static_cast<int>(smaller(args.threads, items));
  const int64_t pack_steps = smaller(chunks, int64_t{threads} * 8);

#pragma omp parallel num_threads(threads)
  {
    AlignedFloats memory(Workspace::floats(dp) + cache_lines_of_floats(kChunk * dp));
    const Workspace workspace(memory.data(), dp);
    auto* pack_rows = reinterpret_cast<uint16_t*>(memory.data() + Workspace::floats(dp));
    const TileScope tiles;
    // One K/V head at a time: packed by all threads, then the query heads that share it, item
    // by item (an item writes only its own rows, so the result does not depend on the threads).
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
        if (chunks > 0) {
#pragma omp for schedule(static)
          for (int64_t step = 0; step < pack_steps; ++step) {
            pack_chunks(call, b, kv_head, chunks * step / pack_steps,
                        chunks * (step + 1) / pack_steps, pack_rows);
          }
        }
        // Late query blocks first: under a causal mask they carry the most keys.
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; ++item) {
          const int64_t head = kv_head * group + item / q_blocks;
          const int64_t block = q_blocks - 1 - item % q_blocks;
          const int64_t entries =
              QueryBlock(call, workspace, b, head, block * kQueryRows).run();
          if (args.work_done) args.work_done->fetch_add(entries, std::memory_order_relaxed);
        }
      }
    }
  }
}

// The tile peak probe: four independent C tiles, each TDPBF16PS 16 x 16 x 32 products (2 flops
// each) on operands that stay in the tile registers. Returns a value that depends on the result.
float tile_chains(int64_t iterations) {
  alignas(64) uint16_t ones[kTileElements];
  for (uint16_t& x : ones)
    x = 0x3c00;  // bf16 2^-7: the sums stay exact and finite
  alignas(64) float out[kTileRows * kTileRows];
  const TileScope tiles;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  float sum = out[0];
  _tile_stored(3, out, 64);
  return sum + out[255];
}

}  // namespace a2d::cpu::amx
