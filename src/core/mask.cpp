// The mask's host side (mask.hpp): building and checking it, its range index, the answers the
// library asks of it, and the one parser of mask specifications the front ends share.
#include "attention2d/mask.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "attention2d/error.hpp"

namespace a2d {
namespace {

constexpr int64_t U = kMaskUnbounded;
// The range index holds at most this many pieces (slices cut at every other slice's q0 and q1):
// 2^21 pieces are 96 MiB.
constexpr int64_t kMaxPieces = int64_t{1} << 21;

uint64_t fnv(uint64_t hash, int64_t value) {
  return (hash ^ static_cast<uint64_t>(value)) * 1099511628211ull;
}
constexpr uint64_t kFnvStart = 14695981039346656037ull;

std::string slice_text(const MaskSlice& s) {
  std::ostringstream out;
  out << "[" << s.q0 << ", " << s.q1 << ") x [" << s.k0 << ", " << s.k1 << ") "
      << range_type_name(s.type);
  return out.str();
}

// The band of the position rule.
void band_of(const Mask& mask, int64_t& lo, int64_t& hi) {
  lo = -U, hi = U;
  switch (mask.kind) {
    case MaskKind::none:
    case MaskKind::ranges:
      break;
    case MaskKind::causal:
      hi = 0;
      break;
    case MaskKind::causal_window:
      lo = -(mask.window - 1), hi = 0;
      break;
    case MaskKind::window:
      lo = mask.left < 0 ? -U : -mask.left;
      hi = mask.right < 0 ? U : mask.right;
      break;
  }
}

// The index of MaskView from sorted, non-empty slices; throws naming two slices that overlap.
std::shared_ptr<const MaskRanges> build_ranges(std::vector<MaskSlice> slices) {
  auto out = std::make_shared<MaskRanges>();
  std::vector<int64_t> bounds;
  for (const MaskSlice& s : slices) {
    bounds.push_back(s.q0);
    bounds.push_back(s.q1);
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  const int64_t segments = bounds.empty() ? 0 : static_cast<int64_t>(bounds.size()) - 1;
  const auto segment_at = [&](int64_t q) {
    return std::lower_bound(bounds.begin(), bounds.end(), q) - bounds.begin();
  };
  // Pieces per run: the slice index, cut to the run's rows.
  int64_t total = 0;
  for (const MaskSlice& s : slices)
    total += segment_at(s.q1) - segment_at(s.q0);
  A2D_REQUIRE(total <= kMaxPieces, "the ", slices.size(), " mask slices cut into ", total,
              " pieces (one per slice and run of query rows between slice edges), more than ",
              kMaxPieces, ": merge slices that share their query rows");
  std::vector<std::vector<int64_t>> runs(static_cast<size_t>(segments));
  for (size_t i = 0; i < slices.size(); ++i) {
    for (int64_t s = segment_at(slices[i].q0); s < segment_at(slices[i].q1); ++s)
      runs[static_cast<size_t>(s)].push_back(static_cast<int64_t>(i));
  }
  std::vector<int64_t>& index = out->index;
  index.reserve(static_cast<size_t>(2 * (segments + 1) + 6 * total));
  index.insert(index.end(), bounds.begin(), bounds.end());
  if (bounds.empty()) index.clear();
  int64_t first = 0;
  std::vector<int64_t> firsts{0};
  for (std::vector<int64_t>& run : runs) {
    std::sort(run.begin(), run.end(), [&](int64_t a, int64_t b) {
      return slices[static_cast<size_t>(a)].k0 < slices[static_cast<size_t>(b)].k0;
    });
    for (size_t j = 0; j + 1 < run.size(); ++j) {
      const MaskSlice& a = slices[static_cast<size_t>(run[j])];
      const MaskSlice& b = slices[static_cast<size_t>(run[j + 1])];
      A2D_REQUIRE(a.k1 <= b.k0, "mask slices ", slice_text(a), " and ", slice_text(b),
                  " overlap; slices must not share a (query, key) pair");
    }
    first += static_cast<int64_t>(run.size());
    firsts.push_back(first);
  }
  if (segments > 0) index.insert(index.end(), firsts.begin(), firsts.end());
  for (int64_t s = 0; s < segments; ++s) {
    for (const int64_t i : runs[static_cast<size_t>(s)]) {
      const MaskPiece p = slice_piece(slices[static_cast<size_t>(i)]);
      index.insert(index.end(), {bounds[static_cast<size_t>(s)], bounds[static_cast<size_t>(s) + 1],
                                 p.k0, p.k1, p.lo, p.hi});
    }
  }
  out->segments = segments;
  uint64_t digest = fnv(kFnvStart, static_cast<int64_t>(slices.size()));
  for (const MaskSlice& s : slices) {
    for (const int64_t v : {s.q0, s.q1, s.k0, s.k1, static_cast<int64_t>(s.type)})
      digest = fnv(digest, v);
  }
  out->digest = digest;
  out->slices = std::move(slices);
  return out;
}

int64_t parse_integer(const std::string& text, const std::string& what) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  A2D_REQUIRE(!text.empty() && used == text.size(), what, ": '", text, "' is not an integer");
  return value;
}

// "B" tokens or "F%" of seq.
int64_t tokens_or_percent(const std::string& text, int64_t seq, const std::string& what) {
  if (!text.empty() && text.back() == '%') {
    const std::string number = text.substr(0, text.size() - 1);
    double percent = 0;
    size_t used = 0;
    try {
      percent = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    A2D_REQUIRE(!number.empty() && used == number.size() && percent >= 0 && percent <= 100, what,
                ": '", text, "' is not a percentage between 0% and 100%");
    return std::llround(percent / 100.0 * static_cast<double>(seq));
  }
  return parse_integer(text, what);
}

}  // namespace

MaskPiece slice_piece(const MaskSlice& s) {
  MaskPiece p{s.q0, s.q1, s.k0, s.k1, -U, U};
  // Local i = q - q0, j = k - k0: causal j <= i + sk - sq is k - q <= k1 - q1; inv_causal j >= i
  // is k - q >= k0 - q0.
  if (s.type == RangeType::causal || s.type == RangeType::bi_causal) p.hi = s.k1 - s.q1;
  if (s.type == RangeType::inv_causal || s.type == RangeType::bi_causal) p.lo = s.k0 - s.q0;
  return p;
}

Mask Mask::window_size(int64_t left, int64_t right) {
  A2D_REQUIRE(left >= -1 && right >= -1, "a window's sides must be -1 (unbounded) or >= 0, got (",
              left, ", ", right, ")");
  if (left == -1 && right == -1) return none();
  if (right == 0) return left == -1 ? causal() : causal_window(left + 1);
  Mask m;
  m.kind = MaskKind::window;
  m.left = left;
  m.right = right;
  return m;
}

Mask Mask::from_ranges(std::vector<MaskSlice> slices) {
  for (size_t i = 0; i < slices.size(); ++i) {
    const MaskSlice& s = slices[i];
    const int type = static_cast<int>(s.type);
    A2D_REQUIRE(type >= 0 && type <= 3, "mask slice ", i, ": unknown type ", type,
                " (0 full, 1 causal, 2 inv-causal, 3 bi-causal)");
    A2D_REQUIRE(s.q0 >= 0 && s.k0 >= 0 && s.q1 >= s.q0 && s.k1 >= s.k0, "mask slice ", i, " ",
                slice_text(s), " is malformed: each range needs 0 <= start <= end");
    A2D_REQUIRE(s.q1 < U && s.k1 < U, "mask slice ", i, " ", slice_text(s), " is out of range");
  }
  slices.erase(std::remove_if(slices.begin(), slices.end(),
                              [](const MaskSlice& s) { return s.q0 == s.q1 || s.k0 == s.k1; }),
               slices.end());
  std::sort(slices.begin(), slices.end(), [](const MaskSlice& a, const MaskSlice& b) {
    return a.q0 != b.q0 ? a.q0 < b.q0 : a.k0 < b.k0;
  });
  Mask m;
  m.kind = MaskKind::ranges;
  m.ranges = build_ranges(std::move(slices));
  return m;
}

Mask Mask::with_documents(const std::vector<int64_t>& lengths) const {
  A2D_REQUIRE(kind != MaskKind::ranges,
              "a range mask cannot take packed documents as well: give each document its own "
              "slices instead (--mask-ranges, not beside --doc-lens)");
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

MaskView Mask::view() const {
  MaskView v;
  v.kind = kind;
  band_of(*this, v.lo, v.hi);
  if (doc_offsets) {
    v.doc_offsets = doc_offsets->data();
    v.documents = static_cast<int64_t>(doc_offsets->size()) - 1;
  }
  if (ranges && !ranges->index.empty()) {
    v.ranges = ranges->index.data();
    v.segments = ranges->segments;
  }
  return v;
}

int64_t Mask::window_left() const {
  switch (kind) {
    case MaskKind::causal_window:
      return window - 1;
    case MaskKind::window:
      return left;
    default:
      return -1;
  }
}

int64_t Mask::window_right() const {
  switch (kind) {
    case MaskKind::causal:
    case MaskKind::causal_window:
      return 0;
    case MaskKind::window:
      return right;
    default:
      return -1;
  }
}

MaskBalance Mask::balance() const {
  if (doc_offsets || kind == MaskKind::ranges) return MaskBalance::interleaved;
  switch (kind) {
    case MaskKind::none:
      return MaskBalance::any;
    case MaskKind::window:
      // Bounded on both sides every row sees about left + right + 1 keys; unbounded on one side
      // the work grows (or shrinks) along the sequence, as under a causal mask.
      return left >= 0 && right >= 0 ? MaskBalance::any : MaskBalance::mirrored;
    default:
      return MaskBalance::mirrored;
  }
}

const char* mask_kind_name(MaskKind kind) {
  switch (kind) {
    case MaskKind::none:
      return "none";
    case MaskKind::causal:
      return "causal";
    case MaskKind::causal_window:
      return "causal-window";
    case MaskKind::window:
      return "window";
    case MaskKind::ranges:
      return "ranges";
  }
  return "unknown";
}

bool Mask::extends_causally() const {
  return !doc_offsets && (kind == MaskKind::causal || kind == MaskKind::causal_window);
}

std::vector<MaskPiece> Mask::pieces(int64_t seq) const {
  std::vector<MaskPiece> out;
  if (kind == MaskKind::ranges) {
    if (ranges) {
      for (const MaskSlice& s : ranges->slices)
        out.push_back(slice_piece(s));
    }
    return out;
  }
  int64_t lo = -U, hi = U;
  band_of(*this, lo, hi);
  if (!doc_offsets) {
    out.push_back({0, seq, 0, seq, lo, hi});
    return out;
  }
  const std::vector<int64_t>& offsets = *doc_offsets;
  for (size_t d = 0; d + 1 < offsets.size(); ++d)
    out.push_back({offsets[d], offsets[d + 1], offsets[d], offsets[d + 1], lo, hi});
  return out;
}

void Mask::validate() const {
  switch (kind) {
    case MaskKind::none:
    case MaskKind::causal:
      break;
    case MaskKind::causal_window:
      A2D_REQUIRE(window >= 1, "the causal window must be at least 1 token (got ", window,
                  "); use --window W with W >= 1, or drop --window for a plain causal mask");
      break;
    case MaskKind::window:
      A2D_REQUIRE(left >= -1 && right >= -1 && (left >= 0 || right >= 0) && right != 0,
                  "a window (left, right) needs each side -1 (unbounded) or >= 0, one side "
                  "bounded, and a right side other than 0 (that is the causal window); got (",
                  left, ", ", right, ")");
      break;
    case MaskKind::ranges:
      A2D_REQUIRE(ranges != nullptr, "a range mask needs its slices (Mask::from_ranges)");
      A2D_REQUIRE(!doc_offsets, "a range mask cannot take packed documents as well");
      break;
    default:
      A2D_FAIL("unknown mask kind ", static_cast<int>(kind));
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
  if (ranges) {
    for (const MaskSlice& s : ranges->slices) {
      A2D_REQUIRE(s.q1 <= seq && s.k1 <= seq, "mask slice ", slice_text(s),
                  " lies outside the sequence of ", seq, " tokens (positions 0 to ", seq - 1, ")");
    }
  }
}

std::string Mask::describe() const {
  std::string text;
  switch (kind) {
    case MaskKind::none:
      text = "none";
      break;
    case MaskKind::causal:
      text = "causal";
      break;
    case MaskKind::causal_window:
      text = "causal-window(" + std::to_string(window) + ")";
      break;
    case MaskKind::window:
      text = "window(" + std::to_string(left) + "," + std::to_string(right) + ")";
      break;
    case MaskKind::ranges:
      text = "ranges(" + std::to_string(slices()) + ")";
      break;
  }
  if (doc_offsets) text += "+documents(" + std::to_string(documents()) + ")";
  return text;
}

int64_t Mask::digest() const {
  if (!doc_offsets && !ranges) return 0;
  uint64_t hash = kFnvStart;
  if (doc_offsets) {
    for (const int64_t offset : *doc_offsets)
      hash = fnv(hash, offset);
  }
  if (ranges) hash = fnv(hash, static_cast<int64_t>(ranges->digest));
  return static_cast<int64_t>(hash >> 1);
}

RangeType parse_range_type(const std::string& name) {
  static const std::map<std::string, RangeType> names = {{"full", RangeType::full},
                                                         {"0", RangeType::full},
                                                         {"causal", RangeType::causal},
                                                         {"1", RangeType::causal},
                                                         {"inv-causal", RangeType::inv_causal},
                                                         {"inv_causal", RangeType::inv_causal},
                                                         {"2", RangeType::inv_causal},
                                                         {"bi-causal", RangeType::bi_causal},
                                                         {"bi_causal", RangeType::bi_causal},
                                                         {"3", RangeType::bi_causal}};
  const auto it = names.find(name);
  A2D_REQUIRE(it != names.end(), "unknown slice type '", name,
              "': full, causal, inv-causal or bi-causal (or 0, 1, 2, 3)");
  return it->second;
}

const char* range_type_name(RangeType type) {
  switch (type) {
    case RangeType::full:
      return "full";
    case RangeType::causal:
      return "causal";
    case RangeType::inv_causal:
      return "inv-causal";
    case RangeType::bi_causal:
      return "bi-causal";
  }
  return "?";
}

std::vector<MaskSlice> parse_mask_range_lines(const std::string& text, const std::string& what) {
  std::vector<MaskSlice> slices;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string word; fields >> word;)
      words.push_back(word);
    if (words.empty()) continue;
    const std::string where = what + ", line " + std::to_string(number);
    A2D_REQUIRE(words.size() == 5, where, ": a slice is 'q0 q1 k0 k1 type', got ", words.size(),
                " fields");
    MaskSlice s;
    s.q0 = parse_integer(words[0], where);
    s.q1 = parse_integer(words[1], where);
    s.k0 = parse_integer(words[2], where);
    s.k1 = parse_integer(words[3], where);
    try {
      s.type = parse_range_type(words[4]);
    } catch (const Error& e) {
      A2D_FAIL(where, ": ", e.message());
    }
    A2D_REQUIRE(s.q0 >= 0 && s.k0 >= 0 && s.q1 >= s.q0 && s.k1 >= s.k0, where, ": slice ",
                slice_text(s), " is malformed: each range needs 0 <= start <= end");
    slices.push_back(s);
  }
  return slices;
}

std::vector<MaskSlice> generated_mask_ranges(const std::string& kind, int64_t seq,
                                             const std::string& argument) {
  A2D_REQUIRE(seq >= 1, "the sequence must have at least 1 token (got ", seq, ")");
  const std::string what = kind + ":" + argument;
  std::vector<MaskSlice> slices;
  if (kind == "prefix-lm") {
    const int64_t prefix = tokens_or_percent(argument, seq, what);
    A2D_REQUIRE(prefix >= 0 && prefix <= seq, what, ": the prefix must lie within the ", seq,
                " tokens");
    if (prefix > 0) slices.push_back({0, seq, 0, prefix, RangeType::full});
    if (prefix < seq) slices.push_back({prefix, seq, prefix, seq, RangeType::causal});
    return slices;
  }
  if (kind == "block-causal") {
    const int64_t block = tokens_or_percent(argument, seq, what);
    A2D_REQUIRE(block >= 1, what, ": blocks need at least 1 token");
    for (int64_t begin = 0; begin < seq; begin += block) {
      const int64_t end = std::min(seq, begin + block);
      slices.push_back({begin, end, 0, end, RangeType::full});
    }
    return slices;
  }
  if (kind == "chunked-causal") {
    const int64_t chunk = tokens_or_percent(argument, seq, what);
    A2D_REQUIRE(chunk >= 1, what, ": chunks need at least 1 token");
    for (int64_t begin = 0; begin < seq; begin += chunk) {
      const int64_t end = std::min(seq, begin + chunk);
      slices.push_back({begin, end, begin, end, RangeType::causal});
    }
    return slices;
  }
  A2D_REQUIRE(kind == "random", "unknown mask generator '", kind,
              "' (prefix-lm:P, block-causal:B, chunked-causal:C or random:S[:SEED])");
  const size_t colon = argument.find(':');
  const int64_t count = parse_integer(argument.substr(0, colon), what);
  const uint64_t seed =
      colon == std::string::npos
          ? 1
          : static_cast<uint64_t>(parse_integer(argument.substr(colon + 1), what));
  A2D_REQUIRE(count >= 1 && count <= 65536, what, ": between 1 and 65536 slices");
  // Bands of query rows (about 4 slices each), each with disjoint key ranges and gaps between.
  const int64_t bands = std::min(seq, std::max<int64_t>(1, count / 4));
  const int64_t per_band = (count + bands - 1) / bands;
  A2D_REQUIRE(2 * per_band <= seq + 1, what, ": ", count, " slices need a longer sequence than ",
              seq, " tokens");
  std::mt19937_64 random(seed);
  const auto distinct = [&](int64_t how_many, int64_t low,
                            int64_t high) {  // sorted, in [low, high]
    std::set<int64_t> picked;
    if (how_many <= 0) return std::vector<int64_t>{};
    std::uniform_int_distribution<int64_t> pick(low, high);
    while (static_cast<int64_t>(picked.size()) < how_many)
      picked.insert(pick(random));
    return std::vector<int64_t>(picked.begin(), picked.end());
  };
  std::vector<int64_t> cuts = distinct(bands - 1, 1, seq - 1);
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(seq);
  std::uniform_int_distribution<int> type(0, 3);
  int64_t left = count;
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t here = std::min(left, count / bands + (b < count % bands ? 1 : 0));
    left -= here;
    const std::vector<int64_t> keys = distinct(2 * here, 0, seq);
    for (int64_t i = 0; i < here; ++i) {
      slices.push_back({cuts[static_cast<size_t>(b)], cuts[static_cast<size_t>(b) + 1],
                        keys[static_cast<size_t>(2 * i)], keys[static_cast<size_t>(2 * i + 1)],
                        static_cast<RangeType>(type(random))});
    }
  }
  return slices;
}

std::vector<MaskSlice> parse_mask_ranges(const std::string& text, int64_t seq) {
  for (const std::string kind : {"prefix-lm", "block-causal", "chunked-causal", "random"}) {
    if (text.rfind(kind + ":", 0) == 0) {
      return generated_mask_ranges(kind, seq, text.substr(kind.size() + 1));
    }
  }
  const std::string path = !text.empty() && text[0] == '@' ? text.substr(1) : text;
  std::ifstream file(path);
  A2D_REQUIRE(!path.empty() && file.good(), "cannot read the mask ranges file '", path,
              "' (one slice a line, 'q0 q1 k0 k1 type'; or prefix-lm:P, block-causal:B, "
              "chunked-causal:C, random:S[:SEED])");
  std::ostringstream content;
  content << file.rdbuf();
  return parse_mask_range_lines(content.str(), path);
}

void parse_window_size(const std::string& text, int64_t& left, int64_t& right) {
  const size_t comma = text.find(',');
  A2D_REQUIRE(comma != std::string::npos,
              "--window-size takes LEFT,RIGHT (e.g. 128,128 or -1,0), "
              "got '",
              text, "'");
  left = parse_integer(text.substr(0, comma), "--window-size's LEFT");
  right = parse_integer(text.substr(comma + 1), "--window-size's RIGHT");
  A2D_REQUIRE(left >= -1 && right >= -1, "--window-size ", text,
              ": each side is -1 (unbounded) or >= 0");
}

Mask make_mask(const MaskOptions& o) {
  A2D_REQUIRE(o.window >= 0, o.window_name, " must be >= 1 (or 0 for no window), got ", o.window);
  if (o.ranges_given) {
    A2D_REQUIRE(!o.causal, o.ranges_name, " gives the whole mask; ", o.causal_name,
                " beside it is a second one: drop ", o.causal_name,
                " (a causal slice is 'q0 q1 k0 k1 causal')");
    A2D_REQUIRE(o.window == 0 && !o.window_size_given, o.ranges_name,
                " gives the whole mask; a window beside it is a second one: drop ",
                o.window > 0 ? o.window_name : o.window_size_name);
    A2D_REQUIRE(o.doc_lengths.empty(), o.ranges_name, " and ", o.documents_name,
                " are two masks: give each document its own slices in ", o.ranges_name);
    return Mask::from_ranges(o.ranges);
  }
  Mask mask;
  if (o.window_size_given) {
    A2D_REQUIRE(o.window == 0, o.window_name, " W is ", o.window_size_name,
                " (W-1, 0): give one of them");
    int64_t left = o.window_left, right = o.window_right;
    A2D_REQUIRE(left >= -1 && right >= -1, o.window_size_name, " (", left, ", ", right,
                "): each side is -1 (unbounded) or >= 0");
    if (o.causal && o.causal_sets_right) {
      right = 0;  // flash-attn: causal makes the right side 0
    } else if (o.causal) {
      A2D_REQUIRE(!(left == -1 && right == -1), o.window_size_name,
                  " -1,-1 is no window at all, and ", o.causal_name,
                  " asks for a causal mask: give one of them");
      A2D_REQUIRE(right == 0, o.causal_name, " hides every key after the query, but ",
                  o.window_size_name, " ", left, ",", right, " shows ", right == -1 ? "all" : "",
                  right == -1 ? "" : std::to_string(right), " of them: drop ", o.causal_name,
                  ", or give a right side of 0");
    }
    mask = Mask::window_size(left, right);
  } else if (o.window > 0) {
    mask = Mask::causal_window(o.window);
  } else if (o.causal) {
    mask = Mask::causal();
  }
  if (!o.doc_lengths.empty()) mask = mask.with_documents(o.doc_lengths);
  return mask;
}

}  // namespace a2d
