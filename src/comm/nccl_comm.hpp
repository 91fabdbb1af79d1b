// Internal: the NCCL communicator (nccl_comm.cpp, compiled with the CUDA backend only).
#pragma once

#ifdef A2D_WITH_MPI
#include <mpi.h>
#endif

#include <memory>
#include <string>

#include "attention2d/comm.hpp"

namespace a2d::nccl {

// ncclGetVersion's code (2.28.9 = 22809).
int version();
// This rank's GPU as "host/PCI bus id": equal strings are one GPU.
std::string gpu_identity(const Backend& backend);
// Collective over `host`, a communicator of the same ranks on host memory (MPI, or the Gloo mesh
// of a torch process group): a communicator over NCCL on `backend`'s device memory, the CUDA
// backend's. NCCL's unique id is broadcast over `host`, which then carries the host operations
// (host memory, broadcast, all_reduce, barrier); splits split it beside ncclCommSplit. The caller
// has checked that NCCL can run these ranks (comm_choice.hpp).
std::unique_ptr<Communicator> make_communicator(std::unique_ptr<Communicator> host,
                                                Backend& backend);
#ifdef A2D_WITH_MPI
// The same over a duplicate of the MPI communicator `comm`.
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Backend& backend);
#endif

}  // namespace a2d::nccl
