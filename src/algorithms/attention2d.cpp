// ATTENTION2D (V. Elango, arXiv 2503.15758) over the communicator interface: the no-overlap
// variant (paper's Algorithm 1) and the overlapped variant (Algorithms 4-6), forward and a derived
// backward for each. docs/attention2d.md describes both with their communication volumes.
//
// Shards are cyclic over world ranks: rank q holds tokens t with t mod P == q. On p(r, c):
//   row gather    Q of the row's ranks    -> tokens t mod R == r       (q_rows_ = N/R rows)
//   column gather K/V of the column       -> tokens t mod C == c after the K/V transpose
//                                            (kv_rows_ = N/C rows)
//   local kernel  (N/R) x (N/C) block, masked by global positions
//   row merge     reduce-scatter of partial results back to each rank's own tokens
#include <algorithm>
#include <numeric>
#include <vector>

#include "algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "records.hpp"

namespace a2d::algorithms {
namespace {

// Tags keep concurrent point-to-point streams between the same ranks apart.
enum Tag : int { kTagTranspose = 1, kTagKv = 2, kTagQ = 3, kTagPartial = 4, kTagDkv = 5 };

class Attention2D final : public Attention2DWithDelta {
 public:
  Attention2D(const Problem& problem, const Plan& plan, Communicator& world, Backend& backend)
      : problem_(problem),
        plan_(plan),
        backend_(backend),
        grid_(private_communicator(world, backend), plan.grid),
        layout_(LayoutKind::cyclic, problem.seq, plan.grid.size()) {
    const Attention2DRank at = attention2d_rank(problem_, plan_, grid_.rank());
    own_tokens_ = at.own_tokens;
    row_counts_ = at.row_counts;
    col_counts_ = at.col_counts;
    row_offsets_ = prefix_offsets(row_counts_);
    col_offsets_ = prefix_offsets(col_counts_);
    q_rows_ = row_offsets_.back();
    kv_rows_ = col_offsets_.back();
    kv_source_ = at.kv_source;
    kv_dest_ = at.kv_dest;
    // The gathered rows' positions in the backend's memory, in gathered order (the overlapped
    // variant's per-part calls) and sorted by position where a mask can hide tiles (records.hpp).
    q_positions_ = upload_indices(backend_, at.q_positions);
    kv_positions_ = upload_indices(backend_, at.kv_positions);
    q_order_ = TokenOrder(at.q_positions, sort_by_position(problem_.mask));
    kv_order_ = TokenOrder(at.kv_positions, sort_by_position(problem_.mask));
    q_order_.attach(backend_);
    kv_order_.attach(backend_);

    const int64_t b = problem_.batch, h = problem_.heads, hkv = problem_.kv_heads;
    const WireRecords wire = wire_records(problem_);
    q_rec_ = {b, h, wire.q};
    kv_rec_ = {b, hkv, wire.kv};
    partial_rec_ = {b, h, wire.partial};
    q_back_rec_ = {b, h, wire.q_backward};
    dq_rec_ = {b, h, wire.dq};
    dkv_rec_ = {b, hkv, wire.dkv};
    dkv_final_rec_ = {b, hkv, wire.dkv_final};
  }

  const Problem& problem() const override { return problem_; }
  const Plan& plan() const override { return plan_; }
  const TokenLayout& layout() const override { return layout_; }
  Backend& backend() const override { return backend_; }

  void forward(const ForwardShards& shards) override {
    check_shard_types(problem_, backend_, shards);
    if (plan_.algorithm == Algorithm::attention2d_overlap) {
      forward_overlapped(shards);
    } else {
      forward_no_overlap(shards);
    }
  }

  void backward(const BackwardShards& shards) override {
    check_shard_types(problem_, backend_, shards);
    backward_rows(shards, nullptr);
  }

  void backward_with_delta(const BackwardShards& shards, const RowTensor& delta) override {
    BackwardShards checked = shards;
    checked.out = shards.d_out;  // not read
    check_shard_types(problem_, backend_, checked);
    backward_rows(shards, &delta);
  }

 private:
  // delta: rowsum(dO * O) of the rank's rows, or nullptr to compute it from O.
  void backward_rows(const BackwardShards& shards, const RowTensor* delta) {
    if (plan_.algorithm == Algorithm::attention2d_overlap) {
      backward_overlapped(shards, delta);
    } else {
      backward_no_overlap(shards, delta);
    }
  }

