// The kernel paths (portable, AVX2/FMA, AVX-512): selection, and the cases the fast path's tiling
// makes special, each on every supported path against the fp64 reference: sizes at and around its
// tile and micro-kernel edges (24-row query panels, 4-key blocks, 96/256-key tiles, 48-row query
// tiles), odd head dims, masks whose borders cut tiles and blocks, memory strides, rows that see
// no key, determinism and the forward's memory bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/data.hpp"
#include "attention_case.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(KernelPath, NamesParseAndSelection) {
  EXPECT_STREQ(kernel_path_name(KernelPath::portable), "portable");
  EXPECT_STREQ(kernel_path_name(KernelPath::avx2), "avx2");
  EXPECT_EQ(parse_kernel_path("portable"), KernelPath::portable);
  EXPECT_STREQ(kernel_path_name(KernelPath::avx512), "avx512");
  EXPECT_EQ(parse_kernel_path("avx2"), KernelPath::avx2);
  EXPECT_EQ(parse_kernel_path("avx512"), KernelPath::avx512);
  EXPECT_STREQ(kernel_path_name(KernelPath::amx), "amx");
  EXPECT_EQ(parse_kernel_path("amx"), KernelPath::amx);
  EXPECT_STREQ(kernel_path_name(KernelPath::avx512bf16), "avx512bf16");
  EXPECT_EQ(parse_kernel_path("avx512bf16"), KernelPath::avx512bf16);
  EXPECT_EQ(parse_kernel_path("auto"), best_kernel_path());
  EXPECT_THROW(parse_kernel_path("avx1024"), Error);
  EXPECT_TRUE(kernel_path_supported(KernelPath::portable));
  EXPECT_TRUE(kernel_path_supported(best_kernel_path()));
  for (const KernelPath path : bf16_paths()) {
    const PathScope scope(path);
    EXPECT_EQ(kernel_path(), path);
  }
  for (const KernelPath path :
       {KernelPath::avx2, KernelPath::avx512, KernelPath::avx512bf16, KernelPath::amx}) {
    if (!kernel_path_supported(path)) {
      EXPECT_THROW(set_kernel_path(path), Error);
    }
  }
  // auto is the widest path the CPU has.
  const KernelPath best = kernel_path_supported(KernelPath::amx)          ? KernelPath::amx
                          : kernel_path_supported(KernelPath::avx512bf16) ? KernelPath::avx512bf16
                          : kernel_path_supported(KernelPath::avx512)     ? KernelPath::avx512
                          : kernel_path_supported(KernelPath::avx2)       ? KernelPath::avx2
                                                                          : KernelPath::portable;
  // The amx and avx512bf16 paths need everything the avx512 path needs; amx needs AVX512-BF16 too.
  if (kernel_path_supported(KernelPath::amx)) {
    EXPECT_TRUE(kernel_path_supported(KernelPath::avx512bf16));
  }
  if (kernel_path_supported(KernelPath::avx512bf16)) {
    EXPECT_TRUE(kernel_path_supported(KernelPath::avx512));
  }
  EXPECT_EQ(best_kernel_path(), best);
}

void expect_all_paths_within_bound(const Case& c) {
  for (const auto& [path, e] : run_case_on_paths(c, /*backward=*/true)) {
    SCOPED_TRACE(std::string(kernel_path_name(path)) + " " + c.name());
    EXPECT_LE(e.out, kFp32RelativeBound) << "O";
    EXPECT_LE(e.lse, kFp32RelativeBound) << "LSE";
    EXPECT_LE(e.dq, kFp32RelativeBound) << "dQ";
    EXPECT_LE(e.dk, kFp32RelativeBound) << "dK";
    EXPECT_LE(e.dv, kFp32RelativeBound) << "dV";
    EXPECT_LE(e.dsink, kFp32RelativeBound) << "dsink";
  }
}

