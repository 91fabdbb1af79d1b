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

class Attention2D final : public DistributedAttention {
 public:
  Attention2D(const Problem& problem, const Plan& plan, Communicator& world)
      : problem_(problem),
        plan_(plan),
        grid_(world.split(0, world.rank()), plan.grid),
        layout_(LayoutKind::cyclic, problem.seq, plan.grid.size()) {
    const Attention2DRank at = attention2d_rank(problem_, plan_, grid_.rank());
    own_tokens_ = at.own_tokens;
    row_counts_ = at.row_counts;
    col_counts_ = at.col_counts;
    q_positions_ = at.q_positions;
    kv_positions_ = at.kv_positions;
    row_offsets_ = prefix_offsets(row_counts_);
    col_offsets_ = prefix_offsets(col_counts_);
    q_rows_ = row_offsets_.back();
    kv_rows_ = col_offsets_.back();
    kv_source_ = at.kv_source;
    kv_dest_ = at.kv_dest;
    // The kernel works on gathered buffers sorted by position when a mask can hide tiles.
    q_order_ = TokenOrder(q_positions_, problem_.mask.is_causal());
    kv_order_ = TokenOrder(kv_positions_, problem_.mask.is_causal());

    const int64_t b = problem_.batch, h = problem_.heads, hkv = problem_.kv_heads;
    const int64_t d = problem_.head_dim;
    q_rec_ = {b, h, d};
    kv_rec_ = {b, hkv, 2 * d};
    partial_rec_ = {b, h, d + 2};
    q_back_rec_ = {b, h, 2 * d + 2};
  }

  const Problem& problem() const override { return problem_; }
  const Plan& plan() const override { return plan_; }
  const TokenLayout& layout() const override { return layout_; }

  void forward(const ForwardShards& shards) override {
    if (plan_.algorithm == Algorithm::attention2d_overlap) {
      forward_overlapped(shards);
    } else {
      forward_no_overlap(shards);
    }
  }

  void backward(const BackwardShards& shards) override {
    if (plan_.algorithm == Algorithm::attention2d_overlap) {
      backward_overlapped(shards);
    } else {
      backward_no_overlap(shards);
    }
  }

 private:
  int row() const { return grid_.row(); }
  int col() const { return grid_.col(); }
  int64_t head_dim() const { return problem_.head_dim; }

  // K and V of this rank's shard, packed as [k v] records and moved to where the column gathers
  // want them (the paper's transpose), into `slot` (kv_rec_ records of this rank's column part).
  void place_kv(TokenView<const float> k, TokenView<const float> v, const std::string& phase,
                float* slot) {
    const int64_t d = head_dim();
    Floats own(static_cast<size_t>(kv_rec_.floats(own_tokens_)));
    pack(k, own_tokens_, d, kv_rec_, own.data(), 0);
    pack(v, own_tokens_, d, kv_rec_, own.data(), d);
    grid_.world().set_phase(phase + ".kv_transpose");
    grid_.world().send_recv(own.data(), kv_rec_.floats(own_tokens_), kv_dest_, slot,
                            kv_rec_.floats(col_counts_[static_cast<size_t>(row())]), kv_source_,
                            kTagTranspose);
  }

  // Sends this rank's dK, dV part back to the rank that owns those tokens and unpacks its own.
  void return_dkv(const float* dkv_part, const std::string& phase, TokenView<float> dk,
                  TokenView<float> dv) {
    const int64_t d = head_dim();
    Floats own(static_cast<size_t>(kv_rec_.floats(own_tokens_)));
    grid_.world().set_phase(phase + ".dkv_transpose");
    grid_.world().send_recv(dkv_part, kv_rec_.floats(col_counts_[static_cast<size_t>(row())]),
                            kv_source_, own.data(), kv_rec_.floats(own_tokens_), kv_dest_,
                            kTagTranspose);
    unpack(kv_rec_, own.data(), 0, own_tokens_, d, dk);
    unpack(kv_rec_, own.data(), d, own_tokens_, d, dv);
  }

