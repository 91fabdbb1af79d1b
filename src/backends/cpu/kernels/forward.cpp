// The portable tiled CPU forward kernel (FlashAttention-2 style online softmax, fp32 arithmetic;
// plain loops the compiler vectorises for the build's baseline ISA).
//
// Work item = (batch, head, query tile of kBlockQ rows). For each key tile the mask does not hide
// entirely: S = scale Q K^T, rescale the running state to the new row maximum, add P V. Tiles
// the mask leaves fully visible skip the per-element mask test. Memory: one tile of scores and
// one accumulator per thread, never q_tokens x kv_tokens.
//
// Element types: Q is converted (exactly) to fp32 as it is scaled into the query tile. fp32 K
// and V are read in place; 16-bit K and V rows of a key tile are converted once per (item, key
// tile) into per-thread fp32 rows, and the same loops run on those, so a 16-bit input gives the
// bits of the fp32 kernel on the widened values. O is rounded to its DType once, at the store.
#include <cmath>
#include <limits>
#include <vector>

#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "paths.hpp"
#include "tiles.hpp"

namespace a2d::cpu::portable {
namespace {

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Running online-softmax state of one query tile, dense [rows, head_dim].
struct TileState {
  std::vector<float> acc, row_max, row_sum;
  explicit TileState(int64_t head_dim)
      : acc(kBlockQ * head_dim), row_max(kBlockQ), row_sum(kBlockQ) {}
};

struct Workspace {
  std::vector<float> q;       // scale * Q tile, [kBlockQ, head_dim]
  std::vector<float> scores;  // [kBlockQ, kBlockK]
  std::vector<float> k, v;    // 16-bit K, V rows of one key tile in fp32, [kBlockK, head_dim]
  explicit Workspace(int64_t head_dim) : q(kBlockQ * head_dim), scores(kBlockQ * kBlockK) {}
};

// Rows of one key tile in fp32: row j at rows + j * stride.
struct KeyRows {
  const float* rows;
  int64_t stride;
};

// K or V rows [kt.begin, kt.end) of K/V head kvh: in place for fp32, else converted into
// `scratch` (sized on first use).
KeyRows key_rows(InTokens x, int64_t b, int64_t kvh, const cpu::Tile& kt, int64_t dim,
                 std::vector<float>& scratch) {
  if (x.dtype == DType::f32) return {x.floats().at(b, kt.begin, kvh), x.token_stride};
  scratch.resize(static_cast<size_t>(kBlockK * dim));
  for (int64_t j = 0; j < kt.size(); ++j)
    load_row(x.at(b, kt.begin + j, kvh), x.dtype, dim, scratch.data() + j * dim);
  return {scratch.data(), dim};
}

// Folds one key tile into the state of one query tile.
void attend_key_tile(const ForwardArgs& args, const MaskView& mask, const cpu::Tile& qt,
                     const cpu::Tile& kt, BlockVisibility visibility, KeyRows keys, KeyRows values,
                     Workspace& ws, TileState& state) {
  const int64_t dim = args.shape.head_dim;
  const int64_t rows = qt.size();
  const int64_t cols = kt.size();
  float* scores = ws.scores.data();

  for (int64_t i = 0; i < rows; ++i) {
    const float* q = ws.q.data() + i * dim;
    for (int64_t j = 0; j < cols; ++j) {
      const float* k = keys.rows + j * keys.stride;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < dim; ++d)
        sum += q[d] * k[d];
      scores[i * kBlockK + j] = sum;
    }
  }
  if (args.softcap != 0.0f) {
    const float cap = args.softcap, inverse = 1.0f / args.softcap;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        scores[i * kBlockK + j] = cap * std::tanh(scores[i * kBlockK + j] * inverse);
  }
  if (visibility == BlockVisibility::partial) {
    for (int64_t i = 0; i < rows; ++i) {
      const MaskRow row = mask.row(cpu::position_of(args.q_positions, qt.begin + i));
      for (int64_t j = 0; j < cols; ++j) {
        if (!row.visible(cpu::position_of(args.kv_positions, kt.begin + j))) {
          scores[i * kBlockK + j] = kNegInf;
        }
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* s = scores + i * kBlockK;
    float tile_max = kNegInf;
    for (int64_t j = 0; j < cols; ++j)
      tile_max = max_keep_nan(tile_max, s[j]);
    const float old_max = state.row_max[i];
    const float new_max = max_keep_nan(old_max, tile_max);
    if (new_max == kNegInf) continue;  // the row has still seen no key
    // exp(-inf - finite) = 0: a row that had seen nothing keeps nothing.
    const float rescale = std::exp(old_max - new_max);
    float sum = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      s[j] = std::exp(s[j] - new_max);
      sum += s[j];
    }
    state.row_max[i] = new_max;
    state.row_sum[i] = state.row_sum[i] * rescale + sum;
    float* acc = state.acc.data() + i * dim;
    if (rescale != 1.0f) {
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d)
        acc[d] *= rescale;
    }
    for (int64_t j = 0; j < cols; ++j) {
      const float p = s[j];
      if (p == 0.0f) continue;
      const float* v = values.rows + j * values.stride;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d)
        acc[d] += p * v[d];
    }
  }
}

