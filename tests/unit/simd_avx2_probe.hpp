// Plain-array entry points to the AVX2 building blocks, for tests (see simd_avx2_probe.cpp).
// Call them only when kernel_path_supported(KernelPath::avx2).
#pragma once

#include <cstdint>

#include "attention2d/dtype.hpp"

namespace a2d::test {

// The AVX2 kernels' conversions (src/backends/cpu/kernels/avx2/convert.hpp) of count 16-bit values of
// `dtype` (bf16 or f16) to fp32 and back: 8 lanes at a time, the last count % 8 one at a time,
// as the kernels' row copies and O stores do.
void widen_avx2(DType dtype, const uint16_t* from, float* to, int64_t count);
void narrow_avx2(DType dtype, const float* from, uint16_t* to, int64_t count);

// out[i] = 2^x[i] by exp2_lanes, for count a multiple of 8.
void exp2_avx2(const float* x, float* out, int64_t count);

// C[m][n] = sum_k A(m, k) B(k, n) by the micro-kernel with M = rows, NV = vectors (n < 8 NV);
// A(m, k) = a[m * a_stride + k] (a_row_major) or a[k * a_stride + m]; B(k, n) = b[k * b_step + n];
// C[m][n] at c[m * c_stride + n]. Returns false for an (M, NV) the kernels do not use.
bool multiply_avx2(int rows, int vectors, bool a_row_major, const float* a, int64_t a_stride,
                   const float* b, int64_t b_step, int64_t depth, float* c, int64_t c_stride);

}  // namespace a2d::test
