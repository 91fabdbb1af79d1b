// Plans (each algorithm's rules are its entry in the table, src/table/) and the factory that
// makes an attention from its table entry.
#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

#include "algorithms/algorithms.hpp"
#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"
#include "table/table.hpp"

namespace a2d {

// Generated from the table: the plan's fields that its algorithm uses.
std::string Plan::describe() const {
  const AlgorithmTraits& traits = algorithm_traits(algorithm);
  std::ostringstream out;
  out << traits.name;
  if (traits.heads_parallel) out << " heads_parallel=" << heads_parallel;
  out << " grid=" << grid.describe() << " layout=" << layout_name(layout);
  if (layout == LayoutKind::striped) out << "(" << stripe << ")";
  if (traits.grid) out << " kv_transpose=" << (kv_transpose ? "yes" : "no");
  out << " threads=" << threads;
  return out.str();
}

Plan default_plan(Algorithm algorithm, const Problem& problem, int ranks) {
  Plan plan;
  plan.algorithm = algorithm;
  algorithm_entry(algorithm).default_plan(plan, problem, ranks);
  return plan;
}

void check_plan(const Plan& plan, const Problem& problem, int ranks) {
  A2D_REQUIRE(plan.threads >= 1, "the kernel thread count must be at least 1 (got ", plan.threads,
              ")");
  A2D_REQUIRE(plan.stripe >= 1, "the stripe width must be at least 1 (got ", plan.stripe, ")");
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  A2D_REQUIRE(entry.traits.heads_parallel || plan.heads_parallel == 1,
              "--heads-parallel applies to --algo hybrid only (got ", plan.heads_parallel, " for ",
              entry.traits.name, ")");
  entry.check(plan, problem, ranks);
}

namespace {

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
  std::unique_ptr<DistributedAttention> attention =
      algorithm_entry(plan.algorithm).make(problem, plan, world, backend);
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
  return algorithms::with_checked_calls(
      algorithms::make_checked_attention(problem, plan, world, backend), world);
}

}  // namespace a2d
