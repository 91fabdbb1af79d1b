// The AVX-512 layer's test entry points (simd_probe.hpp), compiled with the AVX-512 kernels' flags.
#include "backends/cpu/kernels/avx512/convert.hpp"
#include "backends/cpu/kernels/avx512/simd.hpp"
#include "simd_probe.hpp"

#define A2D_SIMD_NAMESPACE avx512
#include "simd_probe.inc"
