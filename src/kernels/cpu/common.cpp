#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "attention2d/error.hpp"
#include "tiles.hpp"

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