  int row() const { return grid_.row(); }
  int col() const { return grid_.col(); }
  int64_t head_dim() const { return problem_.head_dim; }
  DType dtype() const { return problem_.dtype; }
  int64_t tensor_bytes() const { return head_dim() * dtype_bytes(dtype()); }  // one row, dtype
  TokenBlock q_block(int64_t tokens) const {
    return {problem_.batch, tokens, problem_.heads, head_dim()};
  }
  TokenBlock kv_block(int64_t tokens) const {
    return {problem_.batch, tokens, problem_.kv_heads, head_dim()};
  }

  // Record fields (records.hpp): the records start `at` bytes into the buffer.
  TokenTensor q_field(Buffer& buffer, int64_t at) const {
    return q_rec_.tokens(buffer, at, 0, dtype());
  }
  TokenTensor k_field(Buffer& buffer, int64_t at) const {
    return kv_rec_.tokens(buffer, at, 0, dtype());
  }
  TokenTensor v_field(Buffer& buffer, int64_t at) const {
    return kv_rec_.tokens(buffer, at, tensor_bytes(), dtype());
  }
  // [lse, delta, q(D), dO(D)]
  RowTensor lse_field(Buffer& buffer, int64_t at) const { return q_back_rec_.rows(buffer, at, 0); }
  RowTensor delta_field(Buffer& buffer, int64_t at) const {
    return q_back_rec_.rows(buffer, at, kFloatBytes);
  }
  TokenTensor back_q_field(Buffer& buffer, int64_t at) const {
    return q_back_rec_.tokens(buffer, at, 2 * kFloatBytes, dtype());
  }
  TokenTensor back_do_field(Buffer& buffer, int64_t at) const {
    return q_back_rec_.tokens(buffer, at, 2 * kFloatBytes + tensor_bytes(), dtype());
  }
  TokenTensor dq_field(Buffer& buffer, int64_t at) const {
    return dq_rec_.tokens(buffer, at, 0, DType::f32);
  }
  TokenTensor dk_field(Buffer& buffer, int64_t at) const {
    return dkv_rec_.tokens(buffer, at, 0, DType::f32);
  }
  TokenTensor dv_field(Buffer& buffer, int64_t at) const {
    return dkv_rec_.tokens(buffer, at, head_dim() * kFloatBytes, DType::f32);
  }

  // Positions of the gathered rows from token `first` on, in gathered order.
  Place q_positions_from(int64_t first) const {
    return Place::in(*q_positions_, first * kIndexBytes);
  }
  Place kv_positions_from(int64_t first) const {
    return Place::in(*kv_positions_, first * kIndexBytes);
  }
  // Byte offset of K/V part `slot` in a gathered K/V (or dK/dV) record buffer.
  int64_t kv_slot(const RecordLayout& rec, int slot) const {
    return rec.bytes(col_offsets_[static_cast<size_t>(slot)]);
  }

  // K and V of this rank's shard, packed as [k v] records and moved to where the column gathers
  // want them (the paper's transpose), into `buffer` at byte `slot` (this rank's column part).
  void place_kv(const TokenTensor& k, const TokenTensor& v, const std::string& phase,
                Buffer& buffer, int64_t slot) {
    BufferPtr own = backend_.allocate(kv_rec_.bytes(own_tokens_));
    backend_.copy_tokens(k, k_field(*own, 0), kv_block(own_tokens_));
    backend_.copy_tokens(v, v_field(*own, 0), kv_block(own_tokens_));
    grid_.world().set_phase(phase + ".kv_transpose");
    grid_.world().send_recv(
        Place::in(*own), kv_rec_.bytes(own_tokens_), kv_dest_, Place::in(buffer, slot),
        kv_rec_.bytes(col_counts_[static_cast<size_t>(row())]), kv_source_, kTagTranspose);
  }

  // Sends this rank's dK, dV part (fp32 sums, complete) back to the rank that owns those tokens,
  // rounded to the dtype first, and unpacks its own into the shards.
  void return_dkv(Buffer& dkv_part, int64_t at, const std::string& phase, const TokenTensor& dk,
                  const TokenTensor& dv) {
    const int64_t part = col_counts_[static_cast<size_t>(row())];
    BufferPtr rounded;
    Buffer* outgoing = &dkv_part;
    if (dtype() != DType::f32) {
      rounded = backend_.allocate(dkv_final_rec_.bytes(part));
      backend_.copy_tokens(dkv_rec_.tokens(dkv_part, at, 0, DType::f32),
                           dkv_final_rec_.tokens(*rounded, 0, 0, dtype()),
                           {problem_.batch, part, problem_.kv_heads, 2 * head_dim()});
      outgoing = rounded.get();
      at = 0;
    }
    BufferPtr own = backend_.allocate(dkv_final_rec_.bytes(own_tokens_));
    grid_.world().set_phase(phase + ".dkv_transpose");
    grid_.world().send_recv(Place::in(*outgoing, at), dkv_final_rec_.bytes(part), kv_source_,
                            Place::in(*own), dkv_final_rec_.bytes(own_tokens_), kv_dest_,
                            kTagTranspose);
    backend_.copy_tokens(dkv_final_rec_.tokens(*own, 0, 0, dtype()), dk, kv_block(own_tokens_));
    backend_.copy_tokens(dkv_final_rec_.tokens(*own, 0, tensor_bytes(), dtype()), dv,
                         kv_block(own_tokens_));
  }

