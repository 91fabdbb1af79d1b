// attention2d: the attention mask, one value that everything asks.
//
// Which keys a query sees is a function of global token positions, so every layout, grid and
// gathered order uses the same mask. The kinds (flash-attn's and MagiAttention's meanings):
//
//   none           every key
//   causal         k <= q
//   causal_window  q - W < k <= q                  (flash-attn's window_size (W - 1, 0))
//   window         q - left <= k <= q + right      (flash-attn's window_size (left, right); -1 on
//                                                   a side: unbounded; at least one side bounded,
//                                                   and not (left, 0), which is causal_window)
//   ranges         the union of slices [q0, q1) x [k0, k1), each of a type (MagiAttention's
//                  flex_flash_attn_func and attn_type_map), in local coordinates i = q - q0,
//                  j = k - k0 of a slice of sq = q1 - q0 queries and sk = k1 - k0 keys:
//                    full        every pair
//                    causal      j <= i + sk - sq   (bottom-right aligned)
//                    inv_causal  j >= i             (top-left aligned)
//                    bi_causal   both
//                  Slices must not overlap (as rectangles); a query row no slice covers, or whose
//                  slices show it no key, sees nothing (O = 0, LSE = -inf, zero gradients).
//
// combined (and) with documents, when set (not with ranges): the sequence packs documents of the
// given lengths (flash-attn's cu_seqlens are their running sums) and a query sees only keys of
// its own document. Documents and range slices are shared (never copied per call).
//
// Every kind is a set of diagonal bands cut to rectangles: a pair (q, k) is visible when
// lo <= k - q <= hi for the band of the rectangle holding it. MaskView is that form as plain
// numbers and pointers, the same object on the host and in the CUDA kernels (the CUDA backend
// copies its two arrays to the GPU); Mask owns the arrays and answers the questions the
// algorithms, the cost model and the front ends ask (which layouts balance it, whether a decoder
// can extend it, its pieces for the closed-form pair counts).
//
// Adding a kind: docs/architecture.md, "Adding a mask kind" (this header and src/core/mask.cpp).
// This header includes only the standard library (the library's ground floor).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// The tests the kernels make (MaskView, MaskRow) run on the host and on a GPU. On the host they
// are always inlined: the AVX2 and AVX-512 kernels compile them with those instructions, and no
// out-of-line copy of theirs may be the one the linker keeps for code that runs without them.
#ifndef A2D_HOST_DEVICE
#if defined(__CUDACC__)
#define A2D_HOST_DEVICE __host__ __device__
#else
#define A2D_HOST_DEVICE
#endif
#endif
#if defined(__CUDACC__)
#define A2D_MASK_INLINE __host__ __device__ inline
#elif defined(__GNUC__)
#define A2D_MASK_INLINE inline __attribute__((always_inline))
#else
#define A2D_MASK_INLINE inline
#endif

