// The AMX tile peak probe of measure_product_peak (src/backends/cpu/kernels/peak.cpp).
#define A2D_BF16_NAMESPACE amx
#define A2D_BF16_ON_AMX 1
#include "backends/cpu/kernels/bf16/tiles.hpp"
#include "backends/cpu/kernels/paths.hpp"

namespace a2d::cpu::amx {

// The tile peak probe: four independent C tiles, each TDPBF16PS 16 x 16 x 32 products (2 flops
// each) on operands that stay in the tile registers. Returns a value that depends on the result.
float tile_chains(int64_t iterations) {
  alignas(64) uint16_t ones[kTileElements];
  for (uint16_t& x : ones)
    x = 0x3c00;  // bf16 2^-7: the sums stay exact and finite
  alignas(64) float out[kTileRows * kTileRows];
  const TileScope tiles;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  float sum = out[0];
  _tile_stored(3, out, 64);
  return sum + out[255];
}

}  // namespace a2d::cpu::amx
