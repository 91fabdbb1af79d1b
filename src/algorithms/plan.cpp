// Problems, plans and the algorithm factory.
#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

#include "algorithms.hpp"
#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"

namespace a2d {

Algorithm parse_algorithm(const std::string& name) {
  if (name == "attention2d") return Algorithm::attention2d;
  if (name == "attention2d-overlap") return Algorithm::attention2d_overlap;
  if (name == "ring") return Algorithm::ring;
  if (name == "allgather-kv") return Algorithm::allgather_kv;
  if (name == "ulysses") return Algorithm::ulysses;
  if (name == "hybrid") return Algorithm::hybrid;
  A2D_FAIL("unknown algorithm '", name,
           "'; choose attention2d, attention2d-overlap, ring, allgather-kv, ulysses or hybrid");
}

std::string algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::attention2d:
      return "attention2d";
    case Algorithm::attention2d_overlap:
      return "attention2d-overlap";
    case Algorithm::ring:
      return "ring";
    case Algorithm::allgather_kv:
      return "allgather-kv";
    case Algorithm::ulysses:
      return "ulysses";
    case Algorithm::hybrid:
      return "hybrid";
  }
  return "?";
}

float Problem::softmax_scale() const {
  return scale > 0 ? scale : default_scale(head_dim);
}

void Problem::validate() const {
  A2D_REQUIRE(seq >= 1, "the sequence length must be at least 1 (got ", seq, ")");
  local_shape(seq, seq).validate();
  // Upper limits keep every buffer size and index far from 64-bit overflow.
  A2D_REQUIRE(seq <= (int64_t{1} << 40), "the sequence length ", seq, " exceeds 2^40 tokens");
  A2D_REQUIRE(head_dim <= 4096, "head_dim ", head_dim, " exceeds 4096, the largest supported");
  A2D_REQUIRE(batch <= (1 << 20) && heads <= (1 << 20), "batch (", batch, ") and heads (", heads,
              ") must each be at most 2^20");
  const double elements = static_cast<double>(batch) * static_cast<double>(seq) *
                          static_cast<double>(heads) * static_cast<double>(head_dim);
  A2D_REQUIRE(elements <= 0x1p56, "Q would hold ", elements,
              " elements; at most 2^56 are "
              "supported");
  mask.validate(seq);
  A2D_REQUIRE(std::isfinite(softcap) && softcap >= 0,
              "the softcap must be positive (or 0 for none); got ", softcap);
  A2D_REQUIRE(std::isfinite(scale) && scale >= 0,
              "the softmax scale must be positive (or 0 for 1/sqrt(head_dim)); got ", scale);
}

std::string Problem::describe() const {
  std::ostringstream out;
  out << "batch=" << batch << " heads=" << heads << " kv_heads=" << kv_heads << " seq=" << seq
      << " head_dim=" << head_dim << " mask=" << mask.describe() << " scale=" << softmax_scale()
      << " dtype=" << dtype_name(dtype);
  if (sinks) out << " sinks=yes";
  if (softcap > 0) out << " softcap=" << softcap;
  return out.str();
}

AttentionShape Problem::local_shape(int64_t q_tokens, int64_t kv_tokens) const {
  return {batch, heads, kv_heads, q_tokens, kv_tokens, head_dim};
}

std::string Plan::describe() const {
  std::ostringstream out;
  out << algorithm_name(algorithm);
  if (algorithm == Algorithm::hybrid) out << " heads_parallel=" << heads_parallel;
  out << " grid=" << grid.describe() << " layout=" << layout_name(layout);
  if (layout == LayoutKind::striped) out << "(" << stripe << ")";
  if (algorithm == Algorithm::attention2d || algorithm == Algorithm::attention2d_overlap ||
      algorithm == Algorithm::hybrid) {
    out << " kv_transpose=" << (kv_transpose ? "yes" : "no");
  }
  out << " threads=" << threads;
  return out.str();
}

Plan default_plan(Algorithm algorithm, const Problem& problem, int ranks) {
  Plan plan;
  plan.algorithm = algorithm;
  switch (algorithm) {
    case Algorithm::attention2d:
    case Algorithm::attention2d_overlap:
      plan.grid = default_grid(ranks);
      plan.layout = LayoutKind::cyclic;
      break;
    case Algorithm::ring:
      plan.grid = {1, ranks};
      plan.layout = problem.mask.is_causal() ? LayoutKind::zigzag : LayoutKind::contiguous;
      break;
    case Algorithm::allgather_kv:
      plan.grid = {1, ranks};
      plan.layout = problem.mask.is_causal() ? LayoutKind::zigzag : LayoutKind::contiguous;
      break;
    case Algorithm::ulysses:
      plan.grid = {1, ranks};
      plan.layout = LayoutKind::contiguous;
      break;
    case Algorithm::hybrid: {
      // The most heads parallelism without replicating K/V: the largest U dividing P, H and Hkv.
      int u = 1;
      for (int d = 1; d <= ranks; ++d) {
        if (ranks % d == 0 && problem.heads % d == 0 && problem.kv_heads % d == 0) u = d;
      }
      plan.heads_parallel = u;
      plan.grid = default_grid(ranks / u);
      plan.layout = LayoutKind::cyclic;
      break;
    }
  }
  return plan;
}