  ForwardCall forward_call(const TokenTensor& q, int64_t q_tokens, Place q_pos, Buffer& kv,
                           int64_t kv_at, int64_t kv_tokens, Place kv_pos) {
    auto call = kernel_call<ForwardCall>(problem_, plan_, grid_.world(), q_tokens, q_pos,
                                         k_field(kv, kv_at), v_field(kv, kv_at), kv_tokens, kv_pos);
    call.q = q;
    return call;
  }

  void finalize(Buffer& own_partial, const TokenTensor& out, const RowTensor& lse) {
    backend_.finalize({problem_.batch, own_tokens_, problem_.heads, head_dim()},
                      partial_records(partial_rec_, own_partial, 0), out, lse);
  }

  // Q-side records of the backward: [lse delta q(D) dO(D)] for this rank's rows, at byte `at`;
  // delta computed from O unless given.
  void pack_backward_rows(const BackwardShards& s, const RowTensor* delta, Buffer& buffer,
                          int64_t at) {
    backend_.copy_tokens(s.q, back_q_field(buffer, at), q_block(own_tokens_));
    backend_.copy_tokens(s.d_out, back_do_field(buffer, at), q_block(own_tokens_));
    backend_.copy_rows(s.lse, lse_field(buffer, at), problem_.batch, problem_.heads, own_tokens_);
    if (delta) {
      backend_.copy_rows(*delta, delta_field(buffer, at), problem_.batch, problem_.heads,
                         own_tokens_);
    } else {
      backend_.delta({problem_.batch, own_tokens_, problem_.heads, head_dim()}, s.out, s.d_out,
                     delta_field(buffer, at));
    }
  }

  // dQ (fp32 [dq] records at dq_at) and dK, dV (fp32 [dk dv] records at dkv_at) of Q-side records
  // against K/V records. accumulate: add to the gradient buffers instead of overwriting them.
  void kernel_backward(Buffer& q_back, int64_t q_at, int64_t q_tokens, Place q_pos, Buffer& kv,
                       int64_t kv_at, int64_t kv_tokens, Place kv_pos, Buffer& dq, int64_t dq_at,
                       Buffer& dkv, int64_t dkv_at, bool accumulate) {
    auto call =
        kernel_call<BackwardCall>(problem_, plan_, grid_.world(), q_tokens, q_pos,
                                  k_field(kv, kv_at), v_field(kv, kv_at), kv_tokens, kv_pos);
    call.q = back_q_field(q_back, q_at);
    call.d_out = back_do_field(q_back, q_at);
    call.lse = lse_field(q_back, q_at);
    call.delta = delta_field(q_back, q_at);
    call.accumulate = accumulate;
    backend_.attention_backward(call, dq_field(dq, dq_at), dk_field(dkv, dkv_at),
                                dv_field(dkv, dkv_at));
  }

  // ---- ATTENTION2D-NO -------------------------------------------------------------------------

