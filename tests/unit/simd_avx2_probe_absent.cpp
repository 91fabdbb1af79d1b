// Stand-ins for builds without the AVX2 path; the tests skip before calling them.
#include "simd_avx2_probe.hpp"

namespace a2d::test {

void exp2_avx2(const float*, float*, int64_t) {}

bool multiply_avx2(int, int, bool, const float*, int64_t, const float*, int64_t, int64_t, float*,
                   int64_t) {
  return false;
}

void widen_avx2(DType, const uint16_t*, float*, int64_t) {}
void narrow_avx2(DType, const float*, uint16_t*, int64_t) {}

}  // namespace a2d::test
