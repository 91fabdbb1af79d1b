// attention2d: the cost model, as pure functions of (problem, plan, rank). docs/cost-model.md
// derives every formula; tests check them against the counting communicator, exactly.
#pragma once

#include <map>
#include <string>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"

namespace a2d {

// Bytes and messages `rank` sends in one forward and one backward call of `plan`, by the phase
// names the algorithms charge them to ("forward.q_allgather", ...). Phases that send nothing on
// this rank are present with zeros.
std::map<std::string, Traffic> predict_traffic(const Problem& problem, const Plan& plan, int rank);

// Sum of the predicted phases whose name starts with `prefix` ("forward", "backward").
Traffic predicted_total(const std::map<std::string, Traffic>& phases, const std::string& prefix);

}  // namespace a2d
