#include <cmath>

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

}  // namespace a2d::cpu
