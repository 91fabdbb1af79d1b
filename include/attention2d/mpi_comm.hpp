// attention2d: the MPI implementation of the communicator interface.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>

#include "attention2d/comm.hpp"
#include "attention2d/comm_kind.hpp"
#include "attention2d/gloo_comm.hpp"

namespace a2d {

namespace watchdog_detail {
class StartupGuard;  // internal: src/comm/startup_guard.hpp
}

// How ranks wait for MPI, from the environment variable A2D_MPI_WAIT: spin (the default: MPI's
// blocking calls, which poll) or sleep (test, then sleep 10 us doubling up to 8 ms, or up to
// sleep:MICROSECONDS; the blocking collectives become rings of posted steps). Sleep is for ranks
// that outnumber cores many times, as on an emulated cluster. Throws a2d::Error on any other
// value. make_mpi_communicator checks that every rank of `comm` has the same policy (the caps may
// differ) and refuses on every rank otherwise.
enum class WaitPolicy { spin = 0, sleep = 1 };
struct WaitSetting {
  WaitPolicy policy = WaitPolicy::spin;
  int max_sleep_us = 0;
};
WaitSetting mpi_wait_setting();

// Wraps a duplicate of `comm` (the library's messages never match the caller's). MPI errors are
// returned, not fatal, and become a2d::Error with MPI's message.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

// A communicator of `kind` (comm_kind.hpp's CommKind) over the ranks of `comm`.
// Collective over `comm`: every rank passes the same kind and its own backend (the one the
// algorithms will use). Refusals (nccl without the CUDA backend, ranks sharing a GPU under an
// NCCL that refuses it, gloo in a build without Gloo) throw a2d::Error on every rank, with the
// same message, before any NCCL or Gloo call; the message names --comm mpi where that would run.
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Backend& backend, CommKind kind);

// make_gloo_communicator (gloo_comm.hpp) over the ranks of `comm`, the addresses all-gathered
// over MPI (a2d's --comm gloo). Collective over `comm`; throws on every rank in a build without
// Gloo.
std::unique_ptr<Communicator> make_gloo_communicator(MPI_Comm comm,
                                                     const GlooOptions& options = {});

// Initialises MPI unless it already is (thread level MULTIPLE, which the watchdog's helper thread
// needs), and finalises it on destruction if it initialised it. Sets the rank that a2d::Error
// reports.
class MpiSession {
 public:
  // With startup_timeout > 0 the start of the job is watched from before MPI_Init until a
  // Watchdog runs on this rank: a rank or host that stops while the job starts (inside MPI_Init
  // or the first collectives) is reported as the watchdog reports, naming its host, and the job
  // ends with exit code 124 (docs/reliability.md, "The start of a job"; needs a PMIx launcher:
  // Open MPI's mpirun, Slurm's srun --mpi=pmix). A program passes its watchdog's timeout.
  MpiSession(int* argc, char*** argv, double startup_timeout = 0);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  std::unique_ptr<watchdog_detail::StartupGuard> guard_;
  bool owns_ = false;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace a2d

namespace a2d {
// A barrier on `comm` that waits without spinning: ranks that arrive early test it between sleeps
// that double from 10 us to `max_sleep`, leaving the cores to a rank that is still computing
// (ranks may outnumber cores many times over). Each wake-up is a system call or two that takes
// the core from the computing rank: with 63 ranks waiting on rank 0's reference (a2d run --check,
// 64 emulated hosts on 2 cores), a fixed 0.5 ms poll slowed it from 16 s to 1634 s.
void sleeping_barrier(MPI_Comm comm,
                      std::chrono::microseconds max_sleep = std::chrono::milliseconds(20));
}  // namespace a2d