  void forward_no_overlap(const ForwardShards& s) {
    Communicator& row_comm = grid_.row_comm();
    Communicator& col_comm = grid_.col_comm();
    BufferPtr kv = backend_.allocate(kv_rec_.bytes(kv_rows_));
    BufferPtr q = backend_.allocate(q_rec_.bytes(q_rows_));
    const int64_t kv_at = kv_slot(kv_rec_, row());
    const int64_t q_at = q_rec_.bytes(row_offsets_[static_cast<size_t>(col())]);

    // 1. K/V into the column layout; 2, 3. column gather of K/V and row gather of Q, together.
    place_kv(s.k, s.v, "forward", *kv, kv_at);
    backend_.copy_tokens(s.q, q_field(*q, q_at), q_block(own_tokens_));
    // Blocking collectives one after the other: nothing is computed meanwhile, and MPI's
    // blocking algorithms (ring, neighbour exchange) beat its non-blocking ones on large data
    // (docs/benchmarks.md).
    col_comm.set_phase("forward.kv_allgather");
    col_comm.all_gather(Place::in(*kv, kv_at), Place::in(*kv),
                        scaled(col_counts_, kv_rec_.per_token()));
    row_comm.set_phase("forward.q_allgather");
    row_comm.all_gather(Place::in(*q, q_at), Place::in(*q),
                        scaled(row_counts_, q_rec_.per_token()));

    // 4. The (N/R) x (N/C) block, on the gathered rows sorted by position.
    grid_.world().set_phase("forward.kernel");
    q_order_.sort(Place::in(*q), q_rec_.per_token());
    kv_order_.sort(Place::in(*kv), kv_rec_.per_token());
    BufferPtr partial = backend_.allocate(partial_rec_.bytes(q_rows_));
    backend_.attention_forward_partial(
        forward_call(q_field(*q, 0), q_rows_, q_order_.device_positions(), *kv, 0, kv_rows_,
                     kv_order_.device_positions()),
        partial_records(partial_rec_, *partial, 0), false);
    q_order_.unsort(Place::in(*partial), partial_rec_.per_token());

    // 5. Merge along the row; each rank keeps its own tokens. 6. Normalise.
    BufferPtr own = backend_.allocate(partial_rec_.bytes(own_tokens_));
    row_comm.set_phase("forward.merge_reduce_scatter");
    row_comm.merge_scatter(Place::in(*partial), Place::in(*own),
                           scaled(row_counts_, problem_.batch * problem_.heads),
                           partial_rec_.record / kFloatBytes, backend_);
    finalize(*own, s.out, s.lse);
  }

  void backward_no_overlap(const BackwardShards& s, const RowTensor* delta) {
    Communicator& row_comm = grid_.row_comm();
    Communicator& col_comm = grid_.col_comm();
    BufferPtr q_back = backend_.allocate(q_back_rec_.bytes(q_rows_));
    BufferPtr kv = backend_.allocate(kv_rec_.bytes(kv_rows_));
    const int64_t q_at = q_back_rec_.bytes(row_offsets_[static_cast<size_t>(col())]);
    const int64_t kv_at = kv_slot(kv_rec_, row());

    pack_backward_rows(s, delta, *q_back, q_at);
    place_kv(s.k, s.v, "backward", *kv, kv_at);
    row_comm.set_phase("backward.q_allgather");
    row_comm.all_gather(Place::in(*q_back, q_at), Place::in(*q_back),
                        scaled(row_counts_, q_back_rec_.per_token()));
    col_comm.set_phase("backward.kv_allgather");
    col_comm.all_gather(Place::in(*kv, kv_at), Place::in(*kv),
                        scaled(col_counts_, kv_rec_.per_token()));

    BufferPtr dq = backend_.allocate(dq_rec_.bytes(q_rows_));
    BufferPtr dkv = backend_.allocate(dkv_rec_.bytes(kv_rows_));
    grid_.world().set_phase("backward.kernel");
    q_order_.sort(Place::in(*q_back), q_back_rec_.per_token());
    kv_order_.sort(Place::in(*kv), kv_rec_.per_token());
    kernel_backward(*q_back, 0, q_rows_, q_order_.device_positions(), *kv, 0, kv_rows_,
                    kv_order_.device_positions(), *dq, 0, *dkv, 0, false);
    q_order_.unsort(Place::in(*dq), dq_rec_.per_token());
    kv_order_.unsort(Place::in(*dkv), dkv_rec_.per_token());

    // dQ summed along the row back to each rank's tokens; dK, dV along the column, then back
    // through the transpose. Sums in fp32, rounded once at the end.
    BufferPtr dq_own = backend_.allocate(dq_rec_.bytes(own_tokens_));
    row_comm.set_phase("backward.dq_reduce_scatter");
    row_comm.reduce_scatter(Place::in(*dq), Place::in(*dq_own),
                            scaled(row_counts_, problem_.batch * problem_.heads),
                            dq_rec_.record / kFloatBytes, Reduction::sum);
    BufferPtr dkv_part = backend_.allocate(dkv_rec_.bytes(col_counts_[static_cast<size_t>(row())]));
    col_comm.set_phase("backward.dkv_reduce_scatter");
    col_comm.reduce_scatter(Place::in(*dkv), Place::in(*dkv_part),
                            scaled(col_counts_, problem_.batch * problem_.kv_heads),
                            dkv_rec_.record / kFloatBytes, Reduction::sum);
    backend_.copy_tokens(dq_field(*dq_own, 0), s.dq, q_block(own_tokens_));
    return_dkv(*dkv_part, 0, "backward", s.dk, s.dv);
  }

