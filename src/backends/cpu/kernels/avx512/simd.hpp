// Internal: the AVX-512 vector layer of the fast CPU kernels (16 fp32 lanes in a zmm register; the
// same functions as avx2/simd.hpp, which explains the layer), and through simd/math.inc the
// vectorised exp and the register-blocked micro-kernel written on it.
//
// Include this only from translation units compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512vl -mfma -mf16c (CMake does that for the files in this directory). Everything here has
// internal linkage, for the reason avx2/simd.hpp gives.
#pragma once

// GCC 12's AVX-512 intrinsics initialise their "undefined" vectors from themselves
// (_mm512_undefined_ps: __m512 __Y = __Y), which -Wuninitialized reports once they are inlined
// (GCC bug 105593, fixed in GCC 13); the warnings are silenced for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#define A2D_INLINE inline __attribute__((always_inline))
#define A2D_NOINLINE __attribute__((noinline))

namespace a2d::cpu::avx512 {
namespace {

using Vec = __m512;
constexpr int kLanes = 16;  // fp32 lanes of a zmm register
constexpr int kVectorRegisters = 32;

A2D_INLINE Vec vzero() {
  return _mm512_setzero_ps();
}
A2D_INLINE Vec vset(float x) {
  return _mm512_set1_ps(x);
}
// 64-byte aligned
A2D_INLINE Vec vload(const float* p) {
  return _mm512_load_ps(p);
}
A2D_INLINE Vec vloadu(const float* p) {
  return _mm512_loadu_ps(p);
}
A2D_INLINE void vstore(float* p, Vec x) {
  _mm512_store_ps(p, x);
}
A2D_INLINE void vstoreu(float* p, Vec x) {
  _mm512_storeu_ps(p, x);
}
// vbroadcastss m32
A2D_INLINE Vec vbroadcast(const float* p) {
  return _mm512_set1_ps(*p);
}
A2D_INLINE Vec vadd(Vec a, Vec b) {
  return _mm512_add_ps(a, b);
}
A2D_INLINE Vec vsub(Vec a, Vec b) {
  return _mm512_sub_ps(a, b);
}
A2D_INLINE Vec vmul(Vec a, Vec b) {
  return _mm512_mul_ps(a, b);
}
A2D_INLINE Vec vdiv(Vec a, Vec b) {
  return _mm512_div_ps(a, b);
}
// As for AVX2: vmax(c, x) lets a NaN x through.
A2D_INLINE Vec vmax(Vec a, Vec b) {
  return _mm512_max_ps(a, b);
}
A2D_INLINE Vec vmin(Vec a, Vec b) {
  return _mm512_min_ps(a, b);
}
A2D_INLINE Vec vfmadd(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
A2D_INLINE Vec vfmsub(Vec a, Vec b, Vec c) {
  return _mm512_fmsub_ps(a, b, c);
}
A2D_INLINE Vec vfnmadd(Vec a, Vec b, Vec c) {
  return _mm512_fnmadd_ps(a, b, c);
}
A2D_INLINE Vec vround(Vec x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// 2^n for integral n in [-127, 127]; n = -127 gives exactly 0 (the bit pattern 0). Not vscalefps,
// which would give subnormals for n = -127 rather than the zero the masked scores rely on.
A2D_INLINE Vec vpow2_integral(Vec n) {
  const __m512i biased = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23));
}
A2D_INLINE Vec vabs(Vec x) {
  return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);
}
A2D_INLINE Vec vwith_sign_of(Vec magnitude, Vec sign) {
  return _mm512_or_ps(magnitude, _mm512_and_ps(_mm512_set1_ps(-0.0f), sign));
}
A2D_INLINE Vec vselect_less(Vec a, Vec b, Vec if_true, Vec if_false) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), if_false, if_true);
}
A2D_INLINE Vec vselect_equal(Vec a, Vec b, Vec if_true, Vec if_false) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), if_false, if_true);
}

}  // namespace
}  // namespace a2d::cpu::avx512

#define A2D_SIMD_NAMESPACE avx512
#include "backends/cpu/kernels/simd/math.inc"
#undef A2D_SIMD_NAMESPACE
