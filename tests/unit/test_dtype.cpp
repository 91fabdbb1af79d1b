// The element types and their conversions (dtype.hpp, load_row/store_row of kernel.hpp, and the
// AVX2 kernels' vector conversions): every binary16 and bfloat16 bit pattern, and fp32 values at
// and on both sides of every rounding boundary (ties to even, subnormals, overflow, zeros, NaN).
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "simd_probe.hpp"

namespace a2d::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
float float_of(uint32_t bits) {
  return std::bit_cast<float>(bits);
}
bool f16_is_nan(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}
bool bf16_is_nan(uint16_t h) {
  return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

// The value of a binary16 pattern, from its definition (in double, exact).
double f16_value(uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 0x1f;
  const int fraction = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = fraction ? std::numeric_limits<double>::quiet_NaN() : HUGE_VAL;
  } else if (exponent == 0) {
    magnitude = std::ldexp(fraction, -24);
  } else {
    magnitude = std::ldexp(1024 + fraction, exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(parse_dtype("fp32"), DType::f32);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_THROW(parse_dtype("fp8"), Error);
  EXPECT_STREQ(dtype_name(DType::f32), "fp32");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::f16), "fp16");
  EXPECT_EQ(dtype_bytes(DType::f32), 4);
  EXPECT_EQ(dtype_bytes(DType::bf16), 2);
  EXPECT_EQ(dtype_bytes(DType::f16), 2);
}

TEST(DType, F16EveryPatternWidensExactlyAndRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = f16_to_float(h);
    const uint16_t back = float_to_f16(f);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_TRUE(f16_is_nan(back)) << std::hex << i;
      EXPECT_EQ(back & 0x8000u, h & 0x8000u) << std::hex << i;  // the sign
      EXPECT_NE(back & 0x0200u, 0u) << std::hex << i;           // quiet
      EXPECT_EQ(back | 0x0200u, h | 0x0200u) << std::hex << i;  // the payload
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), f16_value(h)) << std::hex << i;
    ASSERT_EQ(back, h) << std::hex << i;  // zeros keep their sign, infinities stay infinite
  }
}

TEST(DType, Bf16EveryPatternWidensExactlyAndRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = bf16_to_float(h);
    ASSERT_EQ(bits_of(f), i << 16) << std::hex << i;
    const uint16_t back = float_to_bf16(f);
    if (bf16_is_nan(h)) {
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << i;
      EXPECT_EQ(back, h | 0x0040u) << std::hex << i;  // quiet, sign and payload kept
      continue;
    }
    ASSERT_EQ(back, h) << std::hex << i;
  }
}

// fp32 values at and around every boundary where rounding to binary16 changes its answer: for
// every pair of neighbouring non-negative binary16 values a < b (subnormals included), the
// midpoint (exact in fp32: 12 significant bits) and its fp32 neighbours; then the same negated.
// Each with the binary16 pattern it must round to.
struct Expected {
  float value;
  uint16_t bits;
};

std::vector<Expected> f16_boundaries() {
  std::vector<Expected> cases;
  for (uint16_t a = 0; a < 0x7c00u; ++a) {
    const auto b = static_cast<uint16_t>(a + 1);  // 0x7c00 = infinity after 65504
    const double low = f16_value(a);
    const double high = b == 0x7c00u ? 65536.0 : f16_value(b);  // infinity's "neighbour"
    const auto mid = static_cast<float>((low + high) / 2);
    EXPECT_EQ(static_cast<double>(mid), (low + high) / 2) << "midpoint not exact " << a;
    const uint16_t even = (a & 1u) ? b : a;
    cases.push_back({static_cast<float>(low), a});
    cases.push_back({mid, even});
    cases.push_back({std::nextafter(mid, 0.0f), a});
    cases.push_back({std::nextafter(mid, kInf), b});
  }
  // Overflow: 65504 is the largest finite value, 65520 (= 65504 + half an ulp) the first that
  // becomes infinity; everything beyond too.
  cases.push_back({65504.0f, 0x7bffu});
  cases.push_back({std::nextafter(65520.0f, 0.0f), 0x7bffu});
  cases.push_back({65520.0f, 0x7c00u});
  cases.push_back({65536.0f, 0x7c00u});
  cases.push_back({1e10f, 0x7c00u});
  cases.push_back({FLT_MAX, 0x7c00u});
  cases.push_back({kInf, 0x7c00u});
  // Underflow: half the smallest subnormal (2^-25) is a tie and goes to the even side, zero.
  cases.push_back({0x1p-25f, 0x0000u});
  cases.push_back({std::nextafter(0x1p-25f, kInf), 0x0001u});
  cases.push_back({0x1p-26f, 0x0000u});
  cases.push_back({FLT_MIN, 0x0000u});
  cases.push_back({std::numeric_limits<float>::denorm_min(), 0x0000u});
  cases.push_back({0.0f, 0x0000u});
  const size_t positive = cases.size();
  for (size_t i = 0; i < positive; ++i)
    cases.push_back({-cases[i].value, static_cast<uint16_t>(cases[i].bits | 0x8000u)});
  return cases;
}

