// The rules behind --comm (comm_choice.hpp), and the kind names.
#include "comm_choice.hpp"

#include <map>
#include <sstream>

#include "attention2d/backend.hpp"
#include "attention2d/error.hpp"
#include "core/enum_names.hpp"

namespace a2d {

constexpr EnumName<CommKind> kCommNames[] = {
    {CommKind::mpi, "mpi"}, {CommKind::nccl, "nccl"}, {CommKind::gloo, "gloo"}};

CommKind parse_comm_kind(const std::string& name) {
  return parse_enum(kCommNames, name, "communicator");
}

std::string comm_kind_name(CommKind kind) {
  return enum_name(kCommNames, kind, "mpi");
}

CommKind default_comm_kind(const Backend& backend) {
  // A backend exists only in a build that has it, and with it its native communicator.
  const std::string& native = backend.capabilities().native_comm;
  return native.empty() ? CommKind::mpi : parse_comm_kind(native);
}

namespace comm_choice {

bool nccl_built() {
#ifdef A2D_WITH_CUDA
  return true;  // NCCL is built with the CUDA backend
#else
  return false;
#endif
}

std::string nccl_version_text(int code) {
  const bool old = code < 20900;  // before 2.9: X*1000 + Y*100 + Z
  const int major = old ? code / 1000 : code / 10000;
  const int minor = old ? (code / 100) % 10 : (code / 100) % 100;
  std::ostringstream out;
  out << major << "." << minor << "." << code % 100;
  return out.str();
}

std::string kind_refusal(CommKind kind, const std::string& backend, const std::string& native_comm,
                         bool nccl_built, bool gloo_built) {
  if (kind == CommKind::mpi) return "";
  if (kind == CommKind::gloo) {
    // Any backend: buffers the host cannot touch are staged through host memory, as for mpi.
    if (gloo_built) return "";
    return "--comm gloo: this build has no Gloo (install libgloo-dev and rebuild); use --comm "
           "mpi";
  }
  if (!nccl_built) {
    return "--comm nccl: this build has no NCCL (configure with -DA2D_WITH_CUDA=ON where CUDA "
           "and NCCL are installed); use --comm mpi";
  }
  if (native_comm != comm_kind_name(kind)) {
    // The backends whose own memory it moves (cuda).
    std::string devices;
    for (const BackendEntry& entry : backend_registry()) {
      if (entry.capabilities.native_comm != comm_kind_name(kind)) continue;
      devices += std::string(devices.empty() ? "" : " or ") + "--device " + entry.name;
    }
    return "--comm nccl moves GPU memory and needs " + devices + " (the device here is " + backend +
           "); use --comm mpi";
  }
  return "";
}

std::string sharing_refusal(const std::vector<std::string>& gpu_of_rank, int nccl_version,
                            bool multi_rank_enabled) {
  std::map<std::string, std::vector<size_t>> ranks_of;
  for (size_t rank = 0; rank < gpu_of_rank.size(); ++rank)
    ranks_of[gpu_of_rank[rank]].push_back(rank);
  const std::vector<size_t>* shared = nullptr;
  size_t most = 0;
  for (const auto& [gpu, ranks] : ranks_of) {
    if (ranks.size() > most) {
      most = ranks.size();
      shared = &ranks;
    }
  }
  if (most <= 1) return "";
  const bool allowed = nccl_version >= kMultiRankNcclVersion && multi_rank_enabled &&
                       most <= static_cast<size_t>(kMultiRankPerGpu);
  if (allowed) return "";
  std::ostringstream out;
  out << "--comm nccl: ranks";
  for (size_t i = 0; i < shared->size() && i < 4; ++i)
    out << (i ? ", " : " ") << (*shared)[i];
  if (shared->size() > 4) out << ", ...";
  out << " share the GPU " << gpu_of_rank[(*shared)[0]] << ", and NCCL "
      << nccl_version_text(nccl_version);
  if (nccl_version < kMultiRankNcclVersion) {
    out << " refuses two ranks of one communicator on one GPU";
  } else if (!multi_rank_enabled) {
    out << " runs several ranks on one GPU only with NCCL_MULTI_RANK_GPU_ENABLE=1";
  } else {
    out << " is known to run at most " << kMultiRankPerGpu << " ranks per GPU (" << most
        << " here)";
  }
  out << "; use --comm mpi (MPI through pinned host buffers), or one GPU per rank";
  return out.str();
}

}  // namespace comm_choice
}  // namespace a2d
