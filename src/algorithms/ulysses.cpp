// DeepSpeed-Ulysses (Jacobs et al., arXiv 2309.14509; TransformerEngine's cp_comm_type "a2a") over
// the communicator interface. docs/baselines.md describes it with its exact traffic.
//
// The shards arrive sequence-sharded (rank i holds the tokens of part i of the plan's layout, all
// heads). One all-to-all makes them head-sharded: rank j receives, from every rank, the tokens of
// that rank for the heads of group j,
//
//   K/V heads [j Hkv/P, (j+1) Hkv/P) and the query heads that use them, [j H/P, (j+1) H/P),
//
// so that with GQA or MQA each K/V head is sent to one rank only. Rank j then holds all N tokens
// of its heads (parts in rank order, with their global positions) and runs the kernel on the
// whole sequence; a second all-to-all returns each token's results to the rank that owns it.
//
//   forward   [q k v] in; [lse o] out
//   backward  [lse delta q dO k v] in (delta = rowsum(dO * O) is computed by the owner of the
//             token, which saves sending O); [dq dk dv] out
// Tensors travel in the problem's dtype (O and the gradients are complete where they are
// computed, so they are rounded once, before they are sent); LSE and delta in fp32.
//
// Requires P | Hkv (check_plan refuses anything else before any data moves). Works with any N,
// also N < P: a rank that owns no token sends nothing but still computes its heads.
#include <vector>

#include "algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "heads_exchange.hpp"
#include "records.hpp"

namespace a2d::algorithms {
namespace {

class UlyssesAttention final : public SequenceParallel {
 public:
  UlyssesAttention(const Problem& problem, const Plan& plan, Communicator& world, Backend& backend)
      : SequenceParallel(problem, plan, world, backend),
        group_(ulysses_heads(problem_, ranks_, rank_)),
        exchange_(backend_, problem_.batch, problem_.head_dim, groups(problem_, ranks_),
                  parts_.counts, rank_) {}

  void forward(const ForwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    const int64_t d = problem_.head_dim, hq = group_.heads, hkv = group_.kv_heads;
    const DType dtype = problem_.dtype;
    const int64_t e = dtype_bytes(dtype);
    // [q(hq x D) k(hkv x D) v(hkv x D)] per (token, batch), in the dtype.
    const HeadRecords in{problem_.batch, d, wire_.ulysses_in};
    BufferPtr gathered = exchange_.forward_to_heads(s, in, dtype, *comm_);

    // [lse(hq) o(hq x D)] per (token, batch), the whole sequence in gathered order.
    const HeadRecords out{problem_.batch, d, wire_.ulysses_out};
    const int64_t o_at = hq * kFloatBytes;
    BufferPtr results = backend_.allocate(out.bytes(problem_.seq));
    auto call = kernel_call<ForwardCall>(problem_, plan_, *comm_, problem_.seq, all_positions(),
                                         in.tokens(*gathered, 0, hq * d * e, dtype),
                                         in.tokens(*gathered, 0, (hq + hkv) * d * e, dtype),
                                         problem_.seq, all_positions());
    call.shape = group_shape();
    call.q = in.tokens(*gathered, 0, 0, dtype);
    comm_->set_phase("forward.kernel");
    backend_.attention_forward(call, out.tokens(*results, 0, o_at, dtype),
                               out.rows(*results, 0, 0));

    BufferPtr returned = exchange_.allocate_own_blocks(out);
    comm_->set_phase("forward.to_sequence_all_to_all");
    comm_->all_to_all(Place::in(*results), exchange_.gathered_bytes(out), Place::in(*returned),
                      exchange_.own_block_bytes(out));
    exchange_.unpack_tokens(out, *returned, o_at, dtype, false, s.out);
    exchange_.unpack_rows(out, *returned, 0, s.lse);
  }

