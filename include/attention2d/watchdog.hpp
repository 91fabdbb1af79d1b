// attention2d: the watchdog that turns a hang into an error.
//
// A distributed job hangs when one rank dies or stalls while the others wait for it. With a
// Watchdog alive, every rank runs a helper thread that notes the phase the algorithm is in (every
// Communicator::set_phase; kernels add heartbeats between tiles). When a rank has made no
// progress for `timeout_seconds`, it asks every rank for its phase and how long ago it last made
// progress. If some rank is still progressing, the job is slow, not hung, and it keeps waiting.
// If no rank progressed within the timeout, or a rank does not answer, it prints
//
//   a2d watchdog: rank 3 made no progress for 10.0 s in phase forward.q_allgather
//     behind: rank 2 (phase 7 forward.kernel, 10.1 s) on host node2
//     waiting: ranks 0, 1, 3 (phase 8 forward.merge_reduce_scatter, 10.0 s) on hosts node0, node1
//
// and aborts the whole job (MPI_Abort, exit code 124). A rank that does not answer within two
// seconds is reported as not answering (dead or stuck outside MPI), with its host. If MPI_Abort
// has not ended the rank 5 s later (a launcher waiting on a frozen host), the rank exits itself
// with code 124. Requires MPI_THREAD_MULTIPLE, which MpiSession requests.
//
// Fault injection for tests (never set in production): A2D_FAULT_STALL="RANK:PHASE:SECONDS"
// makes RANK sleep SECONDS when it enters PHASE; A2D_FAULT_EXIT="RANK:PHASE" makes it exit.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

namespace a2d {

class Watchdog {
 public:
  // Collective over `comm`. timeout_seconds <= 0 creates an inactive watchdog.
  Watchdog(MPI_Comm comm, double timeout_seconds);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool active() const;

  // Called by the MPI communicator on every phase change (any thread may call it).
  static void note_phase(const std::string& phase);
  // Progress within a phase (a kernel finishing a tile).
  static void heartbeat();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace a2d
