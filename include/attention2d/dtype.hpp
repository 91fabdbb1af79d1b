// attention2d: element types of the attention tensors, and the conversions between them.
//
// Q, K, V, O, dO, dQ, dK and dV are stored, passed and sent in the problem's DType. Everything
// else is fp32 whatever the DType: row statistics (row max, row sum, LSE, delta), the unnormalised
// accumulator of partial results, and partial gradient sums (reduced across ranks in fp32 and
// rounded once, at the end). docs/kernels.md lists every place a value is rounded.
//
//   f32   IEEE binary32
//   bf16  bfloat16: the upper 16 bits of a binary32 (8 exponent bits, 7 fraction bits)
//   f16   IEEE binary16 (5 exponent bits, 10 fraction bits; largest finite 65504)
//
// Rounding from fp32 is to nearest, ties to even, for both 16-bit types; NaN stays NaN (quiet),
// infinities stay infinite, and an fp32 value beyond a type's range becomes infinity (as IEEE
// conversion does). Widening to fp32 is exact.
#pragma once

#include <bit>
#include <cstdint>
#include <string>

namespace a2d {

enum class DType : uint8_t { f32, bf16, f16 };

// "fp32", "bf16", "fp16" (also "float32", "bfloat16", "float16"); anything else throws a2d::Error
// naming the choices.
DType parse_dtype(const std::string& name);
const char* dtype_name(DType dtype);  // "fp32", "bf16", "fp16"
constexpr int64_t dtype_bytes(DType dtype) {
  return dtype == DType::f32 ? 4 : 2;
}

inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Overflow of the
  // largest finite values carries into the exponent and gives infinity, as it should.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);

// The value `value` becomes when stored as `dtype`, widened back to fp32.
float round_to(DType dtype, float value);

// count elements of `dtype` at `from` -> fp32, and back (rounding as above).
void to_float(DType dtype, const void* from, float* to, int64_t count);
void from_float(DType dtype, const float* from, void* to, int64_t count);

}  // namespace a2d
