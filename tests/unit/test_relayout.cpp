// The exchange between two layouts as pure index maps, without MPI: shared_tokens against a
// brute-force count, and whole exchanges simulated over up to thousands of virtual ranks (every
// rank's blocks delivered by hand): every rank ends with exactly its tokens of the target layout,
// in order, and exchange_traffic equals what the simulated all-to-all sends by comm.hpp's
// counting convention. Also the record layout and the relayout records of the cost model.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/relayout.hpp"

namespace a2d {
namespace {

// Every kind of layout over (tokens, parts), uneven contiguous cuts (with empty parts) among them.
std::vector<TokenLayout> layouts_of(int64_t tokens, int64_t parts) {
  std::vector<TokenLayout> list;
  for (const LayoutKind kind : {LayoutKind::cyclic, LayoutKind::contiguous, LayoutKind::zigzag})
    list.emplace_back(kind, tokens, parts);
  for (const int64_t stripe : {2, 3, 5})
    list.emplace_back(LayoutKind::striped, tokens, parts, stripe);
  // Uneven cuts: part 1 without tokens, the rest spread unevenly; and all tokens on the last part.
  std::vector<int64_t> counts(static_cast<size_t>(parts), 0);
  int64_t left = tokens;
  for (int64_t p = 0; p < parts && left > 0; ++p) {
    if (p == 1 && parts > 2) continue;
    const int64_t c = p + 1 == parts ? left : std::min(left, (p * 5 + 3) % 11);
    counts[static_cast<size_t>(p)] = c;
    left -= c;
  }
  counts.back() += left;
  list.push_back(TokenLayout::contiguous_counts(counts));
  std::vector<int64_t> last(static_cast<size_t>(parts), 0);
  last.back() = tokens;
  list.push_back(TokenLayout::contiguous_counts(last));
  // The caller's shards in another part order (a DeviceMesh's ranks in torch's order while the
  // engine's take grid positions): the parts reversed, for every kind above.
  if (parts > 1) {
    std::vector<int64_t> reversed(static_cast<size_t>(parts));
    for (int64_t p = 0; p < parts; ++p)
      reversed[static_cast<size_t>(p)] = parts - 1 - p;
    const size_t plain = list.size();
    for (size_t i = 0; i < plain; ++i)
      list.push_back(list[i].permuted(reversed));
  }
  return list;
}

// One rank's blocks, as the all-to-all would carry them: the token ids it sends to each rank.
struct Simulated {
  std::vector<std::vector<int64_t>> received;  // by rank: its `to` shard after the exchange
  std::vector<Traffic> sent;                   // by rank, at one byte per token
};

Simulated simulate(const TokenLayout& from, const TokenLayout& to) {
  const int64_t parts = from.parts();
  std::vector<ExchangePlan> plans;
  for (int64_t r = 0; r < parts; ++r)
    plans.push_back(exchange_plan(from, to, r));
  Simulated out;
  out.sent.resize(static_cast<size_t>(parts));
  // Every rank's packed send records (token ids) and where its block for each rank starts.
  std::vector<std::vector<int64_t>> packed(static_cast<size_t>(parts));
  std::vector<std::vector<int64_t>> starts(static_cast<size_t>(parts));
  for (int64_t r = 0; r < parts; ++r) {
    const ExchangePlan& plan = plans[static_cast<size_t>(r)];
    const std::vector<int64_t> shard = from.tokens_of(r);
    auto& records = packed[static_cast<size_t>(r)];
    records.resize(shard.size());
    for (size_t s = 0; s < shard.size(); ++s)
      records[s] = shard[plan.send_order.empty() ? s : static_cast<size_t>(plan.send_order[s])];
    auto& start = starts[static_cast<size_t>(r)];
    start.assign(static_cast<size_t>(parts) + 1, 0);
    for (int64_t q = 0; q < parts; ++q) {
      const int64_t count = plan.send_counts[static_cast<size_t>(q)];
      start[static_cast<size_t>(q) + 1] = start[static_cast<size_t>(q)] + count;
      if (q != r && count > 0) {
        out.sent[static_cast<size_t>(r)].bytes += count;
        ++out.sent[static_cast<size_t>(r)].messages;
      }
    }
  }
  out.received.resize(static_cast<size_t>(parts));
  int64_t wrong_blocks = 0;  // blocks whose size the receiver does not expect
  for (int64_t r = 0; r < parts; ++r) {
    const ExchangePlan& plan = plans[static_cast<size_t>(r)];
    std::vector<int64_t> arrived;
    for (int64_t source = 0; source < parts; ++source) {
      const auto& start = starts[static_cast<size_t>(source)];
      const int64_t begin = start[static_cast<size_t>(r)], end = start[static_cast<size_t>(r) + 1];
      wrong_blocks += end - begin != plan.recv_counts[static_cast<size_t>(source)] ? 1 : 0;
      const auto& records = packed[static_cast<size_t>(source)];
      arrived.insert(arrived.end(), records.begin() + begin, records.begin() + end);
    }
    auto& shard = out.received[static_cast<size_t>(r)];
    shard.resize(arrived.size());
    for (size_t m = 0; m < arrived.size(); ++m)
      shard[m] = arrived[plan.recv_order.empty() ? m : static_cast<size_t>(plan.recv_order[m])];
  }
  EXPECT_EQ(wrong_blocks, 0) << from.describe() << " -> " << to.describe();
  return out;
}

// The model's traffic (O(P) per rank) is compared on every `traffic_every`-th rank and the last.
void expect_exchange(const TokenLayout& from, const TokenLayout& to, int64_t traffic_every = 1) {
  const Simulated result = simulate(from, to);
  for (int64_t r = 0; r < from.parts(); ++r) {
    ASSERT_EQ(result.received[static_cast<size_t>(r)], to.tokens_of(r))
        << from.describe() << " -> " << to.describe() << " rank " << r;
    if (r % traffic_every != 0 && r + 1 < from.parts()) continue;
    for (const int64_t bytes_per_token : {1, 12}) {
      const Traffic model = exchange_traffic(from, to, r, bytes_per_token);
      ASSERT_EQ(model.bytes, bytes_per_token * result.sent[static_cast<size_t>(r)].bytes)
          << from.describe() << " -> " << to.describe() << " rank " << r;
      ASSERT_EQ(model.messages, result.sent[static_cast<size_t>(r)].messages)
          << from.describe() << " -> " << to.describe() << " rank " << r;
    }
    EXPECT_EQ(exchange_traffic(from, to, r, 0).messages, 0);
  }
  // Nothing moves exactly when no rank sends a byte.
  int64_t total = 0;
  for (const Traffic& t : result.sent)
    total += t.bytes;
  EXPECT_EQ(same_assignment(from, to), total == 0) << from.describe() << " -> " << to.describe();
}

TEST(Relayout, SharedTokensEqualTheBruteForceCountForEveryPairOfLayouts) {
  int checked = 0;
  for (const int64_t parts : {1, 2, 3, 4, 6, 7, 13}) {
    for (const int64_t tokens : {int64_t{0}, int64_t{1}, parts - 1, parts, 2 * parts - 1,
                                 2 * parts + 3, int64_t{97}, int64_t{1000}}) {
      if (tokens < 0) continue;
      const std::vector<TokenLayout> list = layouts_of(tokens, parts);
      for (const TokenLayout& a : list) {
        for (const TokenLayout& b : list) {
          for (int64_t p = 0; p < parts; ++p) {
            const std::vector<int64_t> mine = a.tokens_of(p);
            for (int64_t q = 0; q < parts; ++q) {
              const std::vector<int64_t> theirs = b.tokens_of(q);
              std::vector<int64_t> both;
              std::set_intersection(mine.begin(), mine.end(), theirs.begin(), theirs.end(),
                                    std::back_inserter(both));
              ASSERT_EQ(shared_tokens(a, p, b, q), static_cast<int64_t>(both.size()))
                  << a.describe() << " part " << p << " and " << b.describe() << " part " << q;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
  // Long periods: stripes 7 and 11 (lcm 77), many periods and a rest.
  const TokenLayout seven(LayoutKind::striped, 100003, 5, 7),
      eleven(LayoutKind::striped, 100003, 5, 11);
  for (int64_t p = 0; p < 5; ++p) {
    int64_t brute = 0;
    for (const int64_t t : seven.tokens_of(p))
      brute += eleven.owner(t).part == 3 ? 1 : 0;
    EXPECT_EQ(shared_tokens(seven, p, eleven, 3), brute);
    EXPECT_EQ(shared_tokens(eleven, 3, seven, p), brute);
  }
  EXPECT_THROW(shared_tokens(seven, 0, TokenLayout(LayoutKind::cyclic, 100003, 4), 0), Error);
}

TEST(Relayout, EveryExchangeDeliversTheTargetShardsAndSendsWhatTheTrafficSays) {
  for (const int64_t parts : {1, 2, 3, 4, 6, 7}) {
    for (const int64_t tokens :
         {int64_t{0}, int64_t{1}, parts - 1, parts + 1, 2 * parts + 3, int64_t{13 * 7 + 5}}) {
      if (tokens < 0) continue;
      const std::vector<TokenLayout> list = layouts_of(tokens, parts);
      for (const TokenLayout& from : list) {
        for (const TokenLayout& to : list)
          expect_exchange(from, to);
      }
    }
  }
}

TEST(Relayout, ExchangesOverAThousandVirtualRanks) {
  // The shards users bring (contiguous, uneven with empty ranks, zigzag) into the plans' layouts
  // (cyclic, zigzag) and back, N not a multiple of P or 2P.
  const int64_t parts = 1024, tokens = 25013;
  std::vector<int64_t> counts(static_cast<size_t>(parts));
  int64_t left = tokens;
  for (size_t p = 0; p + 1 < counts.size(); ++p) {
    counts[p] = std::min(left, static_cast<int64_t>((p * 31) % 47));
    left -= counts[p];
  }
  counts.back() = left;
  const TokenLayout contiguous(LayoutKind::contiguous, tokens, parts);
  const TokenLayout zigzag(LayoutKind::zigzag, tokens, parts);
  const TokenLayout cyclic(LayoutKind::cyclic, tokens, parts);
  const TokenLayout uneven = TokenLayout::contiguous_counts(counts);
  expect_exchange(contiguous, cyclic, 31);
  expect_exchange(cyclic, contiguous, 31);
  expect_exchange(zigzag, cyclic, 31);
  expect_exchange(uneven, zigzag, 31);
  expect_exchange(cyclic, uneven, 31);
}

TEST(Relayout, SameAssignmentSeesThroughDifferentDescriptions) {
  // Cyclic is striped(1); a stripe as wide as a part's share is a contiguous cut; one part holds
  // everything in every layout; the even cut is the plain contiguous layout.
  EXPECT_TRUE(same_assignment(TokenLayout(LayoutKind::cyclic, 101, 7),
                              TokenLayout(LayoutKind::striped, 101, 7, 1)));
  EXPECT_TRUE(same_assignment(TokenLayout(LayoutKind::striped, 10, 3, 4),
                              TokenLayout::contiguous_counts({4, 4, 2})));
  EXPECT_TRUE(same_assignment(TokenLayout(LayoutKind::zigzag, 50, 1),
                              TokenLayout(LayoutKind::cyclic, 50, 1)));
  EXPECT_TRUE(same_assignment(TokenLayout::contiguous_counts({4, 3, 3}),
                              TokenLayout(LayoutKind::contiguous, 10, 3)));
  // Fewer tokens than ranks: contiguous and cyclic give token t to part t alike.
  EXPECT_TRUE(same_assignment(TokenLayout(LayoutKind::contiguous, 3, 5),
                              TokenLayout(LayoutKind::cyclic, 3, 5)));
  EXPECT_FALSE(same_assignment(TokenLayout(LayoutKind::contiguous, 10, 3),
                               TokenLayout(LayoutKind::cyclic, 10, 3)));
  EXPECT_FALSE(same_assignment(TokenLayout::contiguous_counts({5, 0, 5}),
                               TokenLayout(LayoutKind::contiguous, 10, 3)));
  EXPECT_FALSE(same_assignment(TokenLayout(LayoutKind::cyclic, 10, 3),
                               TokenLayout(LayoutKind::cyclic, 10, 2)));
}

TEST(Relayout, RecordsAlignEveryFieldAndMatchTheDocumentedSizes) {
  // bf16 O of B·H·D = 3 elements and fp32 LSE of 2: LSE first, O after it, rounded up to 4.
  const ExchangeField fields[2] = {{DType::bf16, 3}, {DType::f32, 2}};
  const ExchangeRecord record = exchange_record(fields);
  EXPECT_EQ(record.offsets, (std::vector<int64_t>{8, 0}));
  EXPECT_EQ(record.bytes, 16);  // 8 + 6, rounded up to 4
  const ExchangeField only_bf16[2] = {{DType::bf16, 3}, {DType::f16, 5}};
  EXPECT_EQ(exchange_record(only_bf16).bytes, 16);
  EXPECT_EQ(exchange_record(only_bf16).offsets, (std::vector<int64_t>{0, 6}));

  Problem p;
  p.batch = 2;
  p.heads = 12;
  p.kv_heads = 4;
  p.head_dim = 80;
  p.seq = 1000;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    p.dtype = dtype;
    const int64_t e = dtype_bytes(dtype), b = p.batch, h = p.heads, hkv = p.kv_heads,
                  d = p.head_dim;
    const RelayoutRecords saved = relayout_records(p, RelayoutBackward::saved);
    EXPECT_EQ(saved.forward_in, b * (h + 2 * hkv) * d * e);
    EXPECT_EQ(saved.forward_out, b * h * (d * e + 4));
    EXPECT_EQ(saved.backward_in, b * h * d * e);
    EXPECT_EQ(saved.backward_out, b * (h + 2 * hkv) * d * e);
    const RelayoutRecords stateless = relayout_records(p, RelayoutBackward::stateless);
    EXPECT_EQ(stateless.backward_in, b * ((3 * h + 2 * hkv) * d * e + 4 * h));
    EXPECT_EQ(stateless.forward_in, saved.forward_in);
  }
  // 16 bits with B·H·D odd: O and LSE padded to a multiple of 4.
  p.batch = 1;
  p.heads = 3;
  p.kv_heads = 1;
  p.head_dim = 5;
  p.dtype = DType::bf16;
  EXPECT_EQ(relayout_records(p, RelayoutBackward::saved).forward_out, 4 * 3 + 2 * 15 + 2);
  EXPECT_EQ(parse_relayout_backward("stateless"), RelayoutBackward::stateless);
  EXPECT_THROW(parse_relayout_backward("lazy"), Error);
}

TEST(Relayout, PlanLayoutsAreTheLayoutsTheAlgorithmsComputeIn) {
  Problem p;
  p.seq = 1001;
  p.heads = 8;
  p.kv_heads = 4;
  p.head_dim = 16;
  p.mask = Mask::causal();
  const Plan ring = default_plan(Algorithm::ring, p, 6);
  EXPECT_TRUE(plan_layout(p, ring) == TokenLayout(LayoutKind::zigzag, 1001, 6));
  const Plan a2d = default_plan(Algorithm::attention2d, p, 6);
  EXPECT_TRUE(plan_layout(p, a2d) == TokenLayout(LayoutKind::cyclic, 1001, 6));
  Plan hybrid = default_plan(Algorithm::hybrid, p, 8);
  EXPECT_EQ(plan_layout(p, hybrid).parts(), 8);
  EXPECT_EQ(plan_layout(p, hybrid).kind(), LayoutKind::cyclic);
  Plan striped = ring;
  striped.layout = LayoutKind::striped;
  striped.stripe = 3;
  EXPECT_TRUE(plan_layout(p, striped) == TokenLayout(LayoutKind::striped, 1001, 6, 3));
}

}  // namespace
}  // namespace a2d
