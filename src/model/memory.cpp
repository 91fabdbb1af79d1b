// Memory per rank in the cost model (cost_model.hpp, docs/cost-model.md): the shards, each
// algorithm's transient buffers (its table entry's memory terms), the exchanges' (relayout) and
// the bytes the masked layouts permute.
//
// The shards the caller keeps plus the largest of the forward's and the backward's transient
// buffers (every buffer the algorithm allocates in the call, as if all were alive at once), with
// tensors in the dtype's element size e and statistics and partial sums in fp32 (the records of
// wire_records). Index arrays (positions, permutations: 8 bytes per gathered row) are left out.
#include <algorithm>
#include <cstdint>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/relayout.hpp"
#include "model/model_internal.hpp"
#include "model/predict.hpp"
#include "table/table.hpp"

namespace a2d {

double model::shard_bytes(const Problem& p, double tokens, bool with_backward) {
  const double b = static_cast<double>(p.batch), d = static_cast<double>(p.head_dim);
  const double h = static_cast<double>(p.heads), hkv = static_cast<double>(p.kv_heads);
  const double e = static_cast<double>(dtype_bytes(p.dtype));
  const double copies = with_backward ? 4 : 2;  // Q, O (dO, dQ); K, V (dK, dV)
  return b * tokens * (e * (copies * h * d + copies * hkv * d) + 4 * h);
}

namespace model {

double memory_bytes(const Problem& p, const Plan& plan, bool with_backward) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.memory_bytes) return entry.memory_bytes(p, plan, with_backward);
  A2D_REQUIRE(entry.memory, "no memory model for ", algorithm_name(plan.algorithm));
  model::MemoryTerms terms;
  terms.b = static_cast<double>(p.batch);
  terms.h = static_cast<double>(p.heads);
  terms.hkv = static_cast<double>(p.kv_heads);
  terms.d = static_cast<double>(p.head_dim);
  terms.e = static_cast<double>(dtype_bytes(p.dtype));
  terms.f = 4;
  terms.narrow = p.dtype != DType::f32;  // fp32 sums go through a rounded copy
  terms.ranks = plan.grid.size();
  const TokenLayout layout(entry.traits.cyclic_only ? LayoutKind::cyclic : plan.layout, p.seq,
                           terms.ranks, plan.stripe);
  terms.n = static_cast<double>(layout.max_count());
  terms.big_n = static_cast<double>(p.seq);
  terms.kv_row = terms.b * terms.hkv * 2 * terms.d;  // elements of one [k v] record row
  terms.q_row = terms.b * terms.h * terms.d;         // elements of one query row over the heads
  const model::Transient transient = entry.memory(p, plan, terms);
  return model::shard_bytes(p, terms.n, with_backward) +
         (with_backward ? std::max(transient.forward, transient.backward) : transient.forward);
}

void require_shards_fit(const Problem& problem, const Plan& plan, const TokenLayout& user) {
  A2D_REQUIRE(user.tokens() == problem.seq && user.parts() == plan.ranks(), "the shards' layout (",
              user.describe(), ") must split the problem's ", problem.seq,
              " tokens over the plan's ", plan.ranks(), " ranks");
}

double relayout_memory_bytes(const Problem& problem, const Plan& plan, const UserShards& shards,
                             bool with_backward) {
  const TokenLayout planned_layout = plan_layout(problem, plan);
  if (same_assignment(shards.layout, planned_layout)) return 0;
  const RelayoutRecords records = relayout_records(problem, shards.backward);
  const double own = static_cast<double>(shards.layout.max_count());
  const double planned = static_cast<double>(planned_layout.max_count());
  const double largest =
      static_cast<double>(with_backward ? std::max({records.forward_in, records.forward_out,
                                                    records.backward_in, records.backward_out})
                                        : std::max(records.forward_in, records.forward_out));
  return model::shard_bytes(problem, own, with_backward) + largest * (own + planned);
}

}  // namespace model

using model::memory_bytes;
using model::relayout_memory_bytes;
using model::require_shards_fit;

double permuted_bytes(const Problem& p, const Plan& plan, bool forward) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.group_plan) {
    return permuted_bytes(entry.group_problem(p, plan), entry.group_plan(plan), forward);
  }
  if (!p.mask.hides_pairs() || plan.grid.size() == 1) return 0;
  return entry.permuted_bytes ? entry.permuted_bytes(p, plan, forward) : 0;
}

int64_t memory_per_rank(const Problem& problem, const Plan& plan, const UserShards* shards,
                        bool with_backward) {
  problem.validate();
  check_plan(plan, problem, plan.ranks());
  double bytes = memory_bytes(problem, plan, with_backward);
  if (shards) {
    require_shards_fit(problem, plan, shards->layout);
    bytes += relayout_memory_bytes(problem, plan, *shards, with_backward);
  }
  return static_cast<int64_t>(bytes);
}

RankMemory memory_parts(const Problem& problem, const Plan& plan, const UserShards* shards,
                        bool with_backward) {
  const int64_t total = memory_per_rank(problem, plan, shards, with_backward);
  RankMemory parts;
  parts.shards = std::min(
      total,
      static_cast<int64_t>(model::shard_bytes(
          problem, static_cast<double>(plan_layout(problem, plan).max_count()), with_backward)));
  parts.buffers = total - parts.shards;
  return parts;
}

}  // namespace a2d
