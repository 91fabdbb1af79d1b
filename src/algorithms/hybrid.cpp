// Heads x ATTENTION2D (the hybrid of USP, LoongTrain and TensorRT-LLM's Ulysses + Attention2D):
// P = U x R x C. docs/attention2d.md ("Heads x ATTENTION2D") describes it with its traffic.
//
// World rank w = s + S u (S = R C) is member u of sequence group s and rank s of heads group u
// (decomposition.hpp). The shards are cyclic over the P world ranks, so the U members of sequence
// group s hold together exactly the tokens t = s (mod S): the cyclic shard of rank s of an R x C
// grid. Each call runs
//
//   1. Ulysses' all-to-all within every sequence group (HeadsExchange): member u receives, for
//      the heads of group u, the tokens of all U members; K/V heads are replicated when U > Hkv;
//   2. ATTENTION2D on the R x C grid of heads group u, on those heads and the whole sequence
//      (its own communicators; the rank's shard is the group's tokens in position order, which
//      interleaves the members' blocks: group token j = u' + U k is member u''s token k);
//   3. the inverse all-to-all, which returns every token's results to the rank that owns it.
//
//   forward   [q k v] in; ATTENTION2D forward; [lse o] out
//   backward  [lse delta q dO k v] in (delta computed by the owner of the token, as Ulysses does,
//             and handed to ATTENTION2D in place of O); ATTENTION2D backward; [dq dk dv] out.
//             With K/V heads replicated, the owner sums the U/Hkv copies of each dK, dV head in
//             fp32 (each already rounded once to the dtype by ATTENTION2D) and rounds again.
//
// U = 1 is ATTENTION2D with a private copy of the shards; R = C = 1 is Ulysses (which then also
// accepts Hkv < P by replication). check_plan refuses every U, R, C that cannot run before any
// data moves.
#include <vector>

#include "algorithms.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "heads_exchange.hpp"
#include "records.hpp"

namespace a2d::algorithms {
namespace {

// The tokens of member `member` (of `members`) inside a group shard: every members-th token from
// token `member` on.
TokenTensor member_tokens(TokenTensor t, int64_t member, int64_t members) {
  t.offset += member * t.token_stride * dtype_bytes(t.dtype);
  t.token_stride *= members;
  return t;
}
RowTensor member_rows(RowTensor t, int64_t member, int64_t members) {
  t.offset += member * t.token_stride * kFloatBytes;
  t.token_stride *= members;
  return t;
}

std::vector<UlyssesHeads> head_groups(const Problem& problem, int heads_parallel) {
  std::vector<UlyssesHeads> out;
  for (int u = 0; u < heads_parallel; ++u)
    out.push_back(hybrid_heads(problem, heads_parallel, u));
  return out;
}

// A private copy of `world` split by (color, key), staged through host memory where the backend
// needs it.
std::unique_ptr<Communicator> split_private(Communicator& world, Backend& backend, int color,
                                            int key) {
  return staged_if_needed(world.split(color, key), backend);
}

class HybridAttention final : public DistributedAttention {
 public:
  HybridAttention(const Problem& problem, const Plan& plan, Communicator& world, Backend& backend)
      : problem_(problem),
        plan_(plan),
        backend_(backend),
        layout_(LayoutKind::cyclic, problem.seq, plan.ranks()),
        at_(hybrid_rank(plan, world.rank())),
        members_(plan.heads_parallel),
        replication_(hybrid_kv_replication(problem, plan.heads_parallel)),
        exchange_(backend, problem.batch, problem.head_dim,
                  head_groups(problem, plan.heads_parallel),
                  hybrid_member_counts(problem, plan, at_.sequence_group), at_.heads_group) {
    A2D_REQUIRE(world.size() == plan.ranks(), "the hybrid plan is for ", plan.ranks(),
                " ranks but the communicator has ", world.size());
    set_heads_records(wire_, problem_, exchange_.own_heads());
    // Both splits are collective over the world, in the same order on every rank.
    sequence_comm_ = split_private(world, backend, at_.sequence_group, at_.heads_group);
    grid_comm_ = world.split(at_.heads_group, at_.sequence_group);
    group_ = make_attention2d_with_delta(hybrid_group_problem(problem_, plan_),
                                         hybrid_group_plan(plan_), *grid_comm_, backend_);
  }

