// Internal: the registry entries of the backends (registry.cpp holds the list), each defined in
// its backend's folder, and what the tests reach inside them.
#pragma once

#include <memory>

#include "attention2d/backend.hpp"

namespace a2d::backends {

BackendEntry cpu_backend_entry();
// cuda_rules: "fenced-cuda", refusing the kernel calls the CUDA backend refuses.
BackendEntry fenced_backend_entry(bool cuda_rules);
BackendEntry cuda_backend_entry();  // built or not (A2D_WITH_CUDA)
BackendCapabilities cuda_capabilities();
BackendEntry sim_backend_entry();  // not made by name (make_sim_backend, in SimGrid)

#ifdef A2D_WITH_CUDA
// cuda_backend.cu; throws without a GPU. device < 0: the node-local rank's GPU (modulo the count).
std::unique_ptr<Backend> make_cuda_backend(int device = -1);
int cuda_device_count();
#endif

// The memory behind a fenced buffer, for the test that shows a stray access crashes.
std::byte* fenced_memory(const Buffer& buffer);

}  // namespace a2d::backends
