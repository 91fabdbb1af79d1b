// The mask object (mask.hpp): flash-attn's two-sided windows and MagiAttention's range masks
// against their definitions, the tile classifier, the pair counters and the pieces against brute
// force over random slice lists, the range parser and generators, the one check of contradictory
// options, and the questions the library asks instead of naming kinds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/kernel.hpp"

namespace a2d {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// MagiAttention's definitions, in a slice's local coordinates (flex_flash_attn_func's docs).
bool slice_shows(const MaskSlice& s, int64_t q, int64_t k) {
  if (q < s.q0 || q >= s.q1 || k < s.k0 || k >= s.k1) return false;
  const int64_t i = q - s.q0, j = k - s.k0, sq = s.q1 - s.q0, sk = s.k1 - s.k0;
  const bool causal = j <= i + sk - sq, inverse = j >= i;
  switch (s.type) {
    case RangeType::full:
      return true;
    case RangeType::causal:
      return causal;
    case RangeType::inv_causal:
      return inverse;
    case RangeType::bi_causal:
      return causal && inverse;
  }
  return false;
}

bool slices_show(const std::vector<MaskSlice>& slices, int64_t q, int64_t k) {
  for (const MaskSlice& s : slices)
    if (slice_shows(s, q, k)) return true;
  return false;
}

// Random non-overlapping slices of every type over [0, n): rectangles drawn at random, each kept
// when it meets none kept before (so rows with several slices, rows with none, and slices of
// every shape, sq > sk and sq < sk, occur).
std::vector<MaskSlice> random_slices(std::mt19937_64& random, int64_t n, int count) {
  std::vector<MaskSlice> out;
  std::uniform_int_distribution<int64_t> at(0, n);
  std::uniform_int_distribution<int> type(0, 3);
  for (int attempt = 0; attempt < 50 * count && static_cast<int>(out.size()) < count; ++attempt) {
    int64_t q0 = at(random), q1 = at(random), k0 = at(random), k1 = at(random);
    if (q0 > q1) std::swap(q0, q1);
    if (k0 > k1) std::swap(k0, k1);
    if (q0 == q1 || k0 == k1) continue;
    const MaskSlice s{q0, q1, k0, k1, static_cast<RangeType>(type(random))};
    const bool meets = std::any_of(out.begin(), out.end(), [&](const MaskSlice& t) {
      return s.q0 < t.q1 && t.q0 < s.q1 && s.k0 < t.k1 && t.k0 < s.k1;
    });
    if (!meets) out.push_back(s);
  }
  return out;
}

TEST(MaskKinds, TwoSidedWindowsHaveFlashAttnsMeaning) {
  for (const auto& [left, right] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {3, 2}, {5, 5}, {-1, 4}, {6, -1}, {0, -1}, {-1, 1}}) {
    const Mask mask = Mask::window_size(left, right);
    EXPECT_EQ(mask.kind, MaskKind::window);
    EXPECT_EQ(mask.window_left(), left);
    EXPECT_EQ(mask.window_right(), right);
    for (int64_t q = 0; q < 40; ++q)
      for (int64_t k = 0; k < 40; ++k) {
        const bool expected = (left < 0 || k >= q - left) && (right < 0 || k <= q + right);
        ASSERT_EQ(mask.visible(q, k), expected) << mask.describe() << " q " << q << " k " << k;
      }
  }
  // flash-attn's (-1, -1), (-1, 0) and (W - 1, 0) are none, causal and the causal window W.
  EXPECT_EQ(Mask::window_size(-1, -1).kind, MaskKind::none);
  EXPECT_EQ(Mask::window_size(-1, 0).kind, MaskKind::causal);
  EXPECT_EQ(Mask::window_size(4, 0).kind, MaskKind::causal_window);
  EXPECT_EQ(Mask::window_size(4, 0).window, 5);
  EXPECT_EQ(Mask::causal_window(5).window_left(), 4);
  EXPECT_EQ(Mask::causal_window(5).window_right(), 0);
  EXPECT_EQ(Mask::window_size(3, 2).describe(), "window(3,2)");
  EXPECT_NE(error_of([] { Mask::window_size(-2, 3); }).find("-1 (unbounded) or >= 0"),
            std::string::npos);
}