  const Problem& problem() const override { return problem_; }
  const Plan& plan() const override { return plan_; }
  const TokenLayout& layout() const override { return layout_; }
  Backend& backend() const override { return backend_; }

  void forward(const ForwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    const int64_t b = problem_.batch, d = problem_.head_dim;
    const int64_t hq = heads().heads, hkv = heads().kv_heads;
    const DType dtype = problem_.dtype;
    const int64_t e = dtype_bytes(dtype);

    // 1. [q(hq x D) k(hkv x D) v(hkv x D)] per (token, batch) to the members of the group.
    const HeadRecords in{b, d, wire_.ulysses_in};
    BufferPtr gathered = exchange_.forward_to_heads(s, in, dtype, *sequence_comm_);

    // 2. The group's shards in position order, and ATTENTION2D on the grid.
    const int64_t n = exchange_.gathered_tokens();
    GroupTensor q = group_tensor(dtype, n, hq), k = group_tensor(dtype, n, hkv),
                v = group_tensor(dtype, n, hkv), out = group_tensor(dtype, n, hq);
    BufferPtr lse_buffer = backend_.allocate(b * hq * n * kFloatBytes);
    const RowTensor lse = dense_row_tensor(*lse_buffer, hq, n);
    to_group(in, *gathered, 0, q.tensor, hq);
    to_group(in, *gathered, hq * d * e, k.tensor, hkv);
    to_group(in, *gathered, (hq + hkv) * d * e, v.tensor, hkv);
    gathered.reset();
    group_->forward({q.tensor, k.tensor, v.tensor, out.tensor, lse, nullptr});

    // 3. [lse(hq) o(hq x D)] back to the owners of the tokens.
    const HeadRecords res{b, d, wire_.ulysses_out};
    const int64_t o_at = hq * kFloatBytes;
    BufferPtr results = exchange_.allocate_gathered(res);
    from_group(out.tensor, hq, res, *results, o_at);
    from_group_rows(lse, res, *results, 0);
    BufferPtr returned = exchange_.allocate_own_blocks(res);
    sequence_comm_->set_phase("forward.to_sequence_all_to_all");
    sequence_comm_->all_to_all(Place::in(*results), exchange_.gathered_bytes(res),
                               Place::in(*returned), exchange_.own_block_bytes(res));
    exchange_.unpack_tokens(res, *returned, o_at, dtype, false, s.out);
    exchange_.unpack_rows(res, *returned, 0, s.lse);
  }

