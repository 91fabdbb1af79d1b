// The portable tiled CPU backward kernel (FlashAttention-2 style, fp32 arithmetic; plain loops
// the compiler vectorises for the build's baseline ISA).
//
// Work item = (batch, K/V head, key tile). The item owns dK and dV of its key rows, summed over
// every query head of the K/V head's group and every visible query tile:
//   P  = exp(scale Q K^T - LSE)          (recomputed, masked entries 0)
//   dV += P^T dO
//   dP = dO V^T,  dS = P * (dP - delta)  (delta = rowsum(dO * O))
//   dK += scale dS^T Q,  dQ += scale dS K
// dQ rows receive contributions from every key tile, so with several threads each thread adds
// into its own dQ buffer and the buffers are summed at the end (in thread order: results are
// deterministic for a given thread count).
//
// Element types: fp32 Q, K, V and dO are read in place. 16-bit K and V rows of the item's key
// tile are converted to fp32 once per item, 16-bit Q and dO rows once per (query head, query
// tile) block, into per-thread rows, and the same loops run on those: a 16-bit input gives the
// bits of the fp32 kernel on the widened values. dQ, dK and dV are fp32.
#include <cmath>
#include <limits>
#include <vector>

#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "paths.hpp"
#include "tiles.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace a2d::cpu::portable {
namespace {

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Workspace {
  std::vector<float> dk, dv;   // [kBlockK, head_dim] accumulators of the item's key rows
  std::vector<float> prob;     // P,  [kBlockQ, kBlockK]
  std::vector<float> d_score;  // dS, [kBlockQ, kBlockK]
  // 16-bit inputs in fp32 (sized on first use): K, V rows of the key tile [kBlockK, head_dim],
  // Q, dO rows of the query tile [kBlockQ, head_dim].
  std::vector<float> k, v, q, d_out;
  explicit Workspace(int64_t head_dim)
      : dk(kBlockK * head_dim),
        dv(kBlockK * head_dim),
        prob(kBlockQ * kBlockK),
        d_score(kBlockQ * kBlockK) {}
};

// Rows [tile.begin, tile.end) of head `head` in fp32: row i at rows + i * stride.
struct Rows {
  const float* rows;
  int64_t stride;
  const float* at(int64_t i) const { return rows + i * stride; }
};

// In place for fp32, else converted into `scratch`.
Rows rows_of(InTokens x, int64_t b, int64_t head, const cpu::Tile& tile, int64_t block, int64_t dim,
             std::vector<float>& scratch) {
  if (x.dtype == DType::f32) return {x.floats().at(b, tile.begin, head), x.token_stride};
  scratch.resize(static_cast<size_t>(block * dim));
  for (int64_t i = 0; i < tile.size(); ++i)
    load_row(x.at(b, tile.begin + i, head), x.dtype, dim, scratch.data() + i * dim);
  return {scratch.data(), dim};
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < n; ++d)
    sum += a[d] * b[d];
  return sum;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d)
    y[d] += alpha * x[d];
}

// One (query tile, key tile) block of one query head.
void backward_block(const BackwardArgs& args, const MaskView& mask, RowView<const float> delta,
                    int64_t b, int64_t h, const cpu::Tile& qt, const cpu::Tile& kt,
                    BlockVisibility visibility, Rows keys, Rows values, TokenView<float> dq,
                    Workspace& ws) {
  const int64_t dim = args.shape.head_dim;
  const Rows queries = rows_of(args.q, b, h, qt, kBlockQ, dim, ws.q);
  const Rows d_out = rows_of(args.d_out, b, h, qt, kBlockQ, dim, ws.d_out);
  const int64_t rows = qt.size();
  const int64_t cols = kt.size();
  const float scale = args.scale;

  for (int64_t i = 0; i < rows; ++i) {
    const int64_t qi = qt.begin + i;
    const float lse = args.lse.at(b, h, qi);
    const float row_delta = delta.at(b, h, qi);
    const float* q = queries.at(i);
    const float* g = d_out.at(i);
    const MaskRow row = visibility == BlockVisibility::partial
                            ? mask.row(cpu::position_of(args.q_positions, qi))
                            : MaskRow{};
    float* p = ws.prob.data() + i * kBlockK;
    float* ds = ws.d_score.data() + i * kBlockK;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t kj = kt.begin + j;
      const bool visible = visibility == BlockVisibility::full ||
                           row.visible(cpu::position_of(args.kv_positions, kj));
      // A row with LSE = -inf saw no key at all: it has no probability mass anywhere.
      if (!visible || lse == kNegInf) {
        p[j] = ds[j] = 0.0f;
        continue;
      }
      const float score = scale * dot(q, keys.at(j), dim);
      if (args.softcap == 0.0f) {
        p[j] = std::exp(score - lse);
        ds[j] = p[j] * (dot(g, values.at(j), dim) - row_delta);
      } else {
        // s' = cap tanh(s / cap), ds'/ds = 1 - tanh^2.
        const float t = std::tanh(score / args.softcap);
        p[j] = std::exp(args.softcap * t - lse);
        ds[j] = p[j] * (dot(g, values.at(j), dim) - row_delta) * (1.0f - t * t);
      }
    }
    float* dq_row = dq.at(b, qi, h);
    for (int64_t j = 0; j < cols; ++j) {
      if (ds[j] != 0.0f) axpy(scale * ds[j], keys.at(j), dq_row, dim);
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    float* dk = ws.dk.data() + j * dim;
    float* dv = ws.dv.data() + j * dim;
    for (int64_t i = 0; i < rows; ++i) {
      const float p = ws.prob[i * kBlockK + j];
      if (p == 0.0f) continue;
      axpy(p, d_out.at(i), dv, dim);
      axpy(scale * ws.d_score[i * kBlockK + j], queries.at(i), dk, dim);
    }
  }
}

}  // namespace