TEST(MaskKinds, RangeTypesAreMagiAttentions) {
  // flex_flash_attn_func's own examples: causal is bottom-right aligned, inv-causal top-left,
  // bi-causal both; sq = 5, sk = 2 and sq = 2, sk = 5.
  const auto pattern = [](RangeType type, int64_t sq, int64_t sk) {
    const Mask mask = Mask::from_ranges({{0, sq, 0, sk, type}});
    std::string rows;
    for (int64_t q = 0; q < sq; ++q) {
      for (int64_t k = 0; k < sk; ++k)
        rows += mask.visible(q, k) ? '1' : '0';
      rows += q + 1 < sq ? " " : "";
    }
    return rows;
  };
  EXPECT_EQ(pattern(RangeType::full, 2, 5), "11111 11111");
  EXPECT_EQ(pattern(RangeType::causal, 5, 2), "00 00 00 10 11");
  EXPECT_EQ(pattern(RangeType::causal, 2, 5), "11110 11111");
  EXPECT_EQ(pattern(RangeType::causal, 5, 5), "10000 11000 11100 11110 11111");
  EXPECT_EQ(pattern(RangeType::inv_causal, 5, 2), "11 01 00 00 00");
  EXPECT_EQ(pattern(RangeType::inv_causal, 2, 5), "11111 01111");
  EXPECT_EQ(pattern(RangeType::bi_causal, 5, 2), "00 00 00 00 00");
  EXPECT_EQ(pattern(RangeType::bi_causal, 2, 5), "11110 01111");
  EXPECT_EQ(pattern(RangeType::bi_causal, 5, 5), "10000 01000 00100 00010 00001");
}

// The property test: random slice lists; every answer of the mask against brute force.
TEST(MaskKinds, RandomSliceListsAgreeWithBruteForce) {
  std::mt19937_64 random(11);
  int rectangles = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(random() % 70);
    const std::vector<MaskSlice> slices =
        random_slices(random, n, 1 + static_cast<int>(random() % 9));
    const Mask mask = Mask::from_ranges(slices);
    const MaskView view = mask.view();
    ASSERT_NO_THROW(mask.validate(n));
    std::vector<std::vector<bool>> shows(static_cast<size_t>(n), std::vector<bool>(n));
    for (int64_t q = 0; q < n; ++q) {
      const MaskRow row = view.row(q);
      for (int64_t k = 0; k < n; ++k) {
        shows[q][k] = slices_show(slices, q, k);
        ASSERT_EQ(mask.visible(q, k), shows[q][k]) << "trial " << trial << " q " << q << " k " << k;
        ASSERT_EQ(row.visible(k), shows[q][k]) << "trial " << trial << " q " << q << " k " << k;
      }
    }
    // Rectangles, some reaching past the sequence: the classifier is exact, the count too.
    std::uniform_int_distribution<int64_t> at(-3, n + 3);
    for (int r = 0; r < 60; ++r, ++rectangles) {
      int64_t q0 = at(random), q1 = at(random), k0 = at(random), k1 = at(random);
      if (q0 > q1) std::swap(q0, q1);
      if (k0 > k1) std::swap(k0, k1);
      int64_t visible = 0, total = 0;
      for (int64_t q = q0; q <= q1; ++q)
        for (int64_t k = k0; k <= k1; ++k) {
          visible += q >= 0 && q < n && k >= 0 && k < n && shows[q][k];
          ++total;
        }
      const BlockVisibility c = mask.classify(q0, q1, k0, k1);
      ASSERT_EQ(c == BlockVisibility::hidden, visible == 0) << "trial " << trial;
      ASSERT_EQ(c == BlockVisibility::full, visible == total) << "trial " << trial;
      ASSERT_EQ(view.count(q0, q1, k0, k1), visible) << "trial " << trial;
    }
    // Pair counts over arbitrary position lists (repeats, any order).
    std::vector<int64_t> q(static_cast<size_t>(random() % 30)),
        k(static_cast<size_t>(random() % 30));
    for (auto& x : q)
      x = static_cast<int64_t>(random() % static_cast<uint64_t>(n));
    for (auto& x : k)
      x = static_cast<int64_t>(random() % static_cast<uint64_t>(n));
    int64_t brute = 0;
    for (const int64_t a : q)
      for (const int64_t b : k)
        brute += shows[a][b];
    ASSERT_EQ(count_visible_pairs(mask, q.data(), static_cast<int64_t>(q.size()), k.data(),
                                  static_cast<int64_t>(k.size())),
              brute);
    // The pieces the cost model sums over show exactly the visible pairs, each once.
    std::vector<std::vector<int>> covered(static_cast<size_t>(n), std::vector<int>(n));
    for (const MaskPiece& p : mask.pieces(n))
      for (int64_t a = p.q0; a < p.q1; ++a)
        for (int64_t b = p.k0; b < p.k1; ++b)
          covered[a][b] += b - a >= p.lo && b - a <= p.hi;
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = 0; b < n; ++b)
        ASSERT_EQ(covered[a][b], shows[a][b] ? 1 : 0);
  }
  EXPECT_EQ(rectangles, 300 * 60);
}

