// Internal: what the cost model's prediction (predict.cpp), memory (memory.cpp) and plan search
// (search.cpp) share.
#pragma once

#include <cstdint>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/layout.hpp"

namespace a2d::model {

// The memory per rank of the algorithm's own run, in bytes (memory.cpp; docs/cost-model.md).
double memory_bytes(const Problem& p, const Plan& plan, bool with_backward);

// Refuses shards whose layout does not split the problem's tokens over the plan's ranks.
void require_shards_fit(const Problem& problem, const Plan& plan, const TokenLayout& user);

// Memory the exchanges add (docs/cost-model.md, "Relayout"): the caller's shards beside the
// plan's (which memory_bytes counts as the shards), and the largest exchange's send and receive
// records. 0 where every rank holds the same tokens in both layouts.
double relayout_memory_bytes(const Problem& problem, const Plan& plan, const UserShards& shards,
                             bool with_backward);

// What the exchanges between the caller's shards and a plan's layout move, at one byte per
// token (docs/cost-model.md, "Relayout"): the most tokens any rank sends into the plan's layout
// and out of it, over every rank (each in O(1): what a rank keeps is one shared_tokens), and the
// traffic of a sample of ranks (each O(P)): every rank up to 64 ranks, else every P/64-th, the
// last and the ranks that send the most. Depends on the two layouts only, so the plan search
// counts it once per plan layout.
struct RelayoutCounts {
  bool moves_nothing = true;
  int64_t most_in = 0, most_out = 0;
  std::vector<int> sample;
  std::vector<Traffic> in, out;  // per sampled rank, one byte per token
};

RelayoutCounts relayout_counts(const TokenLayout& user, const TokenLayout& planned);

// predict() with the exchanges counted for the caller's shards (`counts`: relayout_counts of the
// shards' and the plan's layouts; both null: none).
Prediction predict_with(const Problem& problem, const Plan& plan, const Machine& machine,
                        int ranks_per_node, const UserShards* shards, const RelayoutCounts* counts);

}  // namespace a2d::model
