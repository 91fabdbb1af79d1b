#include "attention2d/check.hpp"

#include <cmath>
#include <limits>

namespace a2d {

double relative_error(const float* got, const double* expected, int64_t count) {
  double diff = 0.0;
  double norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double g = got[i];
    const double e = expected[i];
    if (std::isnan(g) || std::isnan(e)) return std::numeric_limits<double>::infinity();
    if (std::isinf(g) || std::isinf(e)) {
      if (g != e) return std::numeric_limits<double>::infinity();
      continue;
    }
    diff += (g - e) * (g - e);
    norm += e * e;
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace a2d