  void backward(const BackwardShards& s) override {
    check_shard_types(problem_, backend_, s);
    const int64_t b = problem_.batch, d = problem_.head_dim;
    const int64_t hq = heads().heads, hkv = heads().kv_heads;
    const DType dtype = problem_.dtype;
    const int64_t e = dtype_bytes(dtype);
    const int64_t own = exchange_.own_tokens();
    BufferPtr delta = backend_.allocate(b * problem_.heads * own * kFloatBytes);
    const RowTensor delta_rows = dense_row_tensor(*delta, problem_.heads, own);
    backend_.delta({b, own, problem_.heads, d}, s.out, s.d_out, delta_rows);

    // 1. [lse(hq) delta(hq) q(hq x D) dO(hq x D) k(hkv x D) v(hkv x D)] per (token, batch).
    const int64_t q_at = 2 * hq * kFloatBytes, do_at = q_at + hq * d * e;
    const int64_t k_at = do_at + hq * d * e, v_at = k_at + hkv * d * e;
    const HeadRecords in{b, d, wire_.ulysses_backward_in};
    BufferPtr gathered = exchange_.backward_to_heads(s, delta_rows, in, dtype, *sequence_comm_);
    delta.reset();

    // 2. ATTENTION2D's backward on the group's shards, with delta in place of O.
    const int64_t n = exchange_.gathered_tokens();
    GroupTensor q = group_tensor(dtype, n, hq), d_out = group_tensor(dtype, n, hq),
                k = group_tensor(dtype, n, hkv), v = group_tensor(dtype, n, hkv);
    BufferPtr rows = backend_.allocate(2 * b * hq * n * kFloatBytes);
    const RowTensor lse = dense_row_tensor(*rows, hq, n);
    const RowTensor group_delta = dense_row_tensor(*rows, hq, n, b * hq * n * kFloatBytes);
    to_group(in, *gathered, q_at, q.tensor, hq);
    to_group(in, *gathered, do_at, d_out.tensor, hq);
    to_group(in, *gathered, k_at, k.tensor, hkv);
    to_group(in, *gathered, v_at, v.tensor, hkv);
    to_group_rows(in, *gathered, 0, lse);
    to_group_rows(in, *gathered, hq * kFloatBytes, group_delta);
    gathered.reset();
    GroupTensor dq = group_tensor(dtype, n, hq), dk = group_tensor(dtype, n, hkv),
                dv = group_tensor(dtype, n, hkv);
    BackwardShards group_shards;
    group_shards.q = q.tensor;
    group_shards.k = k.tensor;
    group_shards.v = v.tensor;
    group_shards.out = d_out.tensor;  // not read: delta is given
    group_shards.d_out = d_out.tensor;
    group_shards.lse = lse;
    group_shards.dq = dq.tensor;
    group_shards.dk = dk.tensor;
    group_shards.dv = dv.tensor;
    group_->backward_with_delta(group_shards, group_delta);

    // 3. [dq(hq x D) dk(hkv x D) dv(hkv x D)] in the dtype back to the owners.
    const HeadRecords grads{b, d, wire_.ulysses_backward_out};
    const int64_t dk_at = hq * d * e, dv_at = (hq + hkv) * d * e;
    BufferPtr results = exchange_.allocate_gathered(grads);
    from_group(dq.tensor, hq, grads, *results, 0);
    from_group(dk.tensor, hkv, grads, *results, dk_at);
    from_group(dv.tensor, hkv, grads, *results, dv_at);
    BufferPtr returned = exchange_.allocate_own_blocks(grads);
    sequence_comm_->set_phase("backward.to_sequence_all_to_all");
    sequence_comm_->all_to_all(Place::in(*results), exchange_.gathered_bytes(grads),
                               Place::in(*returned), exchange_.own_block_bytes(grads));
    exchange_.unpack_tokens(grads, *returned, 0, dtype, false, s.dq);
    if (replication_ == 1) {
      exchange_.unpack_tokens(grads, *returned, dk_at, dtype, true, s.dk);
      exchange_.unpack_tokens(grads, *returned, dv_at, dtype, true, s.dv);
    } else {
      sum_replicas(grads, *returned, dk_at, s.dk);
      sum_replicas(grads, *returned, dv_at, s.dv);
    }
  }

 private:
  const UlyssesHeads& heads() const { return exchange_.own_heads(); }

  // A dense [batch, group tokens, heads, D] shard of the group in the dtype.
  struct GroupTensor {
    BufferPtr buffer;
    TokenTensor tensor;
  };
  GroupTensor group_tensor(DType dtype, int64_t tokens, int64_t heads) {
    GroupTensor t;
    t.buffer =
        backend_.allocate(problem_.batch * tokens * heads * problem_.head_dim * dtype_bytes(dtype));
    t.tensor = dense_token_tensor(*t.buffer, dtype, tokens, heads, problem_.head_dim);
    return t;
  }
  TokenBlock member_block(int member, int64_t heads) const {
    return {problem_.batch, exchange_.count_of(member), heads, problem_.head_dim};
  }

