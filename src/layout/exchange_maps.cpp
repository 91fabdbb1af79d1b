// The index maps of an exchange between two layouts (relayout.hpp): pure functions, no backend.
#include <algorithm>
#include <numeric>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/exchange_maps.hpp"

namespace a2d {
namespace {

void require_same_sequence(const TokenLayout& a, const TokenLayout& b) {
  A2D_REQUIRE(a.tokens() == b.tokens() && a.parts() == b.parts(), "the layouts ", a.describe(),
              " and ", b.describe(), " do not split the same tokens over the same parts");
}

// Two periodic layouts of different stripes: the tokens of `narrow`'s part p that lie in the
// stripes of `wide`'s part q. Both patterns repeat every L = lcm(stripes) x P tokens, so one
// period is summed and multiplied, and the rest summed stripe by stripe.
int64_t shared_periodic(const TokenLayout& narrow, int64_t p, const TokenLayout& wide, int64_t q) {
  const int64_t n = narrow.tokens(), parts = narrow.parts(), w = wide.stripe();
  const int64_t slot = wide.slot(q);  // wide's part q owns the stripes ≡ slot mod P
  // Over wide's stripes of part q from stripe index `first` (≡ slot mod P) up to token `end`.
  const auto in_stripes = [&](int64_t first, int64_t end) {
    int64_t sum = 0;
    for (int64_t i = first; i * w < end; i += parts) {
      sum += narrow.count_below(p, std::min(end, (i + 1) * w)) - narrow.count_below(p, i * w);
    }
    return sum;
  };
  const int64_t lcm = narrow.stripe() / std::gcd(narrow.stripe(), w) * w;  // < 2^60
  if (lcm > n / parts) return in_stripes(slot, n);                         // less than one period
  const int64_t period = lcm * parts, periods = n / period;
  return periods * in_stripes(slot, period) + in_stripes(periods * period / w + slot, n);
}

}  // namespace

int64_t shared_tokens(const TokenLayout& a, int64_t part_a, const TokenLayout& b, int64_t part_b) {
  require_same_sequence(a, b);
  if (!a.periodic()) {
    int64_t sum = 0;
    for (const TokenLayout::Interval& run : a.intervals(part_a))
      sum += b.count_below(part_b, run.end) - b.count_below(part_b, run.begin);
    return sum;
  }
  if (!b.periodic()) return shared_tokens(b, part_b, a, part_a);
  if (a.stripe() == b.stripe()) return a.slot(part_a) == b.slot(part_b) ? a.count(part_a) : 0;
  return a.stripe() < b.stripe() ? shared_periodic(a, part_a, b, part_b)
                                 : shared_periodic(b, part_b, a, part_a);
}

bool same_assignment(const TokenLayout& a, const TokenLayout& b) {
  if (a.tokens() != b.tokens() || a.parts() != b.parts()) return false;
  if (a == b || a.parts() == 1) return true;
  for (int64_t p = 0; p < a.parts(); ++p) {
    const int64_t count = a.count(p);
    if (count != b.count(p) || shared_tokens(a, p, b, p) != count) return false;
  }
  return true;
}

ExchangePlan exchange_plan(const TokenLayout& from, const TokenLayout& to, int64_t part) {
  require_same_sequence(from, to);
  A2D_REQUIRE(part >= 0 && part < from.parts(), "part ", part, " is outside 0..", from.parts() - 1);
  const auto parts = static_cast<size_t>(from.parts());
  ExchangePlan plan;
  plan.send_counts.assign(parts, 0);
  plan.recv_counts.assign(parts, 0);
  // Send: the part's `from` rows grouped by destination; within a group in increasing token
  // order, which is the shard's own order. O(tokens of the part + P).
  const int64_t sent = from.count(part);
  std::vector<int64_t> dest(static_cast<size_t>(sent));
  for (int64_t i = 0; i < sent; ++i) {
    dest[static_cast<size_t>(i)] = to.owner(from.token_at(part, i)).part;
    ++plan.send_counts[static_cast<size_t>(dest[static_cast<size_t>(i)])];
  }
  std::vector<int64_t> cursor(parts + 1, 0);
  std::partial_sum(plan.send_counts.begin(), plan.send_counts.end(), cursor.begin() + 1);
  plan.send_order.resize(static_cast<size_t>(sent));
  bool identity = true;
  for (int64_t i = 0; i < sent; ++i) {
    const int64_t at = cursor[static_cast<size_t>(dest[static_cast<size_t>(i)])]++;
    plan.send_order[static_cast<size_t>(at)] = i;
    identity = identity && at == i;
  }
  if (identity) plan.send_order.clear();
  // Receive: records arrive grouped by source, each group in increasing token order; row m of the
  // `to` shard (increasing order too) is the next record of its source's group.
  const int64_t received = to.count(part);
  std::vector<int64_t> source(static_cast<size_t>(received));
  for (int64_t m = 0; m < received; ++m) {
    source[static_cast<size_t>(m)] = from.owner(to.token_at(part, m)).part;
    ++plan.recv_counts[static_cast<size_t>(source[static_cast<size_t>(m)])];
  }
  std::fill(cursor.begin(), cursor.end(), 0);
  std::partial_sum(plan.recv_counts.begin(), plan.recv_counts.end(), cursor.begin() + 1);
  plan.recv_order.resize(static_cast<size_t>(received));
  identity = true;
  for (int64_t m = 0; m < received; ++m) {
    const int64_t at = cursor[static_cast<size_t>(source[static_cast<size_t>(m)])]++;
    plan.recv_order[static_cast<size_t>(m)] = at;
    identity = identity && at == m;
  }
  if (identity) plan.recv_order.clear();
  return plan;
}

Traffic exchange_traffic(const TokenLayout& from, const TokenLayout& to, int64_t part,
                         int64_t bytes_per_token) {
  require_same_sequence(from, to);
  A2D_REQUIRE(bytes_per_token >= 0, "bytes per token must be >= 0 (got ", bytes_per_token, ")");
  Traffic t;
  if (bytes_per_token == 0) return t;
  for (int64_t q = 0; q < from.parts(); ++q) {
    if (q == part) continue;
    const int64_t tokens = shared_tokens(from, part, to, q);
    if (tokens == 0) continue;
    t.bytes += tokens * bytes_per_token;
    ++t.messages;
  }
  return t;
}

ExchangeRecord exchange_record(std::span<const ExchangeField> fields) {
  ExchangeRecord record;
  record.offsets.assign(fields.size(), 0);
  std::vector<size_t> order(fields.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_bytes(fields[a].dtype) > dtype_bytes(fields[b].dtype);
  });
  int64_t widest = 1;
  for (const size_t i : order) {
    A2D_REQUIRE(fields[i].elements >= 0, "a record field of ", fields[i].elements, " elements");
    // Larger elements come first, so every offset is already a multiple of this element size.
    record.offsets[i] = record.bytes;
    record.bytes += fields[i].elements * dtype_bytes(fields[i].dtype);
    widest = std::max(widest, dtype_bytes(fields[i].dtype));
  }
  record.bytes = (record.bytes + widest - 1) / widest * widest;
  return record;
}

}  // namespace a2d
