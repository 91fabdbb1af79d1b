// Masks, block classification, visible-pair counts, shape validation and generated data.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "attention2d/data.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"

namespace a2d {
namespace {

TEST(Mask, ClassifyBlockAgreesWithElementwiseVisibility) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int64_t> pos(0, 60), len(1, 12), window(1, 20);
  for (int trial = 0; trial < 20000; ++trial) {
    const Mask masks[] = {Mask::none(), Mask::causal(), Mask::causal_window(window(rng))};
    const Mask mask = masks[trial % 3];
    const int64_t q0 = pos(rng), q1 = q0 + len(rng), k0 = pos(rng), k1 = k0 + len(rng);
    int visible = 0, total = 0;
    for (int64_t q = q0; q <= q1; ++q)
      for (int64_t k = k0; k <= k1; ++k)
        visible += mask.visible(q, k), ++total;
    const BlockVisibility c = classify_block(mask, q0, q1, k0, k1);
    // With contiguous ranges the classification is exact: hidden iff no pair is visible, full
    // iff every pair is.
    ASSERT_EQ(c == BlockVisibility::hidden, visible == 0) << mask.describe();
    ASSERT_EQ(c == BlockVisibility::full, visible == total) << mask.describe();
  }
}

TEST(Mask, CountVisiblePairsMatchesBruteForce) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> q(static_cast<size_t>(rng() % 40)), k(static_cast<size_t>(rng() % 40));
    for (auto& x : q)
      x = static_cast<int64_t>(rng() % 100);
    for (auto& x : k)
      x = static_cast<int64_t>(rng() % 100);
    for (const Mask mask : {Mask::none(), Mask::causal(), Mask::causal_window(1 + rng() % 30)}) {
      int64_t brute = 0;
      for (const int64_t a : q)
        for (const int64_t b : k)
          brute += mask.visible(a, b);
      EXPECT_EQ(count_visible_pairs(mask, q.data(), static_cast<int64_t>(q.size()), k.data(),
                                    static_cast<int64_t>(k.size())),
                brute);
    }
  }
  EXPECT_EQ(count_visible_pairs(Mask::causal(), nullptr, 1000, nullptr, 1000), 1000 * 1001 / 2);
}

TEST(Shape, InvalidShapesAreRefusedWithTheirReason) {
  auto message = [](AttentionShape s) {
    try {
      s.validate();
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({1, 12, 5, 8, 8, 64}).find("multiple of kv_heads"), std::string::npos);
  EXPECT_NE(message({0, 1, 1, 8, 8, 64}).find("batch"), std::string::npos);
  EXPECT_NE(message({1, 1, 1, 8, 8, 0}).find("head_dim"), std::string::npos);
  EXPECT_EQ(message({1, 12, 4, 0, 8, 64}), "accepted");  // a rank may own no query
  EXPECT_THROW(Mask::causal_window(0).validate(), Error);
}

TEST(Data, GeneratedValuesDependOnlyOnSeedTensorAndGlobalIndex) {
  const GlobalTokens global{2, 50, 3, 8};
  const std::vector<float> full = generate_tokens(9, TensorTag::k, global);
  // A shard holding tokens 4, 9, 14, ... (a cyclic layout) sees exactly the same values.
  std::vector<int64_t> tokens;
  for (int64_t t = 4; t < 50; t += 5)
    tokens.push_back(t);
  std::vector<float> shard(2 * tokens.size() * 3 * 8);
  fill_generated(9, TensorTag::k, global, tokens.data(), static_cast<int64_t>(tokens.size()),
                 dense_tokens(shard.data(), static_cast<int64_t>(tokens.size()), 3, 8));
  for (int64_t b = 0; b < 2; ++b)
    for (size_t i = 0; i < tokens.size(); ++i)
      for (int64_t x = 0; x < 24; ++x)
        ASSERT_EQ(shard[(b * tokens.size() + i) * 24 + x], full[(b * 50 + tokens[i]) * 24 + x]);
  EXPECT_NE(generate_tokens(9, TensorTag::q, global), full);
  EXPECT_NE(generate_tokens(10, TensorTag::k, global), full);
  // Roughly standard normal.
  double sum = 0, sq = 0;
  for (const float x : full)
    sum += x, sq += x * x;
  const double mean = sum / full.size(), var = sq / full.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(var, 1.0, 0.15);
}

TEST(Error, CarriesRankLocationAndMessage) {
  set_error_rank(3);
  try {
    A2D_FAIL("grid ", 2, "x", 3, " does not match 5 ranks");
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 3);
    EXPECT_EQ(e.message(), "grid 2x3 does not match 5 ranks");
    EXPECT_NE(std::string(e.what()).find("[rank 3]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("test_problem.cpp"), std::string::npos);
  }
  set_error_rank(-1);
}

}  // namespace
}  // namespace a2d
