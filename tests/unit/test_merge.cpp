// Splitting the keys, attending to each part and merging the partial results in any order gives
// the unsplit attention: the property every distributed algorithm stands on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention2d/kernel.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/data.hpp"
#include "attention_case.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct MergeSetup {
  AttentionShape shape;
  Mask mask;
  float scale;
  std::vector<float> q, k, v;
  std::vector<int64_t> q_pos, k_pos;
};

// Queries at positions 0, 3, 6, ...; keys at 1, 2, 3, ...: under a causal mask the first query
// row sees no key at all, and small key parts leave many rows empty.
MergeSetup make_setup(const Mask& mask, uint64_t seed) {
  MergeSetup s;
  s.shape = {2, 4, 2, 57, 150, 48};
  s.mask = mask;
  s.scale = default_scale(s.shape.head_dim);
  s.q = generate_tokens(seed, TensorTag::q, {2, 57, 4, 48});
  s.k = generate_tokens(seed, TensorTag::k, {2, 150, 2, 48});
  s.v = generate_tokens(seed, TensorTag::v, {2, 150, 2, 48});
  for (int64_t i = 0; i < 57; ++i)
    s.q_pos.push_back(3 * i);
  for (int64_t j = 0; j < 150; ++j)
    s.k_pos.push_back(1 + j);
  return s;
}

// Dense buffers of one partial state over the queries of a setup.
struct Partial {
  std::vector<float> acc, row_max, row_sum;
  Partial(const AttentionShape& s)
      : acc(static_cast<size_t>(s.batch * s.q_tokens * s.heads * s.head_dim)),
        row_max(static_cast<size_t>(s.batch * s.heads * s.q_tokens), kNegInf),
        row_sum(static_cast<size_t>(s.batch * s.heads * s.q_tokens), 0.0f) {}
  PartialView view(const AttentionShape& s) {
    return {dense_tokens(acc.data(), s.q_tokens, s.heads, s.head_dim),
            dense_rows(row_max.data(), s.heads, s.q_tokens),
            dense_rows(row_sum.data(), s.heads, s.q_tokens)};
  }
};

// Attends the queries to the keys listed in `keys` (any subset, in the given order).
void attend_part(const MergeSetup& s, const std::vector<int64_t>& keys, Partial& partial,
                 bool accumulate) {
  AttentionShape shape = s.shape;
  shape.kv_tokens = static_cast<int64_t>(keys.size());
  const int64_t row = shape.kv_heads * shape.head_dim;
  std::vector<float> k(shape.batch * keys.size() * row), v(k.size());
  std::vector<int64_t> positions;
  for (size_t j = 0; j < keys.size(); ++j)
    positions.push_back(s.k_pos[keys[j]]);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (size_t j = 0; j < keys.size(); ++j) {
      const size_t from = (b * s.shape.kv_tokens + keys[j]) * row;
      const size_t to = (b * keys.size() + j) * row;
      std::copy_n(s.k.begin() + from, row, k.begin() + to);
      std::copy_n(s.v.begin() + from, row, v.begin() + to);
    }
  }
  ForwardArgs args;
  args.shape = shape;
  args.mask = s.mask;
  args.scale = s.scale;
  args.q = dense_tokens(s.q.data(), shape.q_tokens, shape.heads, shape.head_dim);
  args.k = dense_tokens(k.data(), shape.kv_tokens, shape.kv_heads, shape.head_dim);
  args.v = dense_tokens(v.data(), shape.kv_tokens, shape.kv_heads, shape.head_dim);
  args.q_positions = s.q_pos.data();
  args.kv_positions = positions.data();
  attention_forward_partial(args, partial.view(s.shape), accumulate);
}

void expect_no_nan(const std::vector<float>& x, const char* what) {
  for (const float value : x)
    ASSERT_FALSE(std::isnan(value)) << what;
}

struct Reference {
  std::vector<double> out, lse;
};

Reference reference_of(const MergeSetup& s) {
  const std::vector<double> q(s.q.begin(), s.q.end()), k(s.k.begin(), s.k.end()),
      v(s.v.begin(), s.v.end());
  Reference r;
  r.out.resize(s.q.size());
  r.lse.resize(static_cast<size_t>(s.shape.batch * s.shape.heads * s.shape.q_tokens));
  reference::forward(
      {s.shape, s.mask, s.scale, q.data(), k.data(), v.data(), s.q_pos.data(), s.k_pos.data(), 1},
      r.out.data(), r.lse.data());
  return r;
}

// Random partition of the keys into `parts` subsets (some may be empty).
std::vector<std::vector<int64_t>> random_split(int64_t keys, int parts, std::mt19937& rng) {
  std::vector<std::vector<int64_t>> split(static_cast<size_t>(parts));
  std::uniform_int_distribution<int> pick(0, parts - 1);
  for (int64_t j = 0; j < keys; ++j)
    split[pick(rng)].push_back(j);
  return split;
}

