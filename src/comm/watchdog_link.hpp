// Internal: what the watchdog (watchdog.hpp) needs from the channel between the ranks' watchdogs,
// so that one logic (timeout, status requests, report, abort) runs over MPI and over a Gloo mesh.
//
//   MPI   its own duplicate of the communicator; the watchdog's thread answers requests
//         (probes) and MPI_Abort ends the job.
//   Gloo  its own view of the mesh (gloo/link.cpp): a listener thread answers requests at once
//         and ends this rank when another aborts; a pending receive from every peer fails when
//         that peer's connection closes, which is how a rank that is gone is noticed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace a2d {
class Communicator;
}

namespace a2d::watchdog_detail {

constexpr int kPhaseChars = 64;

// What a rank reports about itself (sent as bytes between ranks of one program).
struct Status {
  double sequence = 0;  // number of phases entered so far
  double seconds = 0;   // inside: since the last progress; outside: since it left the library;
                        // negative: not known (a rank starting, seen by startup_guard.hpp)
  double outside = 0;   // 1: outside attention2d (Watchdog::note_idle); phase = the last one
  char phase[kPhaseChars] = {};
};

// This process's status now.
Status current_status();

// The report of a rank that made no progress for `timeout` seconds, from every rank's answer
// (`answers`, by rank; ranks missing did not answer) and every rank's host: the lines that
// watchdog.hpp shows, ending with "aborting the job". A pure function, tested on its own.
std::string stall_report(int rank, double timeout, const std::map<int, Status>& answers,
                         const std::vector<std::string>& hosts);

// Claims the end of this process for the caller: true for the first caller only, so that of
// several threads noticing a fault at once (a report, an abort from another rank, a closed
// connection) only one prints.
bool claim_ending();
// Blocks forever (the thread that claimed the end is ending the process).
[[noreturn]] void wait_for_the_end();
#ifdef A2D_WITH_MPI
// Ends the MPI job with exit code `code` (MPI_Abort); if the launcher has not ended this rank 5 s
// later (it may wait forever on a frozen host), the rank exits itself with that code.
[[noreturn]] void abort_mpi_job(int code);
#endif

// Bytes moved between the job's hosts, as progress (a transfer of one MPI call may take longer
// than the timeout on a slow link, or after TCP's retransmission backoff, with no phase or tile
// to mark it). The watchdog's thread sums, over this process's TCP connections whose peer is an
// address of one of the job's hosts (never loopback), the bytes received plus the bytes the peer
// acknowledged (the kernel's TCP_INFO: a connection in retransmission backoff moves none), every
// kTransportSampleSeconds; more than its own status messages could have moved since the last
// progress (transport_progress) counts as progress. Linux only; elsewhere it counts nothing.
constexpr double kTransportSampleSeconds = 0.5;

// This host's addresses (IPv4 and IPv6, not loopback), as text separated by spaces.
std::string local_addresses();
// The sum described above over this process's TCP connections to `peers` (addresses as
// local_addresses writes them); 0 where it cannot be read. Where cap_ms > 0, the same pass sets
// each of those connections' retransmission cap (retransmission_cap_ms below; TCP_RTO_MAX_MS,
// Linux 6.15 and later; on older kernels nothing is changed and it is not tried again).
int64_t tcp_bytes_moved(const std::set<std::string>& peers, int cap_ms = 0);
// The cap on TCP's retransmission interval of the job's connections between hosts: a quarter of
// the watchdog's timeout, between 1 s and the kernel's own 120 s. After an outage TCP retries a
// lost segment at an interval that doubled with every try; when a retry right after the link's
// return is lost too (queues overflow as every connection resumes at once), the next one would
// come up to twice the outage later, and the job would look hung. With the cap, a connection
// retries at least about 4 times within the timeout once the link is back. The kernel's give-up
// time (tcp_retries2 = 15 retries) shrinks with it: 61 s for the cap 5 s (--timeout 20), 627 s
// for 75 s (the default --timeout 300), each longer than an outage the timeout lets a job survive
// (docs/reliability.md). A pure function, tested on its own.
int retransmission_cap_ms(double timeout_seconds);

// What TCP_INFO says of one connection, for the report of a stall (tcp_stall_lines).
struct TcpState {
  uint32_t unacked = 0;     // segments sent and not acknowledged
  uint32_t backoff = 0;     // retransmission timeouts in a row (the interval doubles with each)
  uint32_t probes = 0;      // zero-window probes unanswered (the peer's receive window is closed)
  double rto_seconds = 0;   // the retransmission interval now
  bool loss_state = false;  // the sender is in loss recovery (TCP_CA_Loss)
  double last_sent_seconds = 0, last_received_seconds = 0, last_ack_seconds = 0;
};
// One connection's state as text: "" where it has nothing in flight (no unacknowledged segment,
// no backoff, no probe); else the segments, the backoff or the probes, and how long ago it last
// sent, received and was acknowledged. A pure function, tested on its own.
std::string tcp_state_text(const TcpState& state);
// One line per connection of this process to `peers` that has something in flight (as
// tcp_state_text), naming the peer's address and host (`addresses` and `hosts` by rank, as the
// link gathered them): added to the report of a stall, to tell a network that drops or holds
// data (retransmission backoff, a closed window) from ranks that stopped sending. Linux only.
std::string tcp_stall_lines(const std::set<std::string>& peers,
                            const std::vector<std::string>& addresses,
                            const std::vector<std::string>& hosts);
// Whether `moved` bytes since the last progress, in which the ranks' watchdogs exchanged
// `link_messages` status messages with this one, are the job's traffic: more than 4 KiB plus
// 256 bytes per message (the watchdog's own messages are a few dozen bytes each, with the
// transport's header). A pure function, tested on its own.
bool transport_progress(int64_t moved, int64_t link_messages);
// Counts status messages a link sent or received (for transport_progress).
void count_link_messages(int64_t messages);

class Link {
 public:
  virtual ~Link() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's host, by rank (gathered when the link was made).
  virtual const std::vector<std::string>& hosts() const = 0;
  // Every rank's local_addresses(), by rank (gathered when the link was made).
  virtual const std::vector<std::string>& addresses() const = 0;
  // Answers the other ranks' requests that arrived (MPI; Gloo's listener answers at once).
  virtual void serve() = 0;
  // Asks every other rank for its status; `round` tells the answers of this request apart.
  virtual void ask_everyone(uint64_t round) = 0;
  // Adds the answers to request `round` that arrived to `answers`.
  virtual void collect_answers(uint64_t round, std::map<int, Status>& answers) = 0;
  // A rank whose connection closed without saying goodbye, or -1 (MPI: never).
  virtual int gone() const { return -1; }
  // Whether a transport error on the communicator state `mesh` is this link's to report.
  virtual bool carries(const void* /*mesh*/) const { return false; }
  // Ends the whole job with exit code `code` (the caller printed why). Never returns. `quiet`:
  // the other ranks end without a line of their own (a signal, named once by the caller).
  [[noreturn]] virtual void abort_job(int code = 124, bool quiet = false) = 0;
};

// The link over a Gloo communicator (or a CountingCommunicator around one); throws a2d::Error
// for any other communicator, or in a build without Gloo. Collective over `comm`.
std::unique_ptr<Link> make_gloo_link(Communicator& comm);

}  // namespace a2d::watchdog_detail
