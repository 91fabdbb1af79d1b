// Stand-ins for the layers this build lacks (simd_probe.hpp); the tests skip before calling them.
#include "simd_probe.hpp"

namespace a2d::test {

#if !A2D_HAVE_AVX2_PATH
void exp2_avx2(const float*, float*, int64_t) {}
bool multiply_avx2(int, int, bool, const float*, int64_t, const float*, int64_t, int64_t, float*,
                   int64_t) {
  return false;
}
void widen_avx2(DType, const uint16_t*, float*, int64_t) {}
void narrow_avx2(DType, const float*, uint16_t*, int64_t) {}
#endif

#if !A2D_HAVE_AVX512_PATH
void exp2_avx512(const float*, float*, int64_t) {}
bool multiply_avx512(int, int, bool, const float*, int64_t, const float*, int64_t, int64_t, float*,
                     int64_t) {
  return false;
}
void widen_avx512(DType, const uint16_t*, float*, int64_t) {}
void narrow_avx512(DType, const float*, uint16_t*, int64_t) {}
#endif

}  // namespace a2d::test
