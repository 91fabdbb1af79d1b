// attention2d: the machine's measured FP32 FMA peak, the yardstick of kernel efficiency.
#pragma once

#include <string>

#include "attention2d/dtype.hpp"

namespace a2d {

struct FmaPeak {
  double gflops = 0.0;             // all threads together
  double gflops_per_thread = 0.0;  // gflops / threads
  int threads = 0;
  // What the loop ran: "avx512-fma" (16-lane), "avx2-fma" (8-lane), "portable", or
  // (measure_product_peak) "amx-bf16" or "avx512-bf16".
  std::string isa;
};

// Runs `threads` threads at once, each timing 12 independent chains of fp32 fused multiply-adds
// (enough chains to cover the FMA latency on two FMA pipes) for about `seconds_per_try` seconds,
// best of `tries`; each thread reports its best rate and the peak is their sum. Uses AVX2/FMA
// when the CPU has it, whatever kernel path is selected, so efficiency is always measured against
// the machine, not against the path.
FmaPeak measure_fma_peak(int threads, int tries = 5, double seconds_per_try = 0.02);

// The peak of the products the current kernel path runs for inputs of `dtype`: with bf16, on the
// amx path the AMX tile peak (isa "amx-bf16": TDPBF16PS into four independent C tiles on operands
// held in tile registers), on the avx512bf16 path the VDPBF16PS peak (isa "avx512-bf16": 12
// independent zmm chains); otherwise measure_fma_peak.
FmaPeak measure_product_peak(DType dtype, int threads, int tries = 5,
                             double seconds_per_try = 0.02);

}  // namespace a2d