  ForwardArgs kernel_forward_args(const float* q, int64_t q_tokens, const int64_t* q_pos,
                                  const float* kv, int64_t kv_tokens, const int64_t* kv_pos) {
    ForwardArgs args;
    args.shape = problem_.local_shape(q_tokens, kv_tokens);
    args.mask = problem_.mask;
    args.scale = problem_.softmax_scale();
    args.q = q_rec_.tokens(q, 0);
    args.k = kv_rec_.tokens(kv, 0);
    args.v = kv_rec_.tokens(kv, head_dim());
    args.q_positions = q_pos;
    args.kv_positions = kv_pos;
    args.threads = plan_.threads;
    progress_through(args, grid_.world());
    return args;
  }

  PartialView partial_view(float* records) const {
    return {partial_rec_.tokens(records, 2), partial_rec_.rows(records, 0),
            partial_rec_.rows(records, 1)};
  }

  void finalize(float* own_partial, TokenView<float> out, RowView<float> lse) const {
    finalize_partial({problem_.batch, own_tokens_, problem_.heads, head_dim()},
                     partial_view(own_partial), out, lse);
  }

  // Q-side records of the backward: [q(D) dO(D) lse delta] for this rank's rows, into `slot`.
  void pack_backward_rows(const BackwardShards& s, float* slot) const {
    const int64_t d = head_dim();
    pack(s.q, own_tokens_, d, q_back_rec_, slot, 0);
    pack(s.d_out, own_tokens_, d, q_back_rec_, slot, d);
    pack_rows(s.lse, own_tokens_, q_back_rec_, slot, 2 * d);
    compute_delta({problem_.batch, own_tokens_, problem_.heads, d}, s.out, s.d_out,
                  q_back_rec_.rows(slot, 2 * d + 1));
  }

  // dQ (into dq records, D wide) and dK, dV (into [dk dv] records) of Q-side records against
  // K/V records. accumulate: add to the gradient buffers instead of overwriting them.
  void kernel_backward(const float* q_back, int64_t q_tokens, const int64_t* q_pos, const float* kv,
                       int64_t kv_tokens, const int64_t* kv_pos, float* dq, float* dkv,
                       bool accumulate) {
    const int64_t d = head_dim();
    const RecordLayout dq_rec{problem_.batch, problem_.heads, d};
    BackwardArgs args;
    args.shape = problem_.local_shape(q_tokens, kv_tokens);
    args.mask = problem_.mask;
    args.scale = problem_.softmax_scale();
    args.q = q_back_rec_.tokens(q_back, 0);
    args.d_out = q_back_rec_.tokens(q_back, d);
    args.lse = q_back_rec_.rows(q_back, 2 * d);
    args.delta = q_back_rec_.rows(q_back, 2 * d + 1);
    args.k = kv_rec_.tokens(kv, 0);
    args.v = kv_rec_.tokens(kv, d);
    args.q_positions = q_pos;
    args.kv_positions = kv_pos;
    args.threads = plan_.threads;
    progress_through(args, grid_.world());
    args.accumulate = accumulate;
    attention_backward(args, dq_rec.tokens(dq, 0), kv_rec_.tokens(dkv, 0), kv_rec_.tokens(dkv, d));
  }

  // ---- ATTENTION2D-NO -------------------------------------------------------------------------

