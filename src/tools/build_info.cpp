#include "attention2d/tools/build_info.hpp"

#include <sstream>

#include "attention2d/backend.hpp"
#include "attention2d/version.hpp"
#ifdef A2D_WITH_CUDA
#include "backends/cuda/device_info.hpp"
#endif

#ifdef A2D_WITH_MPI
#include <mpi.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace a2d {

std::string build_info() {
  std::ostringstream out;
  out << "attention2d " << A2D_VERSION_STRING << "\n";
  out << "compiler: " << __VERSION__ << " (C++ " << __cplusplus << ")\n";
#ifdef A2D_WITH_MPI
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(library, &length);
  std::string mpi(library, static_cast<size_t>(length));
  // The first line, without the terminating NUL that some Open MPI releases count in `length`
  // (4.1.6 does) or trailing blanks.
  if (const auto end = mpi.find_first_of(std::string("\n\0", 2)); end != std::string::npos)
    mpi.resize(end);
  while (!mpi.empty() && (mpi.back() == ' ' || mpi.back() == '\t' || mpi.back() == '\r'))
    mpi.pop_back();
  out << "MPI: " << mpi << "\n";
#else
  out << "MPI: not built (configure with -DA2D_WITH_MPI=ON)\n";
#endif
#ifdef _OPENMP
  out << "OpenMP: " << _OPENMP << ", up to " << omp_get_max_threads() << " threads\n";
#endif
#ifdef A2D_WITH_CUDA
  out << cuda::describe_devices();
#else
  out << "CUDA: not built (configure with -DA2D_WITH_CUDA=ON)\n";
#endif
  // The registry's backends and what each computes (BackendCapabilities).
  for (const BackendEntry& entry : backend_registry()) {
    out << "backend " << entry.name << ": ";
    if (!entry.built) {
      out << "not built (configure with -D" << entry.build_option << "=ON)\n";
      continue;
    }
    const BackendCapabilities& c = entry.capabilities;
    for (size_t i = 0; i < c.dtypes.size(); ++i)
      out << (i ? "/" : "") << dtype_name(c.dtypes[i]);
    out << ", head dimensions ";
    if (c.head_dims.empty()) out << "any";
    for (size_t i = 0; i < c.head_dims.size(); ++i)
      out << (i ? "/" : "") << c.head_dims[i];
    out << (c.host_memory ? ", host memory" : ", device memory");
    if (!c.host_accessible) out << " (staged)";
    if (!c.native_comm.empty()) out << ", --comm " << c.native_comm;
    if (!entry.make) {
      out << "; " << entry.summary << "\n";
      continue;
    }
    const int devices = entry.devices();
    if (entry.takes_ordinal) out << "; " << devices << (devices == 1 ? " device" : " devices");
    out << "\n";
  }
  return out.str();
}

}  // namespace a2d