void check_plan(const Plan& plan, const Problem& problem, int ranks) {
  A2D_REQUIRE(plan.threads >= 1, "the kernel thread count must be at least 1 (got ", plan.threads,
              ")");
  A2D_REQUIRE(plan.stripe >= 1, "the stripe width must be at least 1 (got ", plan.stripe, ")");
  const std::string algo = algorithm_name(plan.algorithm);
  A2D_REQUIRE(plan.algorithm == Algorithm::hybrid || plan.heads_parallel == 1,
              "--heads-parallel applies to --algo hybrid only (got ", plan.heads_parallel, " for ",
              algo, ")");
  switch (plan.algorithm) {
    case Algorithm::attention2d:
    case Algorithm::attention2d_overlap:
      check_grid(plan.grid, ranks);
      A2D_REQUIRE(plan.layout == LayoutKind::cyclic, algo,
                  " shards the sequence cyclically (token t "
                  "on rank t mod P); --layout ",
                  layout_name(plan.layout), " is not supported");
      break;
    case Algorithm::ring:
    case Algorithm::allgather_kv:
    case Algorithm::ulysses:
      // Any layout is exact for these (the kernel masks by global position); zigzag or striped
      // balances causal work for ring and allgather-kv, contiguous does not (docs/baselines.md).
      A2D_REQUIRE(plan.grid.rows == 1 && plan.grid.cols == ranks, algo,
                  " runs on all ranks as one group; --grid applies to attention2d only (got ",
                  plan.grid.describe(), " for ", ranks, " ranks)");
      break;
    case Algorithm::hybrid: {
      const int64_t u = plan.heads_parallel;
      A2D_REQUIRE(u >= 1, "--heads-parallel must be at least 1 (got ", u, ")");
      A2D_REQUIRE(plan.grid.rows >= 1 && plan.grid.cols >= 1 && u * plan.grid.size() == ranks,
                  "hybrid: --heads-parallel ", u, " times the grid ", plan.grid.describe(),
                  " makes ", u * plan.grid.size(), " ranks, but the job has ", ranks,
                  "; choose U x R x C = ", ranks);
      A2D_REQUIRE(problem.heads % u == 0, "hybrid: --heads-parallel ", u,
                  " must divide the number of query heads (", problem.heads, ")");
      A2D_REQUIRE(problem.kv_heads % u == 0 || u % problem.kv_heads == 0,
                  "hybrid: --heads-parallel ", u, " must divide the number of K/V heads (",
                  problem.kv_heads, "), or be a multiple of it (K/V heads are then replicated)");
      A2D_REQUIRE(plan.layout == LayoutKind::cyclic, algo,
                  " shards the sequence cyclically (token t on rank t mod P); --layout ",
                  layout_name(plan.layout), " is not supported");
      break;
    }
  }
  if (plan.algorithm == Algorithm::ulysses) {
    // Ulysses gives every rank whole K/V heads, each to one rank only.
    A2D_REQUIRE(problem.kv_heads % ranks == 0, "ulysses shards the heads: the number of ranks (",
                ranks, ") must divide the number of K/V heads (", problem.kv_heads,
                "); use a number of ranks that divides ", problem.kv_heads,
                ", or --algo ring, allgather-kv or attention2d");
  }
}

namespace {

std::unique_ptr<DistributedAttention> make_algorithm(const Problem& problem, const Plan& plan,
                                                     Communicator& world, Backend& backend) {
  switch (plan.algorithm) {
    case Algorithm::attention2d:
    case Algorithm::attention2d_overlap:
      return algorithms::make_attention2d(problem, plan, world, backend);
    case Algorithm::ring:
      return algorithms::make_ring(problem, plan, world, backend);
    case Algorithm::allgather_kv:
      return algorithms::make_allgather_kv(problem, plan, world, backend);
    case Algorithm::ulysses:
      return algorithms::make_ulysses(problem, plan, world, backend);
    case Algorithm::hybrid:
      return algorithms::make_hybrid(problem, plan, world, backend);
  }
  A2D_FAIL("unknown algorithm ", static_cast<int>(plan.algorithm));
}

// Attention sinks on top of any algorithm. The algorithms compute O and LSE of the scores alone
// (the sink is not a key, so no partial result carries it); once every row's final O and LSE are
// on the rank that owns the row, the sink joins each row exactly once (add_sinks). The backward
// needs nothing else: its P = exp(s - LSE) uses the final LSE, which includes the sink, and
// delta = rowsum(dO * O) uses the final O. dsink = -sum_rows P_sink * delta is summed over each
// rank's own rows (every row is owned by exactly one rank) and all-reduced once.
class WithSinks final : public DistributedAttention {
 public:
  WithSinks(std::unique_ptr<DistributedAttention> inner, Communicator& world)
      : inner_(std::move(inner)), world_(world) {}

