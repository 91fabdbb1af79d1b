#include "mpi_checks.hpp"

#include <sstream>

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
