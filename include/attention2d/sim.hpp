// attention2d: the simulated device, for running the engine inside a network simulator.
//
// The `sim` backend stands for one accelerator per rank when the engine runs as a SimGrid (SMPI)
// program (docs/simulation.md): the algorithms, layouts, communicators and relayout run as they
// are, while every backend operation does no arithmetic and instead advances the rank's simulated
// clock by the time the operation would take on the device:
//   kernels      kernel_call_seconds (cost_model.hpp): the cost model's own rates, by the
//                positions of the call's rows (causal pairs counted exactly)
//   data         copies, permutations, merges, sums, finalize, delta: the bytes they read and
//                write at the device's memory bandwidth, or, where the machine has measured rates
//                for them (a CPU calibration: permute_gbs, merge_gbs, sum_gbs), at those
// Buffers are placeholders: address ranges in one region that the simulator does not copy
// (SMPI_SHARED_MALLOC), so that P ranks of gigabytes each fit in one machine. Their contents are
// never meaningful, except what upload() writes (positions and orders, which the kernels' cost
// needs): those are kept in private memory per buffer. A program that reads a sim buffer's
// values reads garbage: the backend is for timing the engine, never for results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "attention2d/backend.hpp"
#include "attention2d/cost_model.hpp"

namespace a2d {

// What the simulated device needs from the simulator it runs in.
class SimRuntime {
 public:
  virtual ~SimRuntime() = default;
  // Advances the calling rank's clock by `seconds` of device work.
  virtual void compute(double seconds) = 0;
  // An address range of at least `bytes` for placeholder buffers, valid for the program's life;
  // it may be the same range for every rank (its contents are never read for values).
  virtual std::byte* placeholder_region(int64_t bytes) = 0;
};

// The device one rank stands for.
struct SimDevice {
  Machine machine;  // kernel rates (and, for CPU calibrations, permute/merge/sum rates)
  // Bytes per second of the data operations (read + written); 0: they take no time.
  double memory_bytes_per_s = 0;
  // Refuse what the CUDA backend refuses (dtype, head dimension, mask; docs/gpu.md), so that a
  // simulated GPU runs only what the CUDA kernels can.
  bool cuda_rules = false;
  // Address space per rank for its buffers (placeholders: nothing is touched).
  int64_t pool_bytes = int64_t{64} << 30;
};

// Seconds charged in one phase of the algorithm.
struct SimPhaseCharge {
  double kernel_s = 0;  // attention kernels
  double data_s = 0;    // every other device operation
};

// Charges accumulated by the backend (for reports and tests).
struct SimCharges {
  double kernel_s = 0;
  double data_s = 0;
  int64_t kernel_calls = 0;
  int64_t peak_bytes = 0;  // largest total of live buffers
  int64_t live_bytes = 0;
  // By the phase the algorithm was in (attribute_to), "" when none was named.
  std::map<std::string, SimPhaseCharge> by_phase;
};

class SimBackend : public Backend {
 public:
  virtual const SimCharges& charges() const = 0;
  virtual void reset_charges() = 0;  // the sums, and the peak to what is live now
  // Charges go to the phase this string names when they are made (a counting communicator's
  // shared_phase(): the phases the algorithms name).
  virtual void attribute_to(std::shared_ptr<const std::string> phase) = 0;
};

// Throws a2d::Error for a device it cannot simulate (no kernel rate).
std::unique_ptr<SimBackend> make_sim_backend(const SimDevice& device, SimRuntime& runtime);

#ifdef A2D_SMPI
// The runtime of the SMPI build: compute() is smpi_execute_flops on the rank's simulated host at
// its speed, the placeholder region one SMPI_SHARED_MALLOC for the whole simulation
// (smpi/shared-malloc:local; sim/run.sh sets it).
SimRuntime& smpi_runtime();

// The MPI communicator's own arithmetic in the SMPI build (mpi_comm.cpp): its ring
// reduce-scatter sums placeholders, so it does not add them; each byte it would reduce costs
// 1 / bytes_per_s seconds of the rank's clock (0, the default: nothing, as NCCL reduces inside
// the copy kernels of its ring; a CPU calibration's sum_gbs for a simulated CPU cluster), and
// its scratch buffers are placeholders too (simulated_scratch: one region for every rank).
// The hooks the MPI communicator calls are declared in src/comm/smpi_hooks.hpp (the comm layer
// sits below the simulation's; smpi_runtime.cpp implements them).
void set_simulated_host_reduction(double bytes_per_s);

// The simulated platform's GPUs (ranks) per node: its root zone's property "gpus_per_node"
// (sim/make_platforms.py writes it into every platform); 0 where the platform does not say.
int platform_gpus_per_node();
#endif

}  // namespace a2d