  // ---- ATTENTION2D-O ---------------------------------------------------------------------------
  //
  // Phase A (column ring, R steps): K/V parts travel around the column; each step attends this
  // rank's own queries to the part that just arrived while the next one is in flight. The parts
  // land in their slots of the gathered K/V buffer.
  // Phase B (row ring, C - 1 steps): Q parts travel around the row (prefetched during phase A);
  // each step attends the visiting part to the gathered K/V, merges the partial result that
  // arrives for the same part from the left neighbour and passes it on to the right. After the
  // last step each rank receives the merged partial of its own part and merges phase A's result.
  // Every rank sends exactly what the no-overlap variant's collectives are charged
  // (docs/attention2d.md), as point-to-point messages overlapped with the kernel.

  // Offsets of ring step `step`'s K/V part in the gathered buffer: the part of column position
  // (r - step) mod R.
  int kv_slot_at(int step) const {
    const int rows = plan_.grid.rows;
    return ((row() - step) % rows + rows) % rows;
  }
  int q_part_at(int step) const {
    const int cols = plan_.grid.cols;
    return ((col() - step) % cols + cols) % cols;
  }

  // Runs the column ring over the K/V buffer; `work(slot)` computes with the part in `slot`
  // while the next part travels.
  template <typename Work>
  void column_ring(Buffer& kv, const std::string& phase, Work&& work) {
    Communicator& col_comm = grid_.col_comm();
    const int rows = plan_.grid.rows;
    const int next = (row() + 1) % rows, prev = (row() - 1 + rows) % rows;
    for (int step = 0; step < rows; ++step) {
      const int slot = kv_slot_at(step);
      RequestPtr shift = completed_request();
      if (step + 1 < rows) {
        const int incoming = kv_slot_at(step + 1);
        col_comm.set_phase(phase + ".kv_ring");
        shift = col_comm.send_recv_async(Place::in(kv, kv_slot(kv_rec_, slot)),
                                         kv_rec_.bytes(col_counts_[slot]), next,
                                         Place::in(kv, kv_slot(kv_rec_, incoming)),
                                         kv_rec_.bytes(col_counts_[incoming]), prev, kTagKv);
      }
      work(slot);
      col_comm.set_phase(phase + ".kv_ring");
      shift->wait();
    }
  }

  // The Q-side ring of phase B: parts of `rec` records travel to the right. Starts the first
  // shift (own part out, left neighbour's in) so it overlaps phase A.
  struct QRing {
    BufferPtr buffers[2];
    int current = 0;
    RequestPtr inflight;
  };

  void start_q_ring(QRing& ring, const RecordLayout& rec, Buffer& own_part,
                    const std::string& phase) {
    const int cols = plan_.grid.cols;
    if (cols == 1) return;
    const int64_t largest = *std::max_element(row_counts_.begin(), row_counts_.end());
    for (auto& buffer : ring.buffers)
      buffer = backend_.allocate(rec.bytes(largest));
    Communicator& row_comm = grid_.row_comm();
    row_comm.set_phase(phase + ".q_ring");
    const int first = q_part_at(1);
    ring.inflight =
        row_comm.send_recv_async(Place::in(own_part), rec.bytes(row_counts_[col()]),
                                 (col() + 1) % cols, Place::in(*ring.buffers[0]),
                                 rec.bytes(row_counts_[first]), (col() - 1 + cols) % cols, kTagQ);
  }

  // Waits for step `step`'s Q part and forwards it while the caller computes with it.
  Buffer& advance_q_ring(QRing& ring, const RecordLayout& rec, int step, const std::string& phase) {
    const int cols = plan_.grid.cols;
    Communicator& row_comm = grid_.row_comm();
    row_comm.set_phase(phase + ".q_ring");
    ring.inflight->wait();
    const int part = q_part_at(step);
    Buffer& here = *ring.buffers[ring.current];
    if (step + 1 < cols) {
      const int incoming = q_part_at(step + 1);
      ring.inflight = row_comm.send_recv_async(
          Place::in(here), rec.bytes(row_counts_[part]), (col() + 1) % cols,
          Place::in(*ring.buffers[1 - ring.current]), rec.bytes(row_counts_[incoming]),
          (col() - 1 + cols) % cols, kTagQ);
      ring.current = 1 - ring.current;
    }
    return here;
  }

