// attention2d: which communicator carries the algorithms' messages (--comm), and its default for
// a backend (src/comm/comm_choice.cpp).
#pragma once

#include <string>

namespace a2d {

class Backend;  // backend.hpp

// What carries the algorithms' messages (--comm):
//   mpi   MPI on host memory; a GPU's buffers (any backend whose buffers are not host-accessible)
//         are staged through pinned host buffers by the algorithms (make_staged_communicator).
//         Works with an MPI that is not CUDA-aware and with several ranks on one GPU.
//   nccl  NCCL on the CUDA backend's device memory (docs/gpu.md, "Communicators"): grouped
//         send/recv, all-gather and reduce-scatter on a stream of its own, ordered against the
//         backend's stream by events, so the host never waits for a transfer. Needs the build's
//         CUDA backend (-DA2D_WITH_CUDA=ON), --device cuda and, under NCCL before 2.30, one GPU
//         per rank.
//   gloo  Gloo's TCP transport on host memory (gloo_comm.hpp): one full mesh of connections,
//         bootstrapped over MPI here (over torch.distributed in Python); a GPU's and the fenced
//         backend's buffers are staged through host memory as for mpi. Needs a build with Gloo
//         (-DA2D_WITH_GLOO, on where libgloo-dev is installed).
enum class CommKind { mpi, nccl, gloo };
CommKind parse_comm_kind(const std::string& name);  // throws a2d::Error naming the choices
std::string comm_kind_name(CommKind kind);
// The backend's native communicator (BackendCapabilities::native_comm: nccl for cuda), else mpi.
CommKind default_comm_kind(const Backend& backend);

}  // namespace a2d