// (mask, kernel path): the partial kernel of every path must merge the same way.
class MergeTest : public ::testing::TestWithParam<std::tuple<Mask, KernelPath>> {
 protected:
  void SetUp() override {
    if (!kernel_path_supported(std::get<1>(GetParam()))) GTEST_SKIP() << "path not supported";
    scope_.emplace(std::get<1>(GetParam()));
  }
  static Mask mask() { return std::get<0>(GetParam()); }

 private:
  std::optional<test::PathScope> scope_;
};

TEST_P(MergeTest, RandomSplitsMergedInRandomOrderEqualUnsplit) {
  const MergeSetup s = make_setup(mask(), 11);
  const Reference expected = reference_of(s);
  const RowsShape rows{s.shape.batch, s.shape.q_tokens, s.shape.heads, s.shape.head_dim};
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 24; ++trial) {
    const int parts = 2 + trial % 15;  // 2 .. 16
    const auto split = random_split(s.shape.kv_tokens, parts, rng);
    std::vector<Partial> partials;
    for (const auto& keys : split) {
      partials.emplace_back(s.shape);
      attend_part(s, keys, partials.back(), false);
      expect_no_nan(partials.back().acc, "partial acc");
      expect_no_nan(partials.back().row_sum, "partial row_sum");
    }
    // Merge as a random tree: repeatedly merge one random partial into another.
    std::vector<size_t> alive(partials.size());
    std::iota(alive.begin(), alive.end(), 0);
    while (alive.size() > 1) {
      std::shuffle(alive.begin(), alive.end(), rng);
      const size_t from = alive.back();
      alive.pop_back();
      merge_partial(rows, partials[alive.front()].view(s.shape), partials[from].view(s.shape));
    }
    Partial& merged = partials[alive.front()];
    std::vector<float> out(s.q.size()), lse(expected.lse.size());
    finalize_partial(rows, merged.view(s.shape),
                     dense_tokens(out.data(), s.shape.q_tokens, s.shape.heads, s.shape.head_dim),
                     dense_rows(lse.data(), s.shape.heads, s.shape.q_tokens));
    expect_no_nan(out, "merged O");
    expect_no_nan(lse, "merged LSE");
    EXPECT_LE(relative_error(out.data(), expected.out.data(), static_cast<int64_t>(out.size())),
              kFp32RelativeBound)
        << "parts=" << parts;
    EXPECT_LE(relative_error(lse.data(), expected.lse.data(), static_cast<int64_t>(lse.size())),
              kFp32RelativeBound)
        << "parts=" << parts;
  }
}

TEST_P(MergeTest, OutputFormMergeEqualsUnsplit) {
  const MergeSetup s = make_setup(mask(), 12);
  const Reference expected = reference_of(s);
  const RowsShape rows{s.shape.batch, s.shape.q_tokens, s.shape.heads, s.shape.head_dim};
  std::mt19937 rng(99);
  for (int trial = 0; trial < 12; ++trial) {
    const int parts = 2 + (trial * 5) % 15;
    auto split = random_split(s.shape.kv_tokens, parts, rng);
    std::shuffle(split.begin(), split.end(), rng);
    std::vector<float> out(s.q.size()), lse(expected.lse.size(), kNegInf);
    for (const auto& keys : split) {
      Partial partial(s.shape);
      attend_part(s, keys, partial, false);
      std::vector<float> part_out(s.q.size()), part_lse(lse.size());
      const auto out_view =
          dense_tokens(part_out.data(), s.shape.q_tokens, s.shape.heads, s.shape.head_dim);
      const auto lse_view = dense_rows(part_lse.data(), s.shape.heads, s.shape.q_tokens);
      finalize_partial(rows, partial.view(s.shape), out_view, lse_view);
      merge_output(rows,
                   dense_tokens(out.data(), s.shape.q_tokens, s.shape.heads, s.shape.head_dim),
                   dense_rows(lse.data(), s.shape.heads, s.shape.q_tokens), out_view, lse_view);
    }
    expect_no_nan(out, "merged O");
    EXPECT_LE(relative_error(out.data(), expected.out.data(), static_cast<int64_t>(out.size())),
              kFp32RelativeBound);
    EXPECT_LE(relative_error(lse.data(), expected.lse.data(), static_cast<int64_t>(lse.size())),
              kFp32RelativeBound);
  }
}

