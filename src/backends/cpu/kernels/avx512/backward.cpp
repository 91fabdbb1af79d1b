// The AVX-512 backward kernel: simd/backward.inc on the 16-lane layer of simd.hpp, every tile
// product a 12 x 32 micro-kernel (12 rows, 2 zmm vectors: 24 accumulators of 32 registers), on
// the tiles of the AVX2 kernel (kCpuBackwardTileQ x kCpuBackwardTileK = 48 x 96).
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/cpu/kernels/paths.hpp"
#include "backends/cpu/kernels/tiles.hpp"
#include "convert.hpp"
#include "simd.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace a2d::cpu::avx512 {
namespace {

constexpr int kRows = 12;    // micro-kernel rows
constexpr int kVectors = 2;  // micro-kernel vectors: 32 columns

}  // namespace
}  // namespace a2d::cpu::avx512

#define A2D_SIMD_NAMESPACE avx512
#include "backends/cpu/kernels/simd/backward.inc"
#undef A2D_SIMD_NAMESPACE