// Runs every (batch, head, query tile); `begin` loads the initial state of a tile and `finish`
// stores the final one.
template <typename Begin, typename Finish>
void run_forward(const ForwardArgs& args, Begin begin, Finish finish) {
  const AttentionShape& shape = args.shape;
  const auto q_tiles = cpu::make_tiles(args.q_positions, shape.q_tokens, kBlockQ);
  const auto k_tiles = cpu::make_tiles(args.kv_positions, shape.kv_tokens, kBlockK);
  const int64_t items = shape.batch * shape.heads * static_cast<int64_t>(q_tiles.size());
  const int64_t dim = shape.head_dim;
  const MaskView mask = args.mask.view();

#pragma omp parallel num_threads(args.threads)
  {
    Workspace ws(dim);
    TileState state(dim);
    // Round-robin static schedule: balanced under causal masks and deterministic.
#pragma omp for schedule(static, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item % static_cast<int64_t>(q_tiles.size());
      const int64_t h = (item / static_cast<int64_t>(q_tiles.size())) % shape.heads;
      const int64_t b = item / (static_cast<int64_t>(q_tiles.size()) * shape.heads);
      const cpu::Tile& qt = q_tiles[t];
      if (args.progress && cpu::is_calling_thread()) args.progress(args.progress_context);
      begin(b, h, qt, state);
      for (int64_t i = 0; i < qt.size(); ++i) {
        if (args.q.dtype != DType::f32) {
          load_row(args.q.at(b, qt.begin + i, h), args.q.dtype, dim, &ws.q[i * dim], args.scale);
          continue;
        }
        const float* q = args.q.floats().at(b, qt.begin + i, h);
        for (int64_t d = 0; d < dim; ++d)
          ws.q[i * dim + d] = args.scale * q[d];
      }
      const int64_t kvh = shape.kv_head_of(h);
      for (const cpu::Tile& kt : k_tiles) {
        const BlockVisibility visibility = cpu::classify(mask, qt, kt);
        if (visibility == BlockVisibility::hidden) continue;
        const KeyRows keys = key_rows(args.k, b, kvh, kt, dim, ws.k);
        const KeyRows values = key_rows(args.v, b, kvh, kt, dim, ws.v);
        attend_key_tile(args, mask, qt, kt, visibility, keys, values, ws, state);
        if (args.work_done)
          args.work_done->fetch_add(qt.size() * kt.size(), std::memory_order_relaxed);
      }
      finish(b, h, qt, state);
    }
  }
}

void reset(TileState& state) {
  std::fill(state.acc.begin(), state.acc.end(), 0.0f);
  std::fill(state.row_max.begin(), state.row_max.end(), kNegInf);
  std::fill(state.row_sum.begin(), state.row_sum.end(), 0.0f);
}

}  // namespace

int64_t forward_workspace_bytes(const AttentionShape& shape, int threads) {
  const int64_t per_thread = (2 * kBlockQ * shape.head_dim + kBlockQ * kBlockK + 2 * kBlockQ) *
                             static_cast<int64_t>(sizeof(float));
  const int64_t tiles =
      (shape.q_tokens + kBlockQ - 1) / kBlockQ + (shape.kv_tokens + kBlockK - 1) / kBlockK;
  return threads * per_thread + tiles * static_cast<int64_t>(sizeof(cpu::Tile));
}

void forward(const ForwardArgs& args, const ForwardResult& result) {
  const int64_t dim = args.shape.head_dim;
  if (!result.partial) {
    const OutTokens out = result.out;
    const RowView<float> lse = result.lse;
    run_forward(
        args, [](int64_t, int64_t, const cpu::Tile&, TileState& state) { reset(state); },
        [&](int64_t b, int64_t h, const cpu::Tile& qt, TileState& state) {
          for (int64_t i = 0; i < qt.size(); ++i) {
            float* acc = state.acc.data() + i * dim;
            const float sum = state.row_sum[i];
            lse.at(b, h, qt.begin + i) = sum == 0.0f ? kNegInf : state.row_max[i] + std::log(sum);
            const float inverse = sum == 0.0f ? 0.0f : 1.0f / sum;
            if (out.dtype != DType::f32) {
              // O in fp32 in place of the accumulator (reset before the next item), then
              // rounded once into the output's DType.
              for (int64_t d = 0; d < dim; ++d)
                acc[d] = sum == 0.0f ? 0.0f : acc[d] * inverse;
              store_row(acc, dim, out.at(b, qt.begin + i, h), out.dtype);
              continue;
            }
            float* o = out.floats().at(b, qt.begin + i, h);
            if (sum == 0.0f) {
              for (int64_t d = 0; d < dim; ++d)
                o[d] = 0.0f;
              continue;
            }
            for (int64_t d = 0; d < dim; ++d)
              o[d] = acc[d] * inverse;
          }
        });
    return;
  }
  const PartialView& partial = *result.partial;
  const bool accumulate = result.accumulate;
  run_forward(
      args,
      [&](int64_t b, int64_t h, const cpu::Tile& qt, TileState& state) {
        if (!accumulate) return reset(state);
        for (int64_t i = 0; i < qt.size(); ++i) {
          const int64_t row = qt.begin + i;
          state.row_max[i] = partial.row_max.at(b, h, row);
          state.row_sum[i] = partial.row_sum.at(b, h, row);
          const float* acc = partial.acc.at(b, row, h);
          for (int64_t d = 0; d < dim; ++d)
            state.acc[i * dim + d] = acc[d];
        }
      },
      [&](int64_t b, int64_t h, const cpu::Tile& qt, TileState& state) {
        for (int64_t i = 0; i < qt.size(); ++i) {
          const int64_t row = qt.begin + i;
          partial.row_max.at(b, h, row) = state.row_max[i];
          partial.row_sum.at(b, h, row) = state.row_sum[i];
          float* acc = partial.acc.at(b, row, h);
          for (int64_t d = 0; d < dim; ++d)
            acc[d] = state.acc[i * dim + d];
        }
      });
}

}  // namespace a2d::cpu::portable
