// attention2d: what this build contains, for `a2d info` and for bug reports.
#pragma once

#include <string>

namespace a2d {

// Multi-line description: version, compiler, MPI library, OpenMP, CUDA devices and NCCL.
std::string build_info();

}  // namespace a2d