TEST(KernelPaths, TileAndMicroKernelEdges) {
  // Query counts around 24 (forward panel), 48 (backward query tile), 96 and 192 (forward query
  // tiles for D = 256 and D <= 128); key counts around 4 (block), 16, 96 (backward key tile) and
  // 256 (forward key tile).
  const std::vector<std::pair<int64_t, int64_t>> sizes = {
      {1, 1},   {23, 5},  {24, 4},  {25, 3},   {47, 95},  {48, 96},   {49, 97},  {95, 17},
      {96, 16}, {97, 15}, {2, 255}, {30, 256}, {31, 257}, {100, 513}, {191, 40}, {193, 260}};
  for (const auto& [nq, nk] : sizes) {
    for (const Mask& mask : {Mask::none(), Mask::causal()}) {
      Case c;
      c.heads = 2;
      c.kv_heads = 1;
      c.q_tokens = nq;
      c.kv_tokens = nk;
      c.head_dim = 40;
      c.mask = mask;
      expect_all_paths_within_bound(c);
    }
  }
}

TEST(KernelPaths, OddHeadDims) {
  // 1 and 3 (less than one vector), 33 (a 4-dim block plus 1), 80 and 96 (not powers of two),
  // 17 and 130 (one lane past a 16-column block).
  for (const int64_t dim : {1, 3, 17, 33, 80, 96, 130}) {
    for (const Mask& mask : {Mask::none(), Mask::causal_window(19)}) {
      Case c;
      c.heads = 3;
      c.kv_heads = 3;
      c.q_tokens = 61;
      c.kv_tokens = 101;
      c.head_dim = dim;
      c.mask = mask;
      expect_all_paths_within_bound(c);
    }
  }
}

TEST(KernelPaths, MaskBordersCrossingTilesAndBlocks) {
  // Windows narrower than a block, a panel, a tile, and wider than one; queries after the keys
  // (Nq < Nk with contiguous positions puts the diagonal at an offset), strided and unordered
  // positions that make every tile partial.
  for (const int64_t window : {1, 2, 5, 23, 97, 250}) {
    Case c;
    c.heads = 2;
    c.kv_heads = 1;
    c.q_tokens = 130;
    c.kv_tokens = 300;
    c.head_dim = 24;
    c.mask = Mask::causal_window(window);
    c.positions = Positions::arbitrary;
    expect_all_paths_within_bound(c);
  }
  for (const Positions positions : {Positions::strided, Positions::shuffled}) {
    Case c;
    c.heads = 4;
    c.kv_heads = 2;
    c.q_tokens = 200;
    c.kv_tokens = 290;
    c.head_dim = 32;
    c.mask = Mask::causal();
    c.positions = positions;
    c.threads = 2;
    expect_all_paths_within_bound(c);
  }
}

// Packed documents (cu_seqlens): one-token documents, documents shorter than a block, a panel
// and a tile, one spanning most of the keys, with every mask kind and position layout; with
// attention sinks and softcapping, alone and together.
TEST(KernelPaths, DocumentsSinksAndSoftcap) {
  // Lengths over positions 0 .. 2999 (arbitrary positions reach ~ 3 x the token count).
  std::vector<int64_t> lengths = {1, 1, 3, 1, 7, 23, 2, 1, 97, 5};
  int64_t covered = 0;
  for (const int64_t length : lengths)
    covered += length;
  lengths.push_back(2000);
  lengths.push_back(1);
  lengths.push_back(3000 - covered - 2001);
  int cases = 0;
  for (const Mask& base : {Mask::none(), Mask::causal(), Mask::causal_window(30)}) {
    for (const Positions positions :
         {Positions::contiguous, Positions::strided, Positions::arbitrary, Positions::shuffled}) {
      Case c;
      c.heads = 4;
      c.kv_heads = 2;
      c.q_tokens = 150;
      c.kv_tokens = 270;
      c.head_dim = 40;
      c.mask = base.with_documents(lengths);
      c.positions = positions;
      c.threads = cases % 2 + 1;
      c.sinks = cases % 3 == 1;
      c.softcap = cases % 4 == 2 ? 1.5f : 0.0f;
      expect_all_paths_within_bound(c);
      ++cases;
    }
  }
  // Sinks and softcap without documents, and a softcap so small that every score saturates.
  for (const float softcap : {0.0f, 0.2f, 5.0f}) {
    Case c;
    c.heads = 3;
    c.q_tokens = 77;
    c.kv_tokens = 300;
    c.head_dim = 64;
    c.mask = Mask::causal();
    c.positions = Positions::arbitrary;
    c.amplitude = 3.0f;
    c.sinks = true;
    c.softcap = softcap;
    expect_all_paths_within_bound(c);
  }
}

