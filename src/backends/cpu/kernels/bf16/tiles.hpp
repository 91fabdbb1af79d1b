// Internal: what the bf16 kernels (bf16/forward.inc, bf16/backward.inc) share: the packing of
// bf16 rows into the two operand layouts of the bf16 pair products, and those products on 32 x 32
// fp32 blocks, in one of two implementations:
//
//   A2D_BF16_ON_AMX 1   AMX tiles (amx/): TDPBF16PS, C blocks in four tile registers
//   A2D_BF16_ON_AMX 0   AVX512-BF16 vectors (avx512bf16/): VDPBF16PS, C blocks in a 4 KiB array
//                       of the thread (the "tile registers"), register-blocked 8 rows x 32 columns
//
// Both compute C += A B with C 32 x 32 fp32, A 32 rows x 32 bf16 (row-major, any row stride) and B
// 32 x 32 bf16 as two 16-column halves, each stored as 16 rows of 16 pairs ("VNNI": B[k][n] at row
// k / 2, pair element k % 2 of column n; 1 KiB): per output element, each pair of bf16 products
// exact in fp32 and added to it in fp32. Every tile here is 16 rows of 64 bytes.
//
// The including file defines A2D_BF16_NAMESPACE (amx or avx512bf16) and A2D_BF16_ON_AMX, and is
// compiled with the flags of its path; everything here has internal linkage.
#pragma once

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/avx512/simd.hpp"  // first: <immintrin.h> (see there)

namespace a2d::cpu::A2D_BF16_NAMESPACE {
namespace {

constexpr int kTileRows = 16;      // rows of every tile
constexpr int kTileElements = 512;  // bf16 elements of one 1 KiB B tile

[[maybe_unused]] int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}
[[maybe_unused]] int64_t smaller(int64_t a, int64_t b) {
  return a < b ? a : b;
}
[[maybe_unused]] int64_t position(const int64_t* positions, int64_t index) {
  return positions ? positions[index] : index;
}

struct Bounds {
  int64_t min = 0;
  int64_t max = 0;
};

// The smallest and largest of positions [begin, end) (nullptr: the indices).
[[maybe_unused]] Bounds bounds_of(const int64_t* positions, int64_t begin, int64_t end) {
  Bounds b{position(positions, begin), position(positions, begin)};
  for (int64_t i = begin + 1; i < end; ++i) {
    const int64_t pos = position(positions, i);
    b.min = pos < b.min ? pos : b.min;
    b.max = pos > b.max ? pos : b.max;
  }
  return b;
}

// 2^x for x <= 0, -inf and NaN: avx512's exp2_lanes polynomial (degree 6, within 2 ulp), with
// 2^n applied by vscalefps. x is clamped below at -200, where the result underflows to exactly 0
// (masked scores need 0).
A2D_INLINE __m512 exp2_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-200.0f), x);  // this operand order lets NaN through
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5461444854736328e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3400427997112274e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618056938052177e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550327152013779e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022650718688965f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471824645996f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The operands of a block product: steps i = 0 .. steps - 1, each A_i B_i with A_i 32 rows of 32
// bf16 at a + i a_step (rows a_stride elements apart) and B_i the two 1 KiB tiles at b + i b_step
// (columns 0-15) and b + i b_step + b_half (columns 16-31); a step is skipped where `use` is set
// and use[i] is false.
struct Operands {
  const uint16_t* a;
  int64_t a_stride, a_step;
  const uint16_t* b;
  int64_t b_half, b_step;
  int64_t steps;
  const bool* use = nullptr;
};

