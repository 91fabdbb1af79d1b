// attention2d: what this build contains, for `a2d info` and for bug reports.
#pragma once

#include <string>

namespace a2d {

// Multi-line description: version, compiler, MPI library, OpenMP, CUDA devices and NCCL.
std::string build_info();

#ifdef A2D_WITH_CUDA
namespace cuda {
// Devices visible to the CUDA runtime and the NCCL version, or why there are none.
std::string describe_devices();
}  // namespace cuda
#endif

}  // namespace a2d
