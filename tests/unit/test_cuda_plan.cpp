// The CUDA backend's host-side logic (src/backends/cuda/cuda_plan.hpp), which needs no GPU and no
// CUDA toolkit: tile classification against the CPU's classify_block and a brute force over
// shuffled positions, launch plans, and the argument checks that run before anything launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/error.hpp"
#include "backends/cuda/cuda_plan.hpp"

namespace a2d {
namespace {

using namespace cuda_plan;

std::vector<Mask> masks() {
  return {Mask::none(),
          Mask::causal(),
          Mask::causal_window(1),
          Mask::causal_window(7),
          Mask::causal_window(100),
          Mask::window_size(3, 2),
          Mask::window_size(-1, 4),
          Mask::window_size(5, -1),
          Mask::causal().with_documents({3, 1, 9, 400, 600}),
          Mask::from_ranges({{0, 5, 0, 12, RangeType::causal},
                             {2, 900, 12, 20, RangeType::bi_causal},
                             {5, 1000, 20, 700, RangeType::inv_causal},
                             {600, 1000, 700, 1000, RangeType::full}})};
}

int expected_class(BlockVisibility v) {
  return v == BlockVisibility::hidden ? kTileHidden
         : v == BlockVisibility::full ? kTileFull
                                      : kTilePartial;
}

TEST(CudaPlan, ClassifyTileMatchesTheCpuRule) {
  for (const Mask& mask : masks()) {
    const MaskView device = mask.view();
    for (int64_t q_min = -3; q_min < 12; ++q_min)
      for (int64_t q_max = q_min; q_max < 14; ++q_max)
        for (int64_t k_min = -3; k_min < 12; ++k_min)
          for (int64_t k_max = k_min; k_max < 14; ++k_max) {
            ASSERT_EQ(classify_tile(device, q_min, q_max, k_min, k_max),
                      expected_class(classify_block(mask, q_min, q_max, k_min, k_max)))
                << mask.describe() << " q [" << q_min << ", " << q_max << "] k [" << k_min << ", "
                << k_max << "]";
          }
    for (int64_t q = -5; q < 20; ++q)
      for (int64_t k = -5; k < 20; ++k)
        ASSERT_EQ(visible(device, q, k), mask.visible(q, k));
  }
}

// Tiles of shuffled positions, bounded as the device's tile_bounds kernel bounds them: a hidden
// pair has no visible (query, key), a full pair no hidden one. Odd lengths leave a ragged last
// tile.
TEST(CudaPlan, TileClassesAreSafeForShuffledPositions) {
  std::mt19937_64 random(7);
  for (const Mask& mask : masks()) {
    const MaskView device = mask.view();
    for (const int64_t n : {int64_t{1}, int64_t{63}, int64_t{333}, int64_t{1000}}) {
      std::vector<int64_t> q_pos(static_cast<size_t>(n)), k_pos(static_cast<size_t>(n));
      std::iota(q_pos.begin(), q_pos.end(), 0);
      std::iota(k_pos.begin(), k_pos.end(), 0);
      // Partly shuffled: blocks of 96 shuffled inside, so that some tiles stay separable.
      for (int64_t b = 0; b < n; b += 96) {
        std::shuffle(q_pos.begin() + b, q_pos.begin() + std::min(n, b + 96), random);
        std::shuffle(k_pos.begin() + b, k_pos.begin() + std::min(n, b + 96), random);
      }
      auto bounds = [](const std::vector<int64_t>& pos, int64_t begin, int64_t tile) {
        const int64_t end = std::min<int64_t>(static_cast<int64_t>(pos.size()), begin + tile);
        const auto [lo, hi] = std::minmax_element(pos.begin() + begin, pos.begin() + end);
        return std::pair<int64_t, int64_t>{*lo, *hi};
      };
      int counts[3] = {0, 0, 0};
      for (int64_t q0 = 0; q0 < n; q0 += kForwardTileQ) {
        const auto [q_min, q_max] = bounds(q_pos, q0, kForwardTileQ);
        for (int64_t k0 = 0; k0 < n; k0 += kForwardTileK) {
          const auto [k_min, k_max] = bounds(k_pos, k0, kForwardTileK);
          const int cls = classify_tile(device, q_min, q_max, k_min, k_max);
          ++counts[cls];
          if (cls == kTilePartial) continue;
          for (int64_t i = q0; i < std::min(n, q0 + kForwardTileQ); ++i)
            for (int64_t j = k0; j < std::min(n, k0 + kForwardTileK); ++j)
              ASSERT_EQ(mask.visible(q_pos[static_cast<size_t>(i)], k_pos[static_cast<size_t>(j)]),
                        cls == kTileFull);
        }
      }
      if (mask.kind == MaskKind::causal && n == 1000) {
        EXPECT_GT(counts[kTileHidden], 0);
      }
    }
  }
}

AttentionShape shape(int64_t heads, int64_t kv_heads, int64_t q, int64_t kv, int64_t d) {
  return {2, heads, kv_heads, q, kv, d};
}

TEST(CudaPlan, ForwardAndBackwardLaunches) {
  const AttentionPlan fwd = plan_forward(shape(12, 4, 333, 501, 80), Mask::causal());
  EXPECT_EQ(fwd.q_tiles, 6);   // ceil(333 / 64)
  EXPECT_EQ(fwd.kv_tiles, 8);  // ceil(501 / 64)
  EXPECT_EQ(fwd.launch.grid_x, 6);
  EXPECT_EQ(fwd.launch.grid_y, 12);
  EXPECT_EQ(fwd.launch.grid_z, 2);
  EXPECT_EQ(fwd.launch.threads, 128);
  EXPECT_EQ(fwd.bounds_bytes, 2 * (6 + 8) * 8);
  EXPECT_EQ(fwd.mask.kind, MaskKind::causal);
  // Q, K, V tiles of 64 padded rows of (80 + 8) 16-bit elements, and 128 positions.
  EXPECT_EQ(fwd.launch.shared_bytes, 3 * 64 * 88 * 2 + 128 * 8);

  const AttentionPlan bwd = plan_backward(shape(12, 4, 333, 501, 128), Mask::causal_window(50));
  EXPECT_EQ(bwd.q_tiles, 11);  // ceil(333 / 32)
  EXPECT_EQ(bwd.kv_tiles, 8);
  EXPECT_EQ(bwd.launch.grid_x, 8);
  EXPECT_EQ(bwd.launch.grid_y, 4);  // K/V heads: the block sums its group's query heads
  EXPECT_EQ(bwd.launch.grid_z, 2);
  EXPECT_EQ(bwd.mask.lo, -49);  // q - 49 <= k <= q
  EXPECT_EQ(bwd.mask.hi, 0);
  EXPECT_EQ(bwd.launch.shared_bytes,
            2 * 32 * 136 * 2 + 2 * 64 * 136 * 2 + 64 * 40 * 2 + 2 * 32 * 4 + (32 + 64) * 8);
  for (const int64_t d : {64, 80, 96, 128}) {
    EXPECT_LE(forward_shared_bytes(d), kMaxSharedBytes);
    EXPECT_LE(backward_shared_bytes(d), kMaxSharedBytes);
    // ldmatrix and cp.async need 16-byte aligned shared rows.
    EXPECT_EQ((d + kRowPadElements) * 2 % 16, 0);
  }
  // No rows: an empty grid (nothing launches).
  EXPECT_TRUE(plan_forward(shape(4, 4, 0, 10, 64), Mask::none()).launch.empty());
  EXPECT_FALSE(plan_backward(shape(4, 4, 0, 10, 64), Mask::none()).launch.empty());
  EXPECT_THROW(plan_forward(shape(4, 4, 10, 10, 48), Mask::none()), Error);
}

TEST(CudaPlan, ElementwiseLaunches) {
  EXPECT_TRUE(plan_elementwise(0).empty());
  EXPECT_EQ(plan_elementwise(1).grid_x, 1);
  EXPECT_EQ(plan_elementwise(1000).grid_x, 4);  // 256 threads per block
  EXPECT_EQ(plan_elementwise(int64_t{1} << 40).grid_x, 65536);
  EXPECT_EQ(plan_rows(17).grid_x, 3);  // 8 rows per block
  EXPECT_EQ(plan_rows(17).threads, 256);
}

// A buffer that only has a size, for the checks (no memory behind it).
class SizeOnlyBuffer final : public Buffer {
 public:
  SizeOnlyBuffer(Backend& backend, int64_t bytes) : Buffer(backend, bytes, nullptr) {}
};

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(CudaPlan, CallChecksNameTheProblem) {
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  SizeOnlyBuffer buffer(*cpu, 1 << 20);
  ForwardCall call;
  call.shape = shape(12, 4, 99, 99, 96);
  call.mask = Mask::causal();
  call.scale = 0.1f;
  call.q = dense_token_tensor(buffer, DType::bf16, 99, 12, 96);
  call.k = dense_token_tensor(buffer, DType::bf16, 99, 4, 96);
  call.v = call.k;
  EXPECT_EQ(error_of([&] { check_forward(call); }), "");

  ForwardCall bad = call;
  bad.q.dtype = bad.k.dtype = bad.v.dtype = DType::f32;
  EXPECT_NE(error_of([&] { check_forward(bad); }).find("bf16 or fp16"), std::string::npos);
  bad = call;
  bad.k.dtype = DType::f16;
  EXPECT_NE(error_of([&] { check_forward(bad); }).find("K is fp16"), std::string::npos);
  bad = call;
  bad.shape.head_dim = 72;
  EXPECT_NE(error_of([&] { check_forward(bad); }).find("64, 80, 96 and 128"), std::string::npos);
  bad = call;
  bad.softcap = 30.0f;
  EXPECT_NE(error_of([&] { check_forward(bad); }).find("softcapping"), std::string::npos);
  bad = call;
  // Documents and range slices run on the CUDA kernels (MaskView's arrays copied to the GPU); a
  // malformed mask is refused with the mask's own message.
  bad.mask = Mask::causal().with_documents({50, 49});
  EXPECT_EQ(error_of([&] { check_forward(bad); }), "");
  bad.mask = Mask::from_ranges({{0, 99, 0, 50, RangeType::inv_causal}});
  EXPECT_EQ(error_of([&] { check_forward(bad); }), "");
  bad.mask = Mask::causal_window(0);
  EXPECT_NE(error_of([&] { check_forward(bad); }).find("at least 1 token"), std::string::npos);
  // Misaligned rows are allowed (the backend copies them to aligned scratch), but detected.
  EXPECT_TRUE(rows_aligned(call.q));
  bad = call;
  bad.q.offset = 2;  // one bf16 element in: rows no longer 16-byte aligned
  EXPECT_EQ(error_of([&] { check_forward(bad); }), "");
  EXPECT_FALSE(rows_aligned(bad.q));
  bad = call;
  bad.k.token_stride = 4 * 96 + 4;
  EXPECT_FALSE(rows_aligned(bad.k));
  bad = call;
  bad.scale = 0.0f;
  EXPECT_NE(error_of([&] { check_forward(bad); }).find("scale"), std::string::npos);

  BackwardCall back;
  back.shape = call.shape;
  back.mask = call.mask;
  back.scale = call.scale;
  back.q = call.q;
  back.k = call.k;
  back.v = call.v;
  back.d_out = call.q;
  EXPECT_NE(error_of([&] { check_backward(back); }).find("neither delta nor O"), std::string::npos);
  back.out = call.q;
  EXPECT_EQ(error_of([&] { check_backward(back); }), "");
  back.d_out.dtype = DType::f16;
  EXPECT_NE(error_of([&] { check_backward(back); }).find("dO is fp16"), std::string::npos);
}

TEST(CudaPlan, ExtentChecks) {
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  SizeOnlyBuffer buffer(*cpu, 1000);
  EXPECT_EQ(error_of([&] { check_place(Place::in(buffer, 900), 100, "x"); }), "");
  EXPECT_NE(error_of([&] { check_place(Place::in(buffer, 901), 100, "x"); }).find("outside"),
            std::string::npos);
  // [1, 5, 2, 50] bf16, dense: 1000 bytes exactly.
  const TokenTensor t = dense_token_tensor(buffer, DType::bf16, 5, 2, 50);
  EXPECT_EQ(error_of([&] { check_tokens(t, {1, 5, 2, 50}, "t"); }), "");
  EXPECT_NE(error_of([&] {
              check_tokens(t, {1, 6, 2, 50}, "t");
            }).find("outside"),
            std::string::npos);
  const RowTensor r = dense_row_tensor(buffer, 10, 25);
  EXPECT_EQ(error_of([&] { check_rows(r, 1, 10, 25, "r"); }), "");
  EXPECT_NE(error_of([&] { check_rows(r, 1, 10, 26, "r"); }).find("outside"), std::string::npos);
  EXPECT_EQ(extent_bytes(2, 1, 5, 2, 50, 500, 100, 50), 1000);
  EXPECT_EQ(extent_bytes(2, 1, 0, 2, 50, 500, 100, 50), 0);
}

// fp32 stays on the CPU even where a GPU is visible: the CUDA kernels take 16-bit inputs only.
TEST(CudaPlan, Fp32DefaultsToTheCpu) {
  EXPECT_EQ(default_device(DType::f32), "cpu");
}

TEST(CudaPlan, CudaDeviceWithoutOneFailsClearly) {
  if (find_backend("cuda")->built && find_backend("cuda")->devices() > 0)
    GTEST_SKIP() << "a GPU is visible";
  const std::string message = error_of([] { make_backend("cuda"); });
  EXPECT_NE(message.find(find_backend("cuda")->built ? "no CUDA GPU" : "no CUDA backend"),
            std::string::npos)
      << message;
  EXPECT_EQ(default_device(DType::bf16), "cpu");
  EXPECT_EQ(default_device(DType::f32), "cpu");
  const std::vector<std::string> names = backend_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "cuda"), find_backend("cuda")->built ? 1 : 0);
}

}  // namespace
}  // namespace a2d
