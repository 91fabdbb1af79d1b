// measure_fma_peak: the FP32 FMA peak of this machine, measured in the same run as the kernel.
#include "attention2d/peak.hpp"

#include <cstdint>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/timing.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "paths.hpp"

namespace a2d {
namespace {

// The same 12 chains in plain C++ for CPUs without AVX2: 96 independent lanes the compiler
// vectorises for the baseline ISA (on x86-64 without FMA: separate multiply and add).
float portable_chains(int64_t iterations) {
  constexpr int kLanesTotal = 96;
  float acc[kLanesTotal];
  for (int c = 0; c < kLanesTotal; ++c)
    acc[c] = static_cast<float>(c % 12);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma omp simd
    for (int c = 0; c < kLanesTotal; ++c)
      acc[c] = acc[c] * 0.999f + 1e-3f;
  }
  float sum = 0.0f;
  for (float a : acc)
    sum += a;
  return sum;
}

// chains x lanes x (multiply + add): 8 lanes for AVX2 and portable (96 lanes), 16 for AVX-512.
constexpr double kFlopsPerIteration = 12 * 8 * 2;
constexpr double kFlopsPerAvx512Iteration = 12 * 16 * 2;

// Runs `chains` (a loop of `flops_per_iteration` per iteration) on `threads` threads at once, best
// of `tries` of about `seconds_per_try` seconds each, and sums the threads' best rates.
template <typename Chains>
FmaPeak measure_chains(Chains&& chains, double flops_per_iteration, int threads, int tries,
                       double seconds_per_try) {
  // Calibrate the iteration count on one short run so every try lasts about seconds_per_try.
  int64_t iterations = 1 << 16;
  for (;;) {
    const double start = seconds_now();
    volatile float sink = chains(iterations);
    (void)sink;
    const double elapsed = seconds_now() - start;
    if (elapsed > seconds_per_try / 4 || iterations > (int64_t{1} << 40)) {
      iterations = static_cast<int64_t>(static_cast<double>(iterations) * seconds_per_try /
                                        (elapsed > 0 ? elapsed : 1e-9)) +
                   1;
      break;
    }
    iterations *= 4;
  }

  std::vector<double> best(static_cast<size_t>(threads), 0.0);
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static, 1)
    for (int t = 0; t < threads; ++t) {
      for (int attempt = 0; attempt < tries; ++attempt) {
        const double start = seconds_now();
        volatile float sink = chains(iterations);
        (void)sink;
        const double rate =
            flops_per_iteration * static_cast<double>(iterations) / (seconds_now() - start) / 1e9;
        if (rate > best[t]) best[t] = rate;
      }
    }
  }
  FmaPeak peak;
  peak.threads = threads;
  for (double rate : best)
    peak.gflops += rate;
  peak.gflops_per_thread = peak.gflops / threads;
  return peak;
}

void check_peak_arguments(int threads, int tries, double seconds_per_try) {
  A2D_REQUIRE(threads >= 1 && tries >= 1 && seconds_per_try > 0,
              "measure_fma_peak: threads and tries must be >= 1 and the time positive");
}

}  // namespace

FmaPeak measure_fma_peak(int threads, int tries, double seconds_per_try) {
  check_peak_arguments(threads, tries, seconds_per_try);
  const bool avx2 = kernel_path_supported(KernelPath::avx2);
  // The peak of the widest vectors this CPU has (the peak the fastest path can reach).
  const bool avx512 = kernel_path_supported(KernelPath::avx512);
  const double flops_per_iteration = avx512 ? kFlopsPerAvx512Iteration : kFlopsPerIteration;
  auto chains = [&](int64_t iterations) {
#if A2D_HAVE_AVX512_PATH
    if (avx512) return cpu::avx512::fma_chains(iterations);
#endif
#if A2D_HAVE_AVX2_PATH
    if (avx2) return cpu::avx2::fma_chains(iterations);
#endif
    return portable_chains(iterations);
  };
  FmaPeak peak = measure_chains(chains, flops_per_iteration, threads, tries, seconds_per_try);
  peak.isa = avx512 ? "avx512-fma" : avx2 ? "avx2-fma" : "portable";
  return peak;
}

FmaPeak measure_product_peak(DType dtype, int threads, int tries, double seconds_per_try) {
#if A2D_HAVE_AMX_PATH
  if (dtype == DType::bf16 && kernel_path() == KernelPath::amx) {
    check_peak_arguments(threads, tries, seconds_per_try);
    // Per iteration: 4 TDPBF16PS of 16 x 16 x 32 products, 2 flops each.
    FmaPeak peak = measure_chains([](int64_t n) { return cpu::amx::tile_chains(n); },
                                  4.0 * 16 * 16 * 32 * 2, threads, tries, seconds_per_try);
    peak.isa = "amx-bf16";
    return peak;
  }
#endif
#if A2D_HAVE_AVX512BF16_PATH
  if (dtype == DType::bf16 && kernel_path() == KernelPath::avx512bf16) {
    check_peak_arguments(threads, tries, seconds_per_try);
    // Per iteration: 12 VDPBF16PS of 16 lanes x 2 products and their 2 adds.
    FmaPeak peak = measure_chains([](int64_t n) { return cpu::avx512bf16::dot_chains(n); },
                                  12.0 * 16 * 4, threads, tries, seconds_per_try);
    peak.isa = "avx512-bf16";
    return peak;
  }
#endif
  (void)dtype;
  return measure_fma_peak(threads, tries, seconds_per_try);
}

}  // namespace a2d
