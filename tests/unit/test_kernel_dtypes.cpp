// The kernels on bf16 and fp16 inputs, on every kernel path this CPU supports. The generated
// inputs are rounded to the dtype and stored in it; the same rounded values, widened to fp32, are
// the inputs of the fp32 kernel and of the fp64 reference. Two kinds of assertion:
//
//   exactness  the 16-bit kernel equals the fp32 kernel on the widened values, bit for bit:
//              LSE, the partial state (row max, row sum, acc), dQ, dK, dV identical; O in the
//              dtype equal to the rounding of the fp32 kernel's O. (Widening is exact and every
//              path converts while copying, so nothing after the copy can differ.)
//   accuracy   against the fp64 reference on the rounded inputs: O within its dtype's output
//              bound (kBf16OutputBound, kF16OutputBound), LSE and the gradients (fp32 outputs)
//              within kFp32RelativeBound, except dQ and dK when delta is computed from the
//              16-bit O (kBf16DeltaGradientBound, kF16DeltaGradientBound). check.hpp derives
//              each bound.
//
// Forward (attention_forward; attention_forward_partial over the first half of the keys, then
// with accumulate over the second, then finalize_partial into the dtype), backward with delta
// given (computed from the fp32 O) and with delta computed from the 16-bit O.
//
// The bf16 kernels of the avx512bf16 and amx paths are the runs that do not widen: they multiply
// bf16 pairs (VDPBF16PS, AMX tiles) and round P (and dS) to bf16 before the products that take them (cpu_kernels.hpp), so there (a)
// does not apply and (b) holds O and the gradients to the tensor-core bounds (check.hpp); LSE
// keeps kFp32RelativeBound.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/tools/check.hpp"
#include "attention_case.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::test {
namespace {

// The rounded problem: fp32 arrays hold the rounded values (what the fp32 kernel and the
// reference read), the 16-bit arrays the same values stored in the dtype.
struct Rounded {
  DType dtype;
  Problem p;
  std::vector<uint16_t> q, k, v, d_out;
};

std::vector<uint16_t> round_in_place(DType dtype, std::vector<float>& x) {
  std::vector<uint16_t> stored(x.size());
  from_float(dtype, x.data(), stored.data(), static_cast<int64_t>(x.size()));
  to_float(dtype, stored.data(), x.data(), static_cast<int64_t>(x.size()));
  return stored;
}

Rounded make_rounded(const Case& c, DType dtype) {
  Rounded r{dtype, make_problem(c), {}, {}, {}, {}};
  r.q = round_in_place(dtype, r.p.q);
  r.k = round_in_place(dtype, r.p.k);
  r.v = round_in_place(dtype, r.p.v);
  r.d_out = round_in_place(dtype, r.p.d_out);
  // The partial forward runs over two halves of the keys, which needs explicit key positions.
  if (r.p.kv_positions.empty()) {
    for (int64_t j = 0; j < c.kv_tokens; ++j)
      r.p.kv_positions.push_back(j);
  }
  return r;
}

// A dense [batch, tokens, heads, dim] tensor of `dtype` from row `first` on.
InTokens in_view(const void* data, DType dtype, int64_t tokens, int64_t heads, int64_t dim,
                 int64_t first = 0) {
  const auto* bytes = static_cast<const std::byte*>(data);
  return {bytes + first * heads * dim * dtype_bytes(dtype), dtype, tokens * heads * dim,
          heads * dim, dim};
}
OutTokens out_view(void* data, DType dtype, int64_t tokens, int64_t heads, int64_t dim) {
  return {data, dtype, tokens * heads * dim, heads * dim, dim};
}

// Everything one kernel run produces; O-like outputs in `bytes` of the run's output dtype.
struct Run {
  std::vector<std::byte> out, final_out;  // attention_forward's O, finalize_partial's O
  std::vector<float> lse, final_lse, acc, row_max, row_sum;
  std::vector<float> dq, dk, dv;        // delta given
  std::vector<float> dq_o, dk_o, dv_o;  // delta computed from O
};

// The inputs of one run: the fp32 kernel gets the widened values (typed = false), the 16-bit
// kernel the stored ones.
struct RunInputs {
  InTokens q, k, v, d_out;
  DType out_dtype;
};

RunInputs inputs_of(const Rounded& r, bool typed) {
  const AttentionShape& s = r.p.shape;
  const int64_t d = s.head_dim;
  if (!typed) {
    return {in_view(r.p.q.data(), DType::f32, s.q_tokens, s.heads, d),
            in_view(r.p.k.data(), DType::f32, s.kv_tokens, s.kv_heads, d),
            in_view(r.p.v.data(), DType::f32, s.kv_tokens, s.kv_heads, d),
            in_view(r.p.d_out.data(), DType::f32, s.q_tokens, s.heads, d), DType::f32};
  }
  return {in_view(r.q.data(), r.dtype, s.q_tokens, s.heads, d),
          in_view(r.k.data(), r.dtype, s.kv_tokens, s.kv_heads, d),
          in_view(r.v.data(), r.dtype, s.kv_tokens, s.kv_heads, d),
          in_view(r.d_out.data(), r.dtype, s.q_tokens, s.heads, d), r.dtype};
}

// The forward, the two-part partial forward with its finalisation, and the backward with
// `delta` and with delta computed from `out_for_delta` (an O of any dtype).
Run run_forward(const Rounded& r, const Case& c, const RunInputs& in) {
  const AttentionShape& s = r.p.shape;
  const int64_t d = s.head_dim;
  const size_t q_elements = r.p.q.size();
  const auto rows = static_cast<size_t>(s.batch * s.heads * s.q_tokens);
  Run run;
  run.out.resize(q_elements * static_cast<size_t>(dtype_bytes(in.out_dtype)));
  run.final_out.resize(run.out.size());
  run.lse.resize(rows);
  ForwardArgs fwd;
  fwd.shape = s;
  fwd.mask = c.mask;
  fwd.scale = r.p.scale;
  fwd.q = in.q;
  fwd.k = in.k;
  fwd.v = in.v;
  fwd.q_positions = r.p.q_pos();
  fwd.kv_positions = r.p.kv_pos();
  fwd.threads = c.threads;
  fwd.softcap = c.softcap;
  attention_forward(fwd, out_view(run.out.data(), in.out_dtype, s.q_tokens, s.heads, d),
                    dense_rows(run.lse.data(), s.heads, s.q_tokens));

  // Keys [0, half), then [half, kv_tokens) with accumulate.
  run.acc.assign(q_elements, 0.0f);
  run.row_max.assign(rows, 0.0f);
  run.row_sum.assign(rows, 0.0f);
  const PartialView partial{dense_tokens(run.acc.data(), s.q_tokens, s.heads, d),
                            dense_rows(run.row_max.data(), s.heads, s.q_tokens),
                            dense_rows(run.row_sum.data(), s.heads, s.q_tokens)};
  const int64_t half = s.kv_tokens / 2;
  for (const bool second : {false, true}) {
    ForwardArgs part = fwd;
    const int64_t first = second ? half : 0;
    part.shape.kv_tokens = second ? s.kv_tokens - half : half;
    auto shifted = [&](InTokens x) {
      return InTokens{x.at(0, first, 0), x.dtype, x.batch_stride, x.token_stride, x.head_stride};
    };
    part.k = shifted(in.k);
    part.v = shifted(in.v);
    part.kv_positions = r.p.kv_positions.data() + first;
    attention_forward_partial(part, partial, /*accumulate=*/second);
  }
  run.final_lse.resize(rows);
  finalize_partial({s.batch, s.q_tokens, s.heads, d}, partial,
                   out_view(run.final_out.data(), in.out_dtype, s.q_tokens, s.heads, d),
                   dense_rows(run.final_lse.data(), s.heads, s.q_tokens));
  return run;
}

void run_backward(const Rounded& r, const Case& c, const RunInputs& in,
                  const std::vector<float>& delta, InTokens out_for_delta, Run& run) {
  const AttentionShape& s = r.p.shape;
  const int64_t d = s.head_dim;
  BackwardArgs bwd;
  bwd.shape = s;
  bwd.mask = c.mask;
  bwd.scale = r.p.scale;
  bwd.q = in.q;
  bwd.k = in.k;
  bwd.v = in.v;
  bwd.d_out = in.d_out;
  bwd.lse = dense_rows(run.lse.data(), s.heads, s.q_tokens);
  bwd.q_positions = r.p.q_pos();
  bwd.kv_positions = r.p.kv_pos();
  bwd.threads = c.threads;
  bwd.softcap = c.softcap;
  for (const bool from_out : {false, true}) {
    std::vector<float>& dq = from_out ? run.dq_o : run.dq;
    std::vector<float>& dk = from_out ? run.dk_o : run.dk;
    std::vector<float>& dv = from_out ? run.dv_o : run.dv;
    dq.assign(r.p.q.size(), 0.0f);
    dk.assign(r.p.k.size(), 0.0f);
    dv.assign(r.p.v.size(), 0.0f);
    bwd.delta = from_out ? RowView<const float>{} : dense_rows(delta.data(), s.heads, s.q_tokens);
    bwd.out = from_out ? out_for_delta : InTokens{};
    attention_backward(bwd, dense_tokens(dq.data(), s.q_tokens, s.heads, d),
                       dense_tokens(dk.data(), s.kv_tokens, s.kv_heads, d),
                       dense_tokens(dv.data(), s.kv_tokens, s.kv_heads, d));
  }
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

std::vector<double> widen(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

Reference reference_of(const Rounded& r, const Case& c) {
  const AttentionShape& s = r.p.shape;
  const std::vector<double> q = widen(r.p.q), k = widen(r.p.k), v = widen(r.p.v);
  const std::vector<double> d_out = widen(r.p.d_out);
  const reference::Inputs in{s,           c.mask,       static_cast<double>(r.p.scale),
                             q.data(),    k.data(),     v.data(),
                             r.p.q_pos(), r.p.kv_pos(), 2,
                             static_cast<double>(c.softcap)};
  Reference ref;
  ref.out.resize(r.p.q.size());
  ref.lse.resize(static_cast<size_t>(s.batch * s.heads * s.q_tokens));
  reference::forward(in, ref.out.data(), ref.lse.data());
  ref.dq.resize(r.p.q.size());
  ref.dk.resize(r.p.k.size());
  ref.dv.resize(r.p.v.size());
  reference::backward(in, d_out.data(), ref.dq.data(), ref.dk.data(), ref.dv.data());
  return ref;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> floats_of(const std::vector<std::byte>& bytes, DType dtype) {
  std::vector<float> x(bytes.size() / static_cast<size_t>(dtype_bytes(dtype)));
  to_float(dtype, bytes.data(), x.data(), static_cast<int64_t>(x.size()));
  return x;
}

// The rounding of an fp32 O into `dtype`, as bytes.
std::vector<std::byte> rounded_bytes(const std::vector<std::byte>& fp32, DType dtype) {
  const std::vector<float> values = floats_of(fp32, DType::f32);
  std::vector<std::byte> out(values.size() * static_cast<size_t>(dtype_bytes(dtype)));
  from_float(dtype, values.data(), out.data(), static_cast<int64_t>(values.size()));
  return out;
}

double error_of(const std::vector<float>& got, const std::vector<double>& expected) {
  return relative_error(got.data(), expected.data(), static_cast<int64_t>(got.size()));
}

double output_bound(DType dtype) {
  return dtype == DType::bf16 ? kBf16OutputBound : kF16OutputBound;
}
double delta_gradient_bound(DType dtype) {
  return dtype == DType::bf16 ? kBf16DeltaGradientBound : kF16DeltaGradientBound;
}

// The 16-bit run equals the fp32 run on the widened inputs (see the top).
void expect_exact(const Run& typed, const Run& wide, DType dtype) {
  EXPECT_TRUE(typed.out == rounded_bytes(wide.out, dtype)) << "O";
  EXPECT_TRUE(same_bits(typed.lse, wide.lse)) << "LSE";
  EXPECT_TRUE(same_bits(typed.acc, wide.acc)) << "partial acc";
  EXPECT_TRUE(same_bits(typed.row_max, wide.row_max)) << "partial row max";
  EXPECT_TRUE(same_bits(typed.row_sum, wide.row_sum)) << "partial row sum";
  EXPECT_TRUE(typed.final_out == rounded_bytes(wide.final_out, dtype)) << "finalized O";
  EXPECT_TRUE(same_bits(typed.final_lse, wide.final_lse)) << "finalized LSE";
  EXPECT_TRUE(same_bits(typed.dq, wide.dq)) << "dQ, delta given";
  EXPECT_TRUE(same_bits(typed.dk, wide.dk)) << "dK, delta given";
  EXPECT_TRUE(same_bits(typed.dv, wide.dv)) << "dV, delta given";
  EXPECT_TRUE(same_bits(typed.dq_o, wide.dq_o)) << "dQ, delta from O";
  EXPECT_TRUE(same_bits(typed.dk_o, wide.dk_o)) << "dK, delta from O";
  EXPECT_TRUE(same_bits(typed.dv_o, wide.dv_o)) << "dV, delta from O";
}

// On every path that differs on 16-bit inputs, or on `paths` only where given; bf16 and fp16, or
// `dtypes` only.
void check_case(const Case& c, const std::vector<KernelPath>& paths = bf16_paths(),
                const std::vector<DType>& dtypes = {DType::bf16, DType::f16}) {
  for (const DType dtype : dtypes) {
    const Rounded r = make_rounded(c, dtype);
    const AttentionShape& s = r.p.shape;
    const Reference ref = reference_of(r, c);
    const RunInputs fp32_in = inputs_of(r, false), typed_in = inputs_of(r, true);
    for (const KernelPath path : paths) {
      const PathScope scope(path);
      const std::string tag = std::string(dtype_name(dtype)) + "_" + kernel_path_name(path);
      SCOPED_TRACE(tag + " " + c.name());

      Run wide = run_forward(r, c, fp32_in);
      Run typed = run_forward(r, c, typed_in);
      // delta given: from the fp32 O and the rounded dO, the same array for both runs.
      std::vector<float> delta(static_cast<size_t>(s.batch * s.heads * s.q_tokens));
      compute_delta({s.batch, s.q_tokens, s.heads, s.head_dim},
                    in_view(wide.out.data(), DType::f32, s.q_tokens, s.heads, s.head_dim),
                    fp32_in.d_out, dense_rows(delta.data(), s.heads, s.q_tokens));
      // delta from O: the 16-bit O, which the fp32 run gets widened.
      const std::vector<float> typed_out_wide = floats_of(typed.out, dtype);
      run_backward(r, c, fp32_in, delta,
                   in_view(typed_out_wide.data(), DType::f32, s.q_tokens, s.heads, s.head_dim),
                   wide);
      run_backward(r, c, typed_in, delta,
                   in_view(typed.out.data(), dtype, s.q_tokens, s.heads, s.head_dim), typed);

      // (a) exactness, except for the bf16 kernels of the avx512bf16 and amx paths.
      const bool native =
          (path == KernelPath::amx || path == KernelPath::avx512bf16) && dtype == DType::bf16;
      if (!native) expect_exact(typed, wide, dtype);

      // (b) accuracy against the fp64 reference on the rounded inputs.
      const double o_bound = native ? kTensorCoreBf16OutputBound : output_bound(dtype);
      const double delta_bound =
          native ? kTensorCoreBf16DeltaGradientBound : delta_gradient_bound(dtype);
      // Their backward rounds P and dS too (tensor-core bounds for every gradient).
      const double q_k_bound = native ? kTensorCoreBf16DeltaGradientBound : kFp32RelativeBound;
      const double v_bound = native ? kTensorCoreBf16ValueGradientBound : kFp32RelativeBound;
      const struct {
        const char* name;
        double error, bound;
      } errors[] = {
          {"o", error_of(typed_out_wide, ref.out), o_bound},
          {"lse", error_of(typed.lse, ref.lse), kFp32RelativeBound},
          {"final_o", error_of(floats_of(typed.final_out, dtype), ref.out), o_bound},
          {"final_lse", error_of(typed.final_lse, ref.lse), kFp32RelativeBound},
          {"dq", error_of(typed.dq, ref.dq), q_k_bound},
          {"dk", error_of(typed.dk, ref.dk), q_k_bound},
          {"dv", error_of(typed.dv, ref.dv), v_bound},
          {"dq_o", error_of(typed.dq_o, ref.dq), delta_bound},
          {"dk_o", error_of(typed.dk_o, ref.dk), delta_bound},
          {"dv_o", error_of(typed.dv_o, ref.dv), v_bound},
      };
      for (const auto& e : errors) {
        EXPECT_LE(e.error, e.bound) << e.name;
        char value[32];
        std::snprintf(value, sizeof value, "%.3e", e.error);
        ::testing::Test::RecordProperty("err_" + std::string(e.name) + "_" + tag, value);
      }
    }
  }
}

Case make_case(int64_t batch, int64_t heads, int64_t kv_heads, int64_t q_tokens, int64_t kv_tokens,
               int64_t dim, Mask mask, Positions positions, int threads) {
  Case c;
  c.batch = batch;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.q_tokens = q_tokens;
  c.kv_tokens = kv_tokens;
  c.head_dim = dim;
  c.mask = mask;
  c.positions = positions;
  c.threads = threads;
  return c;
}

TEST(KernelDtypes, OddLengthGqaCausal) {
  // 37 rows: one partial panel, tile and block everywhere; GQA 12:4.
  check_case(make_case(1, 12, 4, 37, 37, 64, Mask::causal(), Positions::contiguous, 1));
}

TEST(KernelDtypes, ThousandTokensMqaWindowTwoThreads) {
  // 1000 tokens: several query tiles of the AVX2 forward, 4 key tiles of 256 and 11 of 96;
  // MQA (4 query heads on one K/V head), head dim 80, a window that cuts tiles.
  check_case(
      make_case(1, 4, 1, 1000, 1000, 80, Mask::causal_window(100), Positions::contiguous, 2));
}

TEST(KernelDtypes, CrossLengthsNoMaskBatch2) {
  // Nq < Nk, no mask, batch 2, MQA 8:1, head dim 96, two threads.
  check_case(make_case(2, 8, 1, 200, 333, 96, Mask::none(), Positions::contiguous, 2));
}

TEST(KernelDtypes, ShuffledCausalOddHeadDim) {
  // Nq > Nk, unordered positions (every tile partial), head dim 33 (a vector tail of 1).
  check_case(make_case(1, 4, 2, 150, 97, 33, Mask::causal(), Positions::shuffled, 2));
}

TEST(KernelDtypes, WindowArbitraryPositionsBatch2) {
  check_case(make_case(2, 3, 3, 61, 300, 64, Mask::causal_window(23), Positions::arbitrary, 1));
}

TEST(KernelDtypes, NonFiniteInputs) {
  // A NaN in Q and V and an infinity in K: the dispatcher's finiteness check reads the 16-bit
  // patterns, so these inputs take the portable path exactly as their fp32 widening does, and
  // the rows the mask keeps from them stay finite.
  Case c = make_case(1, 2, 1, 120, 120, 40, Mask::causal(), Positions::contiguous, 1);
  c.nan_q_row = 70;
  c.inf_k_row = 90;
  c.nan_v_row = 50;
  check_case(c);
}

TEST(KernelDtypes, HeadDim128Causal) {
  check_case(make_case(1, 2, 2, 300, 300, 128, Mask::causal(), Positions::contiguous, 2));
}

// The AVX-512 path on its own (the tests above include it wherever it is supported), so that a
// CPU or build without it reports this test as skipped: head dims its 32-dim value blocks pad (80)
// and fill (128), GQA 12:4, an odd query count, a causal window and arbitrary positions.
TEST(KernelDtypes, Avx512GqaWindowHeadDims80And128) {
  if (!kernel_path_supported(KernelPath::avx512)) {
    GTEST_SKIP() << "no AVX-512 path: this CPU lacks AVX-512 F/BW/DQ/VL (or the build has no "
                    "AVX-512 code)";
  }
  for (const int64_t dim : {80, 128}) {
    check_case(make_case(1, 12, 4, 61, 130, dim, Mask::causal_window(40), Positions::arbitrary, 1),
               {KernelPath::avx512});
  }
}

// The bf16 kernels of the avx512bf16 and amx paths on their own, so that a CPU or build without a
// path reports its tests as skipped: sizes around the 16-row tiles, 32-row items, 32-key chunks
// and 128-key blocks; head dims around the 32-dim chunks (1 to 256); every mask kind on every
// position layout, softcap, GQA and two threads. Each against the fp64 reference (check_case; the
// avx512 run is skipped here, the tests above run it).
void native_tile_and_block_edges(KernelPath path) {
  const std::vector<std::pair<int64_t, int64_t>> sizes = {
      {1, 1},   {15, 31}, {16, 32}, {17, 33}, {31, 127}, {32, 128},
      {33, 129}, {2, 255}, {65, 300}, {100, 513}};
  for (const auto& [nq, nk] : sizes) {
    for (const Mask& mask : {Mask::none(), Mask::causal()}) {
      check_case(make_case(1, 2, 1, nq, nk, 40, mask, Positions::contiguous, 1), {path},
                 {DType::bf16});
    }
  }
}

void native_head_dims(KernelPath path) {
  for (const int64_t dim : {1, 3, 17, 33, 64, 80, 96, 128, 130, 192, 256}) {
    check_case(make_case(1, 3, 3, 61, 101, dim, Mask::causal_window(19), Positions::contiguous, 1),
               {path}, {DType::bf16});
  }
}

void native_masks_positions_softcap_threads(KernelPath path) {
  const std::vector<Mask> masks = {
      Mask::causal(),
      Mask::causal_window(23),
      Mask::window_size(9, 5),
      Mask::window_size(60, 60).with_documents({1, 3, 200, 7, 1000, 1789}),
      Mask::causal().with_documents({1, 1, 3, 1, 7, 23, 2, 1, 97, 5, 2000, 859}),
      Mask::from_ranges(parse_mask_ranges("prefix-lm:97", 3000)),
      Mask::from_ranges(parse_mask_ranges("random:24:5", 3000))};
  int cases = 0;
  for (const Mask& mask : masks) {
    for (const Positions positions :
         {Positions::contiguous, Positions::strided, Positions::arbitrary, Positions::shuffled}) {
      Case c = make_case(1, 4, 2, 150, 270, 64, mask, positions, cases % 2 + 1);
      c.softcap = cases % 3 == 1 ? 1.5f : 0.0f;
      check_case(c, {path}, {DType::bf16});
      ++cases;
    }
  }
}

#define A2D_SKIP_WITHOUT_AMX()                                                                 \
  if (!kernel_path_supported(KernelPath::amx))                                                 \
  GTEST_SKIP() << "no amx path: this CPU lacks AMX-TILE, AMX-BF16 or AVX512-BF16 (or Linux " \
                  "refused the tile state, or the build has no AMX code)"
#define A2D_SKIP_WITHOUT_AVX512BF16()                                                    \
  if (!kernel_path_supported(KernelPath::avx512bf16))                                    \
  GTEST_SKIP() << "no avx512bf16 path: this CPU lacks AVX512-BF16 (or AVX-512), or the " \
                  "build has no AVX512-BF16 code"

TEST(KernelDtypes, AmxTileAndBlockEdges) {
  A2D_SKIP_WITHOUT_AMX();
  native_tile_and_block_edges(KernelPath::amx);
}
TEST(KernelDtypes, AmxHeadDims) {
  A2D_SKIP_WITHOUT_AMX();
  native_head_dims(KernelPath::amx);
}
TEST(KernelDtypes, AmxMasksPositionsSoftcapThreads) {
  A2D_SKIP_WITHOUT_AMX();
  native_masks_positions_softcap_threads(KernelPath::amx);
}
TEST(KernelDtypes, Avx512Bf16TileAndBlockEdges) {
  A2D_SKIP_WITHOUT_AVX512BF16();
  native_tile_and_block_edges(KernelPath::avx512bf16);
}
TEST(KernelDtypes, Avx512Bf16HeadDims) {
  A2D_SKIP_WITHOUT_AVX512BF16();
  native_head_dims(KernelPath::avx512bf16);
}
TEST(KernelDtypes, Avx512Bf16MasksPositionsSoftcapThreads) {
  A2D_SKIP_WITHOUT_AVX512BF16();
  native_masks_positions_softcap_threads(KernelPath::avx512bf16);
}

// Two-sided windows and range masks in bf16 and fp16 (every path): the same bits as the fp32
// kernel on the widened inputs, within the bounds of the reference.
TEST(KernelDtypes, WindowsAndRangeMasks) {
  check_case(make_case(1, 4, 2, 97, 131, 64, Mask::window_size(9, 5), Positions::arbitrary, 1));
  check_case(make_case(2, 2, 1, 61, 61, 48, Mask::from_ranges(parse_mask_ranges("random:12:2", 61)),
                       Positions::contiguous, 2));
  check_case(make_case(1, 3, 3, 75, 75, 80,
                       Mask::from_ranges(parse_mask_ranges("prefix-lm:20", 75)),
                       Positions::shuffled, 1));
}

}  // namespace
}  // namespace a2d::test
