// Internal: the rules behind --comm (mpi_comm.hpp's make_communicator), as plain functions of
// what each rank found, so that they are tested on machines without a GPU or NCCL.
#pragma once

#include <string>
#include <vector>

#include "attention2d/comm.hpp"
#include "attention2d/comm_kind.hpp"

namespace a2d::comm_choice {

// ncclGetVersion's code as text: 22809 -> "2.28.9" (codes below 2.9 were X*1000 + Y*100 + Z).
std::string nccl_version_text(int code);
// The first NCCL that runs two ranks of one communicator on one GPU (with
// NCCL_MULTI_RANK_GPU_ENABLE=1; docs/gpu.md), and how many ranks per GPU it is known to run.
constexpr int kMultiRankNcclVersion = 23000;  // 2.30.0
constexpr int kMultiRankPerGpu = 2;

// Whether this build has NCCL (it comes with the CUDA backend).
bool nccl_built();

// Why `kind` cannot carry the messages of a backend named `backend` whose native communicator
// (BackendCapabilities::native_comm) is `native_comm`, in a build whose NCCL and Gloo support are
// `nccl_built` and `gloo_built`; "" where it can. mpi and gloo carry every backend's messages
// (staged through host memory where the host cannot touch the buffers); nccl only those of a
// backend whose native communicator it is.
std::string kind_refusal(CommKind kind, const std::string& backend, const std::string& native_comm,
                         bool nccl_built, bool gloo_built);

// Why one NCCL communicator cannot span ranks whose GPUs are `gpu_of_rank` (one entry per rank,
// e.g. "host/0000:19:00.0"), under NCCL `nccl_version` with NCCL_MULTI_RANK_GPU_ENABLE=1 set or
// not; "" where it can. NCCL before 2.30 refuses two ranks on one GPU ("Duplicate GPU
// detected"); 2.30 and later run two per GPU with the flag, more can hang.
std::string sharing_refusal(const std::vector<std::string>& gpu_of_rank, int nccl_version,
                            bool multi_rank_enabled);

}  // namespace a2d::comm_choice
