// Internal: AVX2/FMA building blocks of the fast CPU kernels: a vectorised exp and the
// register-blocked micro-kernel every tile product is made of.
//
// Include this only from translation units compiled with -mavx2 -mfma -mf16c (CMake does that for
// the files in this directory). Everything here has internal linkage: an inline function compiled
// with AVX2 must never be shared, through the linker's choice of one copy of an inline
// function, with code that runs on the portable path of a CPU without AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace a2d::cpu::avx2 {
namespace {

constexpr int kLanes = 8;  // fp32 lanes of a ymm register

#define A2D_INLINE inline __attribute__((always_inline))
// The functions that run a micro-kernel over a whole depth are kept out of line: compiled on
// their own, the 12 accumulators, the B vectors and the broadcast fill the 16 ymm registers
// without spilling, which inlined into a large caller they did not always do.
#define A2D_NOINLINE __attribute__((noinline))

// 2^x for 8 lanes. x is split into n = round(x) and f = x - n in [-0.5, 0.5]; 2^f is a degree-6
// polynomial (near-minimax: Chebyshev interpolation of 2^f, approximation error 2.5e-9 relative;
// with fp32 rounding of the Horner steps the result is within 2 ulp of 2^x, see
// tests/unit/test_kernel_paths.cpp) and 2^n is built in the exponent bits. x <= -126.5 (and -inf)
// gives exactly 0, so masked scores (-inf) and rows far below the maximum vanish without a
// branch; NaN stays NaN.
A2D_INLINE __m256 exp2_lanes(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);  // this operand order lets NaN through
  x = _mm256_min_ps(_mm256_set1_ps(127.0f), x);
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.5461444854736328e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3400427997112274e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618056938052177e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550327152013779e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24022650718688965f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931471824645996f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  // n = -127 gives the bit pattern 0, i.e. 2^n = 0.
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

constexpr float kLog2e = 1.44269504088896340736f;

// exp(s - offset / log2(e)) = 2^(s log2(e) - offset): the subtraction rides in the FMA, so a
// score tile costs no extra pass to leave the natural-log domain.
A2D_INLINE __m256 exp_shifted(__m256 s, __m256 offset_log2) {
  return exp2_lanes(_mm256_fmsub_ps(s, _mm256_set1_ps(kLog2e), offset_log2));
}

// cap * tanh(s / cap) for 8 lanes (logit softcapping): tanh(y) = sign(y) (1 - e) / (1 + e),
// e = exp(-2 |y|) = 2^(-2 log2(e) |y|), and below |y| = 1/8, where 1 - e would cancel, the odd
// Taylor polynomial to y^7 (next term 62/2835 y^9 < 3e-10 relative there). 1 - e and 1 + e are
// exact to an ulp of 1, so the large-|y| branch is within a few ulp of tanh (and exactly 1 once
// e underflows).
A2D_INLINE __m256 softcap_lanes(__m256 s, __m256 cap, __m256 inverse_cap) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 y = _mm256_mul_ps(s, inverse_cap);
  const __m256 magnitude = _mm256_andnot_ps(sign_bit, y);
  const __m256 e = exp2_lanes(_mm256_mul_ps(magnitude, _mm256_set1_ps(-2.0f * kLog2e)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 large = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  const __m256 y2 = _mm256_mul_ps(magnitude, magnitude);
  __m256 poly = _mm256_set1_ps(-17.0f / 315.0f);
  poly = _mm256_fmadd_ps(poly, y2, _mm256_set1_ps(2.0f / 15.0f));
  poly = _mm256_fmadd_ps(poly, y2, _mm256_set1_ps(-1.0f / 3.0f));
  poly = _mm256_mul_ps(poly, y2);
  const __m256 small = _mm256_fmadd_ps(poly, magnitude, magnitude);
  const __m256 is_small = _mm256_cmp_ps(magnitude, _mm256_set1_ps(0.125f), _CMP_LT_OQ);
  const __m256 t = _mm256_blendv_ps(large, small, is_small);
  return _mm256_mul_ps(cap, _mm256_or_ps(t, _mm256_and_ps(sign_bit, y)));
}

// An M x (8 NV) block of fp32 accumulators, kept in registers: the micro-kernel's C.
template <int M, int NV>
struct Block {
  __m256 v[M][NV];

  A2D_INLINE void zero() {
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n)
        v[m][n] = _mm256_setzero_ps();
  }
};

// C(m, n) += sum_k A(m, k) B(k, n) over k < depth, the one micro-kernel of both passes.
//   A(m, k) = a[m * a_row + k]        (a_row_major = true: a row of A is contiguous in k)
//   A(m, k) = a[k * a_step + m]       (a_row_major = false: a column of A is contiguous in m)
//   B(k, n) = b[k * b_step + n]       (8 NV contiguous floats per k)
// Per k: NV vector loads of B, M broadcasts of A, M * NV FMAs. With M * NV = 12 accumulators
// (6 x 16 or 4 x 24), 12 FMAs hide the FMA latency on two FMA pipes and the loads stay under
// the load ports' rate; 12 + NV + 1 <= 16 ymm registers, so nothing spills.
template <int M, int NV, bool kARowMajor>
A2D_INLINE void multiply(Block<M, NV>& c, const float* a, int64_t a_stride, const float* b,
                         int64_t b_step, int64_t depth) {
  if constexpr (kARowMajor) {
    const float* rows[M];
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m)
      rows[m] = a + m * a_stride;
    for (int64_t k = 0; k < depth; ++k) {
      __m256 bv[NV];
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n)
        bv[n] = _mm256_loadu_ps(b + k * b_step + n * kLanes);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const __m256 av = _mm256_broadcast_ss(rows[m] + k);
#pragma GCC unroll 4
        for (int n = 0; n < NV; ++n)
          c.v[m][n] = _mm256_fmadd_ps(av, bv[n], c.v[m][n]);
      }
    }
  } else {
    for (int64_t k = 0; k < depth; ++k) {
      __m256 bv[NV];
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n)
        bv[n] = _mm256_loadu_ps(b + k * b_step + n * kLanes);
      const float* column = a + k * a_stride;
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const __m256 av = _mm256_broadcast_ss(column + m);
#pragma GCC unroll 4
        for (int n = 0; n < NV; ++n)
          c.v[m][n] = _mm256_fmadd_ps(av, bv[n], c.v[m][n]);
      }
    }
  }
}

}  // namespace
}  // namespace a2d::cpu::avx2
