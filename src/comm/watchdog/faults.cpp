// Test-only fault injection (watchdog.hpp): A2D_FAULT_STALL stalls and A2D_FAULT_EXIT ends a
// rank as it enters a phase, so that tests can make a job hang or lose a rank on purpose.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "attention2d/error.hpp"
#include "shared.hpp"

namespace a2d::watchdog_detail {
namespace {

// A2D_FAULT_STALL / A2D_FAULT_EXIT: "RANK:PHASE[:SECONDS]" for this rank, if any.
struct Fault {
  bool set = false;
  std::string phase;
  double seconds = 0;
};

Fault fault_for(const char* variable, int rank) {
  Fault fault;
  const char* text = std::getenv(variable);
  if (!text) return fault;
  const std::string spec = text;
  const auto first = spec.find(':');
  if (first == std::string::npos || std::atoi(spec.substr(0, first).c_str()) != rank) return fault;
  const auto second = spec.find(':', first + 1);
  fault.set = true;
  fault.phase =
      spec.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  if (second != std::string::npos) fault.seconds = std::atof(spec.c_str() + second + 1);
  return fault;
}

// The rank the fault injection matches: MPI_COMM_WORLD's, else the last Gloo world's.
int process_rank() {
#ifdef A2D_WITH_MPI
  int initialized = 0, rank = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
  }
#endif
  return std::max(error_rank(), 0);
}

}  // namespace

void inject_faults(const std::string& phase) {
  static const int rank = process_rank();
  static const Fault stall = fault_for("A2D_FAULT_STALL", rank);
  static const Fault exit_fault = fault_for("A2D_FAULT_EXIT", rank);
  if (stall.set && stall.phase == phase) {
    std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  }
  if (exit_fault.set && exit_fault.phase == phase) {
    std::fprintf(stderr, "a2d: A2D_FAULT_EXIT: rank %d exits in phase %s\n", rank, phase.c_str());
    std::_Exit(9);
  }
}

}  // namespace a2d::watchdog_detail