  void forward_no_overlap(const ForwardShards& s) {
    Communicator& row_comm = grid_.row_comm();
    Communicator& col_comm = grid_.col_comm();
    Floats kv(static_cast<size_t>(kv_rec_.floats(kv_rows_)));
    Floats q(static_cast<size_t>(q_rec_.floats(q_rows_)));
    float* kv_slot = kv.data() + kv_rec_.floats(col_offsets_[static_cast<size_t>(row())]);
    float* q_slot = q.data() + q_rec_.floats(row_offsets_[static_cast<size_t>(col())]);

    // 1. K/V into the column layout; 2, 3. column gather of K/V and row gather of Q, together.
    place_kv(s.k, s.v, "forward", kv_slot);
    pack(s.q, own_tokens_, head_dim(), q_rec_, q_slot, 0);
    // Blocking collectives one after the other: nothing is computed meanwhile, and MPI's
    // blocking algorithms (ring, neighbour exchange) beat its non-blocking ones on large data
    // (docs/benchmarks.md).
    col_comm.set_phase("forward.kv_allgather");
    col_comm.all_gather(kv_slot, kv.data(), scaled(col_counts_, kv_rec_.per_token()));
    row_comm.set_phase("forward.q_allgather");
    row_comm.all_gather(q_slot, q.data(), scaled(row_counts_, q_rec_.per_token()));

    // 4. The (N/R) x (N/C) block, on the gathered rows sorted by position.
    grid_.world().set_phase("forward.kernel");
    q_order_.sort(q, q_rec_.per_token());
    kv_order_.sort(kv, kv_rec_.per_token());
    Floats partial(static_cast<size_t>(partial_rec_.floats(q_rows_)));
    attention_forward_partial(kernel_forward_args(q.data(), q_rows_, q_order_.positions.data(),
                                                  kv.data(), kv_rows_, kv_order_.positions.data()),
                              partial_view(partial.data()), false);
    q_order_.unsort(partial, partial_rec_.per_token());

    // 5. Merge along the row; each rank keeps its own tokens. 6. Normalise.
    Floats own(static_cast<size_t>(partial_rec_.floats(own_tokens_)));
    row_comm.set_phase("forward.merge_reduce_scatter");
    row_comm.reduce_scatter(partial.data(), own.data(),
                            scaled(row_counts_, problem_.batch * problem_.heads),
                            partial_rec_.record, Reduction::attention_merge);
    finalize(own.data(), s.out, s.lse);
  }

