// Test access to the AVX2 building blocks of src/backends/cpu/kernels/avx2/simd.hpp and convert.hpp.
// Compiled with -mavx2 -mfma -mf16c, like the kernels; the functions below take and return plain
// arrays, so the test translation units that call them (only on CPUs with AVX2) are compiled
// without AVX2.
#include "simd_avx2_probe.hpp"

#include "backends/cpu/kernels/avx2/convert.hpp"
#include "backends/cpu/kernels/avx2/simd.hpp"

namespace a2d::test {

void exp2_avx2(const float* x, float* out, int64_t count) {
  for (int64_t i = 0; i + cpu::avx2::kLanes <= count; i += cpu::avx2::kLanes) {
    _mm256_storeu_ps(out + i, cpu::avx2::exp2_lanes(_mm256_loadu_ps(x + i)));
  }
}

namespace {
template <int M, int NV, bool kARowMajor>
void multiply_block(const float* a, int64_t a_stride, const float* b, int64_t b_step, int64_t depth,
                    float* c, int64_t c_stride) {
  cpu::avx2::Block<M, NV> block;
  block.zero();
  cpu::avx2::multiply<M, NV, kARowMajor>(block, a, a_stride, b, b_step, depth);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < NV; ++n)
      _mm256_storeu_ps(c + m * c_stride + 8 * n, block.v[m][n]);
}
}  // namespace

bool multiply_avx2(int rows, int vectors, bool a_row_major, const float* a, int64_t a_stride,
                   const float* b, int64_t b_step, int64_t depth, float* c, int64_t c_stride) {
#define A2D_CASE(M, NV)                                                         \
  if (rows == M && vectors == NV) {                                             \
    if (a_row_major) {                                                          \
      multiply_block<M, NV, true>(a, a_stride, b, b_step, depth, c, c_stride);  \
    } else {                                                                    \
      multiply_block<M, NV, false>(a, a_stride, b, b_step, depth, c, c_stride); \
    }                                                                           \
    return true;                                                                \
  }
  A2D_CASE(6, 2)
  A2D_CASE(4, 3)
  A2D_CASE(3, 3)
  A2D_CASE(2, 3)
  A2D_CASE(1, 3)
#undef A2D_CASE
  return false;
}

namespace {
template <DType kType>
void narrow_row_exact(const float* from, uint16_t* to, int64_t count) {
  auto* out = reinterpret_cast<std::byte*>(to);
  int64_t i = 0;
  for (; i + cpu::avx2::kLanes <= count; i += cpu::avx2::kLanes)
    cpu::avx2::narrow8<kType>(_mm256_loadu_ps(from + i), out + 2 * i);
  for (; i < count; ++i)
    cpu::avx2::narrow1<kType>(from[i], out + 2 * i);
}
}  // namespace

void widen_avx2(DType dtype, const uint16_t* from, float* to, int64_t count) {
  cpu::avx2::widen_row(dtype, reinterpret_cast<const std::byte*>(from), to, count);
}

// Not narrow_row itself: its scale (x * 1) would quiet a signalling NaN before the conversion.
void narrow_avx2(DType dtype, const float* from, uint16_t* to, int64_t count) {
  if (dtype == DType::bf16) narrow_row_exact<DType::bf16>(from, to, count);
  if (dtype == DType::f16) narrow_row_exact<DType::f16>(from, to, count);
}

}  // namespace a2d::test