// Windows and documents too: the classifier (exact without documents), the counts, the pieces.
TEST(MaskKinds, WindowsAndDocumentsAgreeWithBruteForce) {
  std::mt19937_64 random(5);
  const int64_t n = 53;
  for (const Mask& base : {Mask::window_size(3, 2), Mask::window_size(-1, 6),
                           Mask::window_size(9, -1), Mask::window_size(0, 0 + 1)}) {
    for (const bool documents : {false, true}) {
      const Mask mask = documents ? base.with_documents({1, 20, 3, 1, 28}) : base;
      const MaskView view = mask.view();
      for (int r = 0; r < 3000; ++r) {
        std::uniform_int_distribution<int64_t> at(-2, n + 2);
        int64_t q0 = at(random), q1 = at(random), k0 = at(random), k1 = at(random);
        if (q0 > q1) std::swap(q0, q1);
        if (k0 > k1) std::swap(k0, k1);
        int64_t visible = 0, total = 0;
        for (int64_t q = q0; q <= q1; ++q)
          for (int64_t k = k0; k <= k1; ++k)
            visible += mask.visible(q, k), ++total;
        const BlockVisibility c = mask.classify(q0, q1, k0, k1);
        ASSERT_TRUE(c != BlockVisibility::hidden || visible == 0) << mask.describe();
        ASSERT_TRUE(c != BlockVisibility::full || visible == total) << mask.describe();
        if (!documents) {
          ASSERT_EQ(c == BlockVisibility::hidden, visible == 0) << mask.describe();
          ASSERT_EQ(c == BlockVisibility::full, visible == total) << mask.describe();
        }
        if (q0 >= 0 && q1 < n && k0 >= 0 && k1 < n) {
          ASSERT_EQ(view.count(q0, q1, k0, k1), visible) << mask.describe();
        }
      }
      int64_t all = 0;
      for (int64_t q = 0; q < n; ++q)
        for (int64_t k = 0; k < n; ++k)
          all += mask.visible(q, k);
      EXPECT_EQ(count_visible_pairs(mask, nullptr, n, nullptr, n), all) << mask.describe();
      int64_t pieces = 0;
      for (const MaskPiece& p : mask.pieces(n))
        for (int64_t q = p.q0; q < p.q1; ++q)
          for (int64_t k = p.k0; k < p.k1; ++k)
            pieces += k - q >= p.lo && k - q <= p.hi;
      EXPECT_EQ(pieces, all) << mask.describe();
    }
  }
}

