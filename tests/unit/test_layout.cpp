// Token layouts over thousands of virtual ranks, without MPI: every token owned exactly once,
// shards in increasing order, owner() and token_at() inverse to each other, counts balanced.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/layout.hpp"

namespace a2d {
namespace {

void check_layout(const TokenLayout& layout) {
  const int64_t n = layout.tokens(), parts = layout.parts();
  std::vector<int> seen(static_cast<size_t>(n), 0);
  int64_t total = 0, smallest = n, largest = 0;
  for (int64_t part = 0; part < parts; ++part) {
    const std::vector<int64_t> tokens = layout.tokens_of(part);
    ASSERT_EQ(static_cast<int64_t>(tokens.size()), layout.count(part)) << layout.describe();
    ASSERT_TRUE(std::is_sorted(tokens.begin(), tokens.end())) << layout.describe();
    for (int64_t i = 0; i < static_cast<int64_t>(tokens.size()); ++i) {
      const int64_t t = tokens[i];
      ASSERT_GE(t, 0);
      ASSERT_LT(t, n);
      ++seen[t];
      const TokenLayout::Owner owner = layout.owner(t);
      ASSERT_EQ(owner.part, part) << layout.describe() << " token " << t;
      ASSERT_EQ(owner.index, i) << layout.describe() << " token " << t;
    }
    total += layout.count(part);
    smallest = std::min(smallest, layout.count(part));
    largest = std::max(largest, layout.count(part));
  }
  ASSERT_EQ(total, n) << layout.describe();
  for (int64_t t = 0; t < n; ++t)
    ASSERT_EQ(seen[t], 1) << layout.describe() << " token " << t;
  ASSERT_EQ(layout.max_count(), largest);
  // Balance: cyclic and contiguous differ by at most one token, zigzag (two chunks) by two,
  // striped by one stripe.
  const int64_t slack = layout.kind() == LayoutKind::zigzag    ? 2
                        : layout.kind() == LayoutKind::striped ? layout.stripe()
                                                               : 1;
  if (n > 0) {
    ASSERT_LE(largest - smallest, slack) << layout.describe();
  }
}

TEST(Layout, EveryKindPartitionsTheTokensOverManyPartCounts) {
  for (const LayoutKind kind :
       {LayoutKind::cyclic, LayoutKind::striped, LayoutKind::contiguous, LayoutKind::zigzag}) {
    for (const int64_t parts : {1, 2, 3, 5, 6, 7, 16, 64, 129}) {
      for (const int64_t tokens : {int64_t{0}, int64_t{1}, parts - 1, parts, parts + 1,
                                   2 * parts - 1, 2 * parts + 3, int64_t{1000}, int64_t{4099}}) {
        if (tokens < 0) continue;
        for (const int64_t stripe : {1, 3, 16}) {
          if (kind != LayoutKind::striped && stripe != 1) continue;
          check_layout(TokenLayout(kind, tokens, parts, stripe));
        }
      }
    }
  }
}

TEST(Layout, ThousandsOfVirtualRanks) {
  for (const LayoutKind kind :
       {LayoutKind::cyclic, LayoutKind::striped, LayoutKind::contiguous, LayoutKind::zigzag}) {
    check_layout(TokenLayout(kind, 100003, 4096, 2));
    check_layout(TokenLayout(kind, 3000, 4096, 1));  // fewer tokens than ranks
  }
}

TEST(Layout, DocumentedExampleOfTenTokensOnThreeParts) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(TokenLayout(LayoutKind::cyclic, 10, 3).tokens_of(0), (V{0, 3, 6, 9}));
  EXPECT_EQ(TokenLayout(LayoutKind::striped, 10, 3, 2).tokens_of(1), (V{2, 3, 8, 9}));
  EXPECT_EQ(TokenLayout(LayoutKind::contiguous, 10, 3).tokens_of(1), (V{4, 5, 6}));
  EXPECT_EQ(TokenLayout(LayoutKind::zigzag, 10, 3).tokens_of(0), (V{0, 1, 9}));
  EXPECT_EQ(TokenLayout(LayoutKind::zigzag, 10, 3).tokens_of(2), (V{4, 5, 6, 7}));
}

TEST(Layout, BadArgumentsAreRefused) {
  EXPECT_THROW(TokenLayout(LayoutKind::cyclic, 10, 0), Error);
  EXPECT_THROW(TokenLayout(LayoutKind::striped, 10, 2, 0), Error);
  EXPECT_THROW(TokenLayout(LayoutKind::cyclic, -1, 2), Error);
  EXPECT_THROW(TokenLayout(LayoutKind::cyclic, 10, 3).owner(10), Error);
  EXPECT_THROW(parse_layout("diagonal"), Error);
  EXPECT_EQ(parse_layout("zigzag"), LayoutKind::zigzag);
}

}  // namespace
}  // namespace a2d
