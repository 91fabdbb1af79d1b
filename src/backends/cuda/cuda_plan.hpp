// Internal: the host-side logic of the CUDA backend, in plain C++ so that it compiles, and is
// unit-tested (tests/unit/test_cuda_plan.cpp), in every build, with or without a CUDA toolkit:
//   - the tile sizes of the attention kernels and the classification of a (query tile, key tile)
//     pair by its minimum and maximum global positions (hidden / partial / full): the mask's own
//     MaskView::classify, as in the CPU kernels (the .cu kernels call classify_tile on the
//     device, with the view's arrays copied to the GPU);
//   - the validation of a kernel call (dtype, head dimension, mask, alignment of the rows that
//     cp.async and ldmatrix read 16 bytes at a time) with clear errors before anything launches;
//   - launch planning: grid and block sizes, shared-memory bytes, the work-space of the
//     per-tile position bounds, for the attention kernels and the element-wise kernels.
// Nothing here touches device memory. docs/gpu.md describes the kernels that use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/kernel.hpp"

namespace a2d::cuda_plan {

// Forward: a thread block of kForwardWarps warps holds kForwardTileQ query rows (16 per warp, the
// M of one m16n8k16 product) and walks the key tiles kForwardTileK keys at a time.
inline constexpr int kForwardWarps = 4;
inline constexpr int kForwardTileQ = 16 * kForwardWarps;  // 64
inline constexpr int kForwardTileK = 64;
// Backward: a block holds kBackwardTileK keys (16 per warp) of one K/V head, accumulates their dK
// and dV in registers, and walks the query tiles of every query head of the group kBackwardTileQ
// rows at a time; dQ is summed into fp32 memory with atomic adds.
inline constexpr int kBackwardWarps = 4;
inline constexpr int kBackwardTileK = 16 * kBackwardWarps;  // 64
inline constexpr int kBackwardTileQ = 32;
// Element-wise kernels: threads per block.
inline constexpr int kElementwiseThreads = 256;
// Shared-memory rows are padded by 8 elements (16 bytes), so that the 8 rows one ldmatrix reads
// fall into distinct banks for every supported head dimension (docs/gpu.md works it out).
inline constexpr int kRowPadElements = 8;

// How queries with positions in [q_min, q_max] relate to keys in [k_min, k_max]: the mask's
// MaskView::classify (every kind, documents and range slices too). A tile with rows past the end
// of the tensor is classified by its real rows; the kernels mask the missing rows themselves.
enum TileClass : int { kTileHidden = 0, kTilePartial = 1, kTileFull = 2 };
A2D_HOST_DEVICE inline int classify_tile(const MaskView& mask, int64_t q_min, int64_t q_max,
                                         int64_t k_min, int64_t k_max) {
  switch (mask.classify(q_min, q_max, k_min, k_max)) {
    case BlockVisibility::hidden:
      return kTileHidden;
    case BlockVisibility::full:
      return kTileFull;
    default:
      return kTilePartial;
  }
}

// Whether query position q sees key position k.
A2D_HOST_DEVICE inline bool visible(const MaskView& mask, int64_t q, int64_t k) {
  return mask.visible(q, k);
}

// The arrays of a mask's view that the kernels read (MaskView's doc_offsets and ranges), in int64
// values: what the CUDA backend copies to the GPU before a call.
int64_t mask_document_values(const Mask& mask);
int64_t mask_range_values(const Mask& mask);

// A kernel launch: grid (x, y, z), threads per block, dynamic shared memory.
struct Launch {
  int64_t grid_x = 1;
  int64_t grid_y = 1;
  int64_t grid_z = 1;
  int threads = 1;
  int64_t shared_bytes = 0;
  bool empty() const { return grid_x == 0 || grid_y == 0 || grid_z == 0; }
};

struct AttentionPlan {
  Launch launch;
  int64_t head_dim = 0;
  int64_t q_tiles = 0;   // tiles of the kernel's query tile size
  int64_t kv_tiles = 0;  // tiles of its key tile size
  // Work-space: (min, max) int64 position pairs of the query tiles and of the key tiles.
  int64_t bounds_bytes = 0;
  // The mask, its arrays in host memory (the backend points them at GPU copies).
  MaskView mask;
  std::string describe() const;
};

// The head dimensions and dtypes the tensor-core kernels are instantiated for (bf16 first: the
// default), as lists for the backends' capabilities.
bool supported_head_dim(int64_t head_dim);
bool supported_dtype(DType dtype);
const std::vector<DType>& kernel_dtypes();
const std::vector<int64_t>& kernel_head_dims();

// Checks a kernel call's arguments (throws a2d::Error naming the first problem): shape, scale,
// dtype (bf16 or fp16, the same for every input), head dimension 64/80/96/128, a valid mask (any
// kind), no softcap (not on the CUDA backend yet).
void check_forward(const ForwardCall& call);
// The same for a whole problem (Backend::check_supported of the CUDA backend).
void check_supported(DType dtype, int64_t head_dim, const Mask& mask, float softcap);
void check_backward(const BackwardCall& call);
// Whether every row of a tensor starts on a 16-byte boundary (offset and strides, in elements),
// as cp.async needs. The CUDA backend copies an input that is not (the algorithms' records put
// fp32 fields before 16-bit rows) into a dense scratch tensor first.
bool rows_aligned(const TokenTensor& t);
// The outputs the kernels write two elements at a time: O in the inputs' dtype (4-byte pairs),
// the fp32 partial accumulator, dK and dV (8-byte pairs); dQ fp32.
void check_forward_output(const ForwardCall& call, const TokenTensor& out);
void check_partial_output(const PartialTensor& state);
void check_backward_outputs(const TokenTensor& dq, const TokenTensor& dk, const TokenTensor& dv);

// Grid: x = query tiles, y = query heads, z = batch. Shared memory: the Q tile and one K and one
// V tile, padded rows of 16-bit elements, plus the tile's query and key positions.
AttentionPlan plan_forward(const AttentionShape& shape, const Mask& mask);
// Grid: x = key tiles, y = K/V heads, z = batch. Shared memory: one Q and one dO tile, the
// block's K and V tiles, dS^T of one tile pair (16-bit), and the tile's LSE, delta and positions.
AttentionPlan plan_backward(const AttentionShape& shape, const Mask& mask);
// Shared bytes of the kernels for head dimension d (what plan_* put in shared_bytes).
int64_t forward_shared_bytes(int64_t head_dim);
int64_t backward_shared_bytes(int64_t head_dim);
// The largest dynamic shared memory one block may use on sm_80 and sm_90 (opt-in): 163 KiB on
// sm_80 (A100), 227 KiB on sm_90. The plans stay under the smaller one.
inline constexpr int64_t kMaxSharedBytes = 163 * 1024;

// One thread per element, kElementwiseThreads per block, at most `max_blocks` blocks (the
// kernels loop with a grid stride over the rest).
Launch plan_elementwise(int64_t count, int64_t max_blocks = 65536);
// One warp per row, 8 rows per block (merge, finalize, delta, sinks).
Launch plan_rows(int64_t rows, int64_t max_blocks = 65536);

// Bytes from a strided tensor's first element to the end of its last row (0 for an empty block),
// and the bounds checks every operation applies before it launches (a2d::Error on failure).
int64_t extent_bytes(int64_t element_bytes, int64_t batch, int64_t tokens, int64_t heads,
                     int64_t width, int64_t batch_stride, int64_t token_stride,
                     int64_t head_stride);
void check_place(const Place& place, int64_t bytes, const char* what);
void check_tokens(const TokenTensor& t, const TokenBlock& block, const char* what);
void check_rows(const RowTensor& t, int64_t batch, int64_t heads, int64_t tokens, const char* what);

}  // namespace a2d::cuda_plan
