// Internal: how the CPU kernels cut query and key rows into tiles, and the argument checks they
// share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention2d/kernel.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace a2d::cpu {

// A run of consecutive rows [begin, end) and the smallest and largest global position in it.
struct Tile {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t min_position = 0;
  int64_t max_position = 0;
  int64_t size() const { return end - begin; }
};

inline std::vector<Tile> make_tiles(const int64_t* positions, int64_t rows, int64_t block) {
  std::vector<Tile> tiles;
  for (int64_t begin = 0; begin < rows; begin += block) {
    Tile tile{begin, std::min(rows, begin + block), 0, 0};
    tile.min_position = positions ? positions[begin] : begin;
    tile.max_position = tile.min_position;
    for (int64_t i = begin; i < tile.end; ++i) {
      const int64_t p = positions ? positions[i] : i;
      tile.min_position = std::min(tile.min_position, p);
      tile.max_position = std::max(tile.max_position, p);
    }
    tiles.push_back(tile);
  }
  return tiles;
}

inline int64_t position_of(const int64_t* positions, int64_t index) {
  return positions ? positions[index] : index;
}

inline BlockVisibility classify(const MaskView& mask, const Tile& q, const Tile& k) {
  return mask.classify(q.min_position, q.max_position, k.min_position, k.max_position);
}

// True on the thread that called the kernel (OpenMP's master thread of the kernel's team): the
// only one allowed to call the progress callback, which may call MPI.
inline bool is_calling_thread() {
#ifdef _OPENMP
  return omp_get_thread_num() == 0;
#else
  return true;
#endif
}

// Shared validation of shape, mask, scale, thread count and the presence of input pointers.
void check_common(const AttentionShape& shape, const Mask& mask, float scale, int threads);
void check_softcap(float softcap);  // 0 (off) or finite and positive

// An uninitialised, 64-byte aligned float array (one cache line, two ymm registers) that the
// AVX2 translation units use instead of std::vector: its code is compiled here, without AVX2, so
// no inline std:: function is instantiated with AVX2 instructions (see avx2/simd.hpp).
class AlignedFloats {
 public:
  explicit AlignedFloats(int64_t count);
  ~AlignedFloats();
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data() const { return data_; }

 private:
  float* data_ = nullptr;
};

// Floats of an AlignedFloats slice rounded up to whole cache lines, so slices stay aligned.
inline int64_t cache_lines_of_floats(int64_t count) {
  return (count + 15) / 16 * 16;
}

}  // namespace a2d::cpu
