// The AVX512-BF16 peak probe of measure_product_peak (src/backends/cpu/kernels/peak.cpp).
#include <cstdint>

#include "backends/cpu/kernels/avx512/simd.hpp"  // first: <immintrin.h> (see there)
#include "backends/cpu/kernels/paths.hpp"

namespace a2d::cpu::avx512bf16 {

// 12 independent accumulator chains (zmm), 12 VDPBF16PS per iteration, each 16 lanes x 2 bf16
// products and their sums (4 flops per lane), on operands that stay in registers. The operands
// are bf16 2^-7 and 1, so the sums grow by 2^-6 an iteration: exact, finite for the iteration
// counts the probe uses. Returns a value that depends on every chain.
float dot_chains(int64_t iterations) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
#pragma GCC unroll 12
  for (int c = 0; c < kChains; ++c)
    acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const auto x = (__m512bh)_mm512_set1_epi16(0x3c00);  // 2^-7
  const auto y = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c)
      acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
  }
  __m512 sum = acc[0];
#pragma GCC unroll 12
  for (int c = 1; c < kChains; ++c)
    sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_cvtss_f32(sum);
}

}  // namespace a2d::cpu::avx512bf16