// The same for bfloat16 (9 significant bits at a midpoint, exact in fp32), over every
// neighbouring pair of non-negative bf16 values, fp32 subnormals included.
std::vector<Expected> bf16_boundaries() {
  std::vector<Expected> cases;
  for (uint32_t a = 0; a < 0x7f80u; ++a) {
    const uint32_t b = a + 1;
    const double low = bf16_to_float(static_cast<uint16_t>(a));
    const double high =
        b == 0x7f80u ? std::ldexp(1.0, 128) : bf16_to_float(static_cast<uint16_t>(b));
    const double mid_exact = (low + high) / 2;
    const uint16_t even = static_cast<uint16_t>((a & 1u) ? b : a);
    cases.push_back({static_cast<float>(low), static_cast<uint16_t>(a)});
    if (b == 0x7f80u) {
      // The midpoint between the largest finite bf16 and 2^128 is 0x7f7f8000 in fp32; it and
      // everything above (FLT_MAX = 0x7f7fffff included) becomes infinity.
      cases.push_back({float_of(0x7f7f8000u), 0x7f80u});
      cases.push_back({float_of(0x7f7f7fffu), 0x7f7fu});
      cases.push_back({FLT_MAX, 0x7f80u});
      continue;
    }
    const auto mid = static_cast<float>(mid_exact);
    EXPECT_EQ(static_cast<double>(mid), mid_exact) << "midpoint not exact " << a;
    cases.push_back({mid, even});
    cases.push_back({std::nextafter(mid, 0.0f), static_cast<uint16_t>(a)});
    cases.push_back({std::nextafter(mid, kInf), static_cast<uint16_t>(b)});
  }
  cases.push_back({kInf, 0x7f80u});
  cases.push_back({0.0f, 0x0000u});
  const size_t positive = cases.size();
  for (size_t i = 0; i < positive; ++i)
    cases.push_back({-cases[i].value, static_cast<uint16_t>(cases[i].bits | 0x8000u)});
  return cases;
}

TEST(DType, F16RoundsToNearestEvenAtEveryBoundary) {
  const std::vector<Expected> cases = f16_boundaries();
  int failures = 0;
  for (const Expected& c : cases) {
    const uint16_t got = float_to_f16(c.value);
    if (got != c.bits && ++failures <= 20) {
      ADD_FAILURE() << std::hexfloat << c.value << " -> " << std::hex << got << ", expected "
                    << c.bits;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << cases.size();
  // Negative zero keeps its sign; so do values that underflow to zero.
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_f16(-1e-30f), 0x8000u);
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000u)));
}

