#include "attention2d/error.hpp"

#include <atomic>

#ifdef A2D_SMPI
#include <mpi.h>
#endif

namespace a2d {
namespace {
std::atomic<int> g_error_rank{-1};

#ifdef A2D_SMPI
// Inside SimGrid every rank is a thread of one process and shares this file's global
// (docs/simulation.md, "Globals"): each rank asks SMPI for its own.
int current_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized || g_error_rank.load() < 0) return g_error_rank.load();
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
#else
int current_rank() {
  return g_error_rank.load();
}
#endif

std::string format(const std::string& message, const char* file, int line, int rank) {
  std::ostringstream out;
  out << "attention2d error";
  if (rank >= 0) out << " [rank " << rank << "]";
  out << " (" << file << ":" << line << "): " << message;
  return out.str();
}
}  // namespace

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(format(message, file, line, current_rank())),
      message_(std::move(message)),
      file_(file),
      line_(line),
      rank_(current_rank()) {}

void set_error_rank(int rank) {
  g_error_rank.store(rank);
}
int error_rank() {
  return current_rank();
}

namespace detail {
void throw_error(const std::string& message, const char* file, int line) {
  throw Error(message, file, line);
}
}  // namespace detail

}  // namespace a2d
