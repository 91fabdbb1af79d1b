// The problem (problem.hpp): document lengths, shapes, the visible-pair count shared by the
// kernels, the reference and the tools, and Problem's checks (the mask itself: mask.cpp).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/problem.hpp"

namespace a2d {

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
  if (!mask.hides_pairs()) return q_tokens * kv_tokens;
  std::vector<int64_t> keys(static_cast<size_t>(kv_tokens));
  for (int64_t j = 0; j < kv_tokens; ++j)
    keys[j] = kv_positions ? kv_positions[j] : j;
  std::sort(keys.begin(), keys.end());
  const auto in = [&](int64_t first, int64_t last) {  // keys with positions in [first, last]
    if (last < first) return int64_t{0};
    return static_cast<int64_t>(std::upper_bound(keys.begin(), keys.end(), last) -
                                std::lower_bound(keys.begin(), keys.end(), first));
  };
  const MaskView view = mask.view();
  int64_t pairs = 0;
  for (int64_t i = 0; i < q_tokens; ++i) {
    const int64_t q = q_positions ? q_positions[i] : i;
    const MaskRow row = view.row(q);
    if (!row.pieces) {
      pairs += in(row.first, row.last);
      continue;
    }
    for (int64_t p = 0; p < row.count; ++p) {  // one interval per slice the row meets
      const MaskPiece& piece = row.pieces[p];
      pairs += in(std::max(piece.k0, q + piece.lo), std::min(piece.k1 - 1, q + piece.hi));
    }
  }
  return pairs;
}

float Problem::softmax_scale() const {
  return scale > 0 ? scale : default_scale(head_dim);
}

void Problem::validate() const {
  A2D_REQUIRE(seq >= 1, "the sequence length must be at least 1 (got ", seq, ")");
  local_shape(seq, seq).validate();
  // Upper limits keep every buffer size and index far from 64-bit overflow.
  A2D_REQUIRE(seq <= (int64_t{1} << 40), "the sequence length ", seq, " exceeds 2^40 tokens");
  A2D_REQUIRE(head_dim <= 4096, "head_dim ", head_dim, " exceeds 4096, the largest supported");
  A2D_REQUIRE(batch <= (1 << 20) && heads <= (1 << 20), "batch (", batch, ") and heads (", heads,
              ") must each be at most 2^20");
  const double elements = static_cast<double>(batch) * static_cast<double>(seq) *
                          static_cast<double>(heads) * static_cast<double>(head_dim);
  A2D_REQUIRE(elements <= 0x1p56, "Q would hold ", elements,
              " elements; at most 2^56 are "
              "supported");
  mask.validate(seq);
  A2D_REQUIRE(std::isfinite(softcap) && softcap >= 0,
              "the softcap must be positive (or 0 for none); got ", softcap);
  A2D_REQUIRE(std::isfinite(scale) && scale >= 0,
              "the softmax scale must be positive (or 0 for 1/sqrt(head_dim)); got ", scale);
}

std::string Problem::describe() const {
  std::ostringstream out;
  out << "batch=" << batch << " heads=" << heads << " kv_heads=" << kv_heads << " seq=" << seq
      << " head_dim=" << head_dim << " mask=" << mask.describe() << " scale=" << softmax_scale()
      << " dtype=" << dtype_name(dtype);
  if (sinks) out << " sinks=yes";
  if (softcap > 0) out << " softcap=" << softcap;
  return out.str();
}

AttentionShape Problem::local_shape(int64_t q_tokens, int64_t kv_tokens) const {
  return {batch, heads, kv_heads, q_tokens, kv_tokens, head_dim};
}

}  // namespace a2d