  void forward_overlapped(const ForwardShards& s) {
    const int cols = plan_.grid.cols;
    BufferPtr kv = backend_.allocate(kv_rec_.bytes(kv_rows_));
    BufferPtr q_own = backend_.allocate(q_rec_.bytes(own_tokens_));
    backend_.copy_tokens(s.q, q_field(*q_own, 0), q_block(own_tokens_));
    place_kv(s.k, s.v, "forward", *kv, kv_slot(kv_rec_, row()));

    QRing q_ring;
    start_q_ring(q_ring, q_rec_, *q_own, "forward");

    // Phase A: own queries against each K/V part of the column.
    BufferPtr own_partial = backend_.allocate(partial_rec_.bytes(own_tokens_));
    const PartialTensor own_state = partial_records(partial_rec_, *own_partial, 0);
    const Place own_positions = q_positions_from(row_offsets_[static_cast<size_t>(col())]);
    column_ring(*kv, "forward", [&](int slot) {
      grid_.world().set_phase("forward.kernel");
      backend_.attention_forward_partial(
          forward_call(q_field(*q_own, 0), own_tokens_, own_positions, *kv, kv_slot(kv_rec_, slot),
                       col_counts_[slot], kv_positions_from(col_offsets_[slot])),
          own_state, /*accumulate=*/slot != row());
    });

    // Phase B: visiting Q parts against the gathered K/V (sorted by position); partial results
    // travel right.
    grid_.world().set_phase("forward.kernel");
    if (cols > 1) kv_order_.sort(Place::in(*kv), kv_rec_.per_token());
    Communicator& row_comm = grid_.row_comm();
    const int next = (col() + 1) % cols, prev = (col() - 1 + cols) % cols;
    const int64_t largest = *std::max_element(row_counts_.begin(), row_counts_.end());
    BufferPtr computed[2], incoming = backend_.allocate(partial_rec_.bytes(largest));
    for (auto& buffer : computed)
      buffer = backend_.allocate(partial_rec_.bytes(largest));
    RequestPtr partial_out = completed_request();
    const int64_t rows_per_token = problem_.batch * problem_.heads;
    const int64_t record_floats = partial_rec_.record / kFloatBytes;
    for (int step = 1; step < cols; ++step) {
      const int part = q_part_at(step);
      Buffer& q_part = advance_q_ring(q_ring, q_rec_, step, "forward");
      RequestPtr partial_in = completed_request();
      if (step >= 2) {
        row_comm.set_phase("forward.partial_ring");
        partial_in =
            row_comm.send_recv_async({}, 0, next, Place::in(*incoming),
                                     partial_rec_.bytes(row_counts_[part]), prev, kTagPartial);
      }
      Buffer& result = *computed[step % 2];
      grid_.world().set_phase("forward.kernel");
      backend_.attention_forward_partial(
          forward_call(q_field(q_part, 0), row_counts_[part], q_positions_from(row_offsets_[part]),
                       *kv, 0, kv_rows_, kv_order_.device_positions()),
          partial_records(partial_rec_, result, 0), false);
      row_comm.set_phase("forward.partial_ring");
      partial_in->wait();
      if (step >= 2) {
        backend_.merge_partials(Place::in(result), Place::in(*incoming),
                                row_counts_[part] * rows_per_token, record_floats);
      }
      partial_out->wait();  // the buffer sent two steps ago is free again
      row_comm.set_phase("forward.partial_ring");
      partial_out = row_comm.send_recv_async(
          Place::in(result), partial_rec_.bytes(row_counts_[part]), next, {}, 0, prev, kTagPartial);
    }
    if (cols > 1) {
      // The merged partial of this rank's own part comes back from the left.
      row_comm.set_phase("forward.partial_ring");
      row_comm.send_recv({}, 0, next, Place::in(*incoming), partial_rec_.bytes(own_tokens_), prev,
                         kTagPartial);
      partial_out->wait();
      backend_.merge_partials(Place::in(*own_partial), Place::in(*incoming),
                              own_tokens_ * rows_per_token, record_floats);
    }
    finalize(*own_partial, s.out, s.lse);
  }

