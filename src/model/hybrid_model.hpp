// Internal: the cost model of the hybrid (heads x ATTENTION2D), composed of ATTENTION2D's model
// on each heads group and the all-to-alls of the sequence groups (docs/cost-model.md).
#pragma once

#include <map>
#include <string>

#include "attention2d/cost_model.hpp"
#include "attention2d/model.hpp"

namespace a2d::model {

// predict_traffic() of a hybrid plan: ATTENTION2D's phases on the group problem at the rank's
// grid rank, and the four all-to-alls of its sequence group.
std::map<std::string, Traffic> hybrid_traffic(const Problem& problem, const Plan& plan, int rank);

// memory_per_rank() of a hybrid plan (without the caller's shards): the world shards, and beside
// them the group's memory or the all-to-all buffers, whichever is larger.
double hybrid_memory_bytes(const Problem& problem, const Plan& plan, bool with_backward);

// predict() of a hybrid plan.
Prediction predict_hybrid(const Problem& problem, const Plan& plan, const Machine& machine,
                          int ranks_per_node);

}  // namespace a2d::model
