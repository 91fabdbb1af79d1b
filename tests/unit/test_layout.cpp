// Token layouts over thousands of virtual ranks, without MPI: every token owned exactly once,
// shards in increasing order, owner() and token_at() inverse to each other, counts balanced.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/layout.hpp"

namespace a2d {
namespace {

// balanced: counts differ by at most the kind's slack (not for contiguous_counts' own cuts).
void check_layout(const TokenLayout& layout, bool balanced = true) {
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
  // count_below: the part's tokens below every position (where that is quick to walk).
  for (int64_t part = 0; part < parts && parts * n <= 2000000; ++part) {
    int64_t below = 0;
    for (int64_t t = 0; t <= n; ++t) {
      ASSERT_EQ(layout.count_below(part, t), below) << layout.describe() << " part " << part;
      if (t < n && layout.owner(t).part == part) ++below;
    }
  }
  if (!balanced) return;
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

TEST(Layout, ContiguousCountsCutTheSequenceAsGivenWithEmptyParts) {
  using V = std::vector<int64_t>;
  const TokenLayout cut = TokenLayout::contiguous_counts({5, 0, 7});
  EXPECT_EQ(cut.kind(), LayoutKind::contiguous);
  EXPECT_EQ(cut.tokens(), 12);
  EXPECT_EQ(cut.parts(), 3);
  EXPECT_TRUE(cut.uneven());
  EXPECT_EQ(cut.tokens_of(0), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(cut.tokens_of(1), V{});
  EXPECT_EQ(cut.tokens_of(2), (V{5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(cut.owner(5).part, 2);
  EXPECT_EQ(cut.owner(5).index, 0);
  EXPECT_EQ(cut.describe(), "contiguous(5,0,7) over 3 parts, 12 tokens");
  check_layout(cut, false);
  // Zeros at the ends, a single part, every token on one part, no tokens at all.
  for (const V& counts : {V{0, 3, 0, 0, 4, 0}, V{9}, V{0, 0, 11, 0}, V{0, 0, 0}, V{1, 2, 3, 4, 5},
                          V{1000, 1, 0, 999}}) {
    check_layout(TokenLayout::contiguous_counts(counts), false);
  }
  // The even split is the plain layout (equal, and described without counts).
  const TokenLayout even = TokenLayout::contiguous_counts({4, 3, 3});
  EXPECT_FALSE(even.uneven());
  EXPECT_TRUE(even == TokenLayout(LayoutKind::contiguous, 10, 3));
  EXPECT_EQ(even.describe(), "contiguous over 3 parts, 10 tokens");
  EXPECT_FALSE(cut == TokenLayout::contiguous_counts({5, 1, 6}));
  EXPECT_TRUE(cut == TokenLayout::contiguous_counts({5, 0, 7}));
  // A copy shares the counts (a cheap value) and stays equal.
  const TokenLayout copy = cut;
  EXPECT_TRUE(copy == cut);
  // Many parts: the description lists the first 16 counts.
  V many(40, 2);
  many[3] = 0;
  EXPECT_NE(TokenLayout::contiguous_counts(many).describe().find("(2,2,2,0,2,"), std::string::npos);
  EXPECT_NE(TokenLayout::contiguous_counts(many).describe().find(",...)"), std::string::npos);
  check_layout(TokenLayout::contiguous_counts(many), false);
  EXPECT_THROW(TokenLayout::contiguous_counts({}), Error);
  EXPECT_THROW(TokenLayout::contiguous_counts({3, -1, 4}), Error);
}

TEST(Layout, ContiguousCountsOverThousandsOfVirtualRanks) {
  std::vector<int64_t> counts(4096);
  for (size_t p = 0; p < counts.size(); ++p)
    counts[p] = static_cast<int64_t>((p * 7919) % 13);  // zeros among them
  const TokenLayout layout = TokenLayout::contiguous_counts(counts);
  for (int64_t p = 0; p < layout.parts(); ++p)
    ASSERT_EQ(layout.count(p), counts[static_cast<size_t>(p)]);
  for (int64_t t = 0; t < layout.tokens(); t += 7) {
    const TokenLayout::Owner owner = layout.owner(t);
    ASSERT_EQ(layout.token_at(owner.part, owner.index), t);
    ASSERT_GT(layout.count(owner.part), owner.index);
  }
}

// A grid's order over torch's: part p = r + c * R of an R x C grid owns the tokens of shard
// r * C + c (python/attention2d/_channel.py).
std::vector<int64_t> grid_slots(int64_t rows, int64_t cols) {
  std::vector<int64_t> slots;
  for (int64_t p = 0; p < rows * cols; ++p)
    slots.push_back((p % rows) * cols + p / rows);
  return slots;
}

TEST(Layout, PermutedPartsOwnTheirSlotsTokens) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{2, 2}, {2, 3}, {3, 2}, {1, 5}}) {
    const int64_t parts = rows * cols;
    const std::vector<int64_t> slots = grid_slots(rows, cols);
    for (const int64_t n : {int64_t{0}, int64_t{1}, parts - 1, 7 * parts + 3, int64_t{101}}) {
      std::vector<TokenLayout> plain;
      for (const LayoutKind kind : {LayoutKind::cyclic, LayoutKind::contiguous, LayoutKind::zigzag})
        plain.emplace_back(kind, n, parts);
      plain.emplace_back(LayoutKind::striped, n, parts, 3);
      std::vector<int64_t> counts(static_cast<size_t>(parts), 0);
      counts.back() = n;
      counts.front() = n > 1 ? 1 : 0;
      counts.back() -= counts.front();
      plain.push_back(TokenLayout::contiguous_counts(counts));
      for (const TokenLayout& base : plain) {
        const TokenLayout moved = base.permuted(slots);
        check_layout(moved, !base.uneven());
        for (int64_t p = 0; p < parts; ++p) {
          ASSERT_EQ(moved.slot(p), slots[static_cast<size_t>(p)]);
          ASSERT_EQ(moved.tokens_of(p), base.tokens_of(slots[static_cast<size_t>(p)]))
              << moved.describe() << " part " << p;
        }
        EXPECT_EQ(moved == base, !moved.is_permuted());
        EXPECT_TRUE(moved == base.permuted(slots));
        if (parts > 1 && rows > 1 && cols > 1) {
          EXPECT_TRUE(moved.is_permuted());
          EXPECT_NE(moved.describe().find("in part order [0,"), std::string::npos)
              << moved.describe();
        }
      }
    }
  }
  // The identity is the plain layout; a slot twice, out of range or the wrong number is refused.
  const TokenLayout layout(LayoutKind::contiguous, 10, 3);
  EXPECT_FALSE(layout.permuted({0, 1, 2}).is_permuted());
  EXPECT_THROW(layout.permuted({0, 0, 2}), Error);
  EXPECT_THROW(layout.permuted({0, 1, 3}), Error);
  EXPECT_THROW(layout.permuted({0, 1}), Error);
  EXPECT_THROW(layout.permuted({1, 0, 2}).permuted({1, 0, 2}), Error);
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