  void backward_no_overlap(const BackwardShards& s) {
    const int64_t d = head_dim();
    Communicator& row_comm = grid_.row_comm();
    Communicator& col_comm = grid_.col_comm();
    Floats q_back(static_cast<size_t>(q_back_rec_.floats(q_rows_)));
    Floats kv(static_cast<size_t>(kv_rec_.floats(kv_rows_)));
    float* q_slot = q_back.data() + q_back_rec_.floats(row_offsets_[static_cast<size_t>(col())]);
    float* kv_slot = kv.data() + kv_rec_.floats(col_offsets_[static_cast<size_t>(row())]);

    pack_backward_rows(s, q_slot);
    place_kv(s.k, s.v, "backward", kv_slot);
    row_comm.set_phase("backward.q_allgather");
    row_comm.all_gather(q_slot, q_back.data(), scaled(row_counts_, q_back_rec_.per_token()));
    col_comm.set_phase("backward.kv_allgather");
    col_comm.all_gather(kv_slot, kv.data(), scaled(col_counts_, kv_rec_.per_token()));

    const RecordLayout dq_rec{problem_.batch, problem_.heads, d};
    Floats dq(static_cast<size_t>(dq_rec.floats(q_rows_)));
    Floats dkv(static_cast<size_t>(kv_rec_.floats(kv_rows_)));
    grid_.world().set_phase("backward.kernel");
    q_order_.sort(q_back, q_back_rec_.per_token());
    kv_order_.sort(kv, kv_rec_.per_token());
    kernel_backward(q_back.data(), q_rows_, q_order_.positions.data(), kv.data(), kv_rows_,
                    kv_order_.positions.data(), dq.data(), dkv.data(), false);
    q_order_.unsort(dq, dq_rec.per_token());
    kv_order_.unsort(dkv, kv_rec_.per_token());

    // dQ summed along the row back to each rank's tokens; dK, dV along the column, then back
    // through the transpose.
    Floats dq_own(static_cast<size_t>(dq_rec.floats(own_tokens_)));
    row_comm.set_phase("backward.dq_reduce_scatter");
    row_comm.reduce_scatter(dq.data(), dq_own.data(),
                            scaled(row_counts_, problem_.batch * problem_.heads), d,
                            Reduction::sum);
    Floats dkv_part(static_cast<size_t>(kv_rec_.floats(col_counts_[static_cast<size_t>(row())])));
    col_comm.set_phase("backward.dkv_reduce_scatter");
    col_comm.reduce_scatter(dkv.data(), dkv_part.data(),
                            scaled(col_counts_, problem_.batch * problem_.kv_heads), 2 * d,
                            Reduction::sum);
    unpack(dq_rec, dq_own.data(), 0, own_tokens_, d, s.dq);
    return_dkv(dkv_part.data(), "backward", s.dk, s.dv);
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
  void column_ring(Floats& kv, const std::string& phase, Work&& work) {
    Communicator& col_comm = grid_.col_comm();
    const int rows = plan_.grid.rows;
    const int next = (row() + 1) % rows, prev = (row() - 1 + rows) % rows;
    for (int step = 0; step < rows; ++step) {
      const int slot = kv_slot_at(step);
      RequestPtr shift = completed_request();
      if (step + 1 < rows) {
        const int incoming = kv_slot_at(step + 1);
        col_comm.set_phase(phase + ".kv_ring");
        shift = col_comm.send_recv_async(kv.data() + kv_rec_.floats(col_offsets_[slot]),
                                         kv_rec_.floats(col_counts_[slot]), next,
                                         kv.data() + kv_rec_.floats(col_offsets_[incoming]),
                                         kv_rec_.floats(col_counts_[incoming]), prev, kTagKv);
      }
      work(slot);
      col_comm.set_phase(phase + ".kv_ring");
      shift->wait();
    }
  }

  // The Q-side ring of phase B: parts of `rec` records travel to the right. Starts the first
  // shift (own part out, left neighbour's in) so it overlaps phase A.
  struct QRing {
    Floats buffers[2];
    int current = 0;
    RequestPtr inflight;
  };

  void start_q_ring(QRing& ring, const RecordLayout& rec, const float* own_part,
                    const std::string& phase) {
    const int cols = plan_.grid.cols;
    if (cols == 1) return;
    const int64_t largest = *std::max_element(row_counts_.begin(), row_counts_.end());
    for (auto& buffer : ring.buffers)
      buffer.resize(static_cast<size_t>(rec.floats(largest)));
    Communicator& row_comm = grid_.row_comm();
    row_comm.set_phase(phase + ".q_ring");
    const int first = q_part_at(1);
    ring.inflight = row_comm.send_recv_async(
        own_part, rec.floats(row_counts_[col()]), (col() + 1) % cols, ring.buffers[0].data(),
        rec.floats(row_counts_[first]), (col() - 1 + cols) % cols, kTagQ);
  }

  // Waits for step `step`'s Q part and forwards it while the caller computes with it.
  const float* advance_q_ring(QRing& ring, const RecordLayout& rec, int step,
                              const std::string& phase) {
    const int cols = plan_.grid.cols;
    Communicator& row_comm = grid_.row_comm();
    row_comm.set_phase(phase + ".q_ring");
    ring.inflight->wait();
    const int part = q_part_at(step);
    float* here = ring.buffers[ring.current].data();
    if (step + 1 < cols) {
      const int incoming = q_part_at(step + 1);
      ring.inflight = row_comm.send_recv_async(
          here, rec.floats(row_counts_[part]), (col() + 1) % cols,
          ring.buffers[1 - ring.current].data(), rec.floats(row_counts_[incoming]),
          (col() - 1 + cols) % cols, kTagQ);
      ring.current = 1 - ring.current;
    }
    return here;
  }

  void forward_overlapped(const ForwardShards& s) {
    const int cols = plan_.grid.cols;
    const int64_t d = head_dim();
    Floats kv(static_cast<size_t>(kv_rec_.floats(kv_rows_)));
    Floats q_own(static_cast<size_t>(q_rec_.floats(own_tokens_)));
    pack(s.q, own_tokens_, d, q_rec_, q_own.data(), 0);
    place_kv(s.k, s.v, "forward",
             kv.data() + kv_rec_.floats(col_offsets_[static_cast<size_t>(row())]));

    QRing q_ring;
    start_q_ring(q_ring, q_rec_, q_own.data(), "forward");

    // Phase A: own queries against each K/V part of the column.
    Floats own_partial(static_cast<size_t>(partial_rec_.floats(own_tokens_)));
    const int64_t* own_positions = q_positions_.data() + row_offsets_[static_cast<size_t>(col())];
    column_ring(kv, "forward", [&](int slot) {
      grid_.world().set_phase("forward.kernel");
      attention_forward_partial(
          kernel_forward_args(q_own.data(), own_tokens_, own_positions,
                              kv.data() + kv_rec_.floats(col_offsets_[slot]), col_counts_[slot],
                              kv_positions_.data() + col_offsets_[slot]),
          partial_view(own_partial.data()), /*accumulate=*/slot != row());
    });

    // Phase B: visiting Q parts against the gathered K/V (sorted by position); partial results
    // travel right.
    grid_.world().set_phase("forward.kernel");
    if (cols > 1) kv_order_.sort(kv, kv_rec_.per_token());
    Communicator& row_comm = grid_.row_comm();
    const int next = (col() + 1) % cols, prev = (col() - 1 + cols) % cols;
    const int64_t largest = *std::max_element(row_counts_.begin(), row_counts_.end());
    Floats computed[2], incoming(static_cast<size_t>(partial_rec_.floats(largest)));
    for (auto& buffer : computed)
      buffer.resize(static_cast<size_t>(partial_rec_.floats(largest)));
    RequestPtr partial_out = completed_request();
    const int64_t rows_per_token = problem_.batch * problem_.heads;
    for (int step = 1; step < cols; ++step) {
      const int part = q_part_at(step);
      const float* q_part = advance_q_ring(q_ring, q_rec_, step, "forward");
      RequestPtr partial_in = completed_request();
      if (step >= 2) {
        row_comm.set_phase("forward.partial_ring");
        partial_in =
            row_comm.send_recv_async(nullptr, 0, next, incoming.data(),
                                     partial_rec_.floats(row_counts_[part]), prev, kTagPartial);
      }
      Floats& result = computed[step % 2];
      grid_.world().set_phase("forward.kernel");
      attention_forward_partial(
          kernel_forward_args(q_part, row_counts_[part], q_positions_.data() + row_offsets_[part],
                              kv.data(), kv_rows_, kv_order_.positions.data()),
          partial_view(result.data()), false);
      row_comm.set_phase("forward.partial_ring");
      partial_in->wait();
      if (step >= 2) {
        merge_partial_records(result.data(), incoming.data(), row_counts_[part] * rows_per_token,
                              partial_rec_.record);
      }
      partial_out->wait();  // the buffer sent two steps ago is free again
      row_comm.set_phase("forward.partial_ring");
      partial_out = row_comm.send_recv_async(result.data(), partial_rec_.floats(row_counts_[part]),
                                             next, nullptr, 0, prev, kTagPartial);
    }
    if (cols > 1) {
      // The merged partial of this rank's own part comes back from the left.
      row_comm.set_phase("forward.partial_ring");
      row_comm.send_recv(nullptr, 0, next, incoming.data(), partial_rec_.floats(own_tokens_), prev,
                         kTagPartial);
      partial_out->wait();
      merge_partial_records(own_partial.data(), incoming.data(), own_tokens_ * rows_per_token,
                            partial_rec_.record);
    }
    finalize(own_partial.data(), s.out, s.lse);
  }

  // dK, dV summed along the column by a ring that runs beside the last pass over the K/V parts:
  // step k (1 <= k < R) sends the sum for part (r - k) mod R (this rank's share of it complete,
  // plus what arrived for it at step k - 1) to the next rank of the column and receives the sum
  // for part (r - k - 1); after R - 1 steps the sum for the rank's own part arrives. The bytes and
  // messages are those of a ring reduce-scatter (docs/attention2d.md).
  class DkvRing {
   public:
    DkvRing(Attention2D& at, Floats& dkv) : at_(at), dkv_(dkv) {
      const int rows = at_.plan_.grid.rows;
      if (rows > 1) {
        const int64_t largest = *std::max_element(at_.col_counts_.begin(), at_.col_counts_.end());
        incoming_.resize(static_cast<size_t>(at_.kv_rec_.floats(largest)));
      }
    }
    // This rank's share of the part in `slot` is complete: the next step of the ring.
    void send(int slot) {
      const int rows = at_.plan_.grid.rows;
      Communicator& col_comm = at_.grid_.col_comm();
      col_comm.set_phase("backward.dkv_ring");
      float* part = at_.slot_of(dkv_, slot);
      const int64_t count = at_.kv_rec_.floats(at_.col_counts_[static_cast<size_t>(slot)]);
      if (steps_ > 0) {
        step_->wait();
        add_into(part, incoming_.data(), count);
      }
      const int arriving = (slot - 1 + rows) % rows;
      step_ = col_comm.send_recv_async(
          part, count, (at_.row() + 1) % rows, incoming_.data(),
          at_.kv_rec_.floats(at_.col_counts_[static_cast<size_t>(arriving)]),
          (at_.row() - 1 + rows) % rows, kTagDkv);
      ++steps_;
    }
    // After the last step: the sum for the rank's own part, in its slot.
    float* finish() {
      const int own = at_.row();
      if (steps_ > 0) {
        at_.grid_.col_comm().set_phase("backward.dkv_ring");
        step_->wait();
        add_into(at_.slot_of(dkv_, own), incoming_.data(),
                 at_.kv_rec_.floats(at_.col_counts_[static_cast<size_t>(own)]));
      }
      return at_.slot_of(dkv_, own);
    }

   private:
    Attention2D& at_;
    Floats& dkv_;
    Floats incoming_;
    RequestPtr step_ = completed_request();
    int steps_ = 0;
  };

  float* slot_of(Floats& kv_records, int slot) {
    return kv_records.data() + kv_rec_.floats(col_offsets_[static_cast<size_t>(slot)]);
  }

  void backward_overlapped(const BackwardShards& s) {
    const int rows = plan_.grid.rows, cols = plan_.grid.cols;
    const int64_t d = head_dim();
    const RecordLayout dq_rec{problem_.batch, problem_.heads, d};
    Floats kv(static_cast<size_t>(kv_rec_.floats(kv_rows_)));
    Floats q_own(static_cast<size_t>(q_back_rec_.floats(own_tokens_)));
    pack_backward_rows(s, q_own.data());
    place_kv(s.k, s.v, "backward", slot_of(kv, row()));

    QRing q_ring;
    start_q_ring(q_ring, q_back_rec_, q_own.data(), "backward");

    // Phase A: own Q-side rows against each K/V part; dK, dV land in the part's slot. With one
    // column there is no phase B: a part's dK, dV are complete after its step, and the column
    // sum runs beside the remaining steps.
    Floats dq_own(static_cast<size_t>(dq_rec.floats(own_tokens_)), 0.0f);
    Floats dkv(static_cast<size_t>(kv_rec_.floats(kv_rows_)), 0.0f);
    DkvRing dkv_ring(*this, dkv);
    const int64_t* own_positions = q_positions_.data() + row_offsets_[static_cast<size_t>(col())];
    column_ring(kv, "backward", [&](int slot) {
      grid_.world().set_phase("backward.kernel");
      kernel_backward(q_own.data(), own_tokens_, own_positions, slot_of(kv, slot),
                      col_counts_[slot], kv_positions_.data() + col_offsets_[slot], dq_own.data(),
                      slot_of(dkv, slot), true);
      if (cols == 1 && slot != row()) dkv_ring.send(slot);
    });

    // Phase B: visiting Q-side parts against all K/V (sorted by position, with their dK, dV);
    // their dQ travels right and is summed. The last step attends its part to the K/V parts one
    // at a time, in the column ring's order, so that the column sum of dK, dV runs beside it.
    Communicator& row_comm = grid_.row_comm();
    const int next = (col() + 1) % cols, prev = (col() - 1 + cols) % cols;
    if (cols > 1) {
      grid_.world().set_phase("backward.kernel");
      kv_order_.sort(kv, kv_rec_.per_token());
      kv_order_.sort(dkv, kv_rec_.per_token());
    }
    const int64_t largest = *std::max_element(row_counts_.begin(), row_counts_.end());
    Floats computed[2], incoming(static_cast<size_t>(dq_rec.floats(largest)));
    for (auto& buffer : computed)
      buffer.resize(static_cast<size_t>(dq_rec.floats(largest)));
    RequestPtr dq_out = completed_request();
    for (int step = 1; step < cols; ++step) {
      const int part = q_part_at(step);
      const float* q_part = advance_q_ring(q_ring, q_back_rec_, step, "backward");
      RequestPtr dq_in = completed_request();
      if (step >= 2) {
        row_comm.set_phase("backward.dq_ring");
        dq_in = row_comm.send_recv_async(nullptr, 0, next, incoming.data(),
                                         dq_rec.floats(row_counts_[part]), prev, kTagPartial);
      }
      dq_out->wait();  // computed[step % 2] was sent two steps ago
      Floats& result = computed[step % 2];
      std::fill_n(result.begin(), dq_rec.floats(row_counts_[part]), 0.0f);
      grid_.world().set_phase("backward.kernel");
      const int64_t* part_positions = q_positions_.data() + row_offsets_[part];
      if (step + 1 < cols || rows == 1) {
        kernel_backward(q_part, row_counts_[part], part_positions, kv.data(), kv_rows_,
                        kv_order_.positions.data(), result.data(), dkv.data(), true);
        if (step + 1 == cols) kv_order_.unsort(dkv, kv_rec_.per_token());
      } else {
        kv_order_.unsort(kv, kv_rec_.per_token());
        kv_order_.unsort(dkv, kv_rec_.per_token());
        for (int k = 1; k <= rows; ++k) {
          const int slot = kv_slot_at(k % rows);  // (r - 1), (r - 2), ..., (r + 1), then r
          grid_.world().set_phase("backward.kernel");
          kernel_backward(q_part, row_counts_[part], part_positions, slot_of(kv, slot),
                          col_counts_[slot], kv_positions_.data() + col_offsets_[slot],
                          result.data(), slot_of(dkv, slot), true);
          if (k < rows) dkv_ring.send(slot);
        }
      }
      row_comm.set_phase("backward.dq_ring");
      dq_in->wait();
      if (step >= 2) add_into(result.data(), incoming.data(), dq_rec.floats(row_counts_[part]));
      row_comm.set_phase("backward.dq_ring");
      dq_out = row_comm.send_recv_async(result.data(), dq_rec.floats(row_counts_[part]), next,
                                        nullptr, 0, prev, kTagPartial);
    }
    if (cols > 1) {
      row_comm.set_phase("backward.dq_ring");
      row_comm.send_recv(nullptr, 0, next, incoming.data(), dq_rec.floats(own_tokens_), prev,
                         kTagPartial);
      dq_out->wait();
      add_into(dq_own.data(), incoming.data(), dq_rec.floats(own_tokens_));
    }
    unpack(dq_rec, dq_own.data(), 0, own_tokens_, d, s.dq);

    // dK, dV of the rank's part, summed along the column, sent home.
    return_dkv(dkv_ring.finish(), "backward", s.dk, s.dv);
  }

  Problem problem_;
  Plan plan_;
  Grid grid_;
  TokenLayout layout_;

  int64_t own_tokens_ = 0;
  std::vector<int64_t> row_counts_, col_counts_;  // tokens of the parts gathered along row / column
  std::vector<int64_t> row_offsets_, col_offsets_;   // prefix sums (tokens)
  std::vector<int64_t> q_positions_, kv_positions_;  // global positions of the gathered rows
  TokenOrder q_order_, kv_order_;                    // the gathered rows sorted by position
  int64_t q_rows_ = 0, kv_rows_ = 0;
  int kv_source_ = 0, kv_dest_ = 0;  // K/V transpose partners (world ranks)
  RecordLayout q_rec_, kv_rec_, partial_rec_, q_back_rec_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_attention2d(const Problem& problem, const Plan& plan,
                                                       Communicator& world) {
  return std::make_unique<Attention2D>(problem, plan, world);
}

}  // namespace a2d::algorithms