TEST(MaskKinds, BadSlicesAreRefusedNamingThem) {
  EXPECT_NE(
      error_of([] {
        Mask::from_ranges({{0, 10, 0, 10, RangeType::full}, {5, 12, 8, 20, RangeType::causal}});
      }).find("overlap"),
      std::string::npos);
  // Overlapping only in rows that a third slice cuts into runs: still found.
  EXPECT_NE(error_of([] {
              Mask::from_ranges({{0, 10, 0, 4, RangeType::full},
                                 {3, 6, 20, 30, RangeType::full},
                                 {8, 9, 2, 5, RangeType::bi_causal}});
            }).find("[8, 9) x [2, 5) bi-causal"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              Mask::from_ranges({{5, 3, 0, 4, RangeType::full}});
            }).find("malformed"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              Mask::from_ranges({{0, 3, -1, 4, RangeType::full}});
            }).find("malformed"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              Mask::from_ranges({{0, 3, 0, 4, static_cast<RangeType>(7)}});
            }).find("unknown type 7"),
            std::string::npos);
  const Mask mask =
      Mask::from_ranges({{0, 3, 0, 4, RangeType::full}, {3, 8, 2, 9, RangeType::causal}});
  EXPECT_NO_THROW(mask.validate(9));
  EXPECT_NE(error_of([&] { mask.validate(8); }).find("outside the sequence of 8 tokens"),
            std::string::npos);
  // Empty slices are dropped (MagiAttention pads its range lists with them); touching ones meet
  // no pair.
  const Mask padded = Mask::from_ranges({{0, 0, 0, 0, RangeType::full},
                                         {4, 4, 1, 9, RangeType::causal},
                                         {0, 4, 0, 4, RangeType::full},
                                         {0, 4, 4, 8, RangeType::inv_causal}});
  EXPECT_EQ(padded.slices(), 2);
  // Documents and ranges are two masks.
  EXPECT_NE(error_of([&] {
              mask.with_documents({4, 5});
            }).find("cannot take packed documents"),
            std::string::npos);
}

TEST(MaskKinds, TheRangeParserReadsFilesAndGenerators) {
  const std::string path = testing::TempDir() + "a2d_mask_ranges.txt";
  {
    std::ofstream file(path);
    file << "# prefix-LM of 8 tokens, by hand\n0 32 0 8 full\n\n8 32 8 32 causal  # the rest\n"
            "0,4,28,32,3\n";
  }
  const std::vector<MaskSlice> slices = parse_mask_ranges(path, 32);
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(slices[1], (MaskSlice{8, 32, 8, 32, RangeType::causal}));
  EXPECT_EQ(slices[2], (MaskSlice{0, 4, 28, 32, RangeType::bi_causal}));
  EXPECT_EQ(parse_mask_ranges("@" + path, 32), slices);
  std::remove(path.c_str());
  EXPECT_NE(error_of([] {
              parse_mask_range_lines("0 4 0 4 diagonal\n", "f");
            }).find("f, line 1: unknown slice type 'diagonal'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_mask_range_lines("1 2 3 4 full\n0 4 0 full\n", "f");
            }).find("f, line 2: a slice is 'q0 q1 k0 k1 type', got 4 fields"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_range_lines("0 4x 0 4 full\n", "f"); }).find("'4x'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_mask_ranges("/nonexistent/ranges.txt", 10);
            }).find("cannot read the mask ranges file"),
            std::string::npos);

  // prefix-lm:P: the prefix sees itself, every later token the prefix and, causally, the rest.
  const Mask prefix = Mask::from_ranges(parse_mask_ranges("prefix-lm:25%", 40));
  for (int64_t q = 0; q < 40; ++q)
    for (int64_t k = 0; k < 40; ++k)
      ASSERT_EQ(prefix.visible(q, k), k < 10 || k <= q);
  EXPECT_EQ(parse_mask_ranges("prefix-lm:10", 40), parse_mask_ranges("prefix-lm:25%", 40));
  // block-causal:B: full within blocks, causal across them (the last block short).
  const Mask blocks = Mask::from_ranges(parse_mask_ranges("block-causal:7", 40));
  for (int64_t q = 0; q < 40; ++q)
    for (int64_t k = 0; k < 40; ++k)
      ASSERT_EQ(blocks.visible(q, k), k / 7 <= q / 7);
  // chunked-causal:C: causal within chunks, nothing across them (Llama 4; the last chunk short).
  const Mask chunks = Mask::from_ranges(parse_mask_ranges("chunked-causal:7", 40));
  for (int64_t q = 0; q < 40; ++q)
    for (int64_t k = 0; k < 40; ++k)
      ASSERT_EQ(chunks.visible(q, k), k <= q && k / 7 == q / 7);
  EXPECT_NE(error_of([] { parse_mask_ranges("chunked-causal:0", 40); }).find("at least 1 token"),
            std::string::npos);
  // random:S[:SEED]: S slices, within the sequence, not overlapping (from_ranges checks), the
  // same for the same seed.
  const std::vector<MaskSlice> drawn = parse_mask_ranges("random:64:3", 65536);
  EXPECT_EQ(drawn.size(), 64u);
  EXPECT_NO_THROW(Mask::from_ranges(drawn).validate(65536));
  EXPECT_EQ(parse_mask_ranges("random:64:3", 65536), drawn);
  EXPECT_NE(parse_mask_ranges("random:64:4", 65536), drawn);
  std::set<RangeType> types;
  for (const MaskSlice& s : drawn)
    types.insert(s.type);
  EXPECT_EQ(types.size(), 4u);
  EXPECT_NE(error_of([] { parse_mask_ranges("prefix-lm:41", 40); }).find("within the 40"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_ranges("block-causal:0", 40); }).find("at least 1 token"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_mask_ranges("random:30", 8); }).find("longer sequence"),
            std::string::npos);
  EXPECT_EQ(parse_range_type("inv-causal"), RangeType::inv_causal);
  EXPECT_EQ(parse_range_type("2"), RangeType::inv_causal);
}

