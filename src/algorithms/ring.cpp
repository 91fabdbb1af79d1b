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
//             P - 1 hops, not P.
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
  RingAttention(const Problem& problem, const Plan& plan, Communicator& world)
      : SequenceParallel(problem, plan, world) {
    largest_part_ = *std::max_element(parts_.counts.begin(), parts_.counts.end());
    kv_rec_ = {problem_.batch, problem_.kv_heads, 2 * problem_.head_dim};
    partial_rec_ = {problem_.batch, problem_.heads, problem_.head_dim + 2};
  }

  void forward(const ForwardShards& s) override {
    KvBuffers kv = own_kv(s.k, s.v);
    Floats partial(static_cast<size_t>(partial_rec_.floats(own_tokens_)));
    const PartialView state{partial_rec_.tokens(partial.data(), 2),
                            partial_rec_.rows(partial.data(), 0),
                            partial_rec_.rows(partial.data(), 1)};
    kv_ring(kv, "forward", [&](int step, int part, const float* block) {
      ForwardArgs args;
      args.shape = problem_.local_shape(own_tokens_, count(part));
      args.mask = problem_.mask;
      args.scale = problem_.softmax_scale();
      args.q = s.q;
      args.k = kv_rec_.tokens(block, 0);
      args.v = kv_rec_.tokens(block, problem_.head_dim);
      args.q_positions = parts_.positions_of(rank_);
      args.kv_positions = parts_.positions_of(part);
      args.threads = plan_.threads;
      progress_through(args, *comm_);
      attention_forward_partial(args, state, /*accumulate=*/step > 0);
    });
    finalize_partial({problem_.batch, own_tokens_, problem_.heads, problem_.head_dim}, state, s.out,
                     s.lse);
  }

  void backward(const BackwardShards& s) override {
    const int64_t d = problem_.head_dim;
    Floats delta(static_cast<size_t>(problem_.batch * problem_.heads * own_tokens_));
    const RowView<float> delta_rows = dense_rows(delta.data(), problem_.heads, own_tokens_);
    compute_delta({problem_.batch, own_tokens_, problem_.heads, d}, s.out, s.d_out, delta_rows);

    KvBuffers kv = own_kv(s.k, s.v);
    // dK, dV accumulators as [dk dv] records: the own part's (kept here), the two most recently
    // computed visiting parts (one may still be on its way to rank + 1) and the incoming one.
    Floats dkv_own(static_cast<size_t>(kv_rec_.floats(own_tokens_)));
    const size_t largest = static_cast<size_t>(kv_rec_.floats(largest_part_));
    Floats computed[2] = {Floats(largest), Floats(largest)};
    Floats incoming(largest);
    RequestPtr sent[2] = {completed_request(), completed_request()};
    const int next = (rank_ + 1) % ranks_, prev = (rank_ - 1 + ranks_) % ranks_;

    kv_ring(kv, "backward", [&](int step, int part, const float* block) {
      BackwardArgs args;
      args.shape = problem_.local_shape(own_tokens_, count(part));
      args.mask = problem_.mask;
      args.scale = problem_.softmax_scale();
      args.q = s.q;
      args.d_out = s.d_out;
      args.lse = s.lse;
      args.delta = delta_rows;
      args.k = kv_rec_.tokens(block, 0);
      args.v = kv_rec_.tokens(block, d);
      args.q_positions = parts_.positions_of(rank_);
      args.kv_positions = parts_.positions_of(part);
      args.threads = plan_.threads;
      progress_through(args, *comm_);
      if (step == 0) {
        // Own keys first: dQ and the own dK, dV are written, not added.
        args.accumulate = false;
        attention_backward(args, s.dq, kv_rec_.tokens(dkv_own.data(), 0),
                           kv_rec_.tokens(dkv_own.data(), d));
        return;
      }
      const int64_t floats = kv_rec_.floats(count(part));
      // The accumulator of this part from rank - 1 (which saw it one step earlier); the part's
      // first visitor (step 1) starts from its own contribution.
      RequestPtr arriving = completed_request();
      if (step >= 2) {
        comm_->set_phase("backward.dkv_ring");
        arriving = comm_->send_recv_async(nullptr, 0, next, incoming.data(), floats, prev, kTagDkv);
      }
      Floats& result = computed[step % 2];
      // result was sent two steps ago; the last step's send stays in flight during this step.
      sent[step % 2]->wait();
      std::fill(result.begin(), result.end(), 0.0f);
      args.accumulate = true;  // dQ adds up over the steps; result starts at zero
      comm_->set_phase("backward.kernel");
      attention_backward(args, s.dq, kv_rec_.tokens(result.data(), 0),
                         kv_rec_.tokens(result.data(), d));
      comm_->set_phase("backward.dkv_ring");
      arriving->wait();
      if (step >= 2) add_into(result.data(), incoming.data(), floats);
      comm_->set_phase("backward.dkv_ring");
      sent[step % 2] =
          comm_->send_recv_async(result.data(), floats, next, nullptr, 0, prev, kTagDkv);
    });
    if (ranks_ > 1) {
      // The own part's accumulator, summed over the other P - 1 ranks, comes back from rank - 1.
      comm_->set_phase("backward.dkv_ring");
      comm_->send_recv(nullptr, 0, next, incoming.data(), kv_rec_.floats(own_tokens_), prev,
                       kTagDkv);
      add_into(dkv_own.data(), incoming.data(), kv_rec_.floats(own_tokens_));
    }
    for (auto& request : sent)
      request->wait();
    unpack(kv_rec_, dkv_own.data(), 0, own_tokens_, d, s.dk);
    unpack(kv_rec_, dkv_own.data(), d, own_tokens_, d, s.dv);
  }

 private:
  // The block being used and the block in flight, each large enough for the largest part.
  struct KvBuffers {
    Floats block[2];
    int current = 0;
  };

  int64_t count(int part) const { return parts_.counts[static_cast<size_t>(part)]; }

  KvBuffers own_kv(TokenView<const float> k, TokenView<const float> v) const {
    KvBuffers kv;
    for (auto& buffer : kv.block)
      buffer.resize(static_cast<size_t>(kv_rec_.floats(largest_part_)));
    pack(k, own_tokens_, problem_.head_dim, kv_rec_, kv.block[0].data(), 0);
    pack(v, own_tokens_, problem_.head_dim, kv_rec_, kv.block[0].data(), problem_.head_dim);
    return kv;
  }

  // P steps; `work(step, part, block)` computes with K/V part `part` while the exchange for the
  // next step (this block to rank + 1, the next one from rank - 1) is in flight.
  template <typename Work>
  void kv_ring(KvBuffers& kv, const std::string& phase, Work&& work) {
    const int next = (rank_ + 1) % ranks_, prev = (rank_ - 1 + ranks_) % ranks_;
    for (int step = 0; step < ranks_; ++step) {
      const int part = ring_part_at(ranks_, rank_, step);
      float* here = kv.block[kv.current].data();
      RequestPtr shift = completed_request();
      if (step + 1 < ranks_) {
        const int arriving = ring_part_at(ranks_, rank_, step + 1);
        comm_->set_phase(phase + ".kv_ring");
        shift = comm_->send_recv_async(here, kv_rec_.floats(count(part)), next,
                                       kv.block[1 - kv.current].data(),
                                       kv_rec_.floats(count(arriving)), prev, kTagKv);
      }
      comm_->set_phase(phase + ".kernel");
      work(step, part, here);
      comm_->set_phase(phase + ".kv_ring");
      shift->wait();
      kv.current = 1 - kv.current;
    }
  }

  int64_t largest_part_ = 0;
  RecordLayout kv_rec_, partial_rec_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_ring(const Problem& problem, const Plan& plan,
                                                Communicator& world) {
  return std::make_unique<RingAttention>(problem, plan, world);
}

}  // namespace a2d::algorithms
