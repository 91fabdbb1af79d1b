#include "mpi_checks.hpp"

#include <sstream>

#include <gtest/gtest.h>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/model.hpp"

namespace a2d {

TestSettings& test_settings() {
  static TestSettings settings;
  return settings;
}

std::string TestSettings::describe() const {
  return std::string(dtype_name(dtype)) + " on " + device;
}

void parse_test_settings(int argc, char** argv) {
  TestSettings& s = test_settings();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    A2D_REQUIRE(i + 1 < argc, "test option ", arg, " needs a value");
    if (arg == "--dtype") {
      s.dtype = parse_dtype(argv[++i]);
    } else if (arg == "--device") {
      s.device = argv[++i];
      make_backend(s.device);  // refuses unknown devices here, before any test runs
    } else {
      A2D_FAIL("unknown test option '", arg, "'; the MPI tests take --dtype and --device");
    }
  }
}

std::unique_ptr<Backend> test_backend() {
  return make_backend(test_settings().device);
}

Problem in_test_dtype(Problem problem) {
  problem.dtype = test_settings().dtype;
  return problem;
}

std::string traffic_mismatches(const TrafficLog& log, const Problem& problem, const Plan& plan,
                               int rank) {
  std::ostringstream out;
  const auto predicted = predict_traffic(problem, plan, rank);
  for (const auto& [phase, expected] : predicted) {
    const auto it = log.phases().find(phase);
    const Traffic got = it == log.phases().end() ? Traffic{} : it->second;
    if (got.bytes != expected.bytes || got.messages != expected.messages) {
      out << " " << phase << ": counted " << got.bytes << " B/" << got.messages
          << " msgs, predicted " << expected.bytes << " B/" << expected.messages << " msgs;";
    }
  }
  for (const auto& [phase, got] : log.phases()) {
    if (!predicted.count(phase) && (got.bytes || got.messages)) {
      out << " unpredicted phase " << phase << ": " << got.bytes << " B;";
    }
  }
  return out.str();
}

}  // namespace a2d

namespace a2d {

void expect_model_totals(Communicator& world, const TrafficLog& log, const Problem& problem,
                         const Plan& plan, const std::string& what) {
  int64_t counted[4] = {log.total("forward").bytes, log.total("forward").messages,
                        log.total("backward").bytes, log.total("backward").messages};
  world.all_reduce(counted, 4, Reduction::max);
  // The machine only affects times.
  const Prediction model =
      predict(problem, plan, preset_machine("h100-ndr", problem.dtype), world.size());
  const double element_bytes = static_cast<double>(dtype_bytes(problem.dtype));
  EXPECT_EQ(model.forward.bytes, counted[0]) << what << ": forward bytes per rank";
  EXPECT_EQ(model.forward.messages, counted[1]) << what << ": forward messages per rank";
  EXPECT_EQ(model.backward.bytes, counted[2]) << what << ": backward bytes per rank";
  EXPECT_EQ(model.backward.messages, counted[3]) << what << ": backward messages per rank";
  EXPECT_DOUBLE_EQ(element_bytes * model.words_forward, static_cast<double>(counted[0])) << what;
  EXPECT_DOUBLE_EQ(element_bytes * model.words_backward, static_cast<double>(counted[2])) << what;
}

}  // namespace a2d
