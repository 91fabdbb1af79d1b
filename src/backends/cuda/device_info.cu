// CUDA runtime and NCCL discovery for `a2d info`; compiled only with A2D_WITH_CUDA=ON.
#include <cuda_runtime.h>
#include <nccl.h>

#include <sstream>

#include "device_info.hpp"

namespace a2d::cuda {

std::string describe_devices() {
  std::ostringstream out;
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  out << "NCCL " << nccl_version / 10000 << "." << (nccl_version / 100) % 100 << "."
      << nccl_version % 100 << "\n";
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    out << "CUDA devices: none (" << cudaGetErrorString(status) << ")\n";
    return out.str();
  }
  out << "CUDA devices: " << count << "\n";
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    out << "  " << device << ": " << prop.name << ", compute capability " << prop.major << "."
        << prop.minor << ", " << (prop.totalGlobalMem >> 20) << " MiB\n";
  }
  return out.str();
}

}  // namespace a2d::cuda
