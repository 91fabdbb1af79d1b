#include "attention2d/tools/check.hpp"

#include <cmath>
#include <limits>

namespace a2d {

double relative_error(const float* got, const double* expected, int64_t count) {
  double diff = 0.0;
  double norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double g = got[i];
    const double e = expected[i];
    constexpr double kInf = std::numeric_limits<double>::infinity();
    if (e == -kInf) {
      if (g != -kInf) return kInf;
      continue;
    }
    if (!std::isfinite(e)) {
      if (std::isfinite(g)) return kInf;
      continue;
    }
    if (!std::isfinite(g)) return kInf;
    diff += (g - e) * (g - e);
    norm += e * e;
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace a2d
