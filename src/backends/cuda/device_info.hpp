// CUDA runtime and NCCL discovery (device_info.cu), for `a2d info` (src/tools/build_info.cpp);
// compiled only with A2D_WITH_CUDA=ON.
#pragma once

#include <string>

namespace a2d::cuda {

// Devices visible to the CUDA runtime and the NCCL version, or why there are none.
std::string describe_devices();

}  // namespace a2d::cuda