TEST(DType, Bf16RoundsToNearestEvenAtEveryBoundary) {
  const std::vector<Expected> cases = bf16_boundaries();
  int failures = 0;
  for (const Expected& c : cases) {
    const uint16_t got = float_to_bf16(c.value);
    if (got != c.bits && ++failures <= 20) {
      ADD_FAILURE() << std::hexfloat << c.value << " -> " << std::hex << got << ", expected "
                    << c.bits;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << cases.size();
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000u);
  // Ties to even on ordinary values: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80u);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82u);
}

TEST(DType, NaNStaysNaNAndQuiet) {
  // Signalling NaNs whose payload lies only in bits a truncation would drop: they must not
  // become infinity.
  for (const uint32_t nan : {0x7f800001u, 0x7f800100u, 0x7fa00000u, 0xff800001u, 0x7fc00000u,
                             0xffffffffu, 0x7f802000u}) {
    const float x = float_of(nan);
    const uint16_t b = float_to_bf16(x);
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << nan << " -> " << b;
    EXPECT_NE(b & 0x0040u, 0u) << std::hex << nan;
    EXPECT_EQ(b & 0x8000u, (nan >> 16) & 0x8000u) << std::hex << nan;
    const uint16_t h = float_to_f16(x);
    EXPECT_TRUE(f16_is_nan(h)) << std::hex << nan << " -> " << h;
    EXPECT_NE(h & 0x0200u, 0u) << std::hex << nan;
    EXPECT_EQ(h & 0x8000u, (nan >> 16) & 0x8000u) << std::hex << nan;
    EXPECT_TRUE(std::isnan(round_to(DType::bf16, x)));
    EXPECT_TRUE(std::isnan(round_to(DType::f16, x)));
  }
}

TEST(DType, RoundToAndArrayConversions) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::vector<float> values;
  for (int i = 0; i < 4096; ++i) {
    const float x = float_of(any_bits(rng));
    if (!std::isnan(x)) values.push_back(x);
  }
  for (float x : {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, FLT_MAX, kInf, -kInf, 0x1p-25f})
    values.push_back(x);
  const auto count = static_cast<int64_t>(values.size());
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<std::byte> stored(static_cast<size_t>(count * dtype_bytes(dtype)));
    from_float(dtype, values.data(), stored.data(), count);
    std::vector<float> widened(values.size());
    to_float(dtype, stored.data(), widened.data(), count);
    for (size_t i = 0; i < values.size(); ++i) {
      const float x = values[i];
      float expected = x;
      if (dtype == DType::bf16) expected = bf16_to_float(float_to_bf16(x));
      if (dtype == DType::f16) expected = f16_to_float(float_to_f16(x));
      ASSERT_EQ(bits_of(round_to(dtype, x)), bits_of(expected)) << std::hexfloat << x;
      ASSERT_EQ(bits_of(widened[i]), bits_of(expected)) << std::hexfloat << x;
      // Rounding is idempotent: a stored value is its own rounding.
      ASSERT_EQ(bits_of(round_to(dtype, expected)), bits_of(expected)) << std::hexfloat << x;
    }
  }
  // Zero counts touch nothing.
  from_float(DType::bf16, nullptr, nullptr, 0);
  to_float(DType::f16, nullptr, nullptr, 0);
}

// load_row widens every 16-bit pattern to the bits of bf16_to_float / f16_to_float (its fp16
// conversion is a branch-free rewrite, so that the portable kernels' row loops vectorise).
TEST(DType, LoadRowWidensEveryPattern) {
  std::vector<uint16_t> patterns(65536);
  for (size_t i = 0; i < patterns.size(); ++i)
    patterns[i] = static_cast<uint16_t>(i);
  std::vector<float> loaded(patterns.size());
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    load_row(reinterpret_cast<const std::byte*>(patterns.data()), dtype,
             static_cast<int64_t>(patterns.size()), loaded.data());
    for (size_t i = 0; i < patterns.size(); ++i) {
      const float expected =
          dtype == DType::bf16 ? bf16_to_float(patterns[i]) : f16_to_float(patterns[i]);
      ASSERT_EQ(bits_of(loaded[i]), bits_of(expected)) << std::hex << i;
    }
  }
}

