// Element types and their conversions (dtype.hpp). The binary16 conversions are written out in
// integer arithmetic so they give the same bits on every compiler and CPU; the AVX2 kernels use
// the F16C instructions instead, which round the same way (tests/unit/test_dtype.cpp checks both
// against each other on every binary16 value and on fp32 values around every rounding boundary).
#include "attention2d/dtype.hpp"

#include <cstring>

#include "attention2d/error.hpp"
#include "core/enum_names.hpp"

namespace a2d {

// The names, then the aliases parse_dtype also takes.
constexpr EnumName<DType> kDTypeNames[] = {{DType::f32, "fp32"},      {DType::bf16, "bf16"},
                                           {DType::f16, "fp16"},      {DType::f32, "float32"},
                                           {DType::bf16, "bfloat16"}, {DType::f16, "float16"}};

DType parse_dtype(const std::string& name) {
  return parse_enum(kDTypeNames, name, "dtype");
}

const char* dtype_name(DType dtype) {
  return enum_name(kDTypeNames, dtype);
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t fraction = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (fraction << 13));
  if (exponent == 0) {
    // Zero or subnormal: fraction * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(fraction) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  // Normal: rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (fraction << 13));
}

uint16_t float_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: quiet, keeping the top payload bits.
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 = 65504 + half an ulp and beyond rounds to infinity (the tie goes to the even side,
  // which is infinity).
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {
    // Normal binary16 (>= 2^-14): round the fraction to 10 bits, nearest even; a carry moves
    // into the exponent, as it should. Then rebias the exponent from 127 to 15.
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // Subnormal or zero: adding 0.5 leaves the value in units of 2^-24 in the low bits of the sum,
  // rounded to nearest even by the fp32 addition itself (its ulp at 0.5 is 2^-24).
  const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
}

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f32:
      return value;
    case DType::bf16:
      return bf16_to_float(float_to_bf16(value));
    case DType::f16:
      return f16_to_float(float_to_f16(value));
  }
  return value;
}

void to_float(DType dtype, const void* from, float* to, int64_t count) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::f32:
      std::memmove(to, from, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::bf16: {
      const auto* in = static_cast<const uint16_t*>(from);
      for (int64_t i = 0; i < count; ++i)
        to[i] = bf16_to_float(in[i]);
      return;
    }
    case DType::f16: {
      const auto* in = static_cast<const uint16_t*>(from);
      for (int64_t i = 0; i < count; ++i)
        to[i] = f16_to_float(in[i]);
      return;
    }
  }
}

void from_float(DType dtype, const float* from, void* to, int64_t count) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::f32:
      std::memmove(to, from, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::bf16: {
      auto* out = static_cast<uint16_t*>(to);
      for (int64_t i = 0; i < count; ++i)
        out[i] = float_to_bf16(from[i]);
      return;
    }
    case DType::f16: {
      auto* out = static_cast<uint16_t*>(to);
      for (int64_t i = 0; i < count; ++i)
        out[i] = float_to_f16(from[i]);
      return;
    }
  }
}

}  // namespace a2d