TEST_P(MergeTest, AccumulatingKernelEqualsUnsplit) {
  const MergeSetup s = make_setup(mask(), 13);
  const Reference expected = reference_of(s);
  const RowsShape rows{s.shape.batch, s.shape.q_tokens, s.shape.heads, s.shape.head_dim};
  std::mt19937 rng(5);
  const auto split = random_split(s.shape.kv_tokens, 7, rng);
  Partial state(s.shape);
  for (const auto& keys : split)
    attend_part(s, keys, state, /*accumulate=*/true);
  std::vector<float> out(s.q.size()), lse(expected.lse.size());
  finalize_partial(rows, state.view(s.shape),
                   dense_tokens(out.data(), s.shape.q_tokens, s.shape.heads, s.shape.head_dim),
                   dense_rows(lse.data(), s.shape.heads, s.shape.q_tokens));
  EXPECT_LE(relative_error(out.data(), expected.out.data(), static_cast<int64_t>(out.size())),
            kFp32RelativeBound);
  EXPECT_LE(relative_error(lse.data(), expected.lse.data(), static_cast<int64_t>(lse.size())),
            kFp32RelativeBound);
}

INSTANTIATE_TEST_SUITE_P(
    Masks, MergeTest,
    ::testing::Combine(::testing::Values(Mask::none(), Mask::causal(), Mask::causal_window(20)),
                       ::testing::Values(KernelPath::portable, KernelPath::avx2,
                                         KernelPath::avx512)),
    [](const auto& p) {
      const Mask& m = std::get<0>(p.param);
      return (m.kind == MaskKind::causal_window ? std::string("window") : m.describe()) + "_" +
             kernel_path_name(std::get<1>(p.param));
    });

TEST(Merge, EmptyRowsStayEmptyWithoutNaN) {
  // Two partials of one row where neither saw a key, and one where only one side did.
  const RowsShape rows{1, 2, 1, 4};
  std::vector<float> acc_a(8, 0.0f), max_a = {kNegInf, kNegInf}, sum_a = {0.0f, 0.0f};
  std::vector<float> acc_b = {0, 0, 0, 0, 1, 2, 3, 4}, max_b = {kNegInf, 0.5f},
                     sum_b = {0.0f, 2.0f};
  PartialView a{dense_tokens(acc_a.data(), 2, 1, 4), dense_rows(max_a.data(), 1, 2),
                dense_rows(sum_a.data(), 1, 2)};
  ConstPartialView b = PartialView{dense_tokens(acc_b.data(), 2, 1, 4),
                                   dense_rows(max_b.data(), 1, 2), dense_rows(sum_b.data(), 1, 2)};
  merge_partial(rows, a, b);
  EXPECT_EQ(max_a[0], kNegInf);
  EXPECT_EQ(sum_a[0], 0.0f);
  EXPECT_FLOAT_EQ(max_a[1], 0.5f);
  EXPECT_FLOAT_EQ(sum_a[1], 2.0f);
  std::vector<float> out(8), lse(2);
  finalize_partial(rows, a, dense_tokens(out.data(), 2, 1, 4), dense_rows(lse.data(), 1, 2));
  EXPECT_EQ(lse[0], kNegInf);
  for (int d = 0; d < 4; ++d)
    EXPECT_EQ(out[d], 0.0f);
  EXPECT_FLOAT_EQ(out[4], 0.5f);
  EXPECT_FLOAT_EQ(lse[1], 0.5f + std::log(2.0f));

  // The (O, LSE) form: merging two empty rows keeps -inf and zeros.
  std::vector<float> o1(4, 0.0f), l1 = {kNegInf}, o2(4, 0.0f), l2 = {kNegInf};
  merge_output({1, 1, 1, 4}, dense_tokens(o1.data(), 1, 1, 4), dense_rows(l1.data(), 1, 1),
               dense_tokens(o2.data(), 1, 1, 4), dense_rows(l2.data(), 1, 1));
  EXPECT_EQ(l1[0], kNegInf);
  for (const float x : o1)
    EXPECT_EQ(x, 0.0f);
}

TEST(Merge, RowWithoutKeysGivesZeroAndMinusInfinity) {
  for (const KernelPath path : test::supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const test::PathScope scope(path);
    // Query at position 0, keys at 1 and 2, causal: the row sees nothing.
    const std::vector<float> q(8, 1.0f), k(16, 1.0f), v(16, 1.0f);
    const int64_t q_pos[] = {0}, k_pos[] = {1, 2};
    ForwardArgs args;
    args.shape = {1, 1, 1, 1, 2, 8};
    args.mask = Mask::causal();
    args.scale = 0.5f;
    args.q = dense_tokens(q.data(), 1, 1, 8);
    args.k = dense_tokens(k.data(), 2, 1, 8);
    args.v = dense_tokens(v.data(), 2, 1, 8);
    args.q_positions = q_pos;
    args.kv_positions = k_pos;
    std::vector<float> out(8, 123.0f), lse(1, 0.0f);
    attention_forward(args, dense_tokens(out.data(), 1, 1, 8), dense_rows(lse.data(), 1, 1));
    EXPECT_EQ(lse[0], kNegInf);
    for (const float x : out)
      EXPECT_EQ(x, 0.0f);
  }
}

}  // namespace
}  // namespace a2d
