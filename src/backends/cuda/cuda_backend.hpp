// The CUDA backend's surface for the rest of the library ("backends/cuda/cuda_backend.hpp"):
// what the NCCL communicator (src/comm/nccl_comm.cpp) needs of it, in plain C++ types (a
// cudaStream_t is a pointer), and nothing of the backend's CUDA internals. Each throws a2d::Error
// for a backend, or a place's buffer, that is not the CUDA backend's.
#pragma once

#include <cstddef>

#include "attention2d/backend.hpp"

namespace a2d::backends {

// The backend's one stream (a cudaStream_t): its kernels and copies run there in order.
void* cuda_stream_of(const Backend& backend);
// The CUDA device ordinal the backend runs on.
int cuda_device_of(const Backend& backend);
// The device address of a place in a buffer of the CUDA backend (a pinned staging buffer's host
// address for those).
std::byte* cuda_address_of(const Place& place);

}  // namespace a2d::backends
