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
//   forward   [q k v] in; [o lse] out
//   backward  [q dO lse delta k v] in (delta = rowsum(dO * O) is computed by the owner of the
//             token, which saves sending O); [dq dk dv] out
//
// Requires P | Hkv (check_plan refuses anything else before any data moves). Works with any N,
// also N < P: a rank that owns no token sends nothing but still computes its heads.
#include <vector>

#include "algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "records.hpp"

namespace a2d::algorithms {
namespace {

// A buffer of [tokens, batch, width] floats whose width floats per (token, batch) concatenate
// segments: a block of heads x head_dim (a TokenView) or one float per head (a RowView). With
// tokens outermost, the tokens of one part are one contiguous block of the all-to-all.
struct HeadRecords {
  int64_t batch = 1;
  int64_t head_dim = 0;
  int64_t width = 0;

  int64_t floats(int64_t tokens) const { return tokens * batch * width; }
  template <typename T>
  TokenView<T> tokens(T* base, int64_t offset) const {
    return {base + offset, width, batch * width, head_dim};
  }
  template <typename T>
  RowView<T> rows(T* base, int64_t offset) const {
    return {base + offset, width, 1, batch * width};
  }
};

class UlyssesAttention final : public SequenceParallel {
 public:
  UlyssesAttention(const Problem& problem, const Plan& plan, Communicator& world)
      : SequenceParallel(problem, plan, world) {
    group_ = ulysses_heads(problem_, ranks_, rank_);
  }

  void forward(const ForwardShards& s) override {
    const int64_t d = problem_.head_dim, hq = group_.heads, hkv = group_.kv_heads;
    // [q(hq x D) k(hkv x D) v(hkv x D)] per (token, batch).
    const HeadRecords in{problem_.batch, d, (hq + 2 * hkv) * d};
    Floats send(static_cast<size_t>(ranks_ * in.floats(own_tokens_)));
    for (int dest = 0; dest < ranks_; ++dest) {
      float* block = send.data() + dest * in.floats(own_tokens_);
      const UlyssesHeads heads = ulysses_heads(problem_, ranks_, dest);
      copy_heads(from_head(s.q, heads.first_head), in.tokens(block, 0), hq);
      copy_heads(from_head(s.k, heads.first_kv_head), in.tokens(block, hq * d), hkv);
      copy_heads(from_head(s.v, heads.first_kv_head), in.tokens(block, (hq + hkv) * d), hkv);
    }
    Floats gathered(static_cast<size_t>(in.floats(problem_.seq)));
    comm_->set_phase("forward.to_heads_all_to_all");
    comm_->all_to_all(send.data(), own_block_counts(in), gathered.data(), part_counts(in));

    // [o(hq x D) lse(hq)] per (token, batch), the whole sequence in gathered order.
    const HeadRecords out{problem_.batch, d, hq * (d + 1)};
    Floats results(static_cast<size_t>(out.floats(problem_.seq)));
    ForwardArgs args;
    args.shape = group_shape();
    args.mask = problem_.mask;
    args.scale = problem_.softmax_scale();
    args.q = in.tokens<const float>(gathered.data(), 0);
    args.k = in.tokens<const float>(gathered.data(), hq * d);
    args.v = in.tokens<const float>(gathered.data(), (hq + hkv) * d);
    args.q_positions = parts_.positions.data();
    args.kv_positions = parts_.positions.data();
    args.threads = plan_.threads;
    progress_through(args, *comm_);
    comm_->set_phase("forward.kernel");
    attention_forward(args, out.tokens(results.data(), 0), out.rows(results.data(), hq * d));

    Floats returned(static_cast<size_t>(ranks_ * out.floats(own_tokens_)));
    comm_->set_phase("forward.to_sequence_all_to_all");
    comm_->all_to_all(results.data(), part_counts(out), returned.data(), own_block_counts(out));
    for (int source = 0; source < ranks_; ++source) {
      const float* block = returned.data() + source * out.floats(own_tokens_);
      const UlyssesHeads heads = ulysses_heads(problem_, ranks_, source);
      copy_heads(out.tokens(block, 0), from_head(s.out, heads.first_head), hq);
      copy_rows(out.rows(block, hq * d), from_head(s.lse, heads.first_head), problem_.batch, hq,
                own_tokens_);
    }
  }