// load_row and store_row, the portable kernels' conversions: the same bits as to_float and
// from_float, with the scale as one fp32 product per element, on rows at any 2-byte offset.
TEST(DType, LoadRowAndStoreRow) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t count = 45;
  std::vector<float> values(count);
  for (float& x : values)
    x = normal(rng);
  values[3] = 1e6f;  // beyond fp16's range
  values[4] = -0.0f;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t bytes = dtype_bytes(dtype);
    // An offset of one 16-bit element: bf16 and fp16 rows need not be 4-byte aligned.
    std::vector<std::byte> buffer(static_cast<size_t>((count + 2) * bytes));
    std::byte* row = buffer.data() + (dtype == DType::f32 ? 4 : 2);
    store_row(values.data(), count, row, dtype);
    std::vector<std::byte> expected(static_cast<size_t>(count * bytes));
    from_float(dtype, values.data(), expected.data(), count);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), row));
    std::vector<float> widened(count), loaded(count), scaled(count);
    to_float(dtype, expected.data(), widened.data(), count);
    load_row(row, dtype, count, loaded.data());
    load_row(row, dtype, count, scaled.data(), 0.125f * 3);
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_EQ(bits_of(loaded[i]), bits_of(widened[i])) << i;
      EXPECT_EQ(bits_of(scaled[i]), bits_of(0.375f * widened[i])) << i;
    }
  }
}

class VectorConversions : public ::testing::TestWithParam<const SimdProbe*> {};

// The AVX2 and AVX-512 kernels convert with F16C (AVX-512: vcvtph2ps/vcvtps2ph on zmm) and
// integer shifts; they must give the scalar functions' bits on every 16-bit pattern (widening)
// and on every boundary value and random fp32 patterns (narrowing). The counts are not multiples
// of 8 or 16, so the one-at-a-time tails run too.
TEST_P(VectorConversions, EqualTheScalarOnes) {
  const SimdProbe& probe = *GetParam();
  if (!kernel_path_supported(probe.path)) {
    GTEST_SKIP() << "no " << probe.name << " path on this CPU or build";
  }
  std::vector<uint16_t> patterns(65536 + 5);
  for (size_t i = 0; i < patterns.size(); ++i)
    patterns[i] = static_cast<uint16_t>(i * 40503u);  // odd multiplier: every pattern once
  const auto count = static_cast<int64_t>(patterns.size());
  std::vector<float> widened(patterns.size());
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    probe.widen(dtype, patterns.data(), widened.data(), count);
    for (size_t i = 0; i < patterns.size(); ++i) {
      const uint16_t h = patterns[i];
      const float expected = dtype == DType::bf16 ? bf16_to_float(h) : f16_to_float(h);
      if (std::isnan(expected)) {
        // F16C quiets a signalling NaN as it widens; the scalar widening keeps it as it is.
        ASSERT_TRUE(std::isnan(widened[i])) << std::hex << h;
        ASSERT_EQ(bits_of(widened[i]) | 0x00400000u, bits_of(expected) | 0x00400000u)
            << std::hex << h;
        continue;
      }
      ASSERT_EQ(bits_of(widened[i]), bits_of(expected)) << std::hex << h;
    }
  }

  std::vector<float> values;
  for (const Expected& e : f16_boundaries())
    values.push_back(e.value);
  for (const Expected& e : bf16_boundaries())
    values.push_back(e.value);
  std::mt19937 rng(17);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < (1 << 18); ++i)
    values.push_back(float_of(any_bits(rng)));
  for (const uint32_t nan : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fbfffffu, 0xffffffffu})
    values.push_back(float_of(nan));
  values.push_back(0.0f);  // so that the count is odd
  std::vector<uint16_t> narrowed(values.size());
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    probe.narrow(dtype, values.data(), narrowed.data(), static_cast<int64_t>(values.size()));
    int failures = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t expected =
          dtype == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
      if (narrowed[i] != expected && ++failures <= 20) {
        ADD_FAILURE() << std::hex << bits_of(values[i]) << " -> " << narrowed[i] << ", expected "
                      << expected;
      }
    }
    EXPECT_EQ(failures, 0) << "of " << values.size();
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, VectorConversions, ::testing::Values(&kAvx2Probe, &kAvx512Probe),
                         [](const auto& p) { return std::string(p.param->name); });

}  // namespace
}  // namespace a2d::test
