// What one GPU's matrix units deliver, against the datasheet peaks the accelerator presets use
// (docs/cost-model.md, section 5): cuBLAS GEMMs in bf16 (fp32 accumulation) and fp32, square
// and at the shapes of attention's two products (S = Q K^T: N x N x D; O = P V: N x D x N, one
// per head, strided-batched). FLOPs 2 M N K per product; the median of `repeats` timed calls
// (CUDA events) after warm-up calls. Prints one line per case.
//   a2d_gemm_peak [repeats]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "a2d_gemm_peak: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "a2d_gemm_peak: %s: cuBLAS status %d\n", what, static_cast<int>(status));
    std::exit(1);
  }
}

struct Case {
  const char* name;
  bool bf16;
  int m, n, k, batch;
};

// Median seconds of one call of the case's (batched) product.
double time_case(cublasHandle_t handle, const Case& c, int repeats) {
  const size_t element = c.bf16 ? 2 : 4;
  const size_t a_count = static_cast<size_t>(c.m) * c.k, b_count = static_cast<size_t>(c.k) * c.n;
  const size_t c_count = static_cast<size_t>(c.m) * c.n;
  void *a = nullptr, *b = nullptr, *out = nullptr;
  check(cudaMalloc(&a, a_count * c.batch * element), "cudaMalloc A");
  check(cudaMalloc(&b, b_count * c.batch * element), "cudaMalloc B");
  check(cudaMalloc(&out, c_count * c.batch * element), "cudaMalloc C");
  // Small values, so that no product overflows; the content does not change the time.
  check(cudaMemset(a, 0x3c, a_count * c.batch * element), "cudaMemset A");
  check(cudaMemset(b, 0x3c, b_count * c.batch * element), "cudaMemset B");
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType type = c.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = c.bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
  const auto call = [&] {
    check(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, c.m, c.n, c.k, &alpha, a,
                                     type, c.m, static_cast<long long>(a_count), b, type, c.k,
                                     static_cast<long long>(b_count), &beta, out, type, c.m,
                                     static_cast<long long>(c_count), c.batch, compute,
                                     CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  };
  for (int i = 0; i < 3; ++i)
    call();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    call();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    seconds.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  cudaFree(out);
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  std::printf("device: %s, %d SMs, compute capability %d.%d, %.0f MHz, %zu MiB\n", prop.name,
              prop.multiProcessorCount, prop.major, prop.minor, clock_khz / 1e3,
              prop.totalGlobalMem >> 20);
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  const Case cases[] = {
      {"bf16 square 8192", true, 8192, 8192, 8192, 1},
      {"bf16 S = Q K^T, N 8192, D 128, 16 heads", true, 8192, 8192, 128, 16},
      {"bf16 O = P V, N 8192, D 128, 16 heads", true, 8192, 128, 8192, 16},
      {"bf16 S = Q K^T, N 8192, D 80, 32 heads", true, 8192, 8192, 80, 32},
      {"bf16 S = Q K^T, N 8192, D 96, 16 heads", true, 8192, 8192, 96, 16},
      {"fp32 square 8192", false, 8192, 8192, 8192, 1},
  };
  for (const Case& c : cases) {
    const double s = time_case(handle, c, repeats);
    const double flops = 2.0 * c.m * c.n * static_cast<double>(c.k) * c.batch;
    std::printf("%-44s %9.3f ms  %7.1f TFLOP/s\n", c.name, s * 1e3, flops / s / 1e12);
  }
  cublasDestroy(handle);
  return 0;
}
