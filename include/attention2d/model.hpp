// attention2d: the cost model, as pure functions of (problem, plan, rank). docs/cost-model.md
// derives every formula; tests check them against the counting communicator, exactly.
#pragma once

#include <map>
#include <string>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/relayout.hpp"

namespace a2d {

// Bytes and messages `rank` sends in one forward and one backward call of `plan`, by the phase
// names the algorithms charge them to ("forward.q_allgather", ...). Phases that send nothing on
// this rank are present with zeros.
std::map<std::string, Traffic> predict_traffic(const Problem& problem, const Plan& plan, int rank);
// What the attention make_attention returns sends: the algorithm's phases, the exchanges between
// the caller's `shards` and the plan's layout where given (relayout.hpp's phases, charged by
// exchange_traffic with relayout_records; none where every rank holds the same tokens in both
// layouts), and, where P > 1, each call's shard check (kCheckForwardPhase, kCheckBackwardPhase:
// one all-reduce of one int64; outside the "forward"/"backward" totals and the time model).
std::map<std::string, Traffic> predict_traffic(const Problem& problem, const Plan& plan, int rank,
                                               const UserShards* shards);
// The four relayout phases alone (empty when nothing moves).
std::map<std::string, Traffic> relayout_traffic(const Problem& problem, const Plan& plan,
                                                const UserShards& shards, int rank);

// Sum of the predicted phases whose name starts with `prefix` ("forward", "backward").
Traffic predicted_total(const std::map<std::string, Traffic>& phases, const std::string& prefix);

}  // namespace a2d
