// Checks shared by the MPI test programs.
#pragma once

#include <string>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"

namespace a2d {

// Every phase where this rank's counted traffic differs from predict_traffic(problem, plan, rank),
// and every counted phase the model does not know; "" when they agree exactly.
std::string traffic_mismatches(const TrafficLog& log, const Problem& problem, const Plan& plan,
                               int rank);

// The cost model's words and messages per rank (predict(), which the planner and a2d model use)
// equal the largest counted totals over the ranks, forward and backward. Collective.
void expect_model_totals(Communicator& world, const TrafficLog& log, const Problem& problem,
                         const Plan& plan, const std::string& what);

}  // namespace a2d