  // dK, dV summed along the column by a ring that runs beside the last pass over the K/V parts:
  // step k (1 <= k < R) sends the sum for part (r - k) mod R (this rank's share of it complete,
  // plus what arrived for it at step k - 1) to the next rank of the column and receives the sum
  // for part (r - k - 1); after R - 1 steps the sum for the rank's own part arrives. The bytes and
  // messages are those of a ring reduce-scatter (docs/attention2d.md).
  class DkvRing {
   public:
    DkvRing(Attention2D& at, Buffer& dkv) : at_(at), dkv_(dkv) {
      const int rows = at_.plan_.grid.rows;
      if (rows > 1) {
        const int64_t largest = *std::max_element(at_.col_counts_.begin(), at_.col_counts_.end());
        incoming_ = at_.backend_.allocate(at_.dkv_rec_.bytes(largest));
      }
    }
    // This rank's share of the part in `slot` is complete: the next step of the ring.
    void send(int slot) {
      const int rows = at_.plan_.grid.rows;
      Communicator& col_comm = at_.grid_.col_comm();
      col_comm.set_phase("backward.dkv_ring");
      const Place part = Place::in(dkv_, at_.kv_slot(at_.dkv_rec_, slot));
      const int64_t bytes = at_.dkv_rec_.bytes(at_.col_counts_[static_cast<size_t>(slot)]);
      if (steps_ > 0) {
        step_->wait();
        at_.backend_.add(part, Place::in(*incoming_), bytes / kFloatBytes);
      }
      const int arriving = (slot - 1 + rows) % rows;
      step_ = col_comm.send_recv_async(
          part, bytes, (at_.row() + 1) % rows, Place::in(*incoming_),
          at_.dkv_rec_.bytes(at_.col_counts_[static_cast<size_t>(arriving)]),
          (at_.row() - 1 + rows) % rows, kTagDkv);
      ++steps_;
    }
    // After the last step: the sum for the rank's own part, in its slot (byte offset returned).
    int64_t finish() {
      const int own = at_.row();
      const int64_t at = at_.kv_slot(at_.dkv_rec_, own);
      if (steps_ > 0) {
        at_.grid_.col_comm().set_phase("backward.dkv_ring");
        step_->wait();
        at_.backend_.add(
            Place::in(dkv_, at), Place::in(*incoming_),
            at_.dkv_rec_.bytes(at_.col_counts_[static_cast<size_t>(own)]) / kFloatBytes);
      }
      return at;
    }

   private:
    Attention2D& at_;
    Buffer& dkv_;
    BufferPtr incoming_;
    RequestPtr step_ = completed_request();
    int steps_ = 0;
  };

