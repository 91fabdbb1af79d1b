#include "attention2d/layout.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>

#include "attention2d/error.hpp"
#include "core/enum_names.hpp"

namespace a2d {

constexpr EnumName<LayoutKind> kLayoutNames[] = {{LayoutKind::cyclic, "cyclic"},
                                                 {LayoutKind::striped, "striped"},
                                                 {LayoutKind::contiguous, "contiguous"},
                                                 {LayoutKind::zigzag, "zigzag"}};

LayoutKind parse_layout(const std::string& name) {
  return parse_enum(kLayoutNames, name, "layout");
}

std::string layout_name(LayoutKind kind) {
  return enum_name(kLayoutNames, kind);
}

TokenLayout::TokenLayout(LayoutKind kind, int64_t tokens, int64_t parts, int64_t stripe)
    : kind_(kind),
      tokens_(tokens),
      parts_(parts),
      stripe_(kind == LayoutKind::cyclic ? 1 : stripe) {
  // The limits keep every intermediate product (stripe * parts, chunk offsets) far from
  // overflowing 64 bits.
  A2D_REQUIRE(tokens >= 0 && tokens <= (int64_t{1} << 50),
              "a layout needs between 0 and 2^50 "
              "tokens (got ",
              tokens, ")");
  A2D_REQUIRE(parts >= 1 && parts <= (int64_t{1} << 30),
              "a layout needs between 1 and 2^30 "
              "parts (got ",
              parts, ")");
  A2D_REQUIRE(stripe_ >= 1 && stripe_ <= (int64_t{1} << 30),
              "the stripe width must be between 1 "
              "and 2^30 (got ",
              stripe, ")");
}

TokenLayout TokenLayout::contiguous_counts(std::vector<int64_t> counts) {
  A2D_REQUIRE(!counts.empty(), "contiguous_counts needs a count for at least one part");
  A2D_REQUIRE(static_cast<int64_t>(counts.size()) <= (int64_t{1} << 30),
              "a layout needs between 1 and 2^30 parts (got ", counts.size(), ")");
  int64_t total = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    A2D_REQUIRE(counts[p] >= 0, "part ", p, " of a contiguous layout has ", counts[p],
                " tokens; counts must be >= 0");
    A2D_REQUIRE(counts[p] <= (int64_t{1} << 50) - total,
                "a layout needs between 0 and 2^50 tokens (the counts sum to more)");
    total += counts[p];
  }
  const int64_t parts = static_cast<int64_t>(counts.size());
  TokenLayout layout(LayoutKind::contiguous, total, parts);
  bool even = true;
  for (int64_t p = 0; p < parts && even; ++p)
    even = counts[static_cast<size_t>(p)] == layout.count(p);
  if (even) return layout;  // the even split: the plain layout, without a table
  auto offsets = std::make_shared<std::vector<int64_t>>(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets->begin() + 1);
  layout.offsets_ = std::move(offsets);
  return layout;
}

TokenLayout TokenLayout::permuted(std::vector<int64_t> slots) const {
  A2D_REQUIRE(!slots_, "the layout ", describe(), " is permuted already");
  A2D_REQUIRE(static_cast<int64_t>(slots.size()) == parts_, "a permutation of ", parts_,
              " parts needs ", parts_, " slots (got ", slots.size(), ")");
  auto parts_of = std::make_shared<std::vector<int64_t>>(slots.size(), -1);
  bool identity = true;
  for (size_t p = 0; p < slots.size(); ++p) {
    const int64_t s = slots[p];
    A2D_REQUIRE(s >= 0 && s < parts_ && (*parts_of)[static_cast<size_t>(s)] < 0,
                "the slots of a permuted layout must be a permutation of 0..", parts_ - 1,
                " (slot ", s, " of part ", p, ")");
    (*parts_of)[static_cast<size_t>(s)] = static_cast<int64_t>(p);
    identity = identity && s == static_cast<int64_t>(p);
  }
  TokenLayout layout = *this;
  if (identity) return layout;
  layout.slots_ = std::make_shared<const std::vector<int64_t>>(std::move(slots));
  layout.parts_of_slots_ = std::move(parts_of);
  return layout;
}