namespace a2d {

enum class MaskKind : int32_t { none, causal, causal_window, window, ranges };

// MagiAttention's attn_type_map values.
enum class RangeType : int32_t { full = 0, causal = 1, inv_causal = 2, bi_causal = 3 };

// One slice of a range mask, in global positions.
struct MaskSlice {
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  RangeType type = RangeType::full;
  bool operator==(const MaskSlice&) const = default;
};

// A rectangle of pairs q in [q0, q1), k in [k0, k1) cut to the diagonals lo <= k - q <= hi.
struct MaskPiece {
  int64_t q0, q1, k0, k1, lo, hi;
};

// How a block of queries relates to a block of keys.
enum class BlockVisibility { hidden, partial, full };

// Which layouts spread a mask's work evenly over ranks that each own a part of the queries:
//   any          every query row sees about as many keys as any other (up to the ends of the
//                sequence): every layout is balanced, the contiguous one too
//   mirrored     a row's work grows (or shrinks) along the sequence, so that rows t and N-1-t
//                together do about the same as any other such pair (causal, one-sided windows):
//                zigzag (chunks p and 2P-1-p) balances it, as does any fine interleaving
//   interleaved  work anywhere (documents, ranges): only a fine interleaving (cyclic, striped)
//                gives each rank a fair sample of every region
enum class MaskBalance { any, mirrored, interleaved };

// Bands without a bound on a side use +-kMaskUnbounded (positions stay far below it).
inline constexpr int64_t kMaskUnbounded = int64_t{1} << 60;

namespace mask_detail {
A2D_MASK_INLINE int64_t at_most(int64_t a, int64_t b) {
  return a < b ? a : b;
}
A2D_MASK_INLINE int64_t at_least(int64_t a, int64_t b) {
  return a > b ? a : b;
}
// Pairs with q in [q_first, q_last], k in [k_first, k_last] (inclusive) and k - q <= t.
A2D_MASK_INLINE int64_t pairs_up_to(int64_t q_first, int64_t q_last, int64_t k_first,
                                    int64_t k_last, int64_t t) {
  if (q_last < q_first || k_last < k_first) return 0;
  const int64_t width = k_last - k_first + 1;
  // Row q sees clamp(q + t - k_first + 1, 0, width) keys: none up to q = k_first - t - 1, all
  // from q = k_last - t on, a linear run between.
  int64_t total = 0;
  const int64_t all_from = at_least(q_first, k_last - t);
  if (all_from <= q_last) total += (q_last - all_from + 1) * width;
  const int64_t first = at_least(q_first, k_first - t);
  const int64_t last = at_most(q_last, k_last - t - 1);
  if (first <= last) {
    const int64_t a = first + t - k_first + 1, b = last + t - k_first + 1;
    total += (a + b) * (last - first + 1) / 2;
  }
  return total;
}
// Pairs of the rectangle with lo <= k - q <= hi.
A2D_MASK_INLINE int64_t band_pairs(int64_t q_first, int64_t q_last, int64_t k_first, int64_t k_last,
                                   int64_t lo, int64_t hi) {
  if (hi < lo) return 0;
  return pairs_up_to(q_first, q_last, k_first, k_last, hi) -
         pairs_up_to(q_first, q_last, k_first, k_last, lo - 1);
}
// How [q_min, q_max] x [k_min, k_max] meets the band lo <= k - q <= hi.
A2D_MASK_INLINE BlockVisibility classify_band(int64_t lo, int64_t hi, int64_t q_min, int64_t q_max,
                                              int64_t k_min, int64_t k_max) {
  if (k_max - q_min < lo || k_min - q_max > hi) return BlockVisibility::hidden;
  if (k_min - q_max >= lo && k_max - q_min <= hi) return BlockVisibility::full;
  return BlockVisibility::partial;
}
}  // namespace mask_detail

// The keys one query row sees: [first, last], and within it, when the row meets several slices
// of a range mask, only the keys of those slices (pieces != nullptr).
struct MaskRow {
  int64_t q = 0;
  int64_t first = 0;
  int64_t last = -1;
  const MaskPiece* pieces = nullptr;  // sorted by k0, disjoint
  int64_t count = 0;

  A2D_MASK_INLINE bool visible(int64_t k) const {
    if (k < first || k > last) return false;
    if (!pieces) return true;
    for (int64_t i = 0; i < count; ++i) {
      const MaskPiece& piece = pieces[i];
      if (k < piece.k0) return false;
      if (k < piece.k1) return k - q >= piece.lo && k - q <= piece.hi;
    }
    return false;
  }
};

// The mask as plain numbers and pointers (host or device memory), with every test the kernels
// make. Obtained from Mask::view(); valid while the Mask (or a copy) lives.
//
// Range index (`ranges`, int64 values): the query axis cut at every slice's q0 and q1 into
// `segments` runs [bounds[s], bounds[s + 1]); each run lists the slices that cover it, cut to its
// rows, as pieces sorted by k0 (disjoint, since slices do not overlap):
//   bounds [segments + 1], first [segments + 1] (run s's pieces are [first[s], first[s + 1])),
//   then the pieces, 6 values each (MaskPiece).
struct MaskView {
  MaskKind kind = MaskKind::none;
  int64_t lo = -kMaskUnbounded;  // the band lo <= k - q <= hi of the position rule
  int64_t hi = kMaskUnbounded;
  const int64_t* doc_offsets = nullptr;  // [documents + 1], or nullptr: one document
  int64_t documents = 0;
  const int64_t* ranges = nullptr;  // the range index (kind ranges)
  int64_t segments = 0;

