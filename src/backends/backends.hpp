// Internal: the constructors of the backends make_backend() knows.
#pragma once

#include <memory>

#include "attention2d/backend.hpp"

namespace a2d::backends {

std::unique_ptr<Backend> make_cpu_backend();
// cuda_rules: "fenced-cuda", refusing the kernel calls the CUDA backend refuses.
std::unique_ptr<Backend> make_fenced_backend(bool cuda_rules = false);
#ifdef A2D_WITH_CUDA
// cuda_backend.cu; throws without a GPU. device < 0: the node-local rank's GPU (modulo the count).
std::unique_ptr<Backend> make_cuda_backend(int device = -1);
int cuda_device_count();
#endif

// The memory behind a fenced buffer, for the test that shows a stray access crashes.
std::byte* fenced_memory(const Buffer& buffer);

}  // namespace a2d::backends
