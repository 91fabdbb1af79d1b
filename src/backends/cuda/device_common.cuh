// Internal, CUDA only: the PTX wrappers and element-type traits the attention kernels share.
// NOT YET RUN ON A GPU: this code compiles for sm_80 and sm_90 (scripts/test.sh), and
// scripts/gpu/gpu_check.sh is the check to run on one (docs/gpu.md).
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// lane = 4 * g + t (g = lane / 4 the group, t = lane % 4 the thread in the group):
//   A (16 x 16, row-major), four b32 registers of two 16-bit elements each:
//     a0 = (row g,     cols 2t, 2t+1)   a1 = (row g + 8, cols 2t, 2t+1)
//     a2 = (row g,     cols 2t+8, 2t+9) a3 = (row g + 8, cols 2t+8, 2t+9)
//   B (16 x 8, "col": stored as 8 rows of n with k contiguous), two registers:
//     b0 = (k 2t, 2t+1; n g)            b1 = (k 2t+8, 2t+9; n g)
//   C/D (16 x 8, fp32): c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g + 8, cols 2t, 2t+1).
// ldmatrix.x4 loads four 8x8 16-bit matrices; lanes 8i..8i+7 give the addresses of the 8 rows of
// matrix i, and each lane receives (row lane / 4, cols 2 (lane % 4), +1) of every matrix, or with
// .trans (rows 2 (lane % 4), +1; col lane / 4): exactly an A/B register of the layouts above.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention2d/error.hpp"

namespace a2d::cuda_kernels {

// After a kernel launch: a2d::Error naming `what` if it failed.
inline void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  A2D_REQUIRE(status == cudaSuccess, what, " launch failed: ", cudaGetErrorString(status));
}

template <typename T>
struct Element;

template <>
struct Element<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
  // d += a * b, fp32 accumulators.
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Element<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, asynchronously; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)),
               "l"(global), "r"(bytes));
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most `Pending` committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

__device__ __forceinline__ void load_matrix_x4(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}
__device__ __forceinline__ void load_matrix_x4_trans(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}

// The maximum of kernel.hpp's max_keep_nan: a NaN wins, so a NaN score poisons its row as on the
// CPU instead of being skipped.
__device__ __forceinline__ float max_keep_nan(float a, float b) {
  return (b > a || b != b) ? b : a;
}

// Loads `rows` rows of `width` 16-bit elements (width a multiple of 8) from global rows
// `first`.. (row r at base + r * row_stride elements) into shared rows of `shared_stride`
// elements, zero-filling rows at or past `limit`; all threads of the block take part.
template <typename T, int Rows, int Width, int Threads>
__device__ __forceinline__ void load_tile_async(T* shared, int shared_stride, const T* base,
                                                int64_t row_stride, int64_t first, int64_t limit) {
  constexpr int kChunks = Width / 8;  // 16-byte pieces per row
  for (int c = threadIdx.x; c < Rows * kChunks; c += Threads) {
    const int r = c / kChunks;
    const int col = (c % kChunks) * 8;
    const int64_t row = first + r;
    const bool valid = row < limit;
    const T* source = valid ? base + row * row_stride + col : base;
    copy_async_16(shared + r * shared_stride + col, source, valid);
  }
}

}  // namespace a2d::cuda_kernels