// Flash-attn's two-sided windows and MagiAttention's range masks (mask.hpp), on every path and
// position layout: windows bounded on both sides, on one side, and with documents; a prefix-LM, a
// block-causal mask, random slices of every type and a hand-made list whose slices leave rows
// with no key and rows that meet several slices; with sinks and softcap on some. The slices span
// positions 0 .. 2999 (arbitrary positions reach ~ 3 x the token count).
TEST(KernelPaths, WindowsAndRangeMasks) {
  const std::vector<Mask> masks = {
      Mask::window_size(5, 3),
      Mask::window_size(-1, 40),
      Mask::window_size(30, -1),
      Mask::window_size(60, 60).with_documents({1, 3, 200, 7, 1000, 1789}),
      Mask::from_ranges(parse_mask_ranges("prefix-lm:97", 3000)),
      Mask::from_ranges(parse_mask_ranges("block-causal:37", 3000)),
      Mask::from_ranges(parse_mask_ranges("random:24:5", 3000)),
      Mask::from_ranges({{0, 50, 0, 30, RangeType::causal},
                         {0, 50, 40, 41, RangeType::full},
                         {60, 300, 10, 200, RangeType::inv_causal},
                         {60, 300, 200, 900, RangeType::bi_causal},
                         {300, 3000, 0, 3000, RangeType::causal}})};
  int cases = 0;
  for (const Mask& mask : masks) {
    for (const Positions positions :
         {Positions::contiguous, Positions::strided, Positions::arbitrary, Positions::shuffled}) {
      Case c;
      c.heads = 4;
      c.kv_heads = 2;
      c.q_tokens = 150;
      c.kv_tokens = 270;
      c.head_dim = 40;
      c.mask = mask;
      c.positions = positions;
      c.threads = cases % 2 + 1;
      c.sinks = cases % 3 == 1;
      c.softcap = cases % 5 == 2 ? 1.5f : 0.0f;
      expect_all_paths_within_bound(c);
      ++cases;
    }
  }
}

// A range mask whose slices leave rows with no key (uncovered rows, a bi-causal slice of more
// queries than keys, which shows nothing, and the rows of a causal slice before its diagonal) and
// keys no query sees: O = 0, LSE = -inf, dQ = 0 on those rows and dK = dV = 0 on those keys, on
// every path, from outputs that start as NaN.
TEST(KernelPaths, RangeRowsWithoutKeysGiveZeroAndMinusInfinity) {
  // Rows 20..39 see keys 0..9; rows 45..49 keys 60..85+; the bi-causal slice [40, 60) x [50, 55)
  // (sq 20 > sk 5) shows nothing.
  const Mask mask = Mask::from_ranges({{20, 40, 0, 10, RangeType::full},
                                       {40, 60, 50, 55, RangeType::bi_causal},
                                       {45, 50, 60, 90, RangeType::causal}});
  const auto row_sees = [](int64_t i) { return (i >= 20 && i < 40) || (i >= 45 && i < 50); };
  const auto key_seen = [](int64_t j) { return j < 10 || (j >= 60 && j < 90); };
  Case c;
  c.heads = 2;
  c.kv_heads = 1;
  c.q_tokens = 60;
  c.kv_tokens = 100;
  c.head_dim = 16;
  c.mask = mask;
  const Problem p = make_problem(c);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const KernelPath path : supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const PathScope scope(path);
    std::vector<float> out(p.q.size(), nan), lse(static_cast<size_t>(2 * 60), nan);
    ForwardArgs fwd;
    fwd.shape = p.shape;
    fwd.mask = mask;
    fwd.scale = p.scale;
    fwd.q = dense_tokens(p.q.data(), 60, 2, 16);
    fwd.k = dense_tokens(p.k.data(), 100, 1, 16);
    fwd.v = dense_tokens(p.v.data(), 100, 1, 16);
    attention_forward(fwd, dense_tokens(out.data(), 60, 2, 16), dense_rows(lse.data(), 2, 60));
    BackwardArgs bwd;
    bwd.shape = p.shape;
    bwd.mask = mask;
    bwd.scale = p.scale;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = dense_tokens(out.data(), 60, 2, 16);
    bwd.d_out = dense_tokens(p.d_out.data(), 60, 2, 16);
    bwd.lse = dense_rows(lse.data(), 2, 60);
    std::vector<float> dq(p.q.size(), nan), dk(p.k.size(), nan), dv(p.v.size(), nan);
    attention_backward(bwd, dense_tokens(dq.data(), 60, 2, 16), dense_tokens(dk.data(), 100, 1, 16),
                       dense_tokens(dv.data(), 100, 1, 16));
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 60; ++i) {
        EXPECT_EQ(lse[h * 60 + i] == kNegInf, !row_sees(i)) << "row " << i;
        for (int64_t d = 0; d < 16; ++d) {
          const float o = out[(i * 2 + h) * 16 + d], g = dq[(i * 2 + h) * 16 + d];
          ASSERT_FALSE(std::isnan(o) || std::isnan(g)) << "row " << i;
          if (!row_sees(i)) {
            ASSERT_EQ(o, 0.0f) << "row " << i;
            ASSERT_EQ(g, 0.0f) << "row " << i;
          }
        }
      }
    }
    for (int64_t j = 0; j < 100; ++j) {
      for (int64_t d = 0; d < 16; ++d) {
        const float gk = dk[j * 16 + d], gv = dv[j * 16 + d];
        ASSERT_FALSE(std::isnan(gk) || std::isnan(gv)) << "key " << j;
        if (!key_seen(j)) {
          ASSERT_EQ(gk, 0.0f) << "key " << j;
          ASSERT_EQ(gv, 0.0f) << "key " << j;
        }
      }
    }
  }
  // And the reference agrees everywhere else.
  expect_all_paths_within_bound(c);
}

