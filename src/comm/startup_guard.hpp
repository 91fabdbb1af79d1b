// Internal: the start of an MPI job, watched (docs/reliability.md, "The start of a job").
//
// The watchdog (watchdog.hpp) can only run once MPI is up and its own communicator and the
// ranks' hosts are gathered, which are collectives: a host that freezes, or a rank that stops,
// while the job starts (inside MPI_Init, or in the first collectives before the watchdog's
// thread runs) left every other rank waiting forever, with nothing printed. The guard covers
// that gap. From before MPI_Init until a watchdog runs, its thread watches how long this rank has
// been in one stage of the start:
//
//   start.mpi_init  inside MPI_Init. The ranks cannot talk over MPI yet; the launcher's process
//                   management interface, PMIx (Open MPI's mpirun, Slurm's srun --mpi=pmix),
//                   can: every rank publishes a key ("a2d.start") before MPI_Init, and the guard
//                   reads every other rank's (PMIx_Get_nb, 2 s). A rank whose key cannot be read
//                   (its host's PMIx server frozen or unreachable) or is missing (the rank never
//                   started) is not answering. A rank stopped inside MPI_Init while its host's
//                   server runs cannot be told from a slow one here.
//   start.setup     MPI_Init returned; the program's first collectives and the watchdog's own
//                   set-up. The guard asks every rank over MPI_COMM_WORLD (its own tags, which the
//                   library never uses there: its communicators are duplicates) and waits 2 s for
//                   the answers, as the watchdog does; every rank's guard answers from then on,
//                   also after its start is done.
//
// When this rank has been in one stage for `timeout` seconds it asks. If every rank answers, the
// start is slow, not hung, and it waits another `timeout`; otherwise it prints the watchdog's
// report (every rank's host from PMIx, else from the answers) and ends the job with exit code 124
// (MPI_Abort once MPI is up, else exiting: the launcher then ends the others).
//
// Without PMIx (another launcher, or a build without libpmix) the guard watches start.setup only.
#pragma once

#include <memory>

namespace a2d::watchdog_detail {

class StartupGuard {
 public:
  // Arms the guard (timeout_seconds > 0): call before MPI_Init.
  explicit StartupGuard(double timeout_seconds);
  // Stops its thread: call before MPI_Finalize.
  ~StartupGuard();
  StartupGuard(const StartupGuard&) = delete;
  StartupGuard& operator=(const StartupGuard&) = delete;

  // MPI_Init returned on this rank with MPI_THREAD_MULTIPLE (stage start.setup).
  void mpi_initialized();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// Under a PMIx launcher, after MPI_Init returned on this rank: waits until MPI_Init has returned
// on every rank of the job (a PMIx fence that collects a key of this library's, so that no
// launcher can complete it on one node alone), before the program sends anything. MPI_Init's own
// closing barrier is a fence without data, which Slurm 22.05's pmix_v4 plugin completes on a node
// as soon as that node's ranks are in it (measured: docs/reliability.md, "Flake hunt"); a rank
// on another node then left MPI_Init and sent its first message to a rank still inside MPI_Init,
// before Open MPI 4.1's ob1 had registered its receive callbacks there: that rank died of
// SIGSEGV (a call through the NULL callback of tag 65) 3-6 % of job starts. Without PMIx
// (a singleton, another launcher, a build without libpmix) it does nothing.
void wait_for_every_rank_in_mpi();

// A watchdog runs on this rank (Watchdog::start): the start is done here; the guard stops
// watching and only answers the other ranks' guards.
void startup_done();

}  // namespace a2d::watchdog_detail