bool TokenLayout::operator==(const TokenLayout& other) const {
  if (kind_ != other.kind_ || tokens_ != other.tokens_ || parts_ != other.parts_ ||
      stripe_ != other.stripe_ || uneven() != other.uneven() ||
      is_permuted() != other.is_permuted()) {
    return false;
  }
  return (!uneven() || *offsets_ == *other.offsets_) &&
         (!is_permuted() || *slots_ == *other.slots_);
}

void TokenLayout::require_part(int64_t part) const {
  A2D_REQUIRE(part >= 0 && part < parts_, "part ", part, " is outside 0..", parts_ - 1);
}

int64_t TokenLayout::chunk_begin(int64_t chunk) const {
  const int64_t chunks = 2 * parts_;
  const int64_t base = tokens_ / chunks, extra = tokens_ % chunks;
  return chunk * base + std::min(chunk, extra);
}

int64_t TokenLayout::chunk_size(int64_t chunk) const {
  const int64_t chunks = 2 * parts_;
  return tokens_ / chunks + (chunk < tokens_ % chunks ? 1 : 0);
}

int64_t TokenLayout::count(int64_t part) const {
  require_part(part);
  return slot_count(slot(part));
}

int64_t TokenLayout::slot_count(int64_t part) const {
  switch (kind_) {
    case LayoutKind::cyclic:
    case LayoutKind::striped: {
      const int64_t round = stripe_ * parts_;
      const int64_t full = tokens_ / round, rest = tokens_ % round;
      return full * stripe_ + std::clamp<int64_t>(rest - part * stripe_, 0, stripe_);
    }
    case LayoutKind::contiguous:
      if (offsets_) return (*offsets_)[part + 1] - (*offsets_)[part];
      return tokens_ / parts_ + (part < tokens_ % parts_ ? 1 : 0);
    case LayoutKind::zigzag:
      return chunk_size(part) + chunk_size(2 * parts_ - 1 - part);
  }
  return 0;
}

int64_t TokenLayout::max_count() const {
  int64_t best = 0;
  for (int64_t p = 0; p < parts_; ++p)
    best = std::max(best, count(p));
  return best;
}

int64_t TokenLayout::token_at(int64_t part, int64_t index) const {
  return slot_token_at(slot(part), index);
}

int64_t TokenLayout::slot_token_at(int64_t part, int64_t index) const {
  switch (kind_) {
    case LayoutKind::cyclic:
    case LayoutKind::striped:
      return (index / stripe_) * stripe_ * parts_ + part * stripe_ + index % stripe_;
    case LayoutKind::contiguous: {
      if (offsets_) return (*offsets_)[part] + index;
      const int64_t base = tokens_ / parts_, extra = tokens_ % parts_;
      return part * base + std::min(part, extra) + index;
    }
    case LayoutKind::zigzag: {
      const int64_t first = chunk_size(part);
      return index < first ? chunk_begin(part) + index
                           : chunk_begin(2 * parts_ - 1 - part) + (index - first);
    }
  }
  return -1;
}