// Inputs and outputs laid out with gaps: Q, K, V inside one packed [batch, tokens, heads +
// 2 kv_heads, dim] buffer, outputs with padded rows, LSE and delta as [batch, tokens, heads]. The
// results must equal, bit for bit, those of the dense layout on the same path: the kernels
// copy what they need, so strides must not change any arithmetic.
struct StridedRun {
  std::vector<float> out, lse, dq, dk, dv, acc, row_max, row_sum;
};

StridedRun run_layout(const Case& c, bool strided) {
  const Problem p = make_problem(c);
  const AttentionShape& s = p.shape;
  const int64_t width = s.heads + 2 * s.kv_heads;  // heads of the packed QKV row
  const int64_t pad = strided ? 3 : 0;             // extra floats after every row of an output
  const int64_t tokens = std::max(s.q_tokens, s.kv_tokens);
  std::vector<float> qkv(static_cast<size_t>(s.batch * tokens * width * s.head_dim), 0.0f);
  auto packed = [&](int64_t first_head) {
    return TokenView<float>{qkv.data() + first_head * s.head_dim, tokens * width * s.head_dim,
                            width * s.head_dim, s.head_dim};
  };
  auto dense_of = [&](const std::vector<float>& x, int64_t n, int64_t h) {
    return dense_tokens(x.data(), n, h, s.head_dim);
  };
  TokenView<const float> q = dense_of(p.q, s.q_tokens, s.heads);
  TokenView<const float> k = dense_of(p.k, s.kv_tokens, s.kv_heads);
  TokenView<const float> v = dense_of(p.v, s.kv_tokens, s.kv_heads);
  if (strided) {
    const TokenView<float> to[] = {packed(0), packed(s.heads), packed(s.heads + s.kv_heads)};
    const TokenView<const float> from[] = {q, k, v};
    const int64_t counts[] = {s.q_tokens, s.kv_tokens, s.kv_tokens};
    const int64_t heads[] = {s.heads, s.kv_heads, s.kv_heads};
    for (int t = 0; t < 3; ++t)
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t n = 0; n < counts[t]; ++n)
          for (int64_t h = 0; h < heads[t]; ++h)
            std::copy_n(from[t].at(b, n, h), s.head_dim, to[t].at(b, n, h));
    q = packed(0);
    k = packed(s.heads);
    v = packed(s.heads + s.kv_heads);
  }
  // Outputs [batch, tokens, heads, dim + pad] and rows [batch, tokens, heads].
  auto out_view = [&](std::vector<float>& x, int64_t n, int64_t h) {
    x.assign(static_cast<size_t>(s.batch * n * h * (s.head_dim + pad)), 0.0f);
    return TokenView<float>{x.data(), n * h * (s.head_dim + pad), h * (s.head_dim + pad),
                            s.head_dim + pad};
  };
  auto row_view = [&](std::vector<float>& x, float fill) {
    x.assign(static_cast<size_t>(s.batch * s.q_tokens * s.heads), fill);
    return strided ? RowView<float>{x.data(), s.q_tokens * s.heads, 1, s.heads}
                   : dense_rows(x.data(), s.heads, s.q_tokens);
  };
  StridedRun r;
  ForwardArgs fwd;
  fwd.shape = s;
  fwd.mask = c.mask;
  fwd.scale = p.scale;
  fwd.q = q;
  fwd.k = k;
  fwd.v = v;
  fwd.q_positions = p.q_pos();
  fwd.kv_positions = p.kv_pos();
  const TokenView<float> out = out_view(r.out, s.q_tokens, s.heads);
  const RowView<float> lse = row_view(r.lse, 0.0f);
  attention_forward(fwd, out, lse);
  // The partial form, continued from a first pass over the same keys (accumulate = true).
  const PartialView partial{out_view(r.acc, s.q_tokens, s.heads), row_view(r.row_max, kNegInf),
                            row_view(r.row_sum, 0.0f)};
  attention_forward_partial(fwd, partial, false);
  attention_forward_partial(fwd, partial, true);

  BackwardArgs bwd;
  bwd.shape = s;
  bwd.mask = c.mask;
  bwd.scale = p.scale;
  bwd.q = q;
  bwd.k = k;
  bwd.v = v;
  bwd.out = out;
  std::vector<float> d_out;
  const TokenView<float> d_out_view = out_view(d_out, s.q_tokens, s.heads);
  const TokenView<const float> d_out_dense = dense_of(p.d_out, s.q_tokens, s.heads);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.q_tokens; ++n)
      for (int64_t h = 0; h < s.heads; ++h)
        std::copy_n(d_out_dense.at(b, n, h), s.head_dim, d_out_view.at(b, n, h));
  bwd.d_out = d_out_view;
  bwd.lse = lse;
  bwd.q_positions = p.q_pos();
  bwd.kv_positions = p.kv_pos();
  bwd.threads = c.threads;
  attention_backward(bwd, out_view(r.dq, s.q_tokens, s.heads),
                     out_view(r.dk, s.kv_tokens, s.kv_heads),
                     out_view(r.dv, s.kv_tokens, s.kv_heads));
  // Back to dense order, so the two layouts compare element by element.
  auto unpad = [&](std::vector<float>& x, int64_t n, int64_t h) {
    std::vector<float> dense(static_cast<size_t>(s.batch * n * h * s.head_dim));
    for (int64_t row = 0; row < s.batch * n * h; ++row)
      std::copy_n(x.begin() + row * (s.head_dim + pad), s.head_dim,
                  dense.begin() + row * s.head_dim);
    x = dense;
  };
  auto rows_dense = [&](std::vector<float>& x) {
    if (!strided) return;
    std::vector<float> dense(x.size());
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t n = 0; n < s.q_tokens; ++n)
          dense[(b * s.heads + h) * s.q_tokens + n] = x[(b * s.q_tokens + n) * s.heads + h];
    x = dense;
  };
  unpad(r.out, s.q_tokens, s.heads);
  unpad(r.acc, s.q_tokens, s.heads);
  unpad(r.dq, s.q_tokens, s.heads);
  unpad(r.dk, s.kv_tokens, s.kv_heads);
  unpad(r.dv, s.kv_tokens, s.kv_heads);
  rows_dense(r.lse);
  rows_dense(r.row_max);
  rows_dense(r.row_sum);
  return r;
}

