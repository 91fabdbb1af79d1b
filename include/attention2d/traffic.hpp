// attention2d: bytes and messages a rank sends, by phase: what the counting communicator records
// (comm_wrappers.hpp) and the cost model predicts, and the ring-schedule charges of the counting
// convention (comm.hpp). Plain values, the ground floor (tests/layers/check_layers.py).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

namespace a2d {

// Bytes and messages this rank sent, by phase name.
struct Traffic {
  int64_t bytes = 0;
  int64_t messages = 0;
};

class TrafficLog {
 public:
  void add(const std::string& phase, int64_t bytes, int64_t messages);
  const std::map<std::string, Traffic>& phases() const { return phases_; }
  // Sum over the phases whose name starts with `prefix` ("" = everything).
  Traffic total(const std::string& prefix = "") const;
  void clear() {
    phases_.clear();
    seconds_.clear();
    switched_at_ = -1;
  }

  // Wall-clock time by phase: a phase's clock runs from the set_phase that names it to the next
  // set_phase (so time spent computing after naming "forward.kernel" is the kernel's).
  void switch_phase(const std::string& from, double now);
  const std::map<std::string, double>& seconds() const { return seconds_; }

 private:
  std::map<std::string, Traffic> phases_;
  std::map<std::string, double> seconds_;
  double switched_at_ = -1;
};

// Ring-schedule charges of the counting convention (comm.hpp) (elements as given in counts); shared
// with the cost model.
struct RingCharge {
  int64_t elements = 0;
  int64_t messages = 0;
};
RingCharge ring_all_gather_charge(std::span<const int64_t> counts, int rank);
RingCharge ring_reduce_scatter_charge(std::span<const int64_t> counts, int rank);

}  // namespace a2d
