// Masks, shapes and the visible-pair count shared by the kernels, the reference and the tools.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"

namespace a2d {

void Mask::validate() const {
  if (kind == MaskKind::causal_window) {
    A2D_REQUIRE(window >= 1, "the causal window must be at least 1 token (got ", window,
                "); use --window W with W >= 1, or drop --window for a plain causal mask");
  }
}

std::string Mask::describe() const {
  switch (kind) {
    case MaskKind::none:
      return "none";
    case MaskKind::causal:
      return "causal";
    case MaskKind::causal_window:
      return "causal-window(" + std::to_string(window) + ")";
  }
  return "?";
}

BlockVisibility classify_block(const Mask& mask, int64_t q_min, int64_t q_max, int64_t k_min,
                               int64_t k_max) {
  switch (mask.kind) {
    case MaskKind::none:
      return BlockVisibility::full;
    case MaskKind::causal:
      if (k_min > q_max) return BlockVisibility::hidden;
      if (k_max <= q_min) return BlockVisibility::full;
      return BlockVisibility::partial;
    case MaskKind::causal_window:
      // Visible iff q - window < k <= q.
      if (k_min > q_max || k_max <= q_min - mask.window) return BlockVisibility::hidden;
      if (k_max <= q_min && k_min > q_max - mask.window) return BlockVisibility::full;
      return BlockVisibility::partial;
  }
  return BlockVisibility::partial;
}

void AttentionShape::validate() const {
  A2D_REQUIRE(batch >= 1, "batch must be at least 1 (got ", batch, ")");
  A2D_REQUIRE(heads >= 1, "heads must be at least 1 (got ", heads, ")");
  A2D_REQUIRE(kv_heads >= 1, "kv_heads must be at least 1 (got ", kv_heads, ")");
  A2D_REQUIRE(heads % kv_heads == 0, "heads (", heads, ") must be a multiple of kv_heads (",
              kv_heads, "): each K/V head serves heads / kv_heads query heads");
  A2D_REQUIRE(head_dim >= 1, "head_dim must be at least 1 (got ", head_dim, ")");
  A2D_REQUIRE(q_tokens >= 0 && kv_tokens >= 0,
              "token counts must not be negative (got q_tokens=", q_tokens,
              ", kv_tokens=", kv_tokens, ")");
}

std::string AttentionShape::describe() const {
  std::ostringstream out;
  out << "batch=" << batch << " heads=" << heads << " kv_heads=" << kv_heads
      << " q_tokens=" << q_tokens << " kv_tokens=" << kv_tokens << " head_dim=" << head_dim;
  return out.str();
}

float default_scale(int64_t head_dim) {
  A2D_REQUIRE(head_dim >= 1, "head_dim must be at least 1 (got ", head_dim, ")");
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

int64_t count_visible_pairs(const Mask& mask, const int64_t* q_positions, int64_t q_tokens,
                            const int64_t* kv_positions, int64_t kv_tokens) {
  if (mask.kind == MaskKind::none) return q_tokens * kv_tokens;
  std::vector<int64_t> keys(static_cast<size_t>(kv_tokens));
  for (int64_t j = 0; j < kv_tokens; ++j)
    keys[j] = kv_positions ? kv_positions[j] : j;
  std::sort(keys.begin(), keys.end());
  int64_t pairs = 0;
  for (int64_t i = 0; i < q_tokens; ++i) {
    const int64_t q = q_positions ? q_positions[i] : i;
    // Keys with position <= q ...
    const auto upper = std::upper_bound(keys.begin(), keys.end(), q);
    auto lower = keys.begin();
    // ... and, with a window, position > q - window.
    if (mask.kind == MaskKind::causal_window) {
      lower = std::upper_bound(keys.begin(), keys.end(), q - mask.window);
    }
    if (upper > lower) pairs += upper - lower;
  }
  return pairs;
}

}  // namespace a2d
