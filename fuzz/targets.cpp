#include "targets.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/mask.hpp"
#include "attention2d/tools/npy.hpp"

namespace a2d::fuzz {
namespace {

// Any violated invariant is a bug: abort so the fuzzer records the input.
void expect(bool condition) {
  if (!condition) __builtin_trap();
}

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint64_t next(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i)
      value = (value << 8) | (pos_ < size_ ? data_[pos_++] : 0);
    return value;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

void npy_reader(const uint8_t* data, size_t size) {
  try {
    const npy::Array array = npy::parse(reinterpret_cast<const std::byte*>(data), size, "fuzz.npy");
    const int64_t count = array.element_count();
    expect(static_cast<size_t>(count) * npy::item_size(array.dtype) == array.bytes.size());
    if (array.dtype == npy::DType::float32) {
      const std::vector<float> values = array.to_float();
      const auto encoded = npy::encode(array.shape, npy::DType::float32, values.data());
      const npy::Array again = npy::parse(encoded.data(), encoded.size(), "re-encoded");
      expect(again.shape == array.shape && again.bytes == array.bytes);
    } else if (array.dtype == npy::DType::float16) {
      // Widening is exact: to_float and to_double agree, and rounding back to binary16 gives the
      // file's bits (a NaN's bits with the quiet bit 0x0200 set).
      const std::vector<float> values = array.to_float();
      const std::vector<double> wide = array.to_double();
      expect(static_cast<int64_t>(values.size()) == count &&
             static_cast<int64_t>(wide.size()) == count);
      std::vector<uint16_t> bits(values.size());
      if (count > 0) std::memcpy(bits.data(), array.bytes.data(), array.bytes.size());
      for (size_t i = 0; i < bits.size(); ++i) {
        if (std::isnan(values[i])) {
          expect(std::isnan(wide[i]) && float_to_f16(values[i]) == (bits[i] | 0x0200u));
        } else {
          expect(wide[i] == values[i] && float_to_f16(values[i]) == bits[i]);
        }
      }
      const auto encoded = npy::encode(array.shape, npy::DType::float16, bits.data());
      const npy::Array again = npy::parse(encoded.data(), encoded.size(), "re-encoded");
      expect(again.dtype == npy::DType::float16 && again.shape == array.shape &&
             again.bytes == array.bytes);
    } else {
      const std::vector<double> values = array.to_double();
      expect(static_cast<int64_t>(values.size()) == count);
    }
  } catch (const Error&) {
    // Refusing malformed input with a message is the expected outcome.
  }
}

void layout_ownership(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const auto kind = static_cast<LayoutKind>(in.next(1) % 4);
  // Sizes up to 2^40 tokens and 2^20 parts; out-of-range ones must be refused, not overflow.
  const int64_t tokens = static_cast<int64_t>(in.next(6) >> (in.next(1) % 48));
  const int64_t parts = static_cast<int64_t>(in.next(3));
  const int64_t stripe = static_cast<int64_t>(in.next(3));
  try {
    const TokenLayout layout(kind, tokens, parts, stripe);
    int64_t total = 0;
    const int64_t checked_parts = std::min<int64_t>(parts, 64);
    for (int64_t p = 0; p < checked_parts; ++p) {
      const int64_t n = layout.count(p);
      expect(n >= 0 && n <= tokens);
      total += n;
      // A few indices of the part: first, last and one from the bytes.
      for (const int64_t i :
           {int64_t{0}, n - 1, n > 0 ? static_cast<int64_t>(in.next(5)) % n : -1}) {
        if (i < 0 || i >= n) continue;
        const int64_t t = layout.token_at(p, i);
        expect(t >= 0 && t < tokens);
        const TokenLayout::Owner owner = layout.owner(t);
        expect(owner.part == p && owner.index == i);
      }
    }
    if (checked_parts == parts) expect(total == tokens);
    if (tokens > 0) {
      const int64_t t = static_cast<int64_t>(in.next(6)) % tokens;
      const TokenLayout::Owner owner = layout.owner(t);
      expect(owner.part >= 0 && owner.part < parts);
      expect(layout.token_at(owner.part, owner.index) == t);
    }
  } catch (const Error&) {
  }
  // Grid coordinates and the K/V transpose of a grid of up to 2^16 ranks.
  const int rows = static_cast<int>(in.next(1) + 1), cols = static_cast<int>(in.next(1) + 1);
  const GridShape shape{rows, cols};
  const int rank = static_cast<int>(in.next(2) % static_cast<uint64_t>(shape.size()));
  const GridCoords at{shape, rank};
  expect(GridCoords::rank_of(shape, at.row(), at.col()) == rank);
  expect(GridCoords{shape, at.kv_dest_rank()}.kv_source_rank() == rank);
  expect(at.kv_source_rank() >= 0 && at.kv_source_rank() < shape.size());
}

namespace {
// MagiAttention's definition of a slice, in its local coordinates.
bool slice_shows(const MaskSlice& s, int64_t q, int64_t k) {
  if (q < s.q0 || q >= s.q1 || k < s.k0 || k >= s.k1) return false;
  const int64_t i = q - s.q0, j = k - s.k0;
  const bool causal = j <= i + (s.k1 - s.k0) - (s.q1 - s.q0), inverse = j >= i;
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
}  // namespace

void mask_ranges(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const int64_t seq = 1 + static_cast<int64_t>((data[0] << 8 | data[1]) % 1024);
  const std::string text(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::vector<MaskSlice> slices;
  Mask mask;
  try {
    const bool generator = text.rfind("prefix-lm:", 0) == 0 ||
                           text.rfind("block-causal:", 0) == 0 ||
                           text.rfind("chunked-causal:", 0) == 0 || text.rfind("random:", 0) == 0;
    // A generator, or slice lines (never a file name: the fuzzer must not open files).
    slices = generator ? parse_mask_ranges(text, seq) : parse_mask_range_lines(text, "fuzz");
    mask = Mask::from_ranges(slices);
    mask.validate(seq);
  } catch (const Error&) {
    return;  // refused with a message: the expected outcome for bad input
  }
  expect(mask.has_ranges() && mask.slices() <= static_cast<int64_t>(slices.size()));
  // Brute force on the first positions.
  const int64_t n = std::min<int64_t>(seq, 48);
  const MaskView view = mask.view();
  std::vector<char> shows(static_cast<size_t>(n * n));
  int64_t total = 0;
  for (int64_t q = 0; q < n; ++q) {
    const MaskRow row = view.row(q);
    for (int64_t k = 0; k < n; ++k) {
      bool any = false;
      for (const MaskSlice& s : slices)
        any = any || slice_shows(s, q, k);
      shows[static_cast<size_t>(q * n + k)] = any;
      total += any;
      expect(mask.visible(q, k) == any && row.visible(k) == any);
    }
  }
  expect(view.count(0, n - 1, 0, n - 1) == total);
  // Rectangles from the bytes: the classifier is exact, the count too.
  for (size_t at = 2; at + 4 <= size && at < 2 + 4 * 16; at += 4) {
    int64_t q0 = data[at] % n, q1 = data[at + 1] % n, k0 = data[at + 2] % n, k1 = data[at + 3] % n;
    if (q0 > q1) std::swap(q0, q1);
    if (k0 > k1) std::swap(k0, k1);
    int64_t visible = 0;
    for (int64_t q = q0; q <= q1; ++q)
      for (int64_t k = k0; k <= k1; ++k)
        visible += shows[static_cast<size_t>(q * n + k)];
    const int64_t area = (q1 - q0 + 1) * (k1 - k0 + 1);
    const BlockVisibility c = view.classify(q0, q1, k0, k1);
    expect((c == BlockVisibility::hidden) == (visible == 0));
    expect((c == BlockVisibility::full) == (visible == area));
    expect(view.count(q0, q1, k0, k1) == visible);
  }
}

}  // namespace a2d::fuzz
