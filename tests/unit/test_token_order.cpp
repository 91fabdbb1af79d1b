// src/algorithms/records.hpp: TokenOrder, the in-place sort of gathered rows by position that
// ATTENTION2D and all-gather K/V apply under a causal mask, and its inverse; Floats, the
// algorithms' buffers, uninitialised unless asked for zero (NaN in the sanitizer build).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "../../src/algorithms/records.hpp"

namespace a2d::algorithms {
namespace {

// Positions as a gather of P cyclic parts concatenates them (part p: p, p + P, p + 2P, ...),
// with uneven parts when P does not divide N.
std::vector<int64_t> gathered_cyclic(int64_t n, int64_t parts) {
  std::vector<int64_t> positions;
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t t = p; t < n; t += parts)
      positions.push_back(t);
  return positions;
}

TEST(TokenOrder, SortsRowsByPositionInPlaceAndUnsortsThemBack) {
  for (const int64_t parts : {1, 2, 3, 7}) {
    for (const int64_t n : {1, 10, 97}) {
      const std::vector<int64_t> positions = gathered_cyclic(n, parts);
      const TokenOrder order(positions, /*reorder=*/true);
      ASSERT_TRUE(std::is_sorted(order.positions.begin(), order.positions.end()));
      EXPECT_EQ(order.identity(), std::is_sorted(positions.begin(), positions.end()));
      const int64_t width = 3;  // floats per token
      std::vector<float> rows(static_cast<size_t>(n * width));
      for (size_t i = 0; i < positions.size(); ++i)
        for (int64_t f = 0; f < width; ++f)
          rows[i * width + static_cast<size_t>(f)] = static_cast<float>(positions[i] * 10 + f);
      const std::vector<float> original = rows;
      order.sort(rows, width);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t f = 0; f < width; ++f)
          ASSERT_EQ(rows[static_cast<size_t>(j * width + f)], static_cast<float>(j * 10 + f))
              << "P=" << parts << " N=" << n;
      order.unsort(rows, width);
      EXPECT_EQ(rows, original) << "P=" << parts << " N=" << n;
    }
  }
}

TEST(TokenOrder, KeepsTheGatheredOrderWithoutAMask) {
  const std::vector<int64_t> positions = gathered_cyclic(20, 4);
  const TokenOrder order(positions, /*reorder=*/false);
  EXPECT_TRUE(order.identity());
  EXPECT_EQ(order.positions, positions);
  std::vector<float> rows(20, 1.0f);
  rows[3] = 7.0f;
  const std::vector<float> original = rows;
  order.sort(rows, 1);
  EXPECT_EQ(rows, original);
}

TEST(Floats, ZeroOnlyWhenAskedAndPoisonedInTheSanitizerBuild) {
  const Floats zeroed(1000, 0.0f);
  EXPECT_TRUE(std::all_of(zeroed.begin(), zeroed.end(), [](float x) { return x == 0.0f; }));
  Floats grown(10, 1.5f);
  grown.resize(1000);
  EXPECT_EQ(grown[9], 1.5f);
  const Floats fresh(1000);
  EXPECT_EQ(fresh.size(), 1000u);
#ifdef A2D_POISON_UNINITIALIZED
  // The sanitizer build: elements nothing wrote are NaN, so reading one poisons a result.
  EXPECT_TRUE(std::all_of(fresh.begin(), fresh.end(), [](float x) { return std::isnan(x); }));
  EXPECT_TRUE(std::isnan(grown[10]) && std::isnan(grown[999]));
#endif
  Floats copy = zeroed;  // copies keep their values
  EXPECT_EQ(copy, zeroed);
  std::vector<float> plain(4, 2.0f);
  const TokenOrder order(gathered_cyclic(4, 2), /*reorder=*/true);
  order.sort(plain, 1);  // sort and unsort take any contiguous float buffer
  order.unsort(plain, 1);
  EXPECT_EQ(plain, std::vector<float>(4, 2.0f));
}

}  // namespace
}  // namespace a2d::algorithms
