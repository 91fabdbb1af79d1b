// The AVX2 layer's test entry points (simd_probe.hpp), compiled with -mavx2 -mfma -mf16c.
#include "backends/cpu/kernels/avx2/convert.hpp"
#include "backends/cpu/kernels/avx2/simd.hpp"
#include "simd_probe.hpp"

#define A2D_SIMD_NAMESPACE avx2
#include "simd_probe.inc"