  const Problem& problem() const override { return inner_->problem(); }
  const Plan& plan() const override { return inner_->plan(); }
  const TokenLayout& layout() const override { return inner_->layout(); }
  Backend& backend() const override { return inner_->backend(); }

  void forward(const ForwardShards& shards) override {
    A2D_REQUIRE(shards.sinks, "the problem has attention sinks but ForwardShards::sinks is null");
    inner_->forward(shards);
    backend().add_sinks(rows(), shards.sinks, 0, shards.out, shards.lse);
  }

  void backward(const BackwardShards& shards) override {
    A2D_REQUIRE(shards.sinks && shards.dsink,
                "the problem has attention sinks but BackwardShards::sinks or ::dsink is null");
    inner_->backward(shards);
    const RowsShape r = rows();
    std::vector<double> dsink(static_cast<size_t>(r.heads), 0.0);
    if (r.tokens > 0) {
      const BufferPtr delta =
          backend().allocate(r.batch * r.heads * r.tokens * static_cast<int64_t>(sizeof(float)));
      const RowTensor delta_rows = dense_row_tensor(*delta, r.heads, r.tokens);
      backend().delta(r, shards.out, shards.d_out, delta_rows);
      backend().add_sink_gradient(r, shards.sinks, 0, shards.lse, delta_rows, dsink.data());
    }
    world_.set_phase("backward.dsink_all_reduce");
    world_.all_reduce(dsink.data(), r.heads, Reduction::sum);
    for (int64_t h = 0; h < r.heads; ++h)
      shards.dsink[h] = static_cast<float>(dsink[static_cast<size_t>(h)]);
  }

 private:
  RowsShape rows() const {
    const Problem& p = problem();
    return {p.batch, layout().count(world_.rank()), p.heads, p.head_dim};
  }

  std::unique_ptr<DistributedAttention> inner_;
  Communicator& world_;
};

}  // namespace

namespace algorithms {
std::unique_ptr<DistributedAttention> make_checked_attention(const Problem& problem,
                                                             const Plan& plan, Communicator& world,
                                                             Backend& backend) {
  std::unique_ptr<DistributedAttention> attention = make_algorithm(problem, plan, world, backend);
  if (problem.sinks) return std::make_unique<WithSinks>(std::move(attention), world);
  return attention;
}
}  // namespace algorithms

std::unique_ptr<DistributedAttention> make_attention(const Problem& problem, const Plan& plan,
                                                     Communicator& world, Backend& backend) {
  collective_check(world, [&] {
    problem.validate();
    check_plan(plan, problem, world.size());
    backend.check_supported(problem.dtype, problem.head_dim, problem.mask, problem.softcap);
  });
  check_agreement(world, problem, plan);
  return algorithms::make_checked_attention(problem, plan, world, backend);
}

namespace {
void check_tensor(const Problem& problem, const Backend& backend, const TokenTensor& t,
                  const char* name) {
  A2D_REQUIRE(t.buffer, "the ", name, " shard has no buffer");
  A2D_REQUIRE(&t.buffer->backend() == &backend, "the ", name, " shard is a buffer of the ",
              t.buffer->backend().name(), " backend, but the attention computes with the ",
              backend.name(), " backend");
  A2D_REQUIRE(t.dtype == problem.dtype, "the ", name, " shard holds ", dtype_name(t.dtype),
              " but the problem's dtype is ", dtype_name(problem.dtype));
}
void check_rows(const Backend& backend, const RowTensor& t, const char* name) {
  A2D_REQUIRE(t.buffer, "the ", name, " shard has no buffer");
  A2D_REQUIRE(&t.buffer->backend() == &backend, "the ", name, " shard is a buffer of the ",
              t.buffer->backend().name(), " backend, but the attention computes with the ",
              backend.name(), " backend");
}
}  // namespace

void check_shards(const Problem& problem, const Backend& backend, const ForwardShards& s) {
  check_tensor(problem, backend, s.q, "Q");
  check_tensor(problem, backend, s.k, "K");
  check_tensor(problem, backend, s.v, "V");
  check_tensor(problem, backend, s.out, "O");
  check_rows(backend, s.lse, "LSE");
}

void check_shards(const Problem& problem, const Backend& backend, const BackwardShards& s) {
  check_tensor(problem, backend, s.q, "Q");
  check_tensor(problem, backend, s.k, "K");
  check_tensor(problem, backend, s.v, "V");
  check_tensor(problem, backend, s.out, "O");
  check_tensor(problem, backend, s.d_out, "dO");
  check_rows(backend, s.lse, "LSE");
  check_tensor(problem, backend, s.dq, "dQ");
  check_tensor(problem, backend, s.dk, "dK");
  check_tensor(problem, backend, s.dv, "dV");
}

}  // namespace a2d
