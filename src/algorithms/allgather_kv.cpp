// All-gather K/V context parallelism (Llama 3, arXiv 2407.21783; TransformerEngine's
// cp_comm_type "all_gather"; ring-flash-attention's llama3 variant) over the communicator
// interface. docs/baselines.md describes it with its exact traffic.
//
//   forward   all-gather K and V over the P ranks (one collective on [k v] records, parts in rank
//             order: N rows), then one kernel call: the rank's own queries against every key.
//   backward  all-gather K and V again (the backward keeps nothing from the forward), one kernel
//             call giving the rank's dQ and a dK, dV contribution for all N keys, then a
//             reduce-scatter (sum) returns to every rank the dK, dV of its own tokens.
//
// The gathers are not overlapped with computation (as in Llama 3 and TransformerEngine, whose
// all_gather mode exposes them); the layout (zigzag by default for causal masks) balances the
// kernel work, because every rank's queries are spread over the whole sequence.
#include <vector>

#include "algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "records.hpp"

namespace a2d::algorithms {
namespace {

class AllGatherKvAttention final : public SequenceParallel {
 public:
  AllGatherKvAttention(const Problem& problem, const Plan& plan, Communicator& world)
      : SequenceParallel(problem, plan, world) {
    kv_rec_ = {problem_.batch, problem_.kv_heads, 2 * problem_.head_dim};
    // The kernel sees the gathered keys sorted by position under a causal mask (records.hpp).
    kv_order_ = TokenOrder(parts_.positions, problem_.mask.is_causal());
  }

  void forward(const ForwardShards& s) override {
    Floats kv = gather_kv(s.k, s.v, "forward");
    comm_->set_phase("forward.kernel");
    kv_order_.sort(kv, kv_rec_.per_token());
    ForwardArgs args;
    args.shape = problem_.local_shape(own_tokens_, problem_.seq);
    args.mask = problem_.mask;
    args.scale = problem_.softmax_scale();
    args.q = s.q;
    args.k = kv_rec_.tokens(kv.data(), 0);
    args.v = kv_rec_.tokens(kv.data(), problem_.head_dim);
    args.q_positions = parts_.positions_of(rank_);
    args.kv_positions = kv_order_.positions.data();
    args.threads = plan_.threads;
    progress_through(args, *comm_);
    attention_forward(args, s.out, s.lse);
  }

  void backward(const BackwardShards& s) override {
    const int64_t d = problem_.head_dim;
    Floats kv = gather_kv(s.k, s.v, "backward");
    comm_->set_phase("backward.kernel");
    kv_order_.sort(kv, kv_rec_.per_token());
    BackwardArgs args;
    args.shape = problem_.local_shape(own_tokens_, problem_.seq);
    args.mask = problem_.mask;
    args.scale = problem_.softmax_scale();
    args.q = s.q;
    args.d_out = s.d_out;
    args.lse = s.lse;
    args.out = s.out;  // the kernel computes delta = rowsum(dO * O) of the rank's own rows
    args.k = kv_rec_.tokens(kv.data(), 0);
    args.v = kv_rec_.tokens(kv.data(), d);
    args.q_positions = parts_.positions_of(rank_);
    args.kv_positions = kv_order_.positions.data();
    args.threads = plan_.threads;
    args.accumulate = false;
    // dK, dV of every key from this rank's queries, [dk dv] records in gathered order.
    Floats dkv(static_cast<size_t>(kv_rec_.floats(problem_.seq)));
    progress_through(args, *comm_);
    attention_backward(args, s.dq, kv_rec_.tokens(dkv.data(), 0), kv_rec_.tokens(dkv.data(), d));
    kv_order_.unsort(dkv, kv_rec_.per_token());

    Floats dkv_own(static_cast<size_t>(kv_rec_.floats(own_tokens_)));
    comm_->set_phase("backward.dkv_reduce_scatter");
    comm_->reduce_scatter(dkv.data(), dkv_own.data(),
                          scaled(parts_.counts, problem_.batch * problem_.kv_heads), 2 * d,
                          Reduction::sum);
    unpack(kv_rec_, dkv_own.data(), 0, own_tokens_, d, s.dk);
    unpack(kv_rec_, dkv_own.data(), d, own_tokens_, d, s.dv);
  }

 private:
  // Every rank's K and V as [k v] records, parts in rank order (N rows).
  Floats gather_kv(TokenView<const float> k, TokenView<const float> v, const std::string& phase) {
    const int64_t d = problem_.head_dim;
    Floats kv(static_cast<size_t>(kv_rec_.floats(problem_.seq)));
    float* slot = kv.data() + kv_rec_.floats(parts_.offsets[static_cast<size_t>(rank_)]);
    pack(k, own_tokens_, d, kv_rec_, slot, 0);
    pack(v, own_tokens_, d, kv_rec_, slot, d);
    comm_->set_phase(phase + ".kv_allgather");
    comm_->all_gather(slot, kv.data(), scaled(parts_.counts, kv_rec_.per_token()));
    return kv;  // parts in rank order
  }

  RecordLayout kv_rec_;
  TokenOrder kv_order_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_allgather_kv(const Problem& problem, const Plan& plan,
                                                        Communicator& world) {
  return std::make_unique<AllGatherKvAttention>(problem, plan, world);
}

}  // namespace a2d::algorithms
