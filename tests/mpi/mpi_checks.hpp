// Checks shared by the MPI test programs.
#pragma once

#include <memory>
#include <string>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"

namespace a2d {

// What the test program was started with (mpi_main.cpp reads them off the command line, after
// GoogleTest's own flags): --dtype fp32|bf16|fp16 (default fp32) and --device cpu|fenced (default
// cpu). The programs run their whole matrix with them, so CTest registers each program at every
// process count once per setting it needs.
struct TestSettings {
  DType dtype = DType::f32;
  std::string device = "cpu";
  std::string describe() const;  // "bf16 on fenced"
};
TestSettings& test_settings();
void parse_test_settings(int argc, char** argv);  // throws a2d::Error on anything it does not know
std::unique_ptr<Backend> test_backend();
// The problem in the settings' dtype.
Problem in_test_dtype(Problem problem);

// Every phase where this rank's counted traffic differs from predict_traffic(problem, plan, rank),
// and every counted phase the model does not know; "" when they agree exactly.
std::string traffic_mismatches(const TrafficLog& log, const Problem& problem, const Plan& plan,
                               int rank);

// The cost model's words and messages per rank (predict(), which the planner and a2d model use)
// equal the largest counted totals over the ranks, forward and backward. Collective.
void expect_model_totals(Communicator& world, const TrafficLog& log, const Problem& problem,
                         const Plan& plan, const std::string& what);

}  // namespace a2d
