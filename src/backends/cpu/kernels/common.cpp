#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "attention2d/error.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "tiles.hpp"

namespace a2d {
namespace {

// Element `i` of a row of 16-bit values. Through memcpy: a row of a strided view need not be
// aligned for uint16_t (the compiler turns this into a plain load).
inline uint16_t bits_at(const std::byte* row, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, row + 2 * i, sizeof bits);
  return bits;
}
inline void put_bits(std::byte* row, int64_t i, uint16_t bits) {
  std::memcpy(row + 2 * i, &bits, sizeof bits);
}

// f16_to_float without branches, so that a row's loop vectorises (the portable forward widens
// every K and V row once per query tile; the scalar function's branches cost a quarter of its
// time at D = 128). The same bits as f16_to_float on every pattern (tests/unit/test_dtype.cpp):
// normal values rebias the exponent by adding 112 << 23, exponent 31 (infinity, NaN) by adding
// 224 << 23 (to 255, the fraction kept), and subnormals are fraction * 2^-24 by an exact integer
// conversion (no subnormal fp32 arithmetic, so a caller's denormals-are-zero mode cannot change
// them). Selections are masks, not conditionals: GCC does not if-convert the latter here.
inline float widen_f16(uint16_t h) {
  const uint32_t bits = h;
  const uint32_t exponent = bits & 0x7c00u;
  const uint32_t special = 0u - static_cast<uint32_t>(exponent == 0x7c00u);  // all ones or 0
  const uint32_t subnormal = 0u - static_cast<uint32_t>(exponent == 0);
  const uint32_t rebiased = ((bits & 0x7fffu) << 13) + 0x38000000u + (special & 0x38000000u);
  const uint32_t small =
      std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(bits & 0x3ffu)) * 0x1p-24f);
  const uint32_t magnitude = (rebiased & ~subnormal) | (small & subnormal);
  return std::bit_cast<float>(((bits & 0x8000u) << 16) | magnitude);
}

}  // namespace

// Plain loops over one row: the portable kernels call these once per row of a tile, not per
// element, so their cost is that of the conversion itself.
void load_row(const std::byte* row, DType dtype, int64_t count, float* to, float scale) {
  switch (dtype) {
    case DType::f32: {
      const auto* from = reinterpret_cast<const float*>(row);
      if (scale == 1.0f) {
        std::copy_n(from, count, to);
      } else {
        for (int64_t i = 0; i < count; ++i)
          to[i] = scale * from[i];
      }
      return;
    }
    // Without a scale, no product: x * 1 would quiet a signalling NaN, and widening is exact.
    case DType::bf16:
      if (scale == 1.0f) {
        for (int64_t i = 0; i < count; ++i)
          to[i] = bf16_to_float(bits_at(row, i));
      } else {
        for (int64_t i = 0; i < count; ++i)
          to[i] = scale * bf16_to_float(bits_at(row, i));
      }
      return;
    case DType::f16:
      if (scale == 1.0f) {
        for (int64_t i = 0; i < count; ++i)
          to[i] = widen_f16(bits_at(row, i));
      } else {
        for (int64_t i = 0; i < count; ++i)
          to[i] = scale * widen_f16(bits_at(row, i));
      }
      return;
  }
}

void store_row(const float* from, int64_t count, std::byte* row, DType dtype) {
  switch (dtype) {
    case DType::f32:
      std::copy_n(from, count, reinterpret_cast<float*>(row));
      return;
    case DType::bf16:
      for (int64_t i = 0; i < count; ++i)
        put_bits(row, i, float_to_bf16(from[i]));
      return;
    case DType::f16:
      for (int64_t i = 0; i < count; ++i)
        put_bits(row, i, float_to_f16(from[i]));
      return;
  }
}

void permute_tokens(void* data, int64_t token_bytes, const int64_t* from, int64_t count) {
  auto* rows = static_cast<std::byte*>(data);
  const auto bytes = static_cast<size_t>(token_bytes);
  std::vector<bool> done(static_cast<size_t>(count), false);
  std::vector<std::byte> held(bytes);
  for (int64_t start = 0; start < count; ++start) {
    if (done[static_cast<size_t>(start)]) continue;
    std::memcpy(held.data(), rows + start * token_bytes, bytes);
    int64_t at = start;
    while (true) {
      done[static_cast<size_t>(at)] = true;
      const int64_t source = from[at];
      if (source == start) {
        std::memcpy(rows + at * token_bytes, held.data(), bytes);
        break;
      }
      std::memcpy(rows + at * token_bytes, rows + source * token_bytes, bytes);
      at = source;
    }
  }
}

}  // namespace a2d

namespace a2d::cpu {

void check_common(const AttentionShape& shape, const Mask& mask, float scale, int threads) {
  shape.validate();
  mask.validate();
  A2D_REQUIRE(std::isfinite(scale) && scale > 0.0f,
              "the softmax scale must be finite and positive (got ", scale, ")");
  A2D_REQUIRE(threads >= 1, "the thread count must be at least 1 (got ", threads, ")");
}

void check_softcap(float softcap) {
  A2D_REQUIRE(std::isfinite(softcap) && softcap >= 0.0f,
              "the softcap must be finite and positive, or 0 for none (got ", softcap, ")");
}

AlignedFloats::AlignedFloats(int64_t count) {
  const size_t bytes =
      static_cast<size_t>(cache_lines_of_floats(std::max<int64_t>(count, 1))) * sizeof(float);
  data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!data_) throw std::bad_alloc();
}

AlignedFloats::~AlignedFloats() {
  std::free(data_);
}

}  // namespace a2d::cpu
