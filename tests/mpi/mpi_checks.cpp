#include "mpi_checks.hpp"

#include <sstream>

#include <gtest/gtest.h>

#include "attention2d/cost_model.hpp"
#include "attention2d/model.hpp"

namespace a2d {

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
  // fp32, so bytes are counted bytes; the machine only affects times.
  const Prediction model = predict(problem, plan, preset_machine("h100-ndr", Precision::fp32),
                                   world.size(), Precision::fp32);
  EXPECT_EQ(model.forward.bytes, counted[0]) << what << ": forward bytes per rank";
  EXPECT_EQ(model.forward.messages, counted[1]) << what << ": forward messages per rank";
  EXPECT_EQ(model.backward.bytes, counted[2]) << what << ": backward bytes per rank";
  EXPECT_EQ(model.backward.messages, counted[3]) << what << ": backward messages per rank";
  EXPECT_DOUBLE_EQ(4 * model.words_forward, static_cast<double>(counted[0])) << what;
  EXPECT_DOUBLE_EQ(4 * model.words_backward, static_cast<double>(counted[2])) << what;
}

}  // namespace a2d
