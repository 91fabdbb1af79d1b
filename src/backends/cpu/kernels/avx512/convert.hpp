// Internal: the element-type conversions of the AVX-512 kernels, 16 lanes at a time, giving the
// same bits as avx2/convert.hpp (which lists them) and the scalar functions of dtype.hpp;
// tests/unit/test_dtype.cpp checks both layers against the scalar functions. Include only from
// translation units compiled with the AVX-512 flags; everything here has internal linkage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention2d/dtype.hpp"
#include "simd.hpp"  // first: it includes <immintrin.h> (see there)

namespace a2d::cpu::avx512 {
namespace {

template <DType kType>
constexpr int64_t kElementBytes = kType == DType::f32 ? 4 : 2;

// 16 elements of kType at `from` (unaligned) -> 16 fp32 lanes.
template <DType kType>
A2D_INLINE Vec widen_lanes(const std::byte* from) {
  if constexpr (kType == DType::f32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(from));
  } else {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
    if constexpr (kType == DType::bf16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    } else {
      return _mm512_cvtph_ps(bits);
    }
  }
}

// 16 fp32 lanes -> 16 bf16 values: round to nearest even, NaN quiet (the bits of
// avx2::narrow_lanes_bf16; not vcvtneps2bf16, whose NaN and subnormal handling differ).
A2D_INLINE __m256i narrow_lanes_bf16(Vec x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lowest_kept)), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i halves = _mm512_mask_blend_epi32(nan, rounded, quiet_nan);  // each < 2^16
  return _mm512_cvtepi32_epi16(halves);  // vpmovdw: keeps the low 16 bits of each lane
}

// 16 fp32 lanes -> 16 elements of kType at `to` (unaligned).
template <DType kType>
A2D_INLINE void narrow_lanes(Vec x, std::byte* to) {
  if constexpr (kType == DType::f32) {
    _mm512_storeu_ps(reinterpret_cast<float*>(to), x);
  } else if constexpr (kType == DType::bf16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), narrow_lanes_bf16(x));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

}  // namespace
}  // namespace a2d::cpu::avx512

#define A2D_SIMD_NAMESPACE avx512
#include "backends/cpu/kernels/simd/convert.inc"
#undef A2D_SIMD_NAMESPACE