  void backward(const BackwardShards& s) override {
    const int64_t b = problem_.batch, d = problem_.head_dim, hq = group_.heads,
                  hkv = group_.kv_heads;
    Floats delta(static_cast<size_t>(b * problem_.heads * own_tokens_));
    const RowView<float> delta_rows = dense_rows(delta.data(), problem_.heads, own_tokens_);
    compute_delta({b, own_tokens_, problem_.heads, d}, s.out, s.d_out, delta_rows);

    // [q(hq x D) dO(hq x D) k(hkv x D) v(hkv x D) lse(hq) delta(hq)] per (token, batch).
    const int64_t k_at = 2 * hq * d, v_at = k_at + hkv * d, lse_at = v_at + hkv * d;
    const int64_t delta_at = lse_at + hq;
    const HeadRecords in{b, d, delta_at + hq};
    Floats send(static_cast<size_t>(ranks_ * in.floats(own_tokens_)));
    for (int dest = 0; dest < ranks_; ++dest) {
      float* block = send.data() + dest * in.floats(own_tokens_);
      const UlyssesHeads heads = ulysses_heads(problem_, ranks_, dest);
      copy_heads(from_head(s.q, heads.first_head), in.tokens(block, 0), hq);
      copy_heads(from_head(s.d_out, heads.first_head), in.tokens(block, hq * d), hq);
      copy_heads(from_head(s.k, heads.first_kv_head), in.tokens(block, k_at), hkv);
      copy_heads(from_head(s.v, heads.first_kv_head), in.tokens(block, v_at), hkv);
      copy_rows(from_head(s.lse, heads.first_head), in.rows(block, lse_at), b, hq, own_tokens_);
      copy_rows(from_head(RowView<const float>(delta_rows), heads.first_head),
                in.rows(block, delta_at), b, hq, own_tokens_);
    }
    Floats gathered(static_cast<size_t>(in.floats(problem_.seq)));
    comm_->set_phase("backward.to_heads_all_to_all");
    comm_->all_to_all(send.data(), own_block_counts(in), gathered.data(), part_counts(in));

    // [dq(hq x D) dk(hkv x D) dv(hkv x D)] per (token, batch), gathered order.
    const HeadRecords grads{b, d, (hq + 2 * hkv) * d};
    Floats results(static_cast<size_t>(grads.floats(problem_.seq)));
    BackwardArgs args;
    args.shape = group_shape();
    args.mask = problem_.mask;
    args.scale = problem_.softmax_scale();
    args.q = in.tokens<const float>(gathered.data(), 0);
    args.d_out = in.tokens<const float>(gathered.data(), hq * d);
    args.k = in.tokens<const float>(gathered.data(), k_at);
    args.v = in.tokens<const float>(gathered.data(), v_at);
    args.lse = in.rows<const float>(gathered.data(), lse_at);
    args.delta = in.rows<const float>(gathered.data(), delta_at);
    args.q_positions = parts_.positions.data();
    args.kv_positions = parts_.positions.data();
    args.threads = plan_.threads;
    args.accumulate = false;
    progress_through(args, *comm_);
    comm_->set_phase("backward.kernel");
    attention_backward(args, grads.tokens(results.data(), 0), grads.tokens(results.data(), hq * d),
                       grads.tokens(results.data(), (hq + hkv) * d));

    Floats returned(static_cast<size_t>(ranks_ * grads.floats(own_tokens_)));
    comm_->set_phase("backward.to_sequence_all_to_all");
    comm_->all_to_all(results.data(), part_counts(grads), returned.data(), own_block_counts(grads));
    for (int source = 0; source < ranks_; ++source) {
      const float* block = returned.data() + source * grads.floats(own_tokens_);
      const UlyssesHeads heads = ulysses_heads(problem_, ranks_, source);
      copy_heads(grads.tokens(block, 0), from_head(s.dq, heads.first_head), hq);
      copy_heads(grads.tokens(block, hq * d), from_head(s.dk, heads.first_kv_head), hkv);
      copy_heads(grads.tokens(block, (hq + hkv) * d), from_head(s.dv, heads.first_kv_head), hkv);
    }
  }

 private:
  // The kernel's problem on this rank: its heads, the whole sequence.
  AttentionShape group_shape() const {
    AttentionShape shape = problem_.local_shape(problem_.seq, problem_.seq);
    shape.heads = group_.heads;
    shape.kv_heads = group_.kv_heads;
    return shape;
  }

  // Copies `heads` heads of this rank's own tokens between a shard and a record block.
  void copy_heads(TokenView<const float> from, TokenView<float> to, int64_t heads) const {
    copy_tokens(from, to, problem_.batch, own_tokens_, heads, problem_.head_dim);
  }

  // All-to-all block sizes (floats): every block holds this rank's own tokens ...
  std::vector<int64_t> own_block_counts(const HeadRecords& records) const {
    return std::vector<int64_t>(static_cast<size_t>(ranks_), records.floats(own_tokens_));
  }
  // ... or block i holds the tokens of part i.
  std::vector<int64_t> part_counts(const HeadRecords& records) const {
    return scaled(parts_.counts, records.floats(1));
  }

  UlyssesHeads group_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_ulysses(const Problem& problem, const Plan& plan,
                                                   Communicator& world) {
  return std::make_unique<UlyssesAttention>(problem, plan, world);
}

}  // namespace a2d::algorithms
