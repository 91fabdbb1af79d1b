// Internal: the NCCL communicator (nccl_comm.cpp, compiled with the CUDA backend only).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "attention2d/comm.hpp"

namespace a2d::nccl {

// ncclGetVersion's code (2.28.9 = 22809).
int version();
// This rank's GPU as "host/PCI bus id": equal strings are one GPU.
std::string gpu_identity(const Backend& backend);
// Collective over `comm` (a duplicate of it carries the host operations): a communicator over
// NCCL on `backend`'s device memory, the CUDA backend's. The caller has checked that NCCL can run
// these ranks (comm_choice.hpp).
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Backend& backend);

}  // namespace a2d::nccl
