// Internal: the token-major record buffers that distributed algorithms send.
//
// A record buffer holds [tokens, batch, heads, record] floats: one record per (token, batch,
// head), tokens outermost, so that concatenating the buffers of several ranks (an all-gather)
// is again a record buffer whose rows are the union of their tokens. A record packs several
// per-row quantities side by side, e.g. K and V as [k(D) v(D)], or a partial attention result
// as [row max, row sum, acc(D)].
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention2d/comm.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"

namespace a2d::algorithms {

// Points a kernel's progress callback at `comm`: while the kernel runs, MPI advances the
// transfers in flight (it progresses only inside MPI calls) and the watchdog sees this rank alive.
template <typename KernelArgs>
void progress_through(KernelArgs& args, Communicator& comm) {
  args.progress = [](void* context) { static_cast<Communicator*>(context)->progress(); };
  args.progress_context = &comm;
}

// An allocator whose default-constructed elements are left uninitialised. The algorithms' buffers
// are overwritten whole by a collective, the kernel (accumulate = false) or a pack before anything
// reads them, so value-initialising them, as std::vector<float>(n) does, only zeroes memory: the
// gathered K/V of ATTENTION2D 16 x 1 at N = 4096 is 16 MiB per rank per call. Buffers that are
// read before they are written are asked for zero explicitly (Floats(n, 0.0f)). In the sanitizer
// build (A2D_POISON_UNINITIALIZED) the elements are NaN instead, so that a read of one that nobody
// wrote poisons the outputs the tests compare with the reference.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}

  template <typename U>
  void construct(U* at) noexcept(std::is_nothrow_default_constructible_v<U>) {
#ifdef A2D_POISON_UNINITIALIZED
    if constexpr (std::is_floating_point_v<U>) {
      ::new (static_cast<void*>(at)) U(std::numeric_limits<U>::quiet_NaN());
      return;
    }
#endif
    ::new (static_cast<void*>(at)) U;
  }
  template <typename U, typename... Args>
  void construct(U* at, Args&&... args) {
    ::new (static_cast<void*>(at)) U(std::forward<Args>(args)...);
  }
};
template <typename T, typename U>
bool operator==(const UninitializedAllocator<T>&, const UninitializedAllocator<U>&) noexcept {
  return true;
}

// A float buffer of the algorithms: Floats(n) is uninitialised, Floats(n, 0.0f) zeroed.
using Floats = std::vector<float, UninitializedAllocator<float>>;

struct RecordLayout {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t record = 1;  // floats per (token, batch, head)

  int64_t per_token() const { return batch * heads * record; }
  int64_t floats(int64_t tokens) const { return tokens * per_token(); }

  // The [batch, tokens, heads, width] tensor stored at `offset` inside each record.
  template <typename T>
  TokenView<T> tokens(T* base, int64_t offset) const {
    return {base + offset, heads * record, batch * heads * record, record};
  }
  // The [batch, heads, tokens] statistic stored at `offset` inside each record.
  template <typename T>
  RowView<T> rows(T* base, int64_t offset) const {
    return {base + offset, heads * record, record, batch * heads * record};
  }
};

// Copies `width` floats per row of a [batch, tokens, heads, width] view into the records at
// `offset`.
inline void pack(TokenView<const float> from, int64_t tokens, int64_t width, const RecordLayout& to,
                 float* base, int64_t offset) {
  const TokenView<float> dst = to.tokens(base, offset);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t b = 0; b < to.batch; ++b)
      for (int64_t h = 0; h < to.heads; ++h)
        std::copy_n(from.at(b, t, h), width, dst.at(b, t, h));
}

inline void unpack(const RecordLayout& from, const float* base, int64_t offset, int64_t tokens,
                   int64_t width, TokenView<float> to) {
  const TokenView<const float> src = from.tokens(base, offset);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t b = 0; b < from.batch; ++b)
      for (int64_t h = 0; h < from.heads; ++h)
        std::copy_n(src.at(b, t, h), width, to.at(b, t, h));
}

