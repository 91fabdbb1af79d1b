// The CUDA backend's registry entry (backends.hpp): plain C++, built with or without the CUDA
// backend, so that a build without it still names it and says how to get it.
#include "backends/backends.hpp"
#include "cuda_plan.hpp"

namespace a2d::backends {

// GPU memory the host cannot touch, NCCL's own transport for it, the tensor-core kernels' dtypes
// and head dimensions; wrap_device takes a torch CUDA tensor's memory.
BackendCapabilities cuda_capabilities() {
  BackendCapabilities c;
  c.host_accessible = false;
  c.host_memory = false;
  c.cpu_kernels = false;
  c.tensor_core_rounding = true;
  c.native_comm = "nccl";
  c.dtypes = cuda_plan::kernel_dtypes();
  c.head_dims = cuda_plan::kernel_head_dims();
  c.wraps_device = true;
  return c;
}

BackendEntry cuda_backend_entry() {
  BackendEntry e;
  e.name = "cuda";
  e.summary = "an NVIDIA GPU";
  e.build_option = "A2D_WITH_CUDA";
  e.title = "CUDA";
  e.toolkit = "a CUDA toolkit";
  e.unit = "GPU";
  e.takes_ordinal = true;
  e.default_rank = 2;  // before the CPU for the dtypes its kernels take, where a GPU is visible
  e.capabilities = cuda_capabilities();
#ifdef A2D_WITH_CUDA
  e.make = [](int ordinal) { return make_cuda_backend(ordinal); };
  e.device_count = cuda_device_count;
#else
  e.built = false;
#endif
  return e;
}

}  // namespace a2d::backends