TEST(KernelPaths, MemoryStridesChangeNoBit) {
  Case c;
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.q_tokens = 70;
  c.kv_tokens = 110;
  c.head_dim = 20;
  c.mask = Mask::causal();
  c.positions = Positions::arbitrary;
  c.threads = 2;
  for (const KernelPath path : supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const PathScope scope(path);
    const StridedRun dense = run_layout(c, false);
    const StridedRun strided = run_layout(c, true);
    EXPECT_EQ(dense.out, strided.out);
    EXPECT_EQ(dense.lse, strided.lse);
    EXPECT_EQ(dense.acc, strided.acc);
    EXPECT_EQ(dense.row_max, strided.row_max);
    EXPECT_EQ(dense.row_sum, strided.row_sum);
    EXPECT_EQ(dense.dq, strided.dq);
    EXPECT_EQ(dense.dk, strided.dk);
    EXPECT_EQ(dense.dv, strided.dv);
  }
}

TEST(KernelPaths, RowsWithoutVisibleKeysGiveZeroAndMinusInfinity) {
  // Causal, queries at 0..59 and keys at 30..129: queries 0..29 see nothing, keys 60..129 are
  // seen by no query. Empty rows fill the first panel and part of the second, so empty and
  // non-empty rows share panels and tiles. Every output starts as NaN: with accumulate = false
  // the kernel overwrites all of it (the algorithms hand it uninitialised buffers).
  Case c;
  c.heads = 2;
  c.kv_heads = 1;
  c.q_tokens = 60;
  c.kv_tokens = 100;
  c.head_dim = 16;
  c.mask = Mask::causal();
  const Problem p = make_problem(c);
  std::vector<int64_t> q_pos(60), k_pos(100);
  for (int64_t i = 0; i < 60; ++i)
    q_pos[i] = i;
  for (int64_t j = 0; j < 100; ++j)
    k_pos[j] = 30 + j;
  const AttentionShape& s = p.shape;
  for (const KernelPath path : supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const PathScope scope(path);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(p.q.size(), nan), lse(static_cast<size_t>(2 * 60), nan);
    ForwardArgs fwd;
    fwd.shape = s;
    fwd.mask = c.mask;
    fwd.scale = p.scale;
    fwd.q = dense_tokens(p.q.data(), 60, 2, 16);
    fwd.k = dense_tokens(p.k.data(), 100, 1, 16);
    fwd.v = dense_tokens(p.v.data(), 100, 1, 16);
    fwd.q_positions = q_pos.data();
    fwd.kv_positions = k_pos.data();
    attention_forward(fwd, dense_tokens(out.data(), 60, 2, 16), dense_rows(lse.data(), 2, 60));
    BackwardArgs bwd;
    bwd.shape = s;
    bwd.mask = c.mask;
    bwd.scale = p.scale;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = dense_tokens(out.data(), 60, 2, 16);
    bwd.d_out = dense_tokens(p.d_out.data(), 60, 2, 16);
    bwd.lse = dense_rows(lse.data(), 2, 60);
    bwd.q_positions = q_pos.data();
    bwd.kv_positions = k_pos.data();
    std::vector<float> dq(p.q.size(), nan), dk(p.k.size(), nan), dv(p.v.size(), nan);
    attention_backward(bwd, dense_tokens(dq.data(), 60, 2, 16), dense_tokens(dk.data(), 100, 1, 16),
                       dense_tokens(dv.data(), 100, 1, 16));
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 60; ++i) {
        const bool empty = i < 30;
        const float row_lse = lse[h * 60 + i];
        EXPECT_EQ(row_lse == kNegInf, empty) << "row " << i;
        for (int64_t d = 0; d < 16; ++d) {
          const float o = out[(i * 2 + h) * 16 + d];
          const float g = dq[(i * 2 + h) * 16 + d];
          ASSERT_FALSE(std::isnan(o) || std::isnan(g)) << "row " << i;
          if (empty) {
            EXPECT_EQ(o, 0.0f);
            EXPECT_EQ(g, 0.0f);
          }
        }
      }
    }
    for (int64_t j = 0; j < 100; ++j) {
      for (int64_t d = 0; d < 16; ++d) {
        const float gk = dk[j * 16 + d], gv = dv[j * 16 + d];
        ASSERT_FALSE(std::isnan(gk) || std::isnan(gv)) << "key " << j;
        if (j >= 30) {  // position 60 or later: no query sees it
          EXPECT_EQ(gk, 0.0f) << "key " << j;
          EXPECT_EQ(gv, 0.0f) << "key " << j;
        }
      }
    }

    // The partial form (accumulate = false): an empty row is (max -inf, sum 0, acc 0).
    std::vector<float> row_max(lse.size(), nan), row_sum(lse.size(), nan), acc(p.q.size(), nan);
    attention_forward_partial(
        fwd,
        {dense_tokens(acc.data(), 60, 2, 16), dense_rows(row_max.data(), 2, 60),
         dense_rows(row_sum.data(), 2, 60)},
        /*accumulate=*/false);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 60; ++i) {
        const bool empty = i < 30;
        ASSERT_FALSE(std::isnan(row_max[h * 60 + i]) || std::isnan(row_sum[h * 60 + i]))
            << "row " << i;
        EXPECT_EQ(row_sum[h * 60 + i] == 0.0f, empty) << "row " << i;
        for (int64_t d = 0; d < 16; ++d) {
          const float a = acc[(i * 2 + h) * 16 + d];
          ASSERT_FALSE(std::isnan(a)) << "row " << i;
          if (empty) {
            EXPECT_EQ(a, 0.0f);
          }
        }
      }
    }
  }
}

