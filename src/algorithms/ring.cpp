// Ring Attention (Liu, Zaharia, Abbeel, arXiv 2310.01889) over the communicator interface, with the
// load-balanced layouts of its successors: zigzag (ring-flash-attention, TransformerEngine's
// DualChunkSwap) and striped (Brandon et al., arXiv 2311.09431). docs/baselines.md describes the
// schedule and its exact traffic.
//
// Every rank keeps its own queries and sees every key once: its K/V block travels around all P
// ranks (to rank + 1, from rank - 1), so at step s rank r holds the K/V part of rank r - s
// (s = 0 .. P-1). The shards are in the plan's layout; the kernel masks by global position, so
// the layout changes only which (query, key) pairs are visible, never the code.
//
//   forward   K/V ring, double-buffered: the exchange for step s + 1 is posted before step s's
//             kernel call and waited after it. Partial results accumulate in one online-softmax
//             state; O and LSE at the end.
//   backward  K/V ring as in the forward; dQ accumulates locally; each part's dK, dV accumulator
//             follows its K/V block one step behind (rank r adds its contribution and passes it
//             to r + 1) and arrives at the owner after the last step, as in ring-flash-attention.
//             The owner keeps its own contribution (step 0) at home, so an accumulator makes
//             P - 1 hops, not P. Accumulators are fp32 (also on the wire) and are rounded into the
//             shards' dtype once, at the end.
#include <algorithm>
#include <vector>

#include "algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "records.hpp"

namespace a2d::algorithms {
namespace {

// Tags keep the K/V stream and the dK/dV stream between the same neighbours apart.
enum Tag : int { kTagKv = 21, kTagDkv = 22 };

class RingAttention final : public SequenceParallel {
 public:
  RingAttention(const Problem& problem, const Plan& plan, Communicator& world, Backend& backend)
      : SequenceParallel(problem, plan, world, backend) {
    largest_part_ = *std::max_element(parts_.counts.begin(), parts_.counts.end());
    kv_rec_ = {problem_.batch, problem_.kv_heads, wire_.kv};
    partial_rec_ = {problem_.batch, problem_.heads, wire_.partial};
    dkv_rec_ = {problem_.batch, problem_.kv_heads, wire_.dkv};
  }

  void forward(const ForwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    KvBuffers kv = own_kv(s.k, s.v);
    BufferPtr partial = backend_.allocate(partial_rec_.bytes(own_tokens_));
    const PartialTensor state = partial_records(partial_rec_, *partial, 0);
    kv_ring(kv, "forward", [&](int step, int part, Buffer& block) {
      auto call = kernel_call<ForwardCall>(problem_, plan_, *comm_, own_tokens_,
                                           positions_of(rank_), key_field(block, 0),
                                           key_field(block, 1), count(part), positions_of(part));
      call.q = s.q;
      backend_.attention_forward_partial(call, state, /*accumulate=*/step > 0);
    });
    backend_.finalize({problem_.batch, own_tokens_, problem_.heads, problem_.head_dim}, state,
                      s.out, s.lse);
  }