  // Gathered records (member by member) <-> group shards (position order).
  void to_group(const HeadRecords& rec, Buffer& gathered, int64_t field, const TokenTensor& shard,
                int64_t heads) {
    for (int m = 0; m < members_; ++m) {
      backend_.copy_tokens(
          rec.tokens(gathered, rec.bytes(exchange_.offset_of(m)), field, shard.dtype),
          member_tokens(shard, m, members_), member_block(m, heads));
    }
  }
  void to_group_rows(const HeadRecords& rec, Buffer& gathered, int64_t field,
                     const RowTensor& shard) {
    for (int m = 0; m < members_; ++m) {
      backend_.copy_rows(rec.rows(gathered, rec.bytes(exchange_.offset_of(m)), field),
                         member_rows(shard, m, members_), problem_.batch, heads().heads,
                         exchange_.count_of(m));
    }
  }
  void from_group(const TokenTensor& shard, int64_t heads, const HeadRecords& rec, Buffer& records,
                  int64_t field) {
    for (int m = 0; m < members_; ++m) {
      backend_.copy_tokens(
          member_tokens(shard, m, members_),
          rec.tokens(records, rec.bytes(exchange_.offset_of(m)), field, shard.dtype),
          member_block(m, heads));
    }
  }
  void from_group_rows(const RowTensor& shard, const HeadRecords& rec, Buffer& records,
                       int64_t field) {
    for (int m = 0; m < members_; ++m) {
      backend_.copy_rows(member_rows(shard, m, members_),
                         rec.rows(records, rec.bytes(exchange_.offset_of(m)), field),
                         problem_.batch, heads().heads, exchange_.count_of(m));
    }
  }

  // K/V heads replicated over `replication_` consecutive heads groups: the dK (or dV) head h of
  // this rank's tokens is the sum of the blocks of members h r .. h r + r - 1, summed in fp32
  // and rounded to the dtype once more.
  void sum_replicas(const HeadRecords& rec, Buffer& returned, int64_t field,
                    const TokenTensor& shard) {
    const int64_t b = problem_.batch, d = problem_.head_dim, own = exchange_.own_tokens();
    const int64_t head_floats = b * own * d;
    // fp32 [kv heads][batch][tokens][D], one contiguous run per head, and one head of scratch.
    BufferPtr sums = backend_.allocate(problem_.kv_heads * head_floats * kFloatBytes);
    BufferPtr scratch = backend_.allocate(head_floats * kFloatBytes);
    const TokenTensor sum_tensor{sums.get(), 0, DType::f32, own * d, d, head_floats};
    const TokenTensor scratch_tensor{scratch.get(), 0, DType::f32, own * d, d, head_floats};
    const TokenBlock one_head{b, own, 1, d};
    for (int m = 0; m < members_; ++m) {
      const int64_t h = exchange_.heads_of(m).first_kv_head;
      const TokenTensor block = rec.tokens(returned, exchange_.block(rec, m), field, shard.dtype);
      if (m % replication_ == 0) {
        backend_.copy_tokens(block, sum_tensor.from_head(h), one_head);
      } else {
        backend_.copy_tokens(block, scratch_tensor, one_head);
        backend_.add(Place::in(*sums, h * head_floats * kFloatBytes), Place::in(*scratch),
                     head_floats);
      }
    }
    backend_.copy_tokens(sum_tensor, shard, {b, own, problem_.kv_heads, d});
  }

  Problem problem_;
  Plan plan_;
  Backend& backend_;
  TokenLayout layout_;
  HybridRank at_;
  int members_ = 1;
  int64_t replication_ = 1;
  HeadsExchange exchange_;
  WireRecords wire_;
  std::unique_ptr<Communicator> sequence_comm_;  // the U members of this rank's sequence group
  std::unique_ptr<Communicator> grid_comm_;      // the R C ranks of its heads group
  std::unique_ptr<Attention2DWithDelta> group_;  // ATTENTION2D on grid_comm_
};

}  // namespace

std::unique_ptr<DistributedAttention> make_hybrid(const Problem& problem, const Plan& plan,
                                                  Communicator& world, Backend& backend) {
  return std::make_unique<HybridAttention>(problem, plan, world, backend);
}

}  // namespace a2d::algorithms
