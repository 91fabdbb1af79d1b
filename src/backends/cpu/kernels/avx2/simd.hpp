// Internal: the AVX2/FMA vector layer of the fast CPU kernels (8 fp32 lanes in a ymm register),
// and through simd/math.inc the building blocks written on it: a vectorised exp and the
// register-blocked micro-kernel every tile product is made of. avx512/simd.hpp is the same layer
// for 16 lanes; the kernels (simd/forward.inc, simd/backward.inc) are written once against it.
//
// Include this only from translation units compiled with -mavx2 -mfma -mf16c (CMake does that for
// the files in this directory). Everything here has internal linkage: an inline function compiled
// with AVX2 must never be shared, through the linker's choice of one copy of an inline
// function, with code that runs on the portable path of a CPU without AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>

#define A2D_INLINE inline __attribute__((always_inline))
// The functions that run a micro-kernel over a whole depth are kept out of line: compiled on
// their own, the accumulators, the B vectors and the broadcast fill the vector registers
// without spilling, which inlined into a large caller they did not always do.
#define A2D_NOINLINE __attribute__((noinline))

namespace a2d::cpu::avx2 {
namespace {

using Vec = __m256;
constexpr int kLanes = 8;  // fp32 lanes of a ymm register
// 12 accumulators of the micro-kernel, its B vectors and the broadcast fit the 16 ymm registers.
constexpr int kVectorRegisters = 16;

A2D_INLINE Vec vzero() {
  return _mm256_setzero_ps();
}
A2D_INLINE Vec vset(float x) {
  return _mm256_set1_ps(x);
}
// 32-byte aligned
A2D_INLINE Vec vload(const float* p) {
  return _mm256_load_ps(p);
}
A2D_INLINE Vec vloadu(const float* p) {
  return _mm256_loadu_ps(p);
}
A2D_INLINE void vstore(float* p, Vec x) {
  _mm256_store_ps(p, x);
}
A2D_INLINE void vstoreu(float* p, Vec x) {
  _mm256_storeu_ps(p, x);
}
A2D_INLINE Vec vbroadcast(const float* p) {
  return _mm256_broadcast_ss(p);
}
A2D_INLINE Vec vadd(Vec a, Vec b) {
  return _mm256_add_ps(a, b);
}
A2D_INLINE Vec vsub(Vec a, Vec b) {
  return _mm256_sub_ps(a, b);
}
A2D_INLINE Vec vmul(Vec a, Vec b) {
  return _mm256_mul_ps(a, b);
}
A2D_INLINE Vec vdiv(Vec a, Vec b) {
  return _mm256_div_ps(a, b);
}
// vmaxps/vminps return the second operand when either is NaN: vmax(c, x) lets a NaN x through.
A2D_INLINE Vec vmax(Vec a, Vec b) {
  return _mm256_max_ps(a, b);
}
A2D_INLINE Vec vmin(Vec a, Vec b) {
  return _mm256_min_ps(a, b);
}
// a b + c
A2D_INLINE Vec vfmadd(Vec a, Vec b, Vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
// a b - c
A2D_INLINE Vec vfmsub(Vec a, Vec b, Vec c) {
  return _mm256_fmsub_ps(a, b, c);
}
// c - a b
A2D_INLINE Vec vfnmadd(Vec a, Vec b, Vec c) {
  return _mm256_fnmadd_ps(a, b, c);
}
A2D_INLINE Vec vround(Vec x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// 2^n for integral n in [-127, 127], built in the exponent bits; n = -127 gives the bit pattern
// 0, i.e. exactly 0.
A2D_INLINE Vec vpow2_integral(Vec n) {
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));
}
A2D_INLINE Vec vabs(Vec x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}
// |magnitude| with the sign of `sign` (magnitude's sign bit must be clear).
A2D_INLINE Vec vwith_sign_of(Vec magnitude, Vec sign) {
  return _mm256_or_ps(magnitude, _mm256_and_ps(_mm256_set1_ps(-0.0f), sign));
}
// Lane-wise a < b ? if_true : if_false, and a == b ? if_true : if_false (ordered compares).
A2D_INLINE Vec vselect_less(Vec a, Vec b, Vec if_true, Vec if_false) {
  return _mm256_blendv_ps(if_false, if_true, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
A2D_INLINE Vec vselect_equal(Vec a, Vec b, Vec if_true, Vec if_false) {
  return _mm256_blendv_ps(if_false, if_true, _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
}

}  // namespace
}  // namespace a2d::cpu::avx2

#define A2D_SIMD_NAMESPACE avx2
#include "backends/cpu/kernels/simd/math.inc"
#undef A2D_SIMD_NAMESPACE
