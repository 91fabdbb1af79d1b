// attention2d: the communicator interface over Gloo's TCP transport, for jobs started without
// mpirun (torchrun: the Python layer bootstraps it through torch.distributed's all_gather_object).
//
// One full mesh of TCP connections per world: every pair of ranks is connected once, when the
// world is made, with the addresses all-gathered over whatever channel the caller has (`exchange`:
// MPI in a2d's --comm gloo, torch.distributed in Python). Everything after that runs over the
// mesh, with no other channel:
//
//   operations  every operation of comm.hpp, on host memory (buffers the host cannot touch are
//               staged by the algorithms through make_staged_communicator, as for MPI). Transfers
//               are Gloo unbound-buffer sends and receives, progressed by Gloo's I/O thread, so
//               posted operations overlap computation; progress() only feeds the watchdog.
//               Reductions run at wait(), over the blocks in rank order: results are bitwise the
//               same from run to run and on every rank (all_reduce).
//   splits      views of the parent's mesh (no new connection): a rank map and a slot space of
//               their own, so split(0, rank()) is a cheap duplicate and views may be used by two
//               threads at once (one thread per view).
//   errors      a failed transfer (a peer that exited or was killed, an I/O error) throws
//               a2d::Error naming the peer's rank and the phase this rank was in, and closes
//               every connection of the mesh, so that no rank waits forever for this one (the
//               mesh is unusable afterwards). With a watchdog over the mesh (watchdog.hpp), the
//               watchdog reports it and ends the job instead.
//
// Addresses: GlooOptions, else the environment (A2D_GLOO_HOSTNAME; A2D_GLOO_INTERFACE, else
// GLOO_SOCKET_IFNAME as torch reads it), else Gloo's default: the address this host's name
// resolves to. A build without Gloo (-DA2D_WITH_GLOO=OFF, or no libgloo-dev) compiles this header;
// every entry point then throws a2d::Error saying so.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/comm.hpp"

namespace a2d {

// Whether this build has the Gloo communicator (CMake option A2D_WITH_GLOO).
bool gloo_built();

struct GlooOptions {
  // The address to listen on and advertise to the other ranks: a host name or an IP address.
  // "" = A2D_GLOO_HOSTNAME if set, else the address this host's name resolves to (Gloo's default).
  std::string hostname;
  // A network interface (e.g. "eth0") whose address is used instead; "" = A2D_GLOO_INTERFACE,
  // else GLOO_SOCKET_IFNAME, else unused.
  std::string interface;
  // Seconds a transfer may wait before it fails (0 = no limit: the watchdog bounds hangs). On a
  // timeout Gloo closes every connection of the mesh.
  double timeout_seconds = 0;
  // Seconds the ranks may take to connect the mesh.
  double connect_timeout_seconds = 300;
  // Whether Gloo's I/O thread runs under SCHED_BATCH from a post until the wait for it (Linux;
  // unless A2D_GLOO_IO_BATCH=0): so that it cannot preempt a caller that holds a connection's lock
  // and then spin until the caller gets the core back (docs/backends.md, "Small calls over Gloo").
  bool batch_io_thread = true;
};

// Collective over `size` processes: every rank passes its own bytes to `exchange`, which returns
// every rank's bytes in rank order (an all-gather over any bootstrap channel).
using AllGatherBytes = std::function<std::vector<std::string>(const std::string& mine)>;

// Connects every pair of the `size` ranks with Gloo's TCP transport (addresses exchanged through
// `exchange`, called once) and returns the world communicator over this full mesh. A rank that
// cannot open its device (bad interface or host name) makes every rank throw its message.
// Ignores SIGPIPE where its action is the default (a write to a closed connection must fail, not
// end the process); a handler the program installed is left alone.
std::unique_ptr<Communicator> make_gloo_communicator(int rank, int size,
                                                     const AllGatherBytes& exchange,
                                                     const GlooOptions& options = {});

// All-gather of variable-length host bytes over any communicator: every rank's `mine`, in rank
// order. Collective; one all_gather where every rank's bytes are at most about 1 KiB (each rank's
// size and first bytes in a fixed slot), a second for the rest where any rank's are more.
std::vector<std::string> all_gather_bytes(Communicator& comm, const std::string& mine);

}  // namespace a2d
