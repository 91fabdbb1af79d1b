// Internal: the token-major record buffers that distributed algorithms send, and the sorted order
// of gathered rows. Everything here describes data in backend buffers; nothing reads them.
//
// A record buffer holds [tokens, batch, heads, record] bytes: one record per (token, batch,
// head), tokens outermost, so that concatenating the buffers of several ranks (an all-gather) is
// again a record buffer whose rows are the union of their tokens. A record packs several per-row
// quantities side by side, fp32 fields first and then fields of the problem's dtype, so that every
// field is aligned to its element size: K and V as [k(D) v(D)] in the dtype; a partial attention
// result as [row max, row sum, acc(D)] in fp32; the backward's query side as [lse, delta, q(D),
// dO(D)]. wire_records() (decomposition.hpp) gives their sizes, which the cost model charges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"

namespace a2d::algorithms {

// Points a kernel call's progress callback at `comm`: while the kernel runs, MPI advances the
// transfers in flight (it progresses only inside MPI calls) and the watchdog sees this rank alive.
template <typename Call>
void progress_through(Call& call, Communicator& comm) {
  call.progress = [](void* context) { static_cast<Communicator*>(context)->progress(); };
  call.progress_context = &comm;
}

// A kernel call (ForwardCall or BackwardCall) of `problem` on q_tokens x kv_tokens rows with K, V
// and the positions set, progressing `comm`: what every call of the algorithms shares. The caller
// sets the query side (Q; dO, LSE, delta or O).
template <typename Call>
Call kernel_call(const Problem& problem, const Plan& plan, Communicator& comm, int64_t q_tokens,
                 Place q_positions, const TokenTensor& k, const TokenTensor& v, int64_t kv_tokens,
                 Place kv_positions) {
  Call call;
  call.shape = problem.local_shape(q_tokens, kv_tokens);
  call.mask = problem.mask;
  call.scale = problem.softmax_scale();
  call.softcap = problem.softcap;
  call.k = k;
  call.v = v;
  call.q_positions = q_positions;
  call.kv_positions = kv_positions;
  call.threads = plan.threads;
  progress_through(call, comm);
  return call;
}

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));
constexpr int64_t kIndexBytes = static_cast<int64_t>(sizeof(int64_t));

struct RecordLayout {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t record = 1;  // bytes per (token, batch, head)

  int64_t per_token() const { return batch * heads * record; }
  int64_t bytes(int64_t tokens) const { return tokens * per_token(); }

  // The [batch, tokens, heads, width] field of `dtype` at byte `field` of each record, for the
  // records that start `at` bytes into `buffer`.
  TokenTensor tokens(Buffer& buffer, int64_t at, int64_t field, DType dtype) const {
    const int64_t e = dtype_bytes(dtype);
    A2D_REQUIRE(record % e == 0 && field % e == 0, "a record of ", record, " bytes cannot hold ",
                dtype_name(dtype), " at byte ", field);
    return {&buffer, at + field, dtype, heads * record / e, batch * heads * record / e, record / e};
  }
  // The [batch, heads, tokens] fp32 statistic at byte `field` of each record.
  RowTensor rows(Buffer& buffer, int64_t at, int64_t field) const {
    A2D_REQUIRE(record % kFloatBytes == 0 && field % kFloatBytes == 0, "a record of ", record,
                " bytes cannot hold an fp32 statistic at byte ", field);
    return {&buffer, at + field, heads * record / kFloatBytes, record / kFloatBytes,
            batch * heads * record / kFloatBytes};
  }
};

// The online-softmax state stored as [row max, row sum, acc(D)] fp32 records.
inline PartialTensor partial_records(const RecordLayout& rec, Buffer& buffer, int64_t at) {
  return {rec.tokens(buffer, at, 2 * kFloatBytes, DType::f32), rec.rows(buffer, at, 0),
          rec.rows(buffer, at, kFloatBytes)};
}

// Token counts times a per-token size (bytes or records per token).
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
// The order, its inverse and the positions live on the host (for the cost model and the tests)
// and, once attach() has been called, in buffers of a backend (for its operations).
// Whether gathered rows are sorted by position before the kernel: under any mask that hides
// pairs, sorted positions let whole tiles be skipped.
inline bool sort_by_position(const Mask& mask) {
  return mask.hides_pairs();
}

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
  int64_t tokens() const { return static_cast<int64_t>(positions.size()); }

  // Uploads positions, order and inverse to `backend`.
  void attach(Backend& backend) {
    backend_ = &backend;
    positions_at_ = upload_indices(backend, positions);
    if (identity()) return;
    order_at_ = upload_indices(backend, order);
    inverse_at_ = upload_indices(backend, inverse);
  }
  // The sorted positions in the backend's memory.
  Place device_positions() const { return Place::in(*positions_at_); }

  // In place, `token_bytes` per token at `rows`: sorted[j] = gathered[order[j]].
  void sort(Place rows, int64_t token_bytes) const {
    if (!identity()) backend_->permute_tokens(rows, tokens(), token_bytes, Place::in(*order_at_));
  }
  // The inverse: gathered[i] = sorted[inverse[i]].
  void unsort(Place rows, int64_t token_bytes) const {
    if (!identity()) backend_->permute_tokens(rows, tokens(), token_bytes, Place::in(*inverse_at_));
  }

 private:
  Backend* backend_ = nullptr;
  std::shared_ptr<Buffer> positions_at_, order_at_, inverse_at_;
};

}  // namespace a2d::algorithms
