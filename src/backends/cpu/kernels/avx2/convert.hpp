// Internal: the element-type conversions of the AVX2 kernels, fp32 <-> bf16 and fp16, 8 lanes at
// a time (and one at a time for the tails, simd/convert.inc), giving the bits of the scalar
// functions of dtype.hpp:
//
//   bf16 -> fp32   the 16 bits become the upper half of a binary32 (zero-extend, shift left 16)
//   fp16 -> fp32   F16C vcvtph2ps (exact, subnormals included, NaN stays NaN)
//   fp32 -> bf16   round to nearest even on the bits (add 0x7fff + the lowest kept bit, keep the
//                  upper half); NaN keeps its upper half and becomes quiet (| 0x0040)
//   fp32 -> fp16   F16C vcvtps2ph with round to nearest even; NaN quiet, beyond 65520 infinity
//
// tests/unit/test_dtype.cpp checks every one against the scalar function (all 65536 16-bit
// patterns, and fp32 values around every rounding boundary). Like simd.hpp: include only from
// translation units compiled with -mavx2 -mfma -mf16c; everything here has internal linkage (the
// scalar functions of dtype.hpp are inline, and an AVX2 copy of them must not reach the portable
// path through the linker).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention2d/dtype.hpp"
#include "simd.hpp"

namespace a2d::cpu::avx2 {
namespace {

// Bytes of one element of kType.
template <DType kType>
constexpr int64_t kElementBytes = kType == DType::f32 ? 4 : 2;

// 8 elements of kType at `from` (unaligned) -> 8 fp32 lanes.
template <DType kType>
A2D_INLINE Vec widen_lanes(const std::byte* from) {
  if constexpr (kType == DType::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(from));
  } else {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
    if constexpr (kType == DType::bf16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    } else {
      return _mm256_cvtph_ps(bits);
    }
  }
}

// 8 fp32 lanes -> 8 bf16 values: round to nearest even, NaN quiet.
A2D_INLINE __m128i narrow_lanes_bf16(Vec x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lowest_kept)), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i halves = _mm256_blendv_epi8(rounded, quiet_nan, nan);  // each < 2^16
  // Pack the 32-bit lanes to 16 bits (within each 128-bit half), then gather the halves.
  const __m256i packed = _mm256_packus_epi32(halves, halves);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// 8 fp32 lanes -> 8 elements of kType at `to` (unaligned).
template <DType kType>
A2D_INLINE void narrow_lanes(Vec x, std::byte* to) {
  if constexpr (kType == DType::f32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(to), x);
  } else if constexpr (kType == DType::bf16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to), narrow_lanes_bf16(x));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

}  // namespace
}  // namespace a2d::cpu::avx2

#define A2D_SIMD_NAMESPACE avx2
#include "backends/cpu/kernels/simd/convert.inc"
#undef A2D_SIMD_NAMESPACE