  void backward(const BackwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    const int64_t b = problem_.batch, d = problem_.head_dim, hq = group_.heads,
                  hkv = group_.kv_heads;
    const DType dtype = problem_.dtype;
    const int64_t e = dtype_bytes(dtype);
    BufferPtr delta = backend_.allocate(b * problem_.heads * own_tokens_ * kFloatBytes);
    const RowTensor delta_rows = dense_row_tensor(*delta, problem_.heads, own_tokens_);
    backend_.delta({b, own_tokens_, problem_.heads, d}, s.out, s.d_out, delta_rows);

    // [lse(hq) delta(hq) q(hq x D) dO(hq x D) k(hkv x D) v(hkv x D)] per (token, batch).
    const int64_t q_at = 2 * hq * kFloatBytes, do_at = q_at + hq * d * e;
    const int64_t k_at = do_at + hq * d * e, v_at = k_at + hkv * d * e;
    const HeadRecords in{b, d, wire_.ulysses_backward_in};
    BufferPtr gathered = exchange_.backward_to_heads(s, delta_rows, in, dtype, *comm_);

    // The kernel's fp32 [dq(hq x D) dk(hkv x D) dv(hkv x D)] per (token, batch), gathered order.
    // Each is complete here (every key and query of these heads), so what goes back is rounded
    // to the dtype once; in fp32 the kernel writes the records that are sent.
    const HeadRecords sums{b, d, (hq + 2 * hkv) * d * kFloatBytes};
    const HeadRecords grads{b, d, wire_.ulysses_backward_out};
    BufferPtr results = backend_.allocate(sums.bytes(problem_.seq));
    auto call = kernel_call<BackwardCall>(problem_, plan_, *comm_, problem_.seq, all_positions(),
                                          in.tokens(*gathered, 0, k_at, dtype),
                                          in.tokens(*gathered, 0, v_at, dtype), problem_.seq,
                                          all_positions());
    call.shape = group_shape();
    call.q = in.tokens(*gathered, 0, q_at, dtype);
    call.d_out = in.tokens(*gathered, 0, do_at, dtype);
    call.lse = in.rows(*gathered, 0, 0);
    call.delta = in.rows(*gathered, 0, hq * kFloatBytes);
    call.accumulate = false;
    comm_->set_phase("backward.kernel");
    const int64_t dk_at = hq * d, dv_at = (hq + hkv) * d;  // elements
    backend_.attention_backward(call, sums.tokens(*results, 0, 0, DType::f32),
                                sums.tokens(*results, 0, dk_at * kFloatBytes, DType::f32),
                                sums.tokens(*results, 0, dv_at * kFloatBytes, DType::f32));
    BufferPtr rounded;
    Buffer* outgoing = results.get();
    if (dtype != DType::f32) {
      rounded = backend_.allocate(grads.bytes(problem_.seq));
      const TokenBlock all{b, problem_.seq, 1, (hq + 2 * hkv) * d};
      backend_.copy_tokens(sums.tokens(*results, 0, 0, DType::f32),
                           grads.tokens(*rounded, 0, 0, dtype), all);
      outgoing = rounded.get();
    }

    BufferPtr returned = exchange_.allocate_own_blocks(grads);
    comm_->set_phase("backward.to_sequence_all_to_all");
    comm_->all_to_all(Place::in(*outgoing), exchange_.gathered_bytes(grads), Place::in(*returned),
                      exchange_.own_block_bytes(grads));
    exchange_.unpack_tokens(grads, *returned, 0, dtype, false, s.dq);
    exchange_.unpack_tokens(grads, *returned, dk_at * e, dtype, true, s.dk);
    exchange_.unpack_tokens(grads, *returned, dv_at * e, dtype, true, s.dv);
  }

 private:
  // The kernel's problem on this rank: its heads, the whole sequence.
  AttentionShape group_shape() const {
    AttentionShape shape = problem_.local_shape(problem_.seq, problem_.seq);
    shape.heads = group_.heads;
    shape.kv_heads = group_.kv_heads;
    return shape;
  }

  static std::vector<UlyssesHeads> groups(const Problem& problem, int ranks) {
    std::vector<UlyssesHeads> out;
    for (int rank = 0; rank < ranks; ++rank)
      out.push_back(ulysses_heads(problem, ranks, rank));
    return out;
  }

  UlyssesHeads group_;
  HeadsExchange exchange_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_ulysses(const Problem& problem, const Plan& plan,
                                                   Communicator& world, Backend& backend) {
  return std::make_unique<UlyssesAttention>(problem, plan, world, backend);
}

}  // namespace a2d::algorithms