TEST(MaskKinds, ContradictoryOptionsAreRefusedInOnePlace) {
  MaskOptions o;
  o.causal = true;
  o.window_size_given = true;
  EXPECT_NE(error_of([&] { make_mask(o); }).find("--window-size -1,-1 is no window at all"),
            std::string::npos);
  o.window_left = 8, o.window_right = 8;
  EXPECT_NE(error_of([&] { make_mask(o); }).find("--causal hides every key after the query"),
            std::string::npos);
  o.window_right = 0;
  EXPECT_EQ(make_mask(o).window, 9);  // --causal --window-size 8,0 = --window 9
  // Python's flash-attn entries: causal makes the right side 0, (-1, -1) is causal.
  o.causal_sets_right = true;
  o.window_right = 8;
  EXPECT_EQ(make_mask(o).window, 9);
  o.window_left = o.window_right = -1;
  EXPECT_EQ(make_mask(o).kind, MaskKind::causal);
  o = MaskOptions{};
  o.window = 5;
  o.window_size_given = true;
  EXPECT_NE(error_of([&] { make_mask(o); }).find("give one of them"), std::string::npos);
  o = MaskOptions{};
  o.ranges_given = true;
  o.ranges = {{0, 4, 0, 4, RangeType::full}};
  EXPECT_EQ(make_mask(o).kind, MaskKind::ranges);
  o.causal = true;
  EXPECT_NE(error_of([&] { make_mask(o); }).find("drop --causal"), std::string::npos);
  o.causal = false;
  o.doc_lengths = {2, 2};
  EXPECT_NE(error_of([&] { make_mask(o); }).find("--mask-ranges and --doc-lens are two masks"),
            std::string::npos);
  o.doc_lengths.clear();
  o.window_size_given = true;
  o.window_left = 2;
  EXPECT_NE(error_of([&] { make_mask(o); }).find("drop --window-size"), std::string::npos);
  o = MaskOptions{};
  o.window = -1;
  EXPECT_NE(error_of([&] { make_mask(o); }).find("--window must be >= 1"), std::string::npos);
  int64_t left = 0, right = 0;
  parse_window_size("-1,128", left, right);
  EXPECT_EQ(left, -1);
  EXPECT_EQ(right, 128);
  EXPECT_NE(error_of([&] { parse_window_size("128", left, right); }).find("LEFT,RIGHT"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_window_size("-2,3", left, right); }).find("-1 (unbounded)"),
            std::string::npos);
}

