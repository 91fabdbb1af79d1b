// The AVX-512 forward kernel: simd/forward.inc on the 16-lane layer of simd.hpp. The panel is 48
// query rows (3 zmm vectors; the cost model's kCpuForwardPanel = 24 is the AVX2 kernel's), the key
// tiles and 4-key blocks are the AVX2 kernel's, and the 32 zmm registers take a P V block of 12
// queries x 32 dims (24 accumulators).
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "backends/cpu/kernels/paths.hpp"
#include "backends/cpu/kernels/tiles.hpp"
#include "convert.hpp"
#include "simd.hpp"

namespace a2d::cpu::avx512 {
namespace {

constexpr int kPanelVectors = 3;  // 48 query rows per panel
// Bytes of Qt and O of one query tile (64 panels at D = 128). Every query tile copies every K and
// V tile it sees, and the copies are the kernel's main cost after the products (a row of K or V
// is one 4 KiB page at 8 heads of 128 dims: one TLB miss per row, see docs/performance.md), so
// query tiles are tall. Their state does not need to stay in L2: each panel's Qt and O (24 KiB
// at D = 128) are streamed in once per 256-key tile, against ~200 000 cycles of products.
constexpr int64_t kQueryTileBytes = 1536 << 10;
constexpr int64_t kTileK = kCpuForwardTileK;                    // 256 keys per key tile
constexpr int kKeyStep = static_cast<int>(kCpuForwardKeyStep);  // keys per S call; mask block
constexpr int kValueRows = 12;                                  // queries per P V micro-kernel call
constexpr int kValueVectors = 2;  // 32 head dims per P V micro-kernel call

}  // namespace
}  // namespace a2d::cpu::avx512

#define A2D_SIMD_NAMESPACE avx512
#include "backends/cpu/kernels/simd/forward.inc"
#undef A2D_SIMD_NAMESPACE