TEST(KernelPaths, DeterministicForAThreadCount) {
  Case c;
  c.heads = 4;
  c.kv_heads = 2;
  c.q_tokens = 333;
  c.kv_tokens = 333;
  c.head_dim = 32;
  c.mask = Mask::causal();
  for (const KernelPath path : supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const PathScope scope(path);
    c.threads = 2;
    const StridedRun first = run_layout(c, false);
    const StridedRun second = run_layout(c, false);
    EXPECT_EQ(first.out, second.out);
    EXPECT_EQ(first.lse, second.lse);
    EXPECT_EQ(first.dq, second.dq);
    EXPECT_EQ(first.dk, second.dk);
    EXPECT_EQ(first.dv, second.dv);
    if (path != KernelPath::portable) {
      // The AVX2 and AVX-512 forwards compute every query tile the same way whichever thread
      // runs it, so their result does not even depend on the thread count (the backward's dQ
      // sums do).
      c.threads = 1;
      const StridedRun one = run_layout(c, false);
      EXPECT_EQ(one.out, first.out);
      EXPECT_EQ(one.lse, first.lse);
    }
  }
}

TEST(KernelPaths, ForwardWorkspaceStaysSmallAtLongSequences) {
  // The bound: N = 65536, H = 1, D = 128 must need < 64 MiB beyond inputs and outputs.
  // (cli.kernel_memory_65536 measures the resident set of a real call.)
  const AttentionShape shape{1, 1, 1, 65536, 65536, 128};
  for (const KernelPath path : supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const PathScope scope(path);
    for (const int threads : {1, 2, 16}) {
      EXPECT_LT(forward_workspace_bytes(shape, threads), int64_t{64} << 20) << threads;
    }
    EXPECT_GT(forward_workspace_bytes(shape, 1), 0);
  }
}