// The questions the library asks: which layouts balance the mask, whether rows are sorted,
// whether a decoder can extend it, whether ranks that disagree on it are told.
TEST(MaskKinds, TheMaskAnswersWhatTheLibraryAsks) {
  const Mask ranges = Mask::from_ranges({{0, 8, 0, 4, RangeType::full}});
  EXPECT_EQ(Mask::none().balance(), MaskBalance::any);
  EXPECT_EQ(Mask::causal().balance(), MaskBalance::mirrored);
  EXPECT_EQ(Mask::causal_window(9).balance(), MaskBalance::mirrored);
  EXPECT_EQ(Mask::window_size(64, 64).balance(), MaskBalance::any);
  EXPECT_EQ(Mask::window_size(-1, 64).balance(), MaskBalance::mirrored);
  EXPECT_EQ(Mask::none().with_documents({3, 5}).balance(), MaskBalance::interleaved);
  EXPECT_EQ(ranges.balance(), MaskBalance::interleaved);
  // A two-sided window is no causal mask: it never gets a causal layout by accident, and a
  // decoder refuses it.
  EXPECT_TRUE(Mask::causal().extends_causally());
  EXPECT_TRUE(Mask::causal_window(4).extends_causally());
  EXPECT_FALSE(Mask::window_size(4, 4).extends_causally());
  EXPECT_FALSE(Mask::window_size(4, -1).extends_causally());
  EXPECT_FALSE(ranges.extends_causally());
  EXPECT_FALSE(Mask::causal().with_documents({3, 5}).extends_causally());
  EXPECT_FALSE(Mask::none().hides_pairs());
  EXPECT_TRUE(Mask::window_size(4, 4).hides_pairs());
  EXPECT_TRUE(Mask::none().with_documents({3, 5}).hides_pairs());
  EXPECT_FALSE(Mask::none().with_documents({3, 5}).masks_by_position());
  EXPECT_TRUE(ranges.fixed_length());
  EXPECT_FALSE(Mask::window_size(4, 4).fixed_length());
  // The digest tells slices and document boundaries apart.
  EXPECT_EQ(Mask::causal().digest(), 0);
  EXPECT_NE(ranges.digest(), Mask::from_ranges({{0, 8, 0, 4, RangeType::causal}}).digest());
  EXPECT_NE(ranges.digest(), Mask::from_ranges({{0, 8, 0, 5, RangeType::full}}).digest());
  EXPECT_EQ(ranges.digest(), Mask::from_ranges({{0, 8, 0, 4, RangeType::full}}).digest());
  EXPECT_NE(Mask::none().with_documents({3, 5}).digest(),
            Mask::none().with_documents({5, 3}).digest());
  EXPECT_EQ(ranges.describe(), "ranges(1)");
}

// A decoder extends a causal mask, plain or windowed, and refuses the others saying why.
TEST(MaskKinds, DecodingRefusesWhatANewTokenCannotExtend) {
  Problem p;
  p.seq = 64;
  p.heads = 2;
  p.kv_heads = 2;
  p.head_dim = 16;
  for (const Mask& mask : {Mask::causal(), Mask::causal_window(8), Mask::window_size(7, 0)}) {
    p.mask = mask;
    EXPECT_NO_THROW(check_decodable(p)) << mask.describe();
  }
  p.mask = Mask::window_size(4, 4);
  EXPECT_NE(error_of([&] { check_decodable(p); }).find("its right side shows keys after the query"),
            std::string::npos);
  p.mask = Mask::from_ranges(parse_mask_ranges("prefix-lm:8", 64));
  EXPECT_NE(error_of([&] { check_decodable(p); }).find("does not take a range mask"),
            std::string::npos);
  p.mask = Mask::none();
  EXPECT_NE(error_of([&] { check_decodable(p); }).find("needs a causal mask"), std::string::npos);
}

}  // namespace
}  // namespace a2d
