// All-gather K/V context parallelism (Llama 3, arXiv 2407.21783; TransformerEngine's
// cp_comm_type "all_gather"; ring-flash-attention's llama3 variant) over the communicator
// interface. docs/baselines.md describes it with its exact traffic.
//
//   forward   all-gather K and V over the P ranks (one collective on [k v] records, parts in rank
//             order: N rows), then one kernel call: the rank's own queries against every key.
//   backward  all-gather K and V again (the backward keeps nothing from the forward), one kernel
//             call giving the rank's dQ and a dK, dV contribution for all N keys, then a
//             reduce-scatter (sum, fp32) returns to every rank the dK, dV of its own tokens,
//             rounded once into the shards' dtype.
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
  AllGatherKvAttention(const Problem& problem, const Plan& plan, Communicator& world,
                       Backend& backend)
      : SequenceParallel(problem, plan, world, backend) {
    kv_rec_ = {problem_.batch, problem_.kv_heads, wire_.kv};
    dkv_rec_ = {problem_.batch, problem_.kv_heads, wire_.dkv};
    // The kernel sees the gathered keys sorted by position under a causal mask (records.hpp).
    kv_order_ = TokenOrder(parts_.positions, sort_by_position(problem_.mask));
    kv_order_.attach(backend_);
  }

  void forward(const ForwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    BufferPtr kv = gather_kv(s.k, s.v, "forward");
    comm_->set_phase("forward.kernel");
    kv_order_.sort(Place::in(*kv), kv_rec_.per_token());
    auto call = kernel_call<ForwardCall>(problem_, plan_, *comm_, own_tokens_, positions_of(rank_),
                                         key_field(*kv, 0), key_field(*kv, 1), problem_.seq,
                                         kv_order_.device_positions());
    call.q = s.q;
    backend_.attention_forward(call, s.out, s.lse);
  }

  void backward(const BackwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    const int64_t d = problem_.head_dim, b = problem_.batch, h = problem_.heads;
    BufferPtr kv = gather_kv(s.k, s.v, "backward");
    comm_->set_phase("backward.kernel");
    kv_order_.sort(Place::in(*kv), kv_rec_.per_token());
    auto call = kernel_call<BackwardCall>(problem_, plan_, *comm_, own_tokens_, positions_of(rank_),
                                          key_field(*kv, 0), key_field(*kv, 1), problem_.seq,
                                          kv_order_.device_positions());
    call.q = s.q;
    call.d_out = s.d_out;
    call.lse = s.lse;
    call.out = s.out;  // the kernel computes delta = rowsum(dO * O) of the rank's own rows
    call.accumulate = false;
    // dQ is complete after the call (the rank's queries against every key): into the shard when
    // it is fp32, else through an fp32 buffer rounded once.
    BufferPtr dq;
    TokenTensor dq_out = s.dq;
    if (problem_.dtype != DType::f32) {
      dq = backend_.allocate(b * own_tokens_ * h * d * kFloatBytes);
      dq_out = dense_token_tensor(*dq, DType::f32, own_tokens_, h, d);
    }
    // dK, dV of every key from this rank's queries, fp32 [dk dv] records in gathered order.
    BufferPtr dkv = backend_.allocate(dkv_rec_.bytes(problem_.seq));
    backend_.attention_backward(call, dq_out, gradient_field(*dkv, 0), gradient_field(*dkv, 1));
    kv_order_.unsort(Place::in(*dkv), dkv_rec_.per_token());
    if (dq) backend_.copy_tokens(dq_out, s.dq, {b, own_tokens_, h, d});

    BufferPtr dkv_own = backend_.allocate(dkv_rec_.bytes(own_tokens_));
    comm_->set_phase("backward.dkv_reduce_scatter");
    comm_->reduce_scatter(Place::in(*dkv), Place::in(*dkv_own),
                          scaled(parts_.counts, problem_.batch * problem_.kv_heads),
                          dkv_rec_.record / kFloatBytes, Reduction::sum);
    const TokenBlock rows{b, own_tokens_, problem_.kv_heads, d};
    backend_.copy_tokens(gradient_field(*dkv_own, 0), s.dk, rows);
    backend_.copy_tokens(gradient_field(*dkv_own, 1), s.dv, rows);
  }

 private:
  TokenTensor key_field(Buffer& block, int field) const {
    return kv_rec_.tokens(block, 0, field * problem_.head_dim * dtype_bytes(problem_.dtype),
                          problem_.dtype);
  }
  TokenTensor gradient_field(Buffer& block, int field) const {
    return dkv_rec_.tokens(block, 0, field * problem_.head_dim * kFloatBytes, DType::f32);
  }

  // Every rank's K and V as [k v] records in the problem's dtype, parts in rank order (N rows).
  BufferPtr gather_kv(const TokenTensor& k, const TokenTensor& v, const std::string& phase) {
    BufferPtr kv = backend_.allocate(kv_rec_.bytes(problem_.seq));
    const int64_t slot = kv_rec_.bytes(parts_.offsets[static_cast<size_t>(rank_)]);
    const TokenBlock rows{problem_.batch, own_tokens_, problem_.kv_heads, problem_.head_dim};
    TokenTensor k_slot = key_field(*kv, 0), v_slot = key_field(*kv, 1);
    k_slot.offset += slot;
    v_slot.offset += slot;
    backend_.copy_tokens(k, k_slot, rows);
    backend_.copy_tokens(v, v_slot, rows);
    comm_->set_phase(phase + ".kv_allgather");
    comm_->all_gather(Place::in(*kv, slot), Place::in(*kv),
                      scaled(parts_.counts, kv_rec_.per_token()));
    return kv;  // parts in rank order
  }

  RecordLayout kv_rec_, dkv_rec_;
  TokenOrder kv_order_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_allgather_kv(const Problem& problem, const Plan& plan,
                                                        Communicator& world, Backend& backend) {
  return std::make_unique<AllGatherKvAttention>(problem, plan, world, backend);
}

}  // namespace a2d::algorithms