int64_t backward_workspace_bytes(const AttentionShape& shape, int threads) {
  const int64_t tiles =
      (shape.q_tokens + kBlockQ - 1) / kBlockQ + (shape.kv_tokens + kBlockK - 1) / kBlockK;
  const int64_t per_thread = 2 * kBlockK * shape.head_dim + 2 * kBlockQ * kBlockK;
  const int64_t dq = shape.batch * shape.q_tokens * shape.heads * shape.head_dim;
  return (threads * per_thread + (threads - 1) * dq) * static_cast<int64_t>(sizeof(float)) +
         tiles * static_cast<int64_t>(sizeof(cpu::Tile));
}

void backward(const BackwardInputs& in, TokenView<float> dq, TokenView<float> dk,
              TokenView<float> dv) {
  const BackwardArgs& args = *in.args;
  const RowView<const float> delta = in.delta;
  const AttentionShape& shape = args.shape;
  const int64_t dim = shape.head_dim;

  const auto q_tiles = cpu::make_tiles(args.q_positions, shape.q_tokens, kBlockQ);
  const auto k_tiles = cpu::make_tiles(args.kv_positions, shape.kv_tokens, kBlockK);
  const int64_t tiles_per_head = static_cast<int64_t>(k_tiles.size());
  const int64_t items = shape.batch * shape.kv_heads * tiles_per_head;
  const int threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(args.threads, items)));
  const MaskView mask = args.mask.view();

  // Thread 0 adds straight into dq; the others into private dense buffers.
  const int64_t dq_elements = shape.batch * shape.q_tokens * shape.heads * dim;
  std::vector<std::vector<float>> private_dq(static_cast<size_t>(threads - 1));

#pragma omp parallel num_threads(threads)
  {
    int thread = 0;
#ifdef _OPENMP
    thread = omp_get_thread_num();
#endif
    TokenView<float> my_dq = dq;
    if (thread > 0) {
      private_dq[thread - 1].assign(static_cast<size_t>(dq_elements), 0.0f);
      my_dq = dense_tokens(private_dq[thread - 1].data(), shape.q_tokens, shape.heads, dim);
    }
    Workspace ws(dim);
#pragma omp for schedule(static, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item % tiles_per_head;
      const int64_t kvh = (item / tiles_per_head) % shape.kv_heads;
      const int64_t b = item / (tiles_per_head * shape.kv_heads);
      const cpu::Tile& kt = k_tiles[t];
      if (args.progress && thread == 0) args.progress(args.progress_context);
      std::fill(ws.dk.begin(), ws.dk.end(), 0.0f);
      std::fill(ws.dv.begin(), ws.dv.end(), 0.0f);
      // Without queries there is no block, and K and V may be unset.
      const bool blocks = !q_tiles.empty();
      const Rows keys = blocks ? rows_of(args.k, b, kvh, kt, kBlockK, dim, ws.k) : Rows{};
      const Rows values = blocks ? rows_of(args.v, b, kvh, kt, kBlockK, dim, ws.v) : Rows{};
      for (int64_t h = kvh * shape.group_size(); h < (kvh + 1) * shape.group_size(); ++h) {
        for (const cpu::Tile& qt : q_tiles) {
          const BlockVisibility visibility = cpu::classify(mask, qt, kt);
          if (visibility == BlockVisibility::hidden) continue;
          backward_block(args, mask, delta, b, h, qt, kt, visibility, keys, values, my_dq, ws);
          if (args.work_done) {
            args.work_done->fetch_add(qt.size() * kt.size(), std::memory_order_relaxed);
          }
        }
      }
      for (int64_t j = 0; j < kt.size(); ++j) {
        float* dk_row = dk.at(b, kt.begin + j, kvh);
        float* dv_row = dv.at(b, kt.begin + j, kvh);
        const float* dk_acc = ws.dk.data() + j * dim;
        const float* dv_acc = ws.dv.data() + j * dim;
        for (int64_t d = 0; d < dim; ++d) {
          dk_row[d] = (args.accumulate ? dk_row[d] : 0.0f) + dk_acc[d];
          dv_row[d] = (args.accumulate ? dv_row[d] : 0.0f) + dv_acc[d];
        }
      }
    }
  }

  for (const auto& buffer : private_dq) {
    if (buffer.empty()) continue;  // the runtime started fewer threads than asked
    const auto view = dense_tokens(buffer.data(), shape.q_tokens, shape.heads, dim);
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t t = 0; t < shape.q_tokens; ++t)
        for (int64_t h = 0; h < shape.heads; ++h)
          axpy(1.0f, view.at(b, t, h), dq.at(b, t, h), dim);
  }
}

}  // namespace a2d::cpu::portable
