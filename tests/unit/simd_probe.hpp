// Plain-array entry points to the building blocks of the fast kernels' vector layers, for tests
// (see simd_probe.inc): one set per layer, `_avx2` (8 lanes) and `_avx512` (16 lanes). Call them
// only when kernel_path_supported(KernelPath::avx2) or (KernelPath::avx512).
#pragma once

#include <cstdint>

#include "attention2d/dtype.hpp"
#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::test {

// The kernels' conversions (src/backends/cpu/kernels/avx2/convert.hpp, avx512/convert.hpp) of
// count 16-bit values of `dtype` (bf16 or f16) to fp32 and back: a vector of lanes at a time, the
// last count % lanes one at a time, as the kernels' row copies and O stores do.
void widen_avx2(DType dtype, const uint16_t* from, float* to, int64_t count);
void narrow_avx2(DType dtype, const float* from, uint16_t* to, int64_t count);
void widen_avx512(DType dtype, const uint16_t* from, float* to, int64_t count);
void narrow_avx512(DType dtype, const float* from, uint16_t* to, int64_t count);

// out[i] = 2^x[i] by exp2_lanes, for count a multiple of the lanes.
void exp2_avx2(const float* x, float* out, int64_t count);
void exp2_avx512(const float* x, float* out, int64_t count);

// C[m][n] = sum_k A(m, k) B(k, n) by the micro-kernel with M = rows, NV = vectors (n < lanes NV);
// A(m, k) = a[m * a_stride + k] (a_row_major) or a[k * a_stride + m]; B(k, n) = b[k * b_step + n];
// C[m][n] at c[m * c_stride + n]. Returns false for an (M, NV) the kernels do not use.
bool multiply_avx2(int rows, int vectors, bool a_row_major, const float* a, int64_t a_stride,
                   const float* b, int64_t b_step, int64_t depth, float* c, int64_t c_stride);
bool multiply_avx512(int rows, int vectors, bool a_row_major, const float* a, int64_t a_stride,
                     const float* b, int64_t b_step, int64_t depth, float* c, int64_t c_stride);

// One layer's entry points, for tests that run over both.
struct SimdProbe {
  const char* name;
  KernelPath path;
  int lanes;
  void (*widen)(DType, const uint16_t*, float*, int64_t);
  void (*narrow)(DType, const float*, uint16_t*, int64_t);
  void (*exp2)(const float*, float*, int64_t);
  bool (*multiply)(int, int, bool, const float*, int64_t, const float*, int64_t, int64_t, float*,
                   int64_t);
};
inline const SimdProbe kAvx2Probe{"avx2",    KernelPath::avx2, 8, widen_avx2, narrow_avx2,
                                  exp2_avx2, multiply_avx2};
inline const SimdProbe kAvx512Probe{
    "avx512", KernelPath::avx512, 16, widen_avx512, narrow_avx512, exp2_avx512, multiply_avx512};

}  // namespace a2d::test
