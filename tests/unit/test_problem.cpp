// Masks, block classification, visible-pair counts, shape validation and generated data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention2d/tools/data.hpp"
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
    for (const Mask& mask : {Mask::none(), Mask::causal(), Mask::causal_window(1 + rng() % 30)}) {
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

// Documents: 1, 2, 1, 9, 1, 3, 40, 1, 5, 20 tokens (one-token documents, a long one).
Mask with_test_documents(const Mask& base) {
  return base.with_documents({1, 2, 1, 9, 1, 3, 40, 1, 5, 20});
}

TEST(Mask, DocumentsRestrictEveryMaskToItsOwnDocument) {
  const Mask docs = with_test_documents(Mask::causal());
  EXPECT_EQ(docs.documents(), 10);
  EXPECT_EQ(docs.document_tokens(), 83);
  EXPECT_EQ(docs.document_of(0), 0);
  EXPECT_EQ(docs.document_of(1), 1);
  EXPECT_EQ(docs.document_of(2), 1);
  EXPECT_EQ(docs.document_of(3), 2);
  EXPECT_EQ(docs.document_of(82), 9);
  EXPECT_EQ(docs.document_first(20), 17);
  EXPECT_EQ(docs.document_last(20), 56);
  EXPECT_TRUE(docs.visible(20, 17));
  EXPECT_FALSE(docs.visible(20, 16));  // the previous document
  EXPECT_FALSE(docs.visible(20, 21));  // causal
  EXPECT_FALSE(with_test_documents(Mask::none()).visible(3, 4));
  EXPECT_TRUE(with_test_documents(Mask::none()).visible(4, 12));
  EXPECT_EQ(docs.describe(), "causal+documents(10)");
  EXPECT_THROW(docs.validate(84), Error);
  docs.validate(83);
  EXPECT_THROW(Mask::none().with_documents({3, 0, 2}), Error);
  EXPECT_THROW(Mask::none().with_documents({}), Error);
}

TEST(Mask, DocumentBlocksAreClassifiedSoundly) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> pos(0, 70), len(0, 12), window(1, 20);
  int hidden = 0, full = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const Mask bases[] = {Mask::none(), Mask::causal(), Mask::causal_window(window(rng))};
    const Mask mask = with_test_documents(bases[trial % 3]);
    const int64_t q0 = pos(rng), q1 = q0 + len(rng), k0 = pos(rng), k1 = k0 + len(rng);
    int visible = 0, total = 0;
    for (int64_t q = q0; q <= q1; ++q)
      for (int64_t k = k0; k <= k1; ++k)
        visible += mask.visible(q, k), ++total;
    const BlockVisibility c = classify_block(mask, q0, q1, k0, k1);
    // Hidden only if no pair is visible, full only if every pair is; without a position mask
    // (documents alone) hidden is exact.
    if (c == BlockVisibility::hidden) {
      ASSERT_EQ(visible, 0) << mask.describe();
    }
    if (c == BlockVisibility::full) {
      ASSERT_EQ(visible, total) << mask.describe();
    }
    if (mask.kind == MaskKind::none && visible == 0) {
      ASSERT_EQ(c, BlockVisibility::hidden);
    }
    hidden += c == BlockVisibility::hidden;
    full += c == BlockVisibility::full;
  }
  EXPECT_GT(hidden, 1000);
  EXPECT_GT(full, 100);
}

