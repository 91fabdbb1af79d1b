// make_communicator (mpi_comm.hpp): --comm mpi|nccl|gloo, refused alike on every rank before any
// NCCL or Gloo call (comm_choice.hpp has the rules); make_gloo_communicator bootstrapped over MPI.

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "comm_choice.hpp"
#ifdef A2D_WITH_CUDA
#include "nccl_comm.hpp"
#endif

namespace a2d {
namespace {

// Throws on every rank when any rank's `refusal` is not empty: the lowest such rank's message,
// with its rank, so that every rank reports the same cause.
void refuse_together(MPI_Comm comm, const std::string& refusal) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int first = refusal.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  int length = rank == first ? static_cast<int>(refusal.size()) : 0;
  MPI_Bcast(&length, 1, MPI_INT, first, comm);
  std::string text = rank == first ? refusal : std::string(static_cast<size_t>(length), ' ');
  MPI_Bcast(text.data(), length, MPI_CHAR, first, comm);
  A2D_FAIL(text, rank == first ? "" : detail::concat(" (rank ", first, ")"));
}

#ifdef A2D_WITH_CUDA
// Every rank's GPU identity, in rank order.
std::vector<std::string> gather_gpus(MPI_Comm comm, const std::string& mine) {
  constexpr int kWidth = 256;
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<char> own(kWidth, '\0'), all(static_cast<size_t>(kWidth) * size, '\0');
  std::strncpy(own.data(), mine.c_str(), kWidth - 1);
  MPI_Allgather(own.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, comm);
  std::vector<std::string> gpus;
  for (int r = 0; r < size; ++r)
    gpus.emplace_back(all.data() + static_cast<size_t>(r) * kWidth);
  return gpus;
}
#endif

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(MPI_Comm comm, const GlooOptions& options) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Every rank's bytes: their sizes, then the bytes (MPI_Allgatherv).
  const AllGatherBytes over_mpi = [comm, size](const std::string& mine) {
    const int own = static_cast<int>(mine.size());
    std::vector<int> sizes(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
    MPI_Allgather(&own, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm);
    int total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[static_cast<size_t>(r)] = total;
      total += sizes[static_cast<size_t>(r)];
    }
    std::string all(static_cast<size_t>(total), '\0');
    MPI_Allgatherv(mine.data(), own, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR,
                   comm);
    std::vector<std::string> out;
    for (int r = 0; r < size; ++r)
      out.emplace_back(all, static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                       static_cast<size_t>(sizes[static_cast<size_t>(r)]));
    return out;
  };
  return make_gloo_communicator(rank, size, over_mpi, options);
}

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Backend& backend, CommKind kind) {
  refuse_together(
      comm, comm_choice::kind_refusal(kind, backend.name(), backend.capabilities().native_comm,
                                      comm_choice::nccl_built(), gloo_built()));
  if (kind == CommKind::mpi) return make_mpi_communicator(comm);
  if (kind == CommKind::gloo) return make_gloo_communicator(comm);
#ifdef A2D_WITH_CUDA
  std::string identity, refusal;
  try {
    identity = nccl::gpu_identity(backend);
  } catch (const Error& e) {
    refusal = e.what();
  }
  refuse_together(comm, refusal);
  const char* flag = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  refuse_together(comm, comm_choice::sharing_refusal(gather_gpus(comm, identity), nccl::version(),
                                                     flag && std::strcmp(flag, "1") == 0));
  return nccl::make_communicator(comm, backend);
#else
  A2D_FAIL("--comm nccl: this build has no NCCL");  // refused above
#endif
}

}  // namespace a2d