inline void pack_rows(RowView<const float> from, int64_t tokens, const RecordLayout& to,
                      float* base, int64_t offset) {
  const RowView<float> dst = to.rows(base, offset);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t b = 0; b < to.batch; ++b)
      for (int64_t h = 0; h < to.heads; ++h)
        dst.at(b, h, t) = from.at(b, h, t);
}

// Copies `heads` x `width` floats per (batch, token) between two views of any strides.
inline void copy_tokens(TokenView<const float> from, TokenView<float> to, int64_t batch,
                        int64_t tokens, int64_t heads, int64_t width) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(from.at(b, t, h), width, to.at(b, t, h));
}

inline void copy_rows(RowView<const float> from, RowView<float> to, int64_t batch, int64_t heads,
                      int64_t tokens) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        to.at(b, h, t) = from.at(b, h, t);
}

// The heads first_head, first_head + 1, ... of a view (the same tensor, fewer heads).
template <typename T>
TokenView<T> from_head(TokenView<T> view, int64_t first_head) {
  return {view.data + first_head * view.head_stride, view.batch_stride, view.token_stride,
          view.head_stride};
}
template <typename T>
RowView<T> from_head(RowView<T> view, int64_t first_head) {
  return {view.data + first_head * view.head_stride, view.batch_stride, view.head_stride,
          view.token_stride};
}

// Token counts times a per-token size (floats or records per token).
inline std::vector<int64_t> scaled(const std::vector<int64_t>& tokens, int64_t per_token) {
  std::vector<int64_t> out(tokens);
  for (auto& x : out)
    x *= per_token;
  return out;
}

// Offsets of consecutive blocks of `counts`: counts.size() + 1 entries, the last the total.
inline std::vector<int64_t> prefix_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  return offsets;
}

// A reordering of the tokens of a record buffer: token j of the sorted buffer is token order[j]
// of the gathered one. Gathers concatenate the ranks' parts, and with the cyclic layout every part
// is a stride-P progression, so a gathered buffer interleaves positions: a kernel tile of it spans
// the whole sequence and nearly every tile is partially masked. Sorted by position, the tiles a
// causal mask hides are skipped and only those on the diagonal are partial (docs/attention2d.md).
struct TokenOrder {
  std::vector<int64_t> order;      // empty: the buffer is already in position order
  std::vector<int64_t> inverse;    // gathered token i is sorted token inverse[i]
  std::vector<int64_t> positions;  // positions in sorted order

  TokenOrder() = default;
  // reorder = false keeps the gathered order (no mask to skip by).
  TokenOrder(const std::vector<int64_t>& gathered_positions, bool reorder)
      : positions(gathered_positions) {
    if (!reorder || std::is_sorted(positions.begin(), positions.end())) return;
    order.resize(positions.size());
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return gathered_positions[static_cast<size_t>(a)] <
             gathered_positions[static_cast<size_t>(b)];
    });
    inverse.resize(order.size());
    for (size_t j = 0; j < order.size(); ++j) {
      positions[j] = gathered_positions[static_cast<size_t>(order[j])];
      inverse[static_cast<size_t>(order[j])] = static_cast<int64_t>(j);
    }
  }
  bool identity() const { return order.empty(); }

  // In place, `per_token` floats per token: sorted[j] = gathered[order[j]].
  void sort(std::span<float> buffer, int64_t per_token) const {
    if (!identity()) permute_tokens(buffer.data(), per_token, order);
  }
  // The inverse: gathered[i] = sorted[inverse[i]].
  void unsort(std::span<float> buffer, int64_t per_token) const {
    if (!identity()) permute_tokens(buffer.data(), per_token, inverse);
  }
};

// Element-wise sum of `count` floats: into += from.
inline void add_into(float* into, const float* from, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    into[i] += from[i];
}

}  // namespace a2d::algorithms