  void backward_overlapped(const BackwardShards& s, const RowTensor* delta) {
    const int rows = plan_.grid.rows, cols = plan_.grid.cols;
    BufferPtr kv = backend_.allocate(kv_rec_.bytes(kv_rows_));
    BufferPtr q_own = backend_.allocate(q_back_rec_.bytes(own_tokens_));
    pack_backward_rows(s, delta, *q_own, 0);
    place_kv(s.k, s.v, "backward", *kv, kv_slot(kv_rec_, row()));

    QRing q_ring;
    start_q_ring(q_ring, q_back_rec_, *q_own, "backward");

    // Phase A: own Q-side rows against each K/V part; dK, dV land in the part's slot. With one
    // column there is no phase B: a part's dK, dV are complete after its step, and the column
    // sum runs beside the remaining steps.
    BufferPtr dq_own = backend_.allocate(dq_rec_.bytes(own_tokens_));
    BufferPtr dkv = backend_.allocate(dkv_rec_.bytes(kv_rows_));
    backend_.fill_zero(Place::in(*dq_own), dq_own->bytes());
    backend_.fill_zero(Place::in(*dkv), dkv->bytes());
    DkvRing dkv_ring(*this, *dkv);
    const Place own_positions = q_positions_from(row_offsets_[static_cast<size_t>(col())]);
    column_ring(*kv, "backward", [&](int slot) {
      grid_.world().set_phase("backward.kernel");
      kernel_backward(*q_own, 0, own_tokens_, own_positions, *kv, kv_slot(kv_rec_, slot),
                      col_counts_[slot], kv_positions_from(col_offsets_[slot]), *dq_own, 0, *dkv,
                      kv_slot(dkv_rec_, slot), true);
      if (cols == 1 && slot != row()) dkv_ring.send(slot);
    });

    // Phase B: visiting Q-side parts against all K/V (sorted by position, with their dK, dV);
    // their dQ travels right and is summed. The last step attends its part to the K/V parts one
    // at a time, in the column ring's order, so that the column sum of dK, dV runs beside it.
    Communicator& row_comm = grid_.row_comm();
    const int next = (col() + 1) % cols, prev = (col() - 1 + cols) % cols;
    if (cols > 1) {
      grid_.world().set_phase("backward.kernel");
      kv_order_.sort(Place::in(*kv), kv_rec_.per_token());
      kv_order_.sort(Place::in(*dkv), dkv_rec_.per_token());
    }
    const int64_t largest = *std::max_element(row_counts_.begin(), row_counts_.end());
    BufferPtr computed[2], incoming = backend_.allocate(dq_rec_.bytes(largest));
    for (auto& buffer : computed)
      buffer = backend_.allocate(dq_rec_.bytes(largest));
    RequestPtr dq_out = completed_request();
    for (int step = 1; step < cols; ++step) {
      const int part = q_part_at(step);
      Buffer& q_part = advance_q_ring(q_ring, q_back_rec_, step, "backward");
      RequestPtr dq_in = completed_request();
      const int64_t part_bytes = dq_rec_.bytes(row_counts_[part]);
      if (step >= 2) {
        row_comm.set_phase("backward.dq_ring");
        dq_in = row_comm.send_recv_async({}, 0, next, Place::in(*incoming), part_bytes, prev,
                                         kTagPartial);
      }
      dq_out->wait();  // computed[step % 2] was sent two steps ago
      Buffer& result = *computed[step % 2];
      backend_.fill_zero(Place::in(result), part_bytes);
      grid_.world().set_phase("backward.kernel");
      const Place part_positions = q_positions_from(row_offsets_[part]);
      if (step + 1 < cols || rows == 1) {
        kernel_backward(q_part, 0, row_counts_[part], part_positions, *kv, 0, kv_rows_,
                        kv_order_.device_positions(), result, 0, *dkv, 0, true);
        if (step + 1 == cols) kv_order_.unsort(Place::in(*dkv), dkv_rec_.per_token());
      } else {
        kv_order_.unsort(Place::in(*kv), kv_rec_.per_token());
        kv_order_.unsort(Place::in(*dkv), dkv_rec_.per_token());
        for (int k = 1; k <= rows; ++k) {
          const int slot = kv_slot_at(k % rows);  // (r - 1), (r - 2), ..., (r + 1), then r
          grid_.world().set_phase("backward.kernel");
          kernel_backward(q_part, 0, row_counts_[part], part_positions, *kv, kv_slot(kv_rec_, slot),
                          col_counts_[slot], kv_positions_from(col_offsets_[slot]), result, 0, *dkv,
                          kv_slot(dkv_rec_, slot), true);
          if (k < rows) dkv_ring.send(slot);
        }
      }
      row_comm.set_phase("backward.dq_ring");
      dq_in->wait();
      if (step >= 2) {
        backend_.add(Place::in(result), Place::in(*incoming), part_bytes / kFloatBytes);
      }
      row_comm.set_phase("backward.dq_ring");
      dq_out =
          row_comm.send_recv_async(Place::in(result), part_bytes, next, {}, 0, prev, kTagPartial);
    }
    if (cols > 1) {
      row_comm.set_phase("backward.dq_ring");
      row_comm.send_recv({}, 0, next, Place::in(*incoming), dq_rec_.bytes(own_tokens_), prev,
                         kTagPartial);
      dq_out->wait();
      backend_.add(Place::in(*dq_own), Place::in(*incoming),
                   dq_rec_.bytes(own_tokens_) / kFloatBytes);
    }
    backend_.copy_tokens(dq_field(*dq_own, 0), s.dq, q_block(own_tokens_));

    // dK, dV of the rank's part, summed along the column, sent home.
    const int64_t own_part_at = dkv_ring.finish();
    return_dkv(*dkv, own_part_at, "backward", s.dk, s.dv);
  }

  Problem problem_;
  Plan plan_;
  Backend& backend_;
  Grid grid_;
  TokenLayout layout_;

  int64_t own_tokens_ = 0;
  std::vector<int64_t> row_counts_, col_counts_;  // tokens of the parts gathered along row / column
  std::vector<int64_t> row_offsets_, col_offsets_;  // prefix sums (tokens)
  BufferPtr q_positions_, kv_positions_;            // positions of the gathered rows (backend)
  TokenOrder q_order_, kv_order_;                   // the gathered rows sorted by position
  int64_t q_rows_ = 0, kv_rows_ = 0;
  int kv_source_ = 0, kv_dest_ = 0;  // K/V transpose partners (world ranks)
  RecordLayout q_rec_, kv_rec_, partial_rec_, q_back_rec_, dq_rec_, dkv_rec_, dkv_final_rec_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_attention2d(const Problem& problem, const Plan& plan,
                                                       Communicator& world, Backend& backend) {
  return std::make_unique<Attention2D>(problem, plan, world, backend);
}

std::unique_ptr<Attention2DWithDelta> make_attention2d_with_delta(const Problem& problem,
                                                                  const Plan& plan,
                                                                  Communicator& world,
                                                                  Backend& backend) {
  return std::make_unique<Attention2D>(problem, plan, world, backend);
}

}  // namespace a2d::algorithms
