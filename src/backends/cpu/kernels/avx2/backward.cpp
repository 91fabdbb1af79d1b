// The AVX2/FMA backward kernel: simd/backward.inc on the 8-lane layer of simd.hpp, every tile
// product a 6 x 16 micro-kernel (6 rows, 2 ymm vectors: 12 accumulators of 16 registers).
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

namespace a2d::cpu::avx2 {
namespace {

constexpr int kRows = 6;     // micro-kernel rows
constexpr int kVectors = 2;  // micro-kernel vectors: 16 columns

}  // namespace
}  // namespace a2d::cpu::avx2

#define A2D_SIMD_NAMESPACE avx2
#include "backends/cpu/kernels/simd/backward.inc"
#undef A2D_SIMD_NAMESPACE
