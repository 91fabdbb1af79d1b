// Masks, shapes and the visible-pair count shared by the kernels, the reference and the tools.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"

namespace a2d {

void Mask::validate() const {
  if (kind == MaskKind::causal_window) {
    A2D_REQUIRE(window >= 1, "the causal window must be at least 1 token (got ", window,
                "); use --window W with W >= 1, or drop --window for a plain causal mask");
  }
  if (doc_offsets) {
    const auto& offsets = *doc_offsets;
    A2D_REQUIRE(offsets.size() >= 2 && offsets.front() == 0,
                "the document offsets must start at 0 and name at least one document");
    for (size_t d = 0; d + 1 < offsets.size(); ++d) {
      A2D_REQUIRE(offsets[d + 1] > offsets[d], "document ", d, " has length ",
                  offsets[d + 1] - offsets[d], "; every document needs at least 1 token");
    }
  }
}

void Mask::validate(int64_t seq) const {
  validate();
  if (doc_offsets) {
    A2D_REQUIRE(document_tokens() == seq, "the ", documents(), " document lengths sum to ",
                document_tokens(), " tokens, but the sequence has ", seq,
                "; --doc-lens must sum to --seq");
  }
}

Mask Mask::with_documents(const std::vector<int64_t>& lengths) const {
  auto offsets = std::make_shared<std::vector<int64_t>>(1, 0);
  offsets->reserve(lengths.size() + 1);
  for (const int64_t length : lengths) {
    A2D_REQUIRE(length >= 1, "document ", offsets->size() - 1, " has length ", length,
                "; every document needs at least 1 token");
    offsets->push_back(offsets->back() + length);
  }
  A2D_REQUIRE(!lengths.empty(), "at least one document length is needed");
  Mask mask = *this;
  mask.doc_offsets = std::move(offsets);
  return mask;
}

std::vector<int64_t> parse_document_lengths(const std::string& text, int64_t seq) {
  for (const std::string kind : {"skewed", "heavy"}) {
    if (text == kind || text.rfind(kind + ":", 0) == 0) {
      uint64_t seed = 1;
      if (text.size() > kind.size()) {
        const std::string digits = text.substr(kind.size() + 1);
        A2D_REQUIRE(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
                    "the seed in '", text, "' is not a number");
        seed = std::stoull(digits);
      }
      return generated_document_lengths(kind, seq, seed);
    }
  }
  std::string list = text;
  if (!text.empty() && text[0] == '@') {
    std::ifstream file(text.substr(1));
    A2D_REQUIRE(file.good(), "cannot read the document lengths file '", text.substr(1), "'");
    std::ostringstream content;
    content << file.rdbuf();
    list = content.str();
  }
  for (char& c : list)
    if (c == ',' || c == '\n' || c == '\r' || c == '\t') c = ' ';
  std::istringstream in(list);
  std::vector<int64_t> lengths;
  std::string entry;
  while (in >> entry) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(entry, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    A2D_REQUIRE(used == entry.size() && value >= 1, "document length '", entry,
                "' is not a positive integer (--doc-lens 100,3000,17 or --doc-lens @file)");
    lengths.push_back(value);
  }
  A2D_REQUIRE(!lengths.empty(), "no document lengths in '", text, "'");
  return lengths;
}

std::vector<int64_t> generated_document_lengths(const std::string& kind, int64_t seq,
                                                uint64_t seed) {
  A2D_REQUIRE(seq >= 1, "the sequence must have at least 1 token (got ", seq, ")");
  std::mt19937_64 random(seed);
  std::vector<int64_t> lengths;
  int64_t left = seq;
  if (kind == "skewed") {
    const int64_t big = std::max<int64_t>(1, seq / 2);
    // The long document in the middle of the sequence, short ones around it.
    std::uniform_int_distribution<int64_t> short_length(1, 64);
    int64_t before = (seq - big) / 2;
    while (before > 0) {
      const int64_t length = std::min(before, short_length(random));
      lengths.push_back(length);
      before -= length;
      left -= length;
    }
    lengths.push_back(big);
    left -= big;
    while (left > 0) {
      const int64_t length = std::min(left, short_length(random));
      lengths.push_back(length);
      left -= length;
    }
    return lengths;
  }
  A2D_REQUIRE(kind == "heavy", "unknown document mix '", kind, "' (skewed or heavy)");
  // Pareto lengths: x_min / u^(1 / alpha), x_min 8 tokens, alpha 1.2 (a heavy tail).
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  while (left > 0) {
    const double u = std::max(1e-12, 1.0 - uniform(random));
    const double length = 8.0 / std::pow(u, 1.0 / 1.2);
    const int64_t tokens =
        std::min<int64_t>(left, std::max<int64_t>(1, std::llround(std::min(length, 1e15))));
    lengths.push_back(tokens);
    left -= tokens;
  }
  return lengths;
}

namespace {
std::string position_mask_text(const Mask& mask) {
  switch (mask.kind) {
    case MaskKind::none:
      return "none";
    case MaskKind::causal:
      return "causal";
    case MaskKind::causal_window:
      return "causal-window(" + std::to_string(mask.window) + ")";
  }
  return "?";
}
}  // namespace

std::string Mask::describe() const {
  std::string text = position_mask_text(*this);
  if (doc_offsets) text += "+documents(" + std::to_string(documents()) + ")";
  return text;
}

namespace {
BlockVisibility classify_by_position(const Mask& mask, int64_t q_min, int64_t q_max, int64_t k_min,
                                     int64_t k_max) {
  switch (mask.kind) {
    case MaskKind::none:
      return BlockVisibility::full;
    case MaskKind::causal:
      if (k_min > q_max) return BlockVisibility::hidden;
      if (k_max <= q_min) return BlockVisibility::full;
      return BlockVisibility::partial;
    case MaskKind::causal_window:
      // Visible iff q - window < k <= q.
      if (k_min > q_max || k_max <= q_min - mask.window) return BlockVisibility::hidden;
      if (k_max <= q_min && k_min > q_max - mask.window) return BlockVisibility::full;
      return BlockVisibility::partial;
  }
  return BlockVisibility::partial;
}
}  // namespace

// With documents: hidden when the documents of the query range and of the key range do not meet
// (a query's document range is [document_of(q_min), document_of(q_max)], whatever positions lie
// between); full only when all of them are one document and the position test is full.
BlockVisibility classify_block(const Mask& mask, int64_t q_min, int64_t q_max, int64_t k_min,
                               int64_t k_max) {
  const BlockVisibility by_position = classify_by_position(mask, q_min, q_max, k_min, k_max);
  if (!mask.doc_offsets || by_position == BlockVisibility::hidden) return by_position;
  const int64_t q_first = mask.document_of(q_min), q_last = mask.document_of(q_max);
  const int64_t k_first = mask.document_of(k_min), k_last = mask.document_of(k_max);
  if (q_last < k_first || k_last < q_first) return BlockVisibility::hidden;
  if (by_position == BlockVisibility::full && q_first == q_last && k_first == k_last &&
      q_first == k_first) {
    return BlockVisibility::full;
  }
  return BlockVisibility::partial;
}

void AttentionShape::validate() const {
  A2D_REQUIRE(batch >= 1, "batch must be at least 1 (got ", batch, ")");
  A2D_REQUIRE(heads >= 1, "heads must be at least 1 (got ", heads, ")");
  A2D_REQUIRE(kv_heads >= 1, "kv_heads must be at least 1 (got ", kv_heads, ")");
  A2D_REQUIRE(heads % kv_heads == 0, "heads (", heads, ") must be a multiple of kv_heads (",
              kv_heads, "): each K/V head serves heads / kv_heads query heads");
  A2D_REQUIRE(head_dim >= 1, "head_dim must be at least 1 (got ", head_dim, ")");
  A2D_REQUIRE(q_tokens >= 0 && kv_tokens >= 0,
              "token counts must not be negative (got q_tokens=", q_tokens,
              ", kv_tokens=", kv_tokens, ")");
}

std::string AttentionShape::describe() const {
  std::ostringstream out;
  out << "batch=" << batch << " heads=" << heads << " kv_heads=" << kv_heads
      << " q_tokens=" << q_tokens << " kv_tokens=" << kv_tokens << " head_dim=" << head_dim;
  return out.str();
}

float default_scale(int64_t head_dim) {
  A2D_REQUIRE(head_dim >= 1, "head_dim must be at least 1 (got ", head_dim, ")");
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

int64_t count_visible_pairs(const Mask& mask, const int64_t* q_positions, int64_t q_tokens,
                            const int64_t* kv_positions, int64_t kv_tokens) {
  if (mask.kind == MaskKind::none && !mask.doc_offsets) return q_tokens * kv_tokens;
  std::vector<int64_t> keys(static_cast<size_t>(kv_tokens));
  for (int64_t j = 0; j < kv_tokens; ++j)
    keys[j] = kv_positions ? kv_positions[j] : j;
  std::sort(keys.begin(), keys.end());
  int64_t pairs = 0;
  for (int64_t i = 0; i < q_tokens; ++i) {
    const int64_t q = q_positions ? q_positions[i] : i;
    // Keys with position <= q (causal) or in q's document ...
    int64_t last = mask.kind == MaskKind::none ? std::numeric_limits<int64_t>::max() : q;
    if (mask.doc_offsets) last = std::min(last, mask.document_last(q));
    const auto upper = std::upper_bound(keys.begin(), keys.end(), last);
    auto lower = keys.begin();
    // ... and, with a window, position > q - window; with documents, in q's document.
    if (mask.kind == MaskKind::causal_window) {
      lower = std::upper_bound(keys.begin(), keys.end(), q - mask.window);
    }
    if (mask.doc_offsets) {
      lower = std::max(lower, std::lower_bound(keys.begin(), keys.end(), mask.document_first(q)));
    }
    if (upper > lower) pairs += upper - lower;
  }
  return pairs;
}

}  // namespace a2d