std::vector<int64_t> TokenLayout::tokens_of(int64_t part) const {
  const int64_t n = count(part), s = slot(part);
  std::vector<int64_t> list(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    list[i] = slot_token_at(s, i);
  return list;
}

TokenLayout::Owner TokenLayout::owner(int64_t token) const {
  A2D_REQUIRE(token >= 0 && token < tokens_, "token ", token, " is outside 0..", tokens_ - 1);
  Owner found = slot_owner(token);
  if (parts_of_slots_) found.part = (*parts_of_slots_)[static_cast<size_t>(found.part)];
  return found;
}

TokenLayout::Owner TokenLayout::slot_owner(int64_t token) const {
  switch (kind_) {
    case LayoutKind::cyclic:
    case LayoutKind::striped: {
      const int64_t stripe_index = token / stripe_;
      return {stripe_index % parts_, (stripe_index / parts_) * stripe_ + token % stripe_};
    }
    case LayoutKind::contiguous: {
      if (offsets_) {
        // The last part starting at or before the token (parts without tokens start where the
        // next one does, so they are never the last).
        const auto after = std::upper_bound(offsets_->begin(), offsets_->end(), token);
        const int64_t part = (after - offsets_->begin()) - 1;
        return {part, token - (*offsets_)[part]};
      }
      const int64_t base = tokens_ / parts_, extra = tokens_ % parts_;
      // The first `extra` parts own base + 1 tokens.
      const int64_t boundary = extra * (base + 1);
      if (token < boundary) return {token / (base + 1), token % (base + 1)};
      return {extra + (token - boundary) / base, (token - boundary) % base};
    }
    case LayoutKind::zigzag: {
      const int64_t chunks = 2 * parts_;
      const int64_t base = tokens_ / chunks, extra = tokens_ % chunks;
      const int64_t boundary = extra * (base + 1);
      const int64_t chunk =
          token < boundary ? token / (base + 1) : extra + (token - boundary) / base;
      const int64_t offset = token - chunk_begin(chunk);
      if (chunk < parts_) return {chunk, offset};
      const int64_t part = chunks - 1 - chunk;
      return {part, chunk_size(part) + offset};
    }
  }
  return {-1, -1};
}

TokenLayout::Intervals TokenLayout::intervals(int64_t part) const {
  require_part(part);
  return slot_intervals(slot(part));
}

TokenLayout::Intervals TokenLayout::slot_intervals(int64_t part) const {
  switch (kind_) {
    case LayoutKind::contiguous: {
      const int64_t count = slot_count(part);
      const int64_t begin = count > 0 ? slot_token_at(part, 0) : 0;
      return {{{begin, begin + count}, {}}, 1};
    }
    case LayoutKind::zigzag: {
      const int64_t last = 2 * parts_ - 1 - part;
      return {{{chunk_begin(part), chunk_begin(part) + chunk_size(part)},
               {chunk_begin(last), chunk_begin(last) + chunk_size(last)}},
              2};
    }
    case LayoutKind::cyclic:
    case LayoutKind::striped:
      break;
  }
  A2D_FAIL("the ", layout_name(kind_), " layout deals stripes: it has no intervals");
}

int64_t TokenLayout::count_below(int64_t part, int64_t token) const {
  require_part(part);
  A2D_REQUIRE(token >= 0 && token <= tokens_, "token ", token, " is outside 0..", tokens_);
  const int64_t s = slot(part);
  if (periodic()) {
    const int64_t round = stripe_ * parts_;
    return token / round * stripe_ + std::clamp<int64_t>(token % round - s * stripe_, 0, stripe_);
  }
  int64_t below = 0;
  for (const Interval& run : slot_intervals(s))
    below += std::clamp<int64_t>(token - run.begin, 0, run.end - run.begin);
  return below;
}

std::string TokenLayout::describe() const {
  std::string text = layout_name(kind_);
  if (kind_ == LayoutKind::striped) text += "(" + std::to_string(stripe_) + ")";
  if (offsets_) {
    // The counts, the first 16 of them where there are more.
    text += "(";
    for (int64_t p = 0; p < std::min<int64_t>(parts_, 16); ++p)
      text += (p ? "," : "") + std::to_string(slot_count(p));
    text += parts_ > 16 ? ",...)" : ")";
  }
  if (slots_) {
    // Which part of the plain layout each part is, the first 16 where there are more.
    text += " in part order [";
    for (int64_t p = 0; p < std::min<int64_t>(parts_, 16); ++p)
      text += (p ? "," : "") + std::to_string(slot(p));
    text += parts_ > 16 ? ",...]" : "]";
  }
  return text + " over " + std::to_string(parts_) + " parts, " + std::to_string(tokens_) +
         " tokens";
}

}  // namespace a2d
