// The simulated device's runtime in the SMPI build (sim.hpp): SimGrid's clock and placeholder
// memory. Compiled only with A2D_WITH_SMPI (cmake/A2dSmpi.cmake).
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/NetZone.hpp>
#include <smpi/smpi.h>
#include <xbt/config.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "attention2d/error.hpp"
#include "attention2d/sim.hpp"
#include "comm/smpi_hooks.hpp"

namespace a2d {
namespace {

class SmpiRuntime final : public SimRuntime {
 public:
  // The rank's host computes `seconds` at its own speed (a host of several cores runs one rank
  // per core at that speed; smpi_execute_benched pauses SMPI's timing of the host code around it).
  void compute(double seconds) override {
    if (seconds > 0) smpi_execute_benched(seconds);
  }

  // One SMPI_SHARED_MALLOC for the whole simulation, made by the first rank that asks and given
  // to every rank (the ranks are threads of one process; with smpi/privatization:no this static
  // is theirs alike). In smpi/shared-malloc:local mode it is one mapping of a sparse shared-memory
  // file: nothing is touched, so its size is address space only, and SMPI moves messages from
  // and to it without copying them. In the default global mode SMPI would map and populate it
  // block by block (1 MiB each): that is refused.
  std::byte* placeholder_region(int64_t bytes) override {
    const std::string& mode = simgrid::config::get_value<std::string>("smpi/shared-malloc");
    A2D_REQUIRE(mode == "local",
                "the simulated device needs --cfg=smpi/shared-malloc:local (sim/run.sh sets it); "
                "this simulation runs with '",
                mode, "'");
    if (bytes > region_bytes_) {
      A2D_REQUIRE(region_ == nullptr, "the simulated devices' placeholder region (", region_bytes_,
                  " bytes) is smaller than a later rank asks (", bytes,
                  "): give every rank the same --pool-gib");
      region_ = static_cast<std::byte*>(SMPI_SHARED_MALLOC(static_cast<size_t>(bytes)));
      A2D_REQUIRE(region_, "SMPI_SHARED_MALLOC of ", bytes, " bytes failed");
      region_bytes_ = bytes;
    }
    return region_;
  }

  bool contains(const void* address, int64_t bytes) const {
    const auto* at = static_cast<const std::byte*>(address);
    return region_ != nullptr && at >= region_ && bytes >= 0 &&
           at - region_ <= region_bytes_ - bytes;
  }

 private:
  std::byte* region_ = nullptr;
  int64_t region_bytes_ = 0;
};

}  // namespace

namespace {
SmpiRuntime& the_runtime() {
  static SmpiRuntime runtime;
  return runtime;
}
}  // namespace

SimRuntime& smpi_runtime() {
  return the_runtime();
}

bool is_placeholder(const void* address, int64_t bytes) {
  return the_runtime().contains(address, bytes);
}

namespace {
double g_host_reduction_bytes_per_s = 0;  // the same for every rank (set by a2d sim's options)
}  // namespace

void set_simulated_host_reduction(double bytes_per_s) {
  A2D_REQUIRE(bytes_per_s >= 0, "the simulated reduction rate must be >= 0");
  g_host_reduction_bytes_per_s = bytes_per_s;
}

void simulated_host_reduction(int64_t bytes) {
  if (g_host_reduction_bytes_per_s > 0 && bytes > 0)
    smpi_runtime().compute(static_cast<double>(bytes) / g_host_reduction_bytes_per_s);
}

int platform_gpus_per_node() {
  const char* value =
      simgrid::s4u::Engine::get_instance()->get_netzone_root()->get_property("gpus_per_node");
  return value ? std::atoi(value) : 0;
}

std::byte* simulated_scratch(int64_t bytes) {
  // A region of its own (the communicator's scratch must not alias the device's buffers, which
  // it reads from and writes to in the same step), grown by replacing it: a rank may still be
  // inside a step on the old one, which is therefore never freed.
  static std::byte* scratch = nullptr;
  static int64_t scratch_bytes = 0;
  if (bytes > scratch_bytes) {
    scratch_bytes = std::max(bytes, 2 * scratch_bytes);
    scratch = static_cast<std::byte*>(SMPI_SHARED_MALLOC(static_cast<size_t>(scratch_bytes)));
    A2D_REQUIRE(scratch, "SMPI_SHARED_MALLOC of ", scratch_bytes, " bytes failed");
  }
  return scratch;
}

}  // namespace a2d