TEST(Mask, DocumentLengthsParseFromListsFilesAndGeneratedMixes) {
  EXPECT_EQ(parse_document_lengths("100,3000,17", 3117), (std::vector<int64_t>{100, 3000, 17}));
  EXPECT_EQ(parse_document_lengths(" 5, 6 ,7 ", 18), (std::vector<int64_t>{5, 6, 7}));
  for (const char* bad : {"", "1,,0", "1,abc", "-3", "2.5", "heavy:x"}) {
    EXPECT_THROW(parse_document_lengths(bad, 10), Error) << bad;
  }
  EXPECT_THROW(parse_document_lengths("@/nonexistent/lengths.txt", 10), Error);
  const std::string file = testing::TempDir() + "a2d_doc_lengths.txt";
  {
    FILE* out = std::fopen(file.c_str(), "w");
    ASSERT_NE(out, nullptr);
    std::fputs("4\n1\n7, 2\n", out);
    std::fclose(out);
  }
  EXPECT_EQ(parse_document_lengths("@" + file, 14), (std::vector<int64_t>{4, 1, 7, 2}));
  for (const int64_t seq : {int64_t{1}, int64_t{2}, int64_t{97}, int64_t{4096}}) {
    for (const char* kind : {"skewed", "heavy", "skewed:5", "heavy:9"}) {
      const std::vector<int64_t> lengths = parse_document_lengths(kind, seq);
      int64_t sum = 0;
      for (const int64_t length : lengths) {
        ASSERT_GE(length, 1);
        sum += length;
      }
      EXPECT_EQ(sum, seq) << kind;
      if (std::string(kind).rfind("skewed", 0) == 0) {
        EXPECT_EQ(*std::max_element(lengths.begin(), lengths.end()), std::max<int64_t>(1, seq / 2));
      }
    }
  }
  // The same seed, the same lengths; another seed, others.
  EXPECT_EQ(parse_document_lengths("heavy:3", 4096), parse_document_lengths("heavy:3", 4096));
  EXPECT_NE(parse_document_lengths("heavy:3", 4096), parse_document_lengths("heavy:4", 4096));
}

TEST(Mask, CountVisiblePairsWithDocumentsMatchesBruteForce) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> q(static_cast<size_t>(rng() % 40)), k(static_cast<size_t>(rng() % 40));
    for (auto& x : q)
      x = static_cast<int64_t>(rng() % 83);
    for (auto& x : k)
      x = static_cast<int64_t>(rng() % 83);
    for (const Mask& base : {Mask::none(), Mask::causal(), Mask::causal_window(1 + rng() % 30)}) {
      const Mask mask = with_test_documents(base);
      int64_t brute = 0;
      for (const int64_t a : q)
        for (const int64_t b : k)
          brute += mask.visible(a, b);
      EXPECT_EQ(count_visible_pairs(mask, q.data(), static_cast<int64_t>(q.size()), k.data(),
                                    static_cast<int64_t>(k.size())),
                brute)
          << mask.describe();
    }
  }
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

TEST(Data, ThreadedGenerationIsBitIdenticalToSingleThreaded) {
  // 2 * 333 * 4 * 64 = 170496 values: above the size from which fill_generated goes parallel.
  const GlobalTokens global{2, 333, 4, 64};
  const std::vector<float> single = generate_tokens(5, TensorTag::v, global, 1.0f, 1);
  // The values themselves: generated_value of each global index, as before threads.
  for (size_t i = 0; i < single.size(); i += 997) {
    const float expected = generated_value(5, TensorTag::v, i);
    ASSERT_EQ(std::memcmp(&single[i], &expected, sizeof(float)), 0) << i;
  }
  for (const int threads : {2, 3, 7, 0}) {
    const std::vector<float> threaded = generate_tokens(5, TensorTag::v, global, 1.0f, threads);
    ASSERT_EQ(threaded.size(), single.size());
    EXPECT_EQ(std::memcmp(threaded.data(), single.data(), single.size() * sizeof(float)), 0)
        << threads << " threads";
  }
  // A shard of rows in another order, with an amplitude, from 4 threads.
  std::vector<int64_t> tokens;
  for (int64_t t = 332; t >= 0; t -= 2)
    tokens.push_back(t);
  const auto n = static_cast<int64_t>(tokens.size());
  std::vector<float> one(static_cast<size_t>(2 * n * 4 * 64)), four(one.size());
  fill_generated(5, TensorTag::v, global, tokens.data(), n, dense_tokens(one.data(), n, 4, 64),
                 0.5f, 1);
  fill_generated(5, TensorTag::v, global, tokens.data(), n, dense_tokens(four.data(), n, 4, 64),
                 0.5f, 4);
  EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * sizeof(float)), 0);
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
