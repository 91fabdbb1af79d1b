#include "targets.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/layout.hpp"
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

}  // namespace a2d::fuzz