#if A2D_BF16_ON_AMX
// The 64-byte tile configuration (palette 1) of LDTILECFG: tiles 0-7, each 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Every thread that runs tile instructions loads the configuration first and releases it after.
class TileScope {
 public:
  TileScope() {
    TileConfig config;
    for (int t = 0; t < 8; ++t) {
      config.bytes_per_row[t] = 64;
      config.rows[t] = kTileRows;
    }
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Every product here is a 2 x 2 block of C tiles 0-3 (rows 0-15: tiles 0, 1; rows 16-31: tiles
// 2, 3; columns 0-15 and 16-31), A tiles 4 (rows 0-15) and 5 (rows 16-31), B tiles 6 (columns
// 0-15) and 7 (columns 16-31). `c` is the block's first fp32 element, rows `stride` floats apart.
A2D_INLINE void load_c_block(const float* c, int64_t stride) {
  _tile_loadd(0, c, stride * 4);
  _tile_loadd(1, c + kTileRows, stride * 4);
  _tile_loadd(2, c + kTileRows * stride, stride * 4);
  _tile_loadd(3, c + kTileRows * stride + kTileRows, stride * 4);
}
A2D_INLINE void zero_c_block() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
A2D_INLINE void store_c_block(float* c, int64_t stride) {
  _tile_stored(0, c, stride * 4);
  _tile_stored(1, c + kTileRows, stride * 4);
  _tile_stored(2, c + kTileRows * stride, stride * 4);
  _tile_stored(3, c + kTileRows * stride + kTileRows, stride * 4);
}
// A tiles: rows 0-15 at `a`, rows 16-31 at a + 16 stride (bf16, rows `stride` elements apart);
// B tiles: two 1 KiB tiles at b0 and b1.
A2D_INLINE void multiply_block(const uint16_t* a, int64_t stride, const uint16_t* b0,
                               const uint16_t* b1) {
  _tile_loadd(4, a, stride * 2);
  _tile_loadd(5, a + kTileRows * stride, stride * 2);
  _tile_loadd(6, b0, 64);
  _tile_loadd(7, b1, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// C = (zero ? 0 : C) + the sum of the steps' products, C 32 x 32 fp32 at c (rows `stride` floats
// apart): start_product computes it and finish_product stores it. On AMX the block stays in the
// tile registers in between, so a caller may run vector code between the two while the tile unit
// works; on AVX512-BF16 start_product also stores it and finish_product does nothing. One block
// at a time per thread.
A2D_INLINE void start_product(float* c, int64_t stride, bool zero, const Operands& x) {
  if (zero) {
    zero_c_block();
  } else {
    load_c_block(c, stride);
  }
  for (int64_t i = 0; i < x.steps; ++i) {
    if (x.use && !x.use[i]) continue;
    const uint16_t* b = x.b + i * x.b_step;
    multiply_block(x.a + i * x.a_step, x.a_stride, b, b + x.b_half);
  }
}
A2D_INLINE void finish_product(float* c, int64_t stride) {
  store_c_block(c, stride);
}

#else
// Nothing to configure: the products run on zmm registers.
class TileScope {
 public:
  TileScope() = default;
  ~TileScope() = default;
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// 8 rows of C (16 zmm accumulators) at a time over every step: per pair of A's columns, one row of
// each B tile (16 pairs) and one broadcast pair of each A row.
A2D_INLINE void start_product(float* c, int64_t stride, bool zero, const Operands& x) {
  constexpr int kRows = 8;
  for (int r0 = 0; r0 < 2 * kTileRows; r0 += kRows) {
    __m512 acc[kRows][2];
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      acc[r][0] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + (r0 + r) * stride);
      acc[r][1] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + (r0 + r) * stride + 16);
    }
    for (int64_t i = 0; i < x.steps; ++i) {
      if (x.use && !x.use[i]) continue;
      const uint16_t* a = x.a + i * x.a_step + r0 * x.a_stride;
      const uint16_t* b0 = x.b + i * x.b_step;
      const uint16_t* b1 = b0 + x.b_half;
#pragma GCC unroll 2
      for (int p = 0; p < kTileRows; ++p) {
        const auto y0 = (__m512bh)_mm512_loadu_si512(b0 + p * 32);
        const auto y1 = (__m512bh)_mm512_loadu_si512(b1 + p * 32);
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) {
          uint32_t pair;
          std::memcpy(&pair, a + r * x.a_stride + 2 * p, sizeof pair);
          const auto xr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, y0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, y1);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      _mm512_storeu_ps(c + (r0 + r) * stride, acc[r][0]);
      _mm512_storeu_ps(c + (r0 + r) * stride + 16, acc[r][1]);
    }
  }
}
A2D_INLINE void finish_product(float*, int64_t) {}
#endif

// start_product and finish_product at once.
A2D_INLINE void block_product(float* c, int64_t stride, bool zero, const Operands& x) {
  start_product(c, stride, zero, x);
  finish_product(c, stride);
}

// B tiles whose pairs run along the dims: for 16 consecutive rows (the tile's columns) of `rows`
// (bf16, `padded_dim` apart, padded_dim a multiple of 32), one tile per 32 dims:
// out[chunk][pair][row] = (rows[row][32 chunk + 2 pair], rows[row][32 chunk + 2 pair + 1]).
// The operand that multiplies A's dims: K in S = Q K^T.
A2D_INLINE void pack_pairs_of_dims(const uint16_t* rows, int64_t padded_dim, uint16_t* out) {
  auto* tiles = reinterpret_cast<uint32_t*>(out);
  for (int64_t chunk = 0; chunk < padded_dim / 32; ++chunk) {
    uint32_t* tile = tiles + chunk * (kTileElements / 2);
    for (int64_t row = 0; row < kTileRows; ++row) {
      const uint16_t* from = rows + row * padded_dim + chunk * 32;
      for (int64_t pair = 0; pair < 16; ++pair) {
        uint32_t bits;
        std::memcpy(&bits, from + 2 * pair, sizeof bits);
        tile[pair * 16 + row] = bits;
      }
    }
  }
}

// B tiles whose pairs run along the rows: for 32 consecutive rows of `rows` (bf16, `padded_dim`
// apart), one tile per 16 dims: out[tile][r][n] = (rows[2 r][16 tile + n], rows[2 r + 1][16 tile +
// n]). The operand whose rows are the product's depth: V in O = P V.
A2D_INLINE void pack_pairs_of_rows(const uint16_t* rows, int64_t padded_dim, uint16_t* out) {
  for (int64_t t = 0; t < padded_dim / 16; ++t) {
    uint16_t* tile = out + t * kTileElements;
    for (int64_t r = 0; r < kTileRows; ++r) {
      const __m512i even = _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + 2 * r * padded_dim + 16 * t)));
      const __m512i odd = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(rows + (2 * r + 1) * padded_dim + 16 * t)));
      _mm512_store_si512(tile + r * 32, _mm512_or_si512(even, _mm512_slli_epi32(odd, 16)));
    }
  }
}

}  // namespace
}  // namespace a2d::cpu::A2D_BF16_NAMESPACE
