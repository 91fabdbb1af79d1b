// Internal: what the AMX kernels (forward.cpp, backward.cpp) share: the tile configuration and
// the packing of bf16 rows into the two operand layouts of TDPBF16PS. Include only from
// translation units compiled with the AMX flags; everything here has internal linkage.
//
// TDPBF16PS C += A B: C is 16 x 16 fp32, A 16 rows x 32 bf16 (row-major, any row stride), B 32 x 16
// bf16 stored as 16 rows of 16 pairs ("VNNI": B[k][n] at row k / 2, pair element k % 2 of column
// n), 1 KiB. Every tile here is 16 rows of 64 bytes.
#pragma once

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/avx512/simd.hpp"  // first: <immintrin.h> (see there)

namespace a2d::cpu::amx {
namespace {

constexpr int kTileRows = 16;      // rows of every tile
constexpr int kTileElements = 512;  // bf16 elements of one 1 KiB B tile

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
}  // namespace a2d::cpu::amx
