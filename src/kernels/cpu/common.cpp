#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "attention2d/error.hpp"
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
    case DType::bf16:
      for (int64_t i = 0; i < count; ++i)
        to[i] = scale * bf16_to_float(bits_at(row, i));
      return;
    case DType::f16:
      for (int64_t i = 0; i < count; ++i)
        to[i] = scale * f16_to_float(bits_at(row, i));
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

}  // namespace a2d

namespace a2d::cpu {

void check_common(const AttentionShape& shape, const Mask& mask, float scale, int threads) {
  shape.validate();
  mask.validate();
  A2D_REQUIRE(std::isfinite(scale) && scale > 0.0f,
              "the softmax scale must be finite and positive (got ", scale, ")");
  A2D_REQUIRE(threads >= 1, "the thread count must be at least 1 (got ", threads, ")");
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