  A2D_MASK_INLINE const int64_t* bounds() const { return ranges; }
  A2D_MASK_INLINE const int64_t* firsts() const { return ranges + segments + 1; }
  A2D_MASK_INLINE const MaskPiece* pieces() const {
    return reinterpret_cast<const MaskPiece*>(ranges + 2 * (segments + 1));
  }

  // Index of the document holding `pos` (0 without documents).
  A2D_MASK_INLINE int64_t document_of(int64_t pos) const {
    if (!doc_offsets) return 0;
    int64_t low = 0, high = documents - 1;  // the last offset <= pos among [0, documents)
    while (low < high) {
      const int64_t mid = (low + high + 1) / 2;
      if (doc_offsets[mid] <= pos) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    return low;
  }
  // The run of the range index holding query `q`, or -1.
  A2D_MASK_INLINE int64_t segment_of(int64_t q) const {
    const int64_t* b = bounds();
    if (segments == 0 || q < b[0] || q >= b[segments]) return -1;
    int64_t low = 0, high = segments - 1;
    while (low < high) {
      const int64_t mid = (low + high + 1) / 2;
      if (b[mid] <= q) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    return low;
  }

  A2D_MASK_INLINE MaskRow row(int64_t q) const {
    MaskRow out;
    out.q = q;
    out.first = q + lo;
    out.last = q + hi;
    if (doc_offsets) {
      const int64_t d = document_of(q);
      out.first = mask_detail::at_least(out.first, doc_offsets[d]);
      out.last = mask_detail::at_most(out.last, doc_offsets[d + 1] - 1);
    }
    if (kind != MaskKind::ranges) return out;
    const int64_t s = segment_of(q);
    const int64_t begin = s < 0 ? 0 : firsts()[s];
    const int64_t count = s < 0 ? 0 : firsts()[s + 1] - begin;
    if (count == 0) {
      out.first = 1, out.last = 0;
      return out;
    }
    const MaskPiece* p = pieces() + begin;
    if (count == 1) {
      out.first = mask_detail::at_least(p->k0, q + p->lo);
      out.last = mask_detail::at_most(p->k1 - 1, q + p->hi);
      return out;
    }
    out.first = p[0].k0;
    out.last = p[count - 1].k1 - 1;
    out.pieces = p;
    out.count = count;
    return out;
  }

  // Whether the band alone decides (no documents, no slices): the kernels' fast path.
  A2D_MASK_INLINE bool band_only() const { return !doc_offsets && kind != MaskKind::ranges; }
  A2D_MASK_INLINE bool in_band(int64_t q, int64_t k) const { return k - q >= lo && k - q <= hi; }

  A2D_MASK_INLINE bool visible(int64_t q, int64_t k) const {
    if (k - q < lo || k - q > hi) return false;
    if (band_only()) return true;
    return visible_by_pieces(q, k);
  }
  // visible() past the band: documents, slices.
  A2D_MASK_INLINE bool visible_by_pieces(int64_t q, int64_t k) const {
    if (doc_offsets && document_of(q) != document_of(k)) return false;
    if (kind != MaskKind::ranges) return true;
    return row(q).visible(k);
  }

  // Queries with positions in [q_min, q_max] against keys in [k_min, k_max] (any positions in
  // between): hidden when no pair of the rectangle is visible, full when every pair is, else
  // partial. Exact for the position rule alone and for ranges; with documents, hidden when the
  // documents of the two ranges do not meet and full only when all lie in one document.
  A2D_MASK_INLINE BlockVisibility classify(int64_t q_min, int64_t q_max, int64_t k_min,
                                           int64_t k_max) const {
    const BlockVisibility by_band = mask_detail::classify_band(lo, hi, q_min, q_max, k_min, k_max);
    if (by_band == BlockVisibility::hidden || band_only()) return by_band;
    return classify_by_pieces(by_band, q_min, q_max, k_min, k_max);
  }
  // classify() past the band: documents, slices.
  A2D_MASK_INLINE BlockVisibility classify_by_pieces(BlockVisibility by_band, int64_t q_min,
                                                     int64_t q_max, int64_t k_min,
                                                     int64_t k_max) const {
    if (doc_offsets) {
      const int64_t q_first = document_of(q_min), q_last = document_of(q_max);
      const int64_t k_first = document_of(k_min), k_last = document_of(k_max);
      if (q_last < k_first || k_last < q_first) return BlockVisibility::hidden;
      if (by_band == BlockVisibility::full && q_first == q_last && k_first == k_last &&
          q_first == k_first) {
        return BlockVisibility::full;
      }
      return BlockVisibility::partial;
    }
    return classify_ranges(q_min, q_max, k_min, k_max);
  }

  // Visible pairs of [q_first, q_last] x [k_first, k_last] (inclusive, contiguous positions).
  A2D_MASK_INLINE int64_t count(int64_t q_first, int64_t q_last, int64_t k_first,
                                int64_t k_last) const {
    if (q_last < q_first || k_last < k_first) return 0;
    if (kind == MaskKind::ranges) {
      bool seen_visible = false, seen_hidden = false;
      return scan_runs(q_first, q_last, k_first, k_last, false, seen_visible, seen_hidden);
    }
    if (!doc_offsets) return mask_detail::band_pairs(q_first, q_last, k_first, k_last, lo, hi);
    int64_t total = 0;
    for (int64_t d = document_of(q_first); d < documents && doc_offsets[d] <= q_last; ++d) {
      const int64_t start = doc_offsets[d], end = doc_offsets[d + 1] - 1;
      total += mask_detail::band_pairs(
          mask_detail::at_least(q_first, start), mask_detail::at_most(q_last, end),
          mask_detail::at_least(k_first, start), mask_detail::at_most(k_last, end), lo, hi);
    }
    return total;
  }

 private:
  // The visible pairs of rows [q_first, q_last] against keys [k_first, k_last], run by run of the
  // range index (rows outside every run see nothing); seen_visible / seen_hidden: whether some
  // run had a visible / a hidden pair. With stop_when_mixed, stops as soon as both are seen.
  A2D_MASK_INLINE int64_t scan_runs(int64_t q_first, int64_t q_last, int64_t k_first,
                                    int64_t k_last, bool stop_when_mixed, bool& seen_visible,
                                    bool& seen_hidden) const {
    const int64_t* b = bounds();
    if (segments == 0 || q_last < b[0] || q_first >= b[segments]) {
      seen_hidden = true;  // no row lies in a run
      return 0;
    }
    const int64_t* first = firsts();
    const MaskPiece* all = pieces();
    if (q_first < b[0] || q_last >= b[segments]) seen_hidden = true;  // some rows lie outside
    int64_t total = 0;
    for (int64_t s = segment_of(mask_detail::at_least(q_first, b[0]));
         s < segments && b[s] <= q_last; ++s) {
      const int64_t rows_first = mask_detail::at_least(q_first, b[s]);
      const int64_t rows_last = mask_detail::at_most(q_last, b[s + 1] - 1);
      int64_t visible = 0;
      for (int64_t i = first[s]; i < first[s + 1]; ++i) {
        const MaskPiece& p = all[i];
        if (p.k0 > k_last) break;
        if (p.k1 <= k_first) continue;
        visible +=
            mask_detail::band_pairs(rows_first, rows_last, mask_detail::at_least(k_first, p.k0),
                                    mask_detail::at_most(k_last, p.k1 - 1), p.lo, p.hi);
      }
      total += visible;
      seen_visible = seen_visible || visible > 0;
      seen_hidden = seen_hidden || visible < (rows_last - rows_first + 1) * (k_last - k_first + 1);
      if (stop_when_mixed && seen_visible && seen_hidden) break;
    }
    return total;
  }

  A2D_MASK_INLINE BlockVisibility classify_ranges(int64_t q_min, int64_t q_max, int64_t k_min,
                                                  int64_t k_max) const {
    bool seen_visible = false, seen_hidden = false;
    scan_runs(q_min, q_max, k_min, k_max, true, seen_visible, seen_hidden);
    if (seen_visible && seen_hidden) return BlockVisibility::partial;
    return seen_visible ? BlockVisibility::full : BlockVisibility::hidden;
  }
};

// The slices of a range mask and their index (MaskView's layout), built and checked once.
struct MaskRanges {
  std::vector<MaskSlice> slices;  // sorted by (q0, k0); non-empty; non-overlapping
  std::vector<int64_t> index;     // MaskView::ranges
  int64_t segments = 0;
  uint64_t digest = 0;  // FNV-1a of the slices (the ranks' agreement check)
};

struct Mask {
  MaskKind kind = MaskKind::none;
  int64_t window = 0;  // causal_window: W
  int64_t left = -1;   // window: flash-attn's window_size (left, right), -1 = unbounded
  int64_t right = -1;
  std::shared_ptr<const std::vector<int64_t>> doc_offsets;  // null: one document
  std::shared_ptr<const MaskRanges> ranges;                 // kind ranges

  static Mask none() { return {}; }
  static Mask causal() {
    Mask m;
    m.kind = MaskKind::causal;
    return m;
  }
  // q - window < k <= q (window >= 1; validate() checks).
  static Mask causal_window(int64_t window) {
    Mask m;
    m.kind = MaskKind::causal_window;
    m.window = window;
    return m;
  }
  // flash-attn's window_size = (left, right): q - left <= k <= q + right, -1 = unbounded on that
  // side. (-1, -1) is none, (-1, 0) causal, (W - 1, 0) causal_window(W). Throws a2d::Error for a
  // side below -1.
  static Mask window_size(int64_t left, int64_t right);
  // The union of `slices` (any order; empty slices are dropped). Throws a2d::Error naming the
  // first slice that is malformed or overlaps another; validate(seq) checks the bounds.
  static Mask from_ranges(std::vector<MaskSlice> slices);
  // This mask restricted to documents of these lengths (each >= 1; validate() checks). Not with
  // ranges (throws).
  Mask with_documents(const std::vector<int64_t>& lengths) const;

  MaskView view() const;

  bool has_documents() const { return doc_offsets != nullptr; }
  bool has_ranges() const { return kind == MaskKind::ranges; }
  int64_t documents() const { return doc_offsets ? int64_t(doc_offsets->size()) - 1 : 1; }
  // The tokens the documents cover (their lengths' sum); 0 without documents.
  int64_t document_tokens() const { return doc_offsets ? doc_offsets->back() : 0; }
  int64_t document_of(int64_t pos) const { return view().document_of(pos); }
  // The positions [first, last] of the document holding `pos`.
  int64_t document_first(int64_t pos) const {
    return doc_offsets ? (*doc_offsets)[static_cast<size_t>(document_of(pos))] : INT64_MIN;
  }
  int64_t document_last(int64_t pos) const {
    return doc_offsets ? (*doc_offsets)[static_cast<size_t>(document_of(pos)) + 1] - 1 : INT64_MAX;
  }
  int64_t slices() const { return ranges ? static_cast<int64_t>(ranges->slices.size()) : 0; }
  // flash-attn's window_size of the position rule: (-1, -1) none, (-1, 0) causal, (W - 1, 0),
  // (left, right); (-1, -1) for ranges.
  int64_t window_left() const;
  int64_t window_right() const;

  bool visible(int64_t q_pos, int64_t k_pos) const { return view().visible(q_pos, k_pos); }
  BlockVisibility classify(int64_t q_min, int64_t q_max, int64_t k_min, int64_t k_max) const {
    return view().classify(q_min, q_max, k_min, k_max);
  }

  // The questions the library asks instead of naming kinds.
  // Whether some pair is hidden (all but none without documents): sorting gathered rows by
  // position then lets the kernels skip whole tiles.
  bool hides_pairs() const { return kind != MaskKind::none || doc_offsets != nullptr; }
  // Whether the position rule hides pairs, so the kernels run partly masked tiles along a
  // diagonal (the calibrated masked rate applies).
  bool masks_by_position() const { return kind != MaskKind::none; }
  // Which layouts balance it (above).
  MaskBalance balance() const;
  // Whether a decoder can extend it by tokens appended after the sequence: a new token must see
  // only keys at or before its position, by a rule of positions alone (causal, causal windows).
  bool extends_causally() const;
  // Whether the position rule shows each query only keys at or before it (causal, causal windows),
  // with documents or without: the "causal" of reports and of the Python Problem.
  bool is_causal() const { return kind == MaskKind::causal || kind == MaskKind::causal_window; }
  // The causal triangle itself: every key at or before its query, one document.
  bool plain_causal() const { return kind == MaskKind::causal && !doc_offsets; }
  // Whether it is defined for one sequence length only (documents, ranges): a problem of another
  // length cannot keep it.
  bool fixed_length() const { return doc_offsets != nullptr || kind == MaskKind::ranges; }

  // Every pair it shows in a sequence of `seq` tokens, as pieces: one band over [0, seq)^2, one
  // per document, or the slices' bands (sorted by q0); the closed-form pair counts of the cost
  // model sum over them.
  std::vector<MaskPiece> pieces(int64_t seq) const;

  void validate() const;
  // Also checks that the documents cover exactly `seq` tokens and the slices lie within it.
  void validate(int64_t seq) const;
  // "none", "causal", "causal-window(W)", "window(L,R)", "ranges(S)", with "+documents(n)"
  std::string describe() const;
  // FNV-1a of what the kind, window and documents do not show: the document boundaries and the
  // slices (0 when none); ranks that pass different masks differ in it.
  int64_t digest() const;
};

// "none", "causal", "causal-window", "window", "ranges": a kind's name in messages.
const char* mask_kind_name(MaskKind kind);

// The band of a slice type over [q0, q1) x [k0, k1) (MaskSlice), as lo <= k - q <= hi.
MaskPiece slice_piece(const MaskSlice& slice);

// "full", "causal", "inv-causal", "bi-causal" (also taking 0-3 and the underscored names);
// throws a2d::Error naming the choices.
RangeType parse_range_type(const std::string& name);
const char* range_type_name(RangeType type);

// Slices from text, shared by the command line and Python: a generator
//   prefix-lm:P       the first P tokens (P%: percent of seq) see each other; every later token
//                     sees them and, causally, the tokens after them
//   block-causal:B    blocks of B tokens (B%: percent of seq): a query sees every key of its
//                     block and of the blocks before
//   chunked-causal:C  chunks of C tokens (C%: percent of seq), causal within each, none across
//                     (Llama 4's chunked attention)
//   random:S[:SEED]   S random non-overlapping slices of every type (some rows uncovered;
//                     S <= 65536)
// or the name of a file with one slice a line, "q0 q1 k0 k1 type" (type as parse_range_type; '#'
// starts a comment). Throws a2d::Error naming the line or entry.
std::vector<MaskSlice> parse_mask_ranges(const std::string& text, int64_t seq);
std::vector<MaskSlice> generated_mask_ranges(const std::string& kind, int64_t seq,
                                             const std::string& argument);
// The same for in-memory text (one slice a line, as in a file); `what` names it in errors.
std::vector<MaskSlice> parse_mask_range_lines(const std::string& text, const std::string& what);

// The mask the options of a front end describe, checked for contradictions before anything else
// (the command line's --causal, --window, --window-size, --doc-lens, --mask-ranges; Python's
// causal=, window=, window_size=, cu_seqlens, mask=): one place, so both refuse alike.
struct MaskOptions {
  bool causal = false;
  int64_t window = 0;              // causal window W (0: none)
  bool window_size_given = false;  // flash-attn's (left, right)
  int64_t window_left = -1;
  int64_t window_right = -1;
  // causal with window_size: flash-attn's meaning (the right side becomes 0) instead of a
  // contradiction (the command line refuses it).
  bool causal_sets_right = false;
  std::vector<int64_t> doc_lengths;  // empty: one document
  bool ranges_given = false;
  std::vector<MaskSlice> ranges;
  // The option names for messages.
  const char* causal_name = "--causal";
  const char* window_name = "--window";
  const char* window_size_name = "--window-size";
  const char* documents_name = "--doc-lens";
  const char* ranges_name = "--mask-ranges";
};
Mask make_mask(const MaskOptions& options);

// "LEFT,RIGHT" -> (left, right), each >= -1; throws a2d::Error naming the option.
void parse_window_size(const std::string& text, int64_t& left, int64_t& right);

}  // namespace a2d
