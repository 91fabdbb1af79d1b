// attention2d: the watchdog that turns a hang into an error.
//
// A distributed job hangs when one rank dies or stalls while the others wait for it. With a
// Watchdog alive, every rank runs a helper thread that notes the phase the algorithm is in (every
// Communicator::set_phase; kernels add heartbeats between tiles). Bytes moving between the job's
// hosts are progress too: the helper thread sums, every 0.5 s, what this process's TCP connections
// to the ranks' addresses received and had acknowledged (Linux's TCP_INFO), beyond what the
// watchdogs' own messages account for, so a transfer that crawls, or resumes after TCP's
// retransmission backoff, is not a hang. When a rank inside attention2d has made no progress for
// `timeout_seconds`, it asks every rank for its phase and how long ago it last made progress. If
// some rank is still progressing, the job is slow, not hung, and it keeps waiting. If no rank
// progressed within the timeout, or a rank does not answer, it prints
//
//   a2d watchdog: rank 3 made no progress for 10.0 s in phase forward.q_allgather
//     behind: rank 2 (phase 7 forward.kernel, 10.1 s) on host node2
//     waiting: ranks 0, 1, 3 (phase 8 forward.merge_reduce_scatter, 10.0 s) on hosts node0, node1
//
// and aborts the whole job (exit code 124). A rank that does not answer within two seconds is
// reported as not answering (dead or stuck), with its host.
//
// Idle ranks: a library host (the Python layer) calls note_idle() when a call returns, and the
// rank is then outside attention2d until its next phase. A rank outside never triggers (a healthy
// job may stay in Python for hours). A rank outside that answers is alive and busy elsewhere (a
// checkpoint save, an evaluation): the ranks waiting for it inside attention2d keep waiting, up to
// `idle_limit_seconds` since it left the library (the Python layer passes the process group's own
// timeout, torch's 30 minutes by default). Only a rank that does not answer (dead, frozen,
// unreachable), a rank stuck inside attention2d, or one outside for longer than the idle limit
// ends the job; an idle rank is reported as
//     idle: rank 2 (outside attention2d since 9.1 s, after phase forward.merge) on host node2
// The command-line program never calls it: its ranks are inside from start to end.
//
// Two transports:
//   MPI   Watchdog(MPI_Comm, timeout): the helper thread answers over a duplicate of the
//         communicator and aborts with MPI_Abort. If MPI_Abort has not ended the rank 5 s later
//         (a launcher waiting on a frozen host), the rank exits itself with code 124. Requires
//         MPI_THREAD_MULTIPLE, which MpiSession requests.
//   Gloo  Watchdog(Communicator&, timeout) over a Gloo communicator (gloo_comm.hpp), on a view of
//         its mesh of its own (no new connection). Requests are answered at once by a listener
//         thread. Aborting tells every rank, each printing one line
//           a2d watchdog: rank 3 ends: the job was aborted by rank 0 (its report above)
//         and exiting with code 124. A rank whose connection closes (it exited or was killed)
//         is noticed at once by every rank:
//           a2d watchdog: rank 2 is gone (its connection closed) while this rank was in phase
//             backward.kv_allgather (this is rank 0 on host node0; rank 2 ran on host node2)
//         and the job is aborted (by the lowest rank that noticed it inside attention2d; a rank
//         outside reports it when it next enters). A transfer of this process that fails on
//         that mesh is reported the same way instead of being thrown. Destroying the watchdog
//         says goodbye to the other ranks: a rank that leaves without doing so is reported as
//         gone by the ranks still inside.
//
// Fault injection for tests (never set in production): A2D_FAULT_STALL="RANK:PHASE:SECONDS"
// makes RANK sleep SECONDS when it enters PHASE; A2D_FAULT_EXIT="RANK:PHASE" makes it exit.
// RANK is the rank in MPI_COMM_WORLD, or (without MPI) the rank of the last Gloo world made.
#pragma once

#ifdef A2D_WITH_MPI
#include <mpi.h>
#endif

#include <memory>
#include <string>

namespace a2d {

class Communicator;

class Watchdog {
 public:
  // How long the ranks inside wait for an idle rank that answers (torch's default process group
  // timeout): see "Idle ranks" above.
  static constexpr double kDefaultIdleLimit = 1800;

#ifdef A2D_WITH_MPI
  // Collective over `comm`. timeout_seconds <= 0 creates an inactive watchdog.
  Watchdog(MPI_Comm comm, double timeout_seconds, double idle_limit_seconds = kDefaultIdleLimit);
#endif
  // Collective over `gloo_world`, a Gloo communicator (or a CountingCommunicator around one):
  // the watchdog takes its own view of the mesh. timeout_seconds <= 0 creates an inactive
  // watchdog. Throws a2d::Error for another kind of communicator, or in a build without Gloo.
  Watchdog(Communicator& gloo_world, double timeout_seconds,
           double idle_limit_seconds = kDefaultIdleLimit);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool active() const;

  // Called by the communicators on every phase change (any thread may call it): this rank is
  // inside attention2d, in `phase`. A library host may call it on entry, before any phase.
  static void note_phase(const std::string& phase);
  // Progress within a phase (a kernel finishing a tile).
  static void heartbeat();
  // This rank left attention2d (a library call returned): it stops counting towards a stall
  // until its next phase (see "Idle ranks" above).
  static void note_idle();
  // The phase this process is in ("outside attention2d" while idle), for error messages.
  static std::string current_phase();

  // Internal (the Gloo communicator): a transfer on the mesh `mesh` failed with `message`. If
  // the active watchdog watches that mesh, it reports the message and ends the job, and this
  // call does not return; otherwise it returns at once and the caller throws. mesh == nullptr
  // (a transport the watchdog does not carry: a caller's process group, group_comm.hpp): any
  // active watchdog reports it (naming the rank that is gone where its own link saw it go).
  static void transport_failed(const void* mesh, const std::string& message);

  // Ends the job on SIGTERM (and SIGINT when `interrupt` is true) instead of dying at once, so
  // that every rank stops, one line names the signal and outputs stay complete or absent
  // (docs/reliability.md, "Signals"). Installs the handlers (they only write to a pipe) and a
  // thread that, on the first signal: runs `before_stop` (the programs pass npy::hold_commits:
  // waits for any output being linked into place and holds back later ones); prints
  //   a2d: rank 2 received SIGTERM; the job stops
  // and ends the job with exit code 128 + signal (143, 130): through the active watchdog
  // (MPI_Abort, or over Gloo every rank told and exiting quietly with that code), else MPI_Abort
  // while MPI runs, else this process alone. A signal from this process's parent (the launcher:
  // mpirun ending the job after another rank ended, or stopping it for a signal of its own) only
  // ends this rank, quietly, with that code: the launcher, or that rank, reports it. A parent that
  // is a shell (sh, bash, zsh, ...: ranks started by hand with the env:// variables) is no
  // launcher: its signal is its user's `kill`, reported as any other's. Except where
  // the parent is slurmstepd (srun's tasks): it signals every task of the step at once (scancel,
  // srun's forwarded Ctrl-C, a time limit) and SIGKILL follows within milliseconds, so every rank
  // ends at once with that code and rank 0 prints the line. Only signals
  // whose disposition is the default are taken (an ignored SIGINT stays ignored; a handler of the
  // program's own stays). Once per process; later calls only add SIGINT if asked.
  static void stop_on_signals(bool interrupt, void (*before_stop)() = nullptr);

 private:
  void start(double timeout_seconds, double idle_limit_seconds);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace a2d
