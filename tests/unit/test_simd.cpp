// The building blocks of the AVX2 and AVX-512 vector layers on their own: the vectorised exp2
// against the exact function, and the micro-kernel against a plain triple loop, for every block
// shape the kernels instantiate. A layer this CPU or build lacks is reported as skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "simd_probe.hpp"

namespace a2d::test {
namespace {

class Simd : public ::testing::TestWithParam<const SimdProbe*> {
 protected:
  void SetUp() override {
    if (!kernel_path_supported(probe().path)) {
      GTEST_SKIP() << "no " << probe().name << " path on this CPU or build";
    }
  }
  static const SimdProbe& probe() { return *GetParam(); }
};

TEST_P(Simd, Exp2IsWithinTwoUlpOverTheUsedRange) {
  // Every argument the kernels produce lies in [-127, 127] (scores minus their row maximum or
  // LSE, in log2 units); sample it densely, plus the points where f = x - round(x) is +-0.5.
  std::vector<float> x;
  for (int i = -1270000; i <= 1270000; ++i)
    x.push_back(static_cast<float>(i) * 1e-4f);
  for (int n = -126; n <= 126; ++n) {
    x.push_back(n + 0.5f);
    x.push_back(std::nextafter(n + 0.5f, 0.0f));
  }
  while (x.size() % 16)
    x.push_back(0.0f);
  std::vector<float> got(x.size());
  probe().exp2(x.data(), got.data(), static_cast<int64_t>(x.size()));
  double worst_ulp = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double exact = std::exp2(static_cast<double>(x[i]));
    if (exact < std::numeric_limits<float>::min()) {
      // Below the smallest normal float the kernel may flush to zero.
      EXPECT_LE(got[i], 2 * std::numeric_limits<float>::min()) << x[i];
      continue;
    }
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    worst_ulp = std::max(worst_ulp, std::abs(got[i] - exact) / ulp);
  }
  RecordProperty("exp2_worst_ulp", std::to_string(worst_ulp));
  EXPECT_LE(worst_ulp, 2.0);
}

TEST_P(Simd, Exp2EdgeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, -1000.0f, -127.0f, -126.6f, 0.0f, 1.0f, -1.0f, std::nanf("")};
  x.resize(16, 0.0f);
  std::vector<float> got(16);
  probe().exp2(x.data(), got.data(), probe().lanes);
  EXPECT_EQ(got[0], 0.0f);  // masked scores vanish exactly
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_EQ(got[2], 0.0f);
  EXPECT_EQ(got[3], 0.0f);
  EXPECT_EQ(got[4], 1.0f);  // the row maximum gives exactly 1
  EXPECT_EQ(got[5], 2.0f);
  EXPECT_EQ(got[6], 0.5f);
  EXPECT_TRUE(std::isnan(got[7]));
}

TEST_P(Simd, MicroKernelMatchesPlainLoops) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  // The blocks the kernels use: AVX2 6 x 2 and 1..4 x 3 (scores); AVX-512 also 12 x 2.
  const int shapes[][2] = {{12, 2}, {6, 2}, {4, 3}, {3, 3}, {2, 3}, {1, 3}};
  for (const auto& [rows, vectors] : shapes) {
    if (probe().lanes == 8 && rows == 12) continue;  // 27 of 16 ymm registers
    for (const bool row_major : {true, false}) {
      for (const int64_t depth : {1, 7, 96}) {
        const int64_t cols = probe().lanes * vectors;
        const int64_t a_stride = row_major ? depth + 3 : rows + 5;  // gaps between rows/columns
        const int64_t b_step = cols + 2;
        std::vector<float> a(static_cast<size_t>((row_major ? rows : depth) * a_stride));
        std::vector<float> b(static_cast<size_t>(depth * b_step));
        for (float& e : a)
          e = value(rng);
        for (float& e : b)
          e = value(rng);
        std::vector<float> c(static_cast<size_t>(rows * cols));
        ASSERT_TRUE(probe().multiply(rows, vectors, row_major, a.data(), a_stride, b.data(), b_step,
                                     depth, c.data(), cols));
        for (int m = 0; m < rows; ++m) {
          for (int64_t n = 0; n < cols; ++n) {
            double expected = 0.0;
            for (int64_t k = 0; k < depth; ++k) {
              const float a_mk = row_major ? a[m * a_stride + k] : a[k * a_stride + m];
              expected += static_cast<double>(a_mk) * b[k * b_step + n];
            }
            EXPECT_NEAR(c[m * cols + n], expected, 1e-5 * (1 + depth))
                << rows << "x" << vectors << " row_major=" << row_major << " depth=" << depth;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, Simd, ::testing::Values(&kAvx2Probe, &kAvx512Probe),
                         [](const auto& p) { return std::string(p.param->name); });

}  // namespace
}  // namespace a2d::test