  void backward(const BackwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    const int64_t d = problem_.head_dim;
    const int64_t b = problem_.batch, h = problem_.heads;
    BufferPtr delta = backend_.allocate(b * h * own_tokens_ * kFloatBytes);
    const RowTensor delta_rows = dense_row_tensor(*delta, h, own_tokens_);
    backend_.delta({b, own_tokens_, h, d}, s.out, s.d_out, delta_rows);
    // dQ summed in fp32 over the steps: in the shard itself when it is fp32, else in a buffer
    // rounded into the shard at the end.
    BufferPtr dq;
    TokenTensor dq_sum = s.dq;
    if (problem_.dtype != DType::f32) {
      dq = backend_.allocate(b * own_tokens_ * h * d * kFloatBytes);
      dq_sum = dense_token_tensor(*dq, DType::f32, own_tokens_, h, d);
    }

    KvBuffers kv = own_kv(s.k, s.v);
    // dK, dV accumulators as fp32 [dk dv] records: the own part's (kept here), the two most
    // recently computed visiting parts (one may still be on its way to rank + 1) and the incoming
    // one.
    BufferPtr dkv_own = backend_.allocate(dkv_rec_.bytes(own_tokens_));
    const int64_t largest = dkv_rec_.bytes(largest_part_);
    BufferPtr computed[2] = {backend_.allocate(largest), backend_.allocate(largest)};
    BufferPtr incoming = backend_.allocate(largest);
    RequestPtr sent[2] = {completed_request(), completed_request()};
    const int next = (rank_ + 1) % ranks_, prev = (rank_ - 1 + ranks_) % ranks_;

    kv_ring(kv, "backward", [&](int step, int part, Buffer& block) {
      auto call = kernel_call<BackwardCall>(problem_, plan_, *comm_, own_tokens_,
                                            positions_of(rank_), key_field(block, 0),
                                            key_field(block, 1), count(part), positions_of(part));
      call.q = s.q;
      call.d_out = s.d_out;
      call.lse = s.lse;
      call.delta = delta_rows;
      if (step == 0) {
        // Own keys first: dQ and the own dK, dV are written, not added.
        call.accumulate = false;
        backend_.attention_backward(call, dq_sum, gradient_field(*dkv_own, 0),
                                    gradient_field(*dkv_own, 1));
        return;
      }
      const int64_t bytes = dkv_rec_.bytes(count(part));
      // The accumulator of this part from rank - 1 (which saw it one step earlier); the part's
      // first visitor (step 1) starts from its own contribution.
      RequestPtr arriving = completed_request();
      if (step >= 2) {
        comm_->set_phase("backward.dkv_ring");
        arriving = comm_->send_recv_async({}, 0, next, Place::in(*incoming), bytes, prev, kTagDkv);
      }
      Buffer& result = *computed[step % 2];
      // result was sent two steps ago; the last step's send stays in flight during this step.
      sent[step % 2]->wait();
      backend_.fill_zero(Place::in(result), bytes);
      call.accumulate = true;  // dQ adds up over the steps; result starts at zero
      comm_->set_phase("backward.kernel");
      backend_.attention_backward(call, dq_sum, gradient_field(result, 0),
                                  gradient_field(result, 1));
      comm_->set_phase("backward.dkv_ring");
      arriving->wait();
      if (step >= 2) backend_.add(Place::in(result), Place::in(*incoming), bytes / kFloatBytes);
      comm_->set_phase("backward.dkv_ring");
      sent[step % 2] = comm_->send_recv_async(Place::in(result), bytes, next, {}, 0, prev, kTagDkv);
    });
    if (ranks_ > 1) {
      // The own part's accumulator, summed over the other P - 1 ranks, comes back from rank - 1.
      comm_->set_phase("backward.dkv_ring");
      comm_->send_recv({}, 0, next, Place::in(*incoming), dkv_rec_.bytes(own_tokens_), prev,
                       kTagDkv);
      backend_.add(Place::in(*dkv_own), Place::in(*incoming),
                   dkv_rec_.bytes(own_tokens_) / kFloatBytes);
    }
    for (auto& request : sent)
      request->wait();
    // Rounded once into the shards.
    if (dq) backend_.copy_tokens(dq_sum, s.dq, {b, own_tokens_, h, d});
    backend_.copy_tokens(gradient_field(*dkv_own, 0), s.dk, {b, own_tokens_, problem_.kv_heads, d});
    backend_.copy_tokens(gradient_field(*dkv_own, 1), s.dv, {b, own_tokens_, problem_.kv_heads, d});
  }

 private:
  // The block being used and the block in flight, each large enough for the largest part.
  struct KvBuffers {
    BufferPtr block[2];
    int current = 0;
  };

  int64_t count(int part) const { return parts_.counts[static_cast<size_t>(part)]; }

  // K (field 0) or V (field 1) of [k v] records in the problem's dtype.
  TokenTensor key_field(Buffer& block, int field) const {
    return kv_rec_.tokens(block, 0, field * problem_.head_dim * dtype_bytes(problem_.dtype),
                          problem_.dtype);
  }
  // dK (field 0) or dV (field 1) of fp32 [dk dv] records.
  TokenTensor gradient_field(Buffer& block, int field) const {
    return dkv_rec_.tokens(block, 0, field * problem_.head_dim * kFloatBytes, DType::f32);
  }

  KvBuffers own_kv(const TokenTensor& k, const TokenTensor& v) {
    KvBuffers kv;
    for (auto& buffer : kv.block)
      buffer = backend_.allocate(kv_rec_.bytes(largest_part_));
    const TokenBlock rows{problem_.batch, own_tokens_, problem_.kv_heads, problem_.head_dim};
    backend_.copy_tokens(k, key_field(*kv.block[0], 0), rows);
    backend_.copy_tokens(v, key_field(*kv.block[0], 1), rows);
    return kv;
  }

  // P steps; `work(step, part, block)` computes with K/V part `part` while the exchange for the
  // next step (this block to rank + 1, the next one from rank - 1) is in flight.
  template <typename Work>
  void kv_ring(KvBuffers& kv, const std::string& phase, Work&& work) {
    const int next = (rank_ + 1) % ranks_, prev = (rank_ - 1 + ranks_) % ranks_;
    for (int step = 0; step < ranks_; ++step) {
      const int part = ring_part_at(ranks_, rank_, step);
      Buffer& here = *kv.block[kv.current];
      RequestPtr shift = completed_request();
      if (step + 1 < ranks_) {
        const int arriving = ring_part_at(ranks_, rank_, step + 1);
        comm_->set_phase(phase + ".kv_ring");
        shift = comm_->send_recv_async(Place::in(here), kv_rec_.bytes(count(part)), next,
                                       Place::in(*kv.block[1 - kv.current]),
                                       kv_rec_.bytes(count(arriving)), prev, kTagKv);
      }
      comm_->set_phase(phase + ".kernel");
      work(step, part, here);
      comm_->set_phase(phase + ".kv_ring");
      shift->wait();
      kv.current = 1 - kv.current;
    }
  }

  int64_t largest_part_ = 0;
  RecordLayout kv_rec_, partial_rec_, dkv_rec_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_ring(const Problem& problem, const Plan& plan,
                                                Communicator& world, Backend& backend) {
  return std::make_unique<RingAttention>(problem, plan, world, backend);
}

}  // namespace a2d::algorithms
