// The SMPI build's hooks in the MPI communicator (mpi_comm.cpp), implemented by the simulated
// device's runtime (src/backends/sim/smpi_runtime.cpp; sim.hpp describes the simulation and
// set_simulated_host_reduction). Compiled only with A2D_SMPI.
#pragma once

#include <cstddef>
#include <cstdint>

namespace a2d {

// Whether [address, address + bytes) lies in the placeholder region of smpi_runtime() (the
// simulated devices' buffers): the MPI communicator moves nothing there by hand (a copy would
// touch the shared region's pages, which stay untouched otherwise).
bool is_placeholder(const void* address, int64_t bytes);
// The ring reduce-scatter's arithmetic on `bytes` bytes, charged to the rank's simulated clock
// (set_simulated_host_reduction), and its scratch buffers (placeholders, one region for every
// rank).
void simulated_host_reduction(int64_t bytes);
std::byte* simulated_scratch(int64_t bytes);

}  // namespace a2d
