// The AVX-512 loop of measure_fma_peak (src/backends/cpu/kernels/peak.cpp).
#include <cstdint>

#include "backends/cpu/kernels/paths.hpp"
#include "simd.hpp"

namespace a2d::cpu::avx512 {

// 12 independent accumulator chains (zmm), 12 vfmadd231ps per iteration; returns a value that
// depends on every chain so that nothing is optimised away.
float fma_chains(int64_t iterations) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
#pragma GCC unroll 12
  for (int c = 0; c < kChains; ++c)
    acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 x = _mm512_set1_ps(0.999f);  // a fixed point at y / (1 - x): values stay finite
  const __m512 y = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c)
      acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  }
  __m512 sum = acc[0];
#pragma GCC unroll 12
  for (int c = 1; c < kChains; ++c)
    sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_cvtss_f32(sum);
}

}  // namespace a2d::cpu::avx512