// The AVX-512 path on its own, so that a CPU or build without it reports this test as skipped
// instead of passing it silently (every test above also runs it wherever it is supported): O,
// LSE, dQ, dK and dV, each against the fp64 reference, at the head dims its 32-dim value blocks
// pad (80, 96) or fill (64, 128), an odd query count (61: a 48-row panel and a partial one), GQA
// 12:4 and the masks whose borders cut its tiles (causal, a window, packed documents with a
// window), each mask at two head dims.
TEST(KernelPathAvx512, MatchesFp64Reference) {
  if (!kernel_path_supported(KernelPath::avx512)) {
    GTEST_SKIP() << "no AVX-512 path: this CPU lacks AVX-512 F/BW/DQ/VL (or the build has no "
                    "AVX-512 code)";
  }
  const std::vector<int64_t> documents = {1, 40, 3, 90, 60, 806};  // positions 0 .. 999
  const Mask masks[] = {Mask::none(), Mask::causal(), Mask::causal_window(37),
                        Mask::causal_window(50).with_documents(documents)};
  const PathScope scope(KernelPath::avx512);
  int index = 0;
  for (const int64_t dim : {64, 80, 96, 128}) {
    for (int twice = 0; twice < 2; ++twice) {  // two of the four masks per head dim, in turn
      Case c;
      c.heads = 12;
      c.kv_heads = 4;
      c.q_tokens = 61;
      c.kv_tokens = 130;
      c.head_dim = dim;
      c.mask = masks[index % 4];
      c.positions = index % 2 ? Positions::arbitrary : Positions::contiguous;
      c.threads = index % 3 == 2 ? 2 : 1;
      ++index;
      SCOPED_TRACE(c.name());
      const Errors e = run_case(c, /*backward=*/true);
      EXPECT_LE(e.out, kFp32RelativeBound) << "O";
      EXPECT_LE(e.lse, kFp32RelativeBound) << "LSE";
      EXPECT_LE(e.dq, kFp32RelativeBound) << "dQ";
      EXPECT_LE(e.dk, kFp32RelativeBound) << "dK";
      EXPECT_LE(e.dv, kFp32RelativeBound) << "dV";
    }
  }
}

}  // namespace
}  // namespace a2d::test
