// The portable tiled CPU forward kernel (FlashAttention-2 style online softmax, fp32 arithmetic;
// plain loops the compiler vectorises for the build's baseline ISA).
//
// Work item = (batch, head, query tile of kBlockQ rows). For each key tile the mask does not hide
// entirely: S = scale Q K^T, rescale the running state to the new row maximum, add P V. Tiles
// the mask leaves fully visible skip the per-element mask test. Memory: one tile of scores and
// one accumulator per thread, never q_tokens x kv_tokens.
#include <cmath>
#include <limits>
#include <vector>

#include "attention2d/kernel.hpp"
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
  explicit Workspace(int64_t head_dim) : q(kBlockQ * head_dim), scores(kBlockQ * kBlockK) {}
};

// Folds one key tile into the state of one query tile.
void attend_key_tile(const ForwardArgs& args, int64_t b, int64_t h, const cpu::Tile& qt,
                     const cpu::Tile& kt, BlockVisibility visibility, Workspace& ws,
                     TileState& state) {
  const int64_t dim = args.shape.head_dim;
  const int64_t kvh = args.shape.kv_head_of(h);
  const int64_t rows = qt.size();
  const int64_t cols = kt.size();
  float* scores = ws.scores.data();

  for (int64_t i = 0; i < rows; ++i) {
    const float* q = ws.q.data() + i * dim;
    for (int64_t j = 0; j < cols; ++j) {
      const float* k = args.k.at(b, kt.begin + j, kvh);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < dim; ++d)
        sum += q[d] * k[d];
      scores[i * kBlockK + j] = sum;
    }
  }
  if (visibility == BlockVisibility::partial) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t q_pos = cpu::position_of(args.q_positions, qt.begin + i);
      for (int64_t j = 0; j < cols; ++j) {
        if (!args.mask.visible(q_pos, cpu::position_of(args.kv_positions, kt.begin + j))) {
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
      const float* v = args.v.at(b, kt.begin + j, kvh);
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
        const float* q = args.q.at(b, qt.begin + i, h);
        for (int64_t d = 0; d < dim; ++d)
          ws.q[i * dim + d] = args.scale * q[d];
      }
      for (const cpu::Tile& kt : k_tiles) {
        const BlockVisibility visibility = cpu::classify(args.mask, qt, kt);
        if (visibility == BlockVisibility::hidden) continue;
        attend_key_tile(args, b, h, qt, kt, visibility, ws, state);
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
    const TokenView<float> out = result.out;
    const RowView<float> lse = result.lse;
    run_forward(
        args, [](int64_t, int64_t, const cpu::Tile&, TileState& state) { reset(state); },
        [&](int64_t b, int64_t h, const cpu::Tile& qt, TileState& state) {
          for (int64_t i = 0; i < qt.size(); ++i) {
            float* o = out.at(b, qt.begin + i, h);
            const float sum = state.row_sum[i];
            if (sum == 0.0f) {
              for (int64_t d = 0; d < dim; ++d)
                o[d] = 0.0f;
              lse.at(b, h, qt.begin + i) = kNegInf;
              continue;
            }
            const float inverse = 1.0f / sum;
            const float* acc = state.acc.data() + i * dim;
            for (int64_t d = 0; d < dim; ++d)
              o[d] = acc[d] * inverse;
            lse.at(b, h, qt.begin + i) = state.row_max[i] + std::log(sum);
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
