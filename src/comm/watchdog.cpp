// The watchdog (watchdog.hpp): one logic over two links (watchdog_link.hpp), MPI's here and
// Gloo's in gloo_comm.cpp.
#include "attention2d/watchdog.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#ifdef __linux__
#include <linux/tcp.h>
#endif
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44  // Linux 6.15 and later; older headers lack it
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "attention2d/comm.hpp"
#include "attention2d/error.hpp"
#include "startup_guard.hpp"
#include "watchdog_link.hpp"

namespace a2d {
namespace watchdog_detail {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The phase tracker every communicator feeds; shared with the watchdog's threads.
struct Tracker {
  std::mutex mutex;
  std::string phase = "start";
  int64_t sequence = 0;
  double since = now();
  bool outside = false;

  Status status() {
    std::lock_guard<std::mutex> lock(mutex);
    Status s;
    s.sequence = static_cast<double>(sequence);
    s.seconds = now() - since;
    s.outside = outside ? 1 : 0;
    std::strncpy(s.phase, phase.c_str(), kPhaseChars - 1);
    return s;
  }
};

Tracker g_tracker;

// A2D_FAULT_STALL / A2D_FAULT_EXIT: "RANK:PHASE[:SECONDS]" for this rank, if any.
struct Fault {
  bool set = false;
  std::string phase;
  double seconds = 0;
};

Fault fault_for(const char* variable, int rank) {
  Fault fault;
  const char* text = std::getenv(variable);
  if (!text) return fault;
  const std::string spec = text;
  const auto first = spec.find(':');
  if (first == std::string::npos || std::atoi(spec.substr(0, first).c_str()) != rank) return fault;
  const auto second = spec.find(':', first + 1);
  fault.set = true;
  fault.phase =
      spec.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  if (second != std::string::npos) fault.seconds = std::atof(spec.c_str() + second + 1);
  return fault;
}

// The rank the fault injection matches: MPI_COMM_WORLD's, else the last Gloo world's.
int process_rank() {
#ifdef A2D_WITH_MPI
  int initialized = 0, rank = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
  }
#endif
  return std::max(error_rank(), 0);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < ranks.size(); ++i)
    out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// " on host h2" or " on hosts h1, h2" for a group of ranks: which machine to look at.
std::string hosts_of(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  std::vector<std::string> names;
  for (int peer : ranks) {
    const std::string& host =
        peer >= 0 && peer < static_cast<int>(hosts.size()) ? hosts[peer] : std::string("?");
    if (std::find(names.begin(), names.end(), host) == names.end()) names.push_back(host);
  }
  std::string text = names.size() > 1 ? " on hosts " : " on host ";
  const size_t shown = std::min<size_t>(names.size(), 4);
  for (size_t i = 0; i < shown; ++i)
    text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
  return text;
}

// An address as text; an IPv4 address mapped into IPv6 as IPv4 (as local_addresses lists it).
std::string address_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof text);
  } else if (address->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      inet_ntop(AF_INET, &v6.s6_addr[12], text, sizeof text);
    } else {
      inet_ntop(AF_INET6, &v6, text, sizeof text);
    }
  }
  return text;
}

bool loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return true;
}

std::atomic<int64_t> g_link_messages{0};

std::atomic<bool> g_ending{false};
// Another rank told this one that it is ending the job for a signal it received (MPI link).
std::atomic<bool> g_end_announced{false};

}  // namespace

Status current_status() {
  return g_tracker.status();
}

std::string local_addresses() {
  std::string text;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return text;
  for (const ifaddrs* entry = list; entry; entry = entry->ifa_next) {
    if (!entry->ifa_addr || loopback(entry->ifa_addr)) continue;
    const std::string address = address_text(entry->ifa_addr);
    if (!address.empty()) text += (text.empty() ? "" : " ") + address;
  }
  freeifaddrs(list);
  return text;
}

namespace {

// Calls fn(fd, peer address, TCP_INFO) for each of this process's TCP connections whose peer is one
// of `peers` (never loopback). Linux only; elsewhere it calls nothing.
template <typename Fn>
void for_each_peer_connection(const std::set<std::string>& peers, Fn&& fn) {
#ifdef __linux__
  DIR* fds = opendir("/proc/self/fd");
  if (!fds) return;
  const int own = dirfd(fds);
  while (const dirent* entry = readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9' || fd == own) continue;
    int type = 0;
    socklen_t length = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage peer = {};
    length = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
    const auto* address = reinterpret_cast<const sockaddr*>(&peer);
    if ((address->sa_family != AF_INET && address->sa_family != AF_INET6) || loopback(address))
      continue;
    const std::string text = address_text(address);
    if (!peers.count(text)) continue;
    tcp_info info = {};
    length = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) continue;
    fn(fd, text, info);
  }
  closedir(fds);
#else
  (void)peers;
  (void)fn;
#endif
}

}  // namespace

namespace {
std::atomic<bool> g_rto_cap_unsupported{false};
}  // namespace

int64_t tcp_bytes_moved(const std::set<std::string>& peers, int cap_ms) {
  int64_t moved = 0;
#ifdef __linux__
  for_each_peer_connection(peers, [&](int fd, const std::string&, const tcp_info& info) {
    moved += static_cast<int64_t>(info.tcpi_bytes_received + info.tcpi_bytes_acked);
    if (cap_ms > 0 && !g_rto_cap_unsupported.load() &&
        setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &cap_ms, sizeof cap_ms) != 0 &&
        errno == ENOPROTOOPT)
      g_rto_cap_unsupported = true;  // an older kernel: nothing is changed, not tried again
  });
#else
  (void)peers;
  (void)cap_ms;
#endif
  return moved;
}

int retransmission_cap_ms(double timeout_seconds) {
  const double seconds = std::clamp(timeout_seconds / 4, 1.0, 120.0);
  return static_cast<int>(seconds * 1000);
}

std::string tcp_state_text(const TcpState& s) {
  if (s.unacked == 0 && s.backoff == 0 && s.probes == 0) return "";
  std::ostringstream out;
  out << s.unacked << " segment" << (s.unacked == 1 ? "" : "s") << " unacknowledged";
  if (s.probes > 0) {
    out << ", " << s.probes << " zero-window probe" << (s.probes == 1 ? "" : "s")
        << " unanswered (the peer's receive window is closed)";
  } else if (s.backoff > 0) {
    out << ", retransmission backoff " << s.backoff << " (interval " << s.rto_seconds << " s)";
  }
  if (s.loss_state) out << ", in loss recovery";
  out << "; last data sent " << s.last_sent_seconds << " s ago, last data received "
      << s.last_received_seconds << " s ago, last ack " << s.last_ack_seconds << " s ago";
  return out.str();
}

std::string tcp_stall_lines(const std::set<std::string>& peers,
                            const std::vector<std::string>& addresses,
                            const std::vector<std::string>& hosts) {
  std::string lines;
#ifdef __linux__
  for_each_peer_connection(peers, [&](int, const std::string& address, const tcp_info& info) {
    TcpState s;
    s.unacked = info.tcpi_unacked;
    s.backoff = info.tcpi_backoff;
    s.probes = info.tcpi_probes;
    s.rto_seconds = info.tcpi_rto / 1e6;
    s.loss_state = info.tcpi_ca_state == TCP_CA_Loss;
    s.last_sent_seconds = info.tcpi_last_data_sent / 1e3;
    s.last_received_seconds = info.tcpi_last_data_recv / 1e3;
    s.last_ack_seconds = info.tcpi_last_ack_recv / 1e3;
    const std::string state = tcp_state_text(s);
    if (state.empty()) return;
    std::string who;
    for (size_t peer = 0; peer < addresses.size() && who.empty(); ++peer) {
      std::istringstream words(addresses[peer]);
      for (std::string word; words >> word;) {
        if (word == address) {
          who = " (host " + (peer < hosts.size() ? hosts[peer] : std::string("?")) + ")";
          break;
        }
      }
    }
    lines += "  TCP to " + address + who + ": " + state + "\n";
  });
#else
  (void)peers;
  (void)addresses;
  (void)hosts;
#endif
  return lines;
}

bool transport_progress(int64_t moved, int64_t link_messages) {
  return moved > 4096 + 256 * link_messages;
}

void count_link_messages(int64_t messages) {
  g_link_messages.fetch_add(messages);
}

bool claim_ending() {
  return !g_ending.exchange(true);
}

void wait_for_the_end() {
  for (;;)
    std::this_thread::sleep_for(std::chrono::seconds(1));
}

std::string stall_report(int rank, double timeout, const std::map<int, Status>& answers,
                         const std::vector<std::string>& hosts) {
  const auto own = answers.find(rank);
  const Status mine = own == answers.end() ? Status{} : own->second;
  // Ranks inside attention2d, grouped by (sequence, phase); ranks outside, by their last phase.
  double furthest = 0, last = 1e300;
  bool any_inside = false;
  for (const auto& [peer, s] : answers) {
    if (s.outside) continue;
    any_inside = true;
    furthest = std::max(furthest, s.sequence);
    last = std::min(last, s.sequence);
  }
  if (!any_inside) last = furthest;
  std::map<std::pair<double, std::string>, std::vector<int>> groups;
  std::map<std::pair<double, std::string>, double> longest;  // -1: not known for any of them
  std::map<std::string, std::vector<int>> idle;
  std::map<std::string, double> idle_longest;
  for (const auto& [peer, s] : answers) {
    if (s.outside) {
      idle[s.phase].push_back(peer);
      idle_longest[s.phase] = std::max(idle_longest[s.phase], s.seconds);
      continue;
    }
    const auto key = std::make_pair(s.sequence, std::string(s.phase));
    groups[key].push_back(peer);
    const auto known = longest.find(key);
    longest[key] = known == longest.end() ? s.seconds : std::max(known->second, s.seconds);
  }
  std::ostringstream out;
  out << "a2d watchdog: rank " << rank << " made no progress for " << mine.seconds << " s in phase "
      << mine.phase << " (timeout " << timeout << " s)\n";
  for (const auto& [key, ranks] : groups) {
    out << "  "
        << (key.first == last && last < furthest ? "did not arrive (furthest behind): "
            : key.first < furthest               ? "behind: "
                                                 : "waiting: ")
        << rank_list(ranks) << " (phase " << static_cast<int64_t>(key.first) << " " << key.second;
    if (longest[key] >= 0) out << ", " << longest[key] << " s";
    out << ")" << hosts_of(ranks, hosts) << "\n";
  }
  for (const auto& [phase, ranks] : idle) {
    out << "  idle: " << rank_list(ranks) << " (outside attention2d since " << idle_longest[phase]
        << " s, after phase " << phase << ")" << hosts_of(ranks, hosts) << "\n";
  }
  std::vector<int> silent;
  for (int peer = 0; peer < static_cast<int>(hosts.size()); ++peer) {
    if (!answers.count(peer)) silent.push_back(peer);
  }
  if (!silent.empty()) {
    out << "  not answering (dead or stuck): " << rank_list(silent) << hosts_of(silent, hosts)
        << "\n";
  }
  out << "a2d watchdog: aborting the job\n";
  return out.str();
}

#ifdef A2D_WITH_MPI
namespace {
// How long a rank that called MPI_Abort waits for the launcher to end it before it exits itself.
constexpr double kAbortGraceSeconds = 5.0;
}  // namespace

// MPI_Abort asks the launcher to end every rank; it may never return when the launcher waits
// on a host whose processes are all stopped (its daemon too). This rank then ends itself after
// kAbortGraceSeconds, so that no live rank outlasts its abort for long (see docs/reliability.md,
// "Faults across hosts").
[[noreturn]] void abort_mpi_job(int code) {
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceSeconds));
    std::fputs("a2d watchdog: MPI_Abort did not end this rank; it exits itself\n", stderr);
    std::_Exit(code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

namespace {

constexpr int kTagRequest = 71;
constexpr int kTagReply = 72;
constexpr int kTagEnding = 73;  // "I end the job for a signal": the others stay quiet

// The MPI link: a duplicate of the communicator, served by the watchdog's thread.
class MpiLink final : public Link {
 public:
  explicit MpiLink(MPI_Comm comm) {
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(host, &length);
    std::vector<char> all(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                  MPI_CHAR, comm_);
    for (int peer = 0; peer < size_; ++peer)
      hosts_.emplace_back(all.data() + static_cast<size_t>(peer) * MPI_MAX_PROCESSOR_NAME);
    // Every rank's addresses, for the bytes between the job's hosts (tcp_bytes_moved).
    const std::string mine = local_addresses();
    const int length_mine = static_cast<int>(mine.size());
    std::vector<int> lengths(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
    MPI_Allgather(&length_mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_);
    int total = 0;
    for (int peer = 0; peer < size_; ++peer) {
      offsets[static_cast<size_t>(peer)] = total;
      total += lengths[static_cast<size_t>(peer)];
    }
    std::vector<char> text(static_cast<size_t>(std::max(total, 1)));
    MPI_Allgatherv(mine.data(), length_mine, MPI_CHAR, text.data(), lengths.data(), offsets.data(),
                   MPI_CHAR, comm_);
    for (int peer = 0; peer < size_; ++peer)
      addresses_.emplace_back(text.data() + offsets[static_cast<size_t>(peer)],
                              static_cast<size_t>(lengths[static_cast<size_t>(peer)]));
  }
  ~MpiLink() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  const std::vector<std::string>& addresses() const override { return addresses_; }

  void serve() override {
    int ending = 0;
    MPI_Status ending_probe;
    MPI_Iprobe(MPI_ANY_SOURCE, kTagEnding, comm_, &ending, &ending_probe);
    if (ending) g_end_announced.store(true);
    for (;;) {
      int pending = 0;
      MPI_Status probe;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagRequest, comm_, &pending, &probe);
      if (!pending) return;
      char ignored = 0;
      MPI_Recv(&ignored, 1, MPI_CHAR, probe.MPI_SOURCE, kTagRequest, comm_, MPI_STATUS_IGNORE);
      Status mine = current_status();
      MPI_Send(&mine, sizeof mine, MPI_BYTE, probe.MPI_SOURCE, kTagReply, comm_);
      count_link_messages(2);
    }
  }

  void ask_everyone(uint64_t /*round*/) override {
    static const char request = 1;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request sent;
      MPI_Isend(&request, 1, MPI_CHAR, peer, kTagRequest, comm_, &sent);
      MPI_Request_free(&sent);
    }
    count_link_messages(size_ - 1);
  }

  void collect_answers(uint64_t /*round*/, std::map<int, Status>& answers) override {
    for (;;) {
      int pending = 0;
      MPI_Status probe;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagReply, comm_, &pending, &probe);
      if (!pending) return;
      Status s;
      MPI_Recv(&s, sizeof s, MPI_BYTE, probe.MPI_SOURCE, kTagReply, comm_, MPI_STATUS_IGNORE);
      answers[probe.MPI_SOURCE] = s;
      count_link_messages(1);
    }
  }

  [[noreturn]] void abort_job(int code, bool quiet) override {
    if (quiet) {
      // Tell the others before MPI_Abort, whose teardown reaches them a second or more later: a
      // rank that received the same signal then stays quiet (Watchdog::stop_on_signals).
      static const char ending = 1;
      std::vector<MPI_Request> sent(static_cast<size_t>(size_), MPI_REQUEST_NULL);
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != rank_) MPI_Isend(&ending, 1, MPI_CHAR, peer, kTagEnding, comm_, &sent[peer]);
      }
      const double deadline = now() + 0.2;
      for (int done = 0; !done && now() < deadline;) {
        MPI_Testall(size_, sent.data(), &done, MPI_STATUSES_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    abort_mpi_job(code);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> hosts_;
  std::vector<std::string> addresses_;
};

}  // namespace
#endif

// The watchdog's thread and what it knows (Watchdog::State).
struct Engine {
  std::unique_ptr<Link> link;
  double timeout = 0;
  double idle_limit = 0;  // how long an idle rank that answers is waited for
  std::atomic<bool> stop{false};
  std::thread thread;
  uint64_t round = 0;
  // A transfer of this process that failed on the link's mesh (transport_failed).
  std::mutex failure_mutex;
  std::string failure;
  // Every rank's addresses (for tcp_bytes_moved and tcp_stall_lines), filled by run().
  std::set<std::string> peers;

  static void print(const std::string& text) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  }

  // Called when this rank made no progress for the timeout. Aborts the job if no rank did (or a
  // rank does not answer); returns if some rank is still making progress.
  void check_everyone(const Status& mine) {
    // Ask everyone, keep serving the others' requests, wait up to two seconds for the answers.
    ++round;
    link->ask_everyone(round);
    std::map<int, Status> answers;
    answers[link->rank()] = mine;
    const double deadline = now() + 2.0;
    const auto everyone = static_cast<size_t>(link->size());
    while (answers.size() < everyone && now() < deadline) {
      link->serve();
      link->collect_answers(round, answers);
      if (answers.size() < everyone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // This rank moved on while it asked (what it waited for arrived), or is stopping: no hang. A
    // job's end races the question: the rank this one waited for sends its last message and
    // stops its watchdog, which then answers nobody (cli.mpi.watchdog's long check under the
    // sanitizers: rank 0 "not answering" after its check had passed).
    const Status after = current_status();
    if (stop.load() || after.outside || after.sequence != mine.sequence ||
        after.seconds < mine.seconds)
      return;
    if (answers.size() == everyone) {
      for (const auto& [peer, s] : answers) {
        // That rank is progressing inside, or alive and busy outside attention2d (a checkpoint,
        // an evaluation) within the idle limit: this is no hang (yet).
        if (s.seconds < (s.outside ? idle_limit : timeout)) return;
      }
    }
    // Ranks that wait for the same one time out together: rank 0 reports at once, the others
    // after a wait that grows with their rank, in which the first abort reaches them.
    std::this_thread::sleep_for(std::chrono::duration<double>(0.1 * std::min(link->rank(), 20)));
    if (!claim_ending()) wait_for_the_end();
    std::string report = stall_report(link->rank(), timeout, answers, link->hosts());
    // This rank's connections with data in flight (retransmitting, or probing a closed window):
    // where a stall on the network comes from.
    const std::string tcp = tcp_stall_lines(peers, link->addresses(), link->hosts());
    report.insert(report.rfind("a2d watchdog: aborting"), tcp);
    print(report);
    link->abort_job();
  }

  // Reports a rank that is gone, or else a transfer of this rank that failed, and ends the job.
  // Rank 0 reports at once, the others after a wait that grows with their rank, in which an abort
  // already on its way arrives: of the ranks noticing one fault, mostly one reports it. The link
  // usually knows which rank is gone a moment after a transfer noticed a connection closed.
  void report_fault() {
    std::this_thread::sleep_for(std::chrono::duration<double>(0.1 * std::min(link->rank(), 20)));
    for (int i = 0; i < 10 && link->gone() < 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::string what;
    const int peer = link->gone();
    if (peer >= 0) {
      what = gone_text(peer, current_status());
    } else {
      std::lock_guard<std::mutex> lock(failure_mutex);
      what = failure;
    }
    if (!claim_ending()) wait_for_the_end();
    print("a2d watchdog: " + what + "\na2d watchdog: aborting the job\n");
    link->abort_job();
  }

  std::string gone_text(int peer, const Status& mine) const {
    const auto& hosts = link->hosts();
    std::ostringstream out;
    out << "rank " << peer << " is gone (its connection closed) while this rank was in phase "
        << (mine.outside ? "outside attention2d, after " : "") << mine.phase << " (this is rank "
        << link->rank() << " on host " << hosts[static_cast<size_t>(link->rank())] << "; rank "
        << peer << " ran on host " << hosts[static_cast<size_t>(peer)] << ")";
    return out.str();
  }

  bool failed() {
    std::lock_guard<std::mutex> lock(failure_mutex);
    return !failure.empty();
  }

  // Bytes between the job's hosts count as progress (watchdog_link.hpp, tcp_bytes_moved): a
  // transfer that crawls, or resumes after TCP's retransmission backoff, is no hang; a job whose
  // connections are all silent still is.
  void note_transport(double& next_sample, int64_t& moved_at_progress,
                      int64_t& messages_at_progress) {
    if (now() < next_sample) return;
    next_sample = now() + kTransportSampleSeconds;
    const int64_t moved = tcp_bytes_moved(peers, retransmission_cap_ms(timeout));
    const int64_t messages = g_link_messages.load();
    if (moved < moved_at_progress) moved_at_progress = moved;  // a connection closed
    if (!transport_progress(moved - moved_at_progress, messages - messages_at_progress)) return;
    moved_at_progress = moved;
    messages_at_progress = messages;
    std::lock_guard<std::mutex> lock(g_tracker.mutex);
    if (!g_tracker.outside) g_tracker.since = now();
  }

  void run() {
    double next_check = 0, next_sample = 0;
    for (const std::string& text : link->addresses()) {
      std::istringstream words(text);
      for (std::string address; words >> address;)
        peers.insert(address);
    }
    int64_t moved_at_progress = tcp_bytes_moved(peers), messages_at_progress = 0;
    while (!stop.load()) {
      link->serve();
      note_transport(next_sample, moved_at_progress, messages_at_progress);
      const Status mine = current_status();
      // A transfer of this rank that failed on the link's mesh, or a rank that is gone: reported
      // at once from inside attention2d; a rank outside reports a rank gone when it enters again
      // (a job may end with ranks leaving while others are idle).
      if (failed() || (link->gone() >= 0 && !mine.outside)) report_fault();
      if (!mine.outside && mine.seconds > timeout && now() >= next_check) {
        check_everyone(mine);
        next_check = now() + std::min(timeout, 10.0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

namespace {
std::atomic<bool> g_active{false};
// The active watchdog, for transport_failed.
std::mutex g_state_mutex;
Engine* g_state = nullptr;
}  // namespace

}  // namespace watchdog_detail

struct Watchdog::State : watchdog_detail::Engine {};

using watchdog_detail::g_active;
using watchdog_detail::g_state;
using watchdog_detail::g_state_mutex;

#ifdef A2D_WITH_MPI
Watchdog::Watchdog(MPI_Comm comm, double timeout_seconds, double idle_limit_seconds)
    : state_(std::make_unique<State>()) {
  if (timeout_seconds <= 0) return;
  int level = 0;
  MPI_Query_thread(&level);
  A2D_REQUIRE(level >= MPI_THREAD_MULTIPLE,
              "the watchdog (--timeout) needs an MPI library "
              "initialised with MPI_THREAD_MULTIPLE; this one provides level ",
              level);
  A2D_REQUIRE(!g_active.load(), "only one watchdog may be active in a process");
  state_->link = std::make_unique<watchdog_detail::MpiLink>(comm);
  start(timeout_seconds, idle_limit_seconds);
}
#endif

Watchdog::Watchdog(Communicator& gloo_world, double timeout_seconds, double idle_limit_seconds)
    : state_(std::make_unique<State>()) {
  if (timeout_seconds <= 0) return;
  A2D_REQUIRE(!g_active.load(), "only one watchdog may be active in a process");
  state_->link = watchdog_detail::make_gloo_link(gloo_world);
  start(timeout_seconds, idle_limit_seconds);
}

void Watchdog::start(double timeout_seconds, double idle_limit_seconds) {
  state_->timeout = timeout_seconds;
  state_->idle_limit = std::max(idle_limit_seconds, timeout_seconds);
  {
    std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
    watchdog_detail::g_tracker.since = watchdog_detail::now();
  }
  g_active.store(true);
  {
    std::lock_guard<std::mutex> lock(g_state_mutex);
    g_state = state_.get();
  }
  state_->thread = std::thread([state = state_.get()] { state->run(); });
  watchdog_detail::startup_done();  // the start of the job is watched no longer (startup_guard.hpp)
}

Watchdog::~Watchdog() {
  if (!state_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(g_state_mutex);
    g_state = nullptr;
  }
  state_->stop.store(true);
  state_->thread.join();
  state_->link.reset();
  g_active.store(false);
}

bool Watchdog::active() const {
  return state_->thread.joinable();
}

void Watchdog::heartbeat() {
  std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
  watchdog_detail::g_tracker.since = watchdog_detail::now();
}

void Watchdog::note_idle() {
  std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
  watchdog_detail::g_tracker.outside = true;
  watchdog_detail::g_tracker.since = watchdog_detail::now();
}

std::string Watchdog::current_phase() {
  std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
  const std::string& phase = watchdog_detail::g_tracker.phase;
  return watchdog_detail::g_tracker.outside ? "outside attention2d (after " + phase + ")" : phase;
}

void Watchdog::transport_failed(const void* mesh, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(g_state_mutex);
    if (!g_state || !g_state->link || (mesh != nullptr && !g_state->link->carries(mesh))) return;
    std::lock_guard<std::mutex> failure_lock(g_state->failure_mutex);
    if (g_state->failure.empty()) g_state->failure = message;
  }
  // The watchdog's thread reports it and ends the process.
  watchdog_detail::wait_for_the_end();
}

namespace watchdog_detail {
namespace {

// What a signal handler passes to the thread that acts on it: async-signal-safe, a write().
struct Received {
  int32_t signal = 0;
  int32_t sender = 0;  // the sending process (0: the kernel, e.g. a terminal's Ctrl-C)
};
int g_signal_pipe[2] = {-1, -1};
pid_t g_signal_owner = 0;  // the process whose thread reads the pipe
// Under srun the parent is slurmstepd, which signals every task of the step at once, for a cause
// nobody else reports (scancel, srun's forwarded Ctrl-C, a time limit), and srun or slurmstepd
// sends SIGKILL milliseconds later (srun_job.c: job_force_termination).
bool g_parent_is_slurmstepd = false;
int g_slurm_task = -1;  // SLURM_PROCID: the rank before MPI_Init has set one
// Task 0's lines, written by the handler itself (async-signal-safe: a write of a line made before):
// the thread that reads the pipe may run too late, SIGKILL having come first.
std::string g_slurm_lines[2];  // SIGTERM's, SIGINT's
std::atomic<bool> g_slurm_line_written{false};
std::atomic<void (*)()> g_before_stop{nullptr};  // Watchdog::stop_on_signals's before_stop

void on_signal(int signal, siginfo_t* info, void* /*context*/) {
  // A child forked after the handlers were installed (a data loader's worker) has no reading
  // thread: it ends as it would have without them.
  if (::getpid() != g_signal_owner) {
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  const int saved = errno;
  if (g_parent_is_slurmstepd && g_slurm_task == 0 && info && info->si_code == SI_USER &&
      info->si_pid == ::getppid() && (signal == SIGTERM || signal == SIGINT) &&
      !g_slurm_line_written.exchange(true)) {
    const std::string& line = g_slurm_lines[signal == SIGTERM ? 0 : 1];
    const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
    (void)written;
  }
  Received received;
  received.signal = signal;
  received.sender = info && info->si_code == SI_USER ? static_cast<int32_t>(info->si_pid) : 0;
  const ssize_t written = ::write(g_signal_pipe[1], &received, sizeof received);
  (void)written;
  errno = saved;
}

// Only where the disposition is the default: a signal ignored (a background job's SIGINT) stays
// ignored, and a handler of the program's own (Python's signal.signal) stays in charge.
void install(int signal) {
  struct sigaction current = {};
  if (sigaction(signal, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) ||
      current.sa_handler != SIG_DFL)
    return;
  struct sigaction action = {};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
}

bool parent_is_slurmstepd() {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/comm", static_cast<int>(::getppid()));
  FILE* file = std::fopen(path, "r");
  if (!file) return false;
  char name[32] = {};
  const bool read = std::fgets(name, sizeof name, file) != nullptr;
  std::fclose(file);
  return read && std::strncmp(name, "slurmstepd", 10) == 0;
}

const char* signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "a signal";
}

// Ends the job for the first signal received (Watchdog::stop_on_signals).
[[noreturn]] void act_on_signals() {
  Received received;
  for (;;) {
    const ssize_t got = ::read(g_signal_pipe[0], &received, sizeof received);
    if (got == static_cast<ssize_t>(sizeof received)) break;
  }
  const int code = 128 + received.signal;
  const auto from_launcher = [](const Received& r) {
    return r.sender != 0 && r.sender == ::getppid();
  };
  // From slurmstepd: every rank has the signal, and SIGKILL follows within milliseconds (no time
  // for rank 0's note to reach the others, nor for MPI_Abort): each rank ends at once with
  // 128 + signal, and only rank 0 prints the line.
  if (from_launcher(received) && g_parent_is_slurmstepd) {
    if (void (*before_stop)() = g_before_stop.load()) before_stop();
    if (!claim_ending()) wait_for_the_end();  // the watchdog is ending the job already
    const int task = error_rank() >= 0 ? error_rank() : g_slurm_task;
    if (task <= 0 && !g_end_announced.load() && !g_slurm_line_written.exchange(true)) {
      const std::string line = "a2d: rank " + std::to_string(std::max(task, 0)) + " received " +
                               signal_name(received.signal) + "; the job stops\n";
      const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
      (void)written;
    }
    std::_Exit(code);
  }
  // A signal to every rank at once (scancel, `pkill`, a terminal's Ctrl-C where the ranks share
  // its process group): rank 0 reports it at once, the others after a wait that grows with their
  // rank (0.25 s + 0.05 s per rank), in which the lower rank's end reaches them (its note over
  // the MPI link, its quiet abort over Gloo, or the launcher's signal): one line, not one per
  // rank. The note needs the watchdog (--timeout > 0, the default).
  const int rank = std::max(error_rank(), 0);
  if (!from_launcher(received) && rank > 0) {
    const double until = now() + 0.25 + 0.05 * std::min(rank, 100);
    for (double left = until - now(); left > 0 && !g_end_announced.load(); left = until - now()) {
      pollfd pipe_end = {g_signal_pipe[0], POLLIN, 0};
      if (::poll(&pipe_end, 1, 10) <= 0) continue;
      Received next;
      if (::read(g_signal_pipe[0], &next, sizeof next) == static_cast<ssize_t>(sizeof next) &&
          from_launcher(next)) {
        received.sender = next.sender;  // quiet, with the exit code of the first signal
        break;
      }
    }
  }
  // The program's last step before the end (outputs being linked into place finished; none
  // starts after this).
  if (void (*before_stop)() = g_before_stop.load()) before_stop();
  if (!claim_ending()) wait_for_the_end();  // the watchdog is ending the job already
  // From the launcher (mpirun, orted, torchrun, slurmstepd): it is ending the job, because it was
  // told to or because another rank ended; reporting that is its part, or that rank's.
  if (from_launcher(received) || g_end_announced.load()) std::_Exit(code);
  const std::string line = "a2d: rank " + std::to_string(rank) + " received " +
                           signal_name(received.signal) + "; the job stops\n";
  const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  (void)written;
  {
    std::lock_guard<std::mutex> lock(g_state_mutex);
    if (g_state && g_state->link && !g_state->stop.load()) g_state->link->abort_job(code, true);
  }
#ifdef A2D_WITH_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) abort_mpi_job(code);
#endif
  std::_Exit(code);
}

}  // namespace
}  // namespace watchdog_detail

void Watchdog::stop_on_signals(bool interrupt, void (*before_stop)()) {
  if (before_stop) watchdog_detail::g_before_stop.store(before_stop);
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(watchdog_detail::g_signal_pipe, O_CLOEXEC) != 0) return;
    watchdog_detail::g_signal_owner = ::getpid();
    watchdog_detail::g_parent_is_slurmstepd = watchdog_detail::parent_is_slurmstepd();
    if (const char* task = std::getenv("SLURM_PROCID"))
      watchdog_detail::g_slurm_task = std::atoi(task);
    for (const int signal : {SIGTERM, SIGINT}) {
      watchdog_detail::g_slurm_lines[signal == SIGTERM ? 0 : 1] =
          "a2d: rank 0 received " + std::string(watchdog_detail::signal_name(signal)) +
          "; the job stops\n";
    }
    std::thread(watchdog_detail::act_on_signals).detach();
    watchdog_detail::install(SIGTERM);
  });
  if (interrupt && watchdog_detail::g_signal_pipe[1] >= 0) watchdog_detail::install(SIGINT);
}

void Watchdog::note_phase(const std::string& phase) {
  {
    std::lock_guard<std::mutex> lock(watchdog_detail::g_tracker.mutex);
    watchdog_detail::g_tracker.phase = phase;
    watchdog_detail::g_tracker.outside = false;
    ++watchdog_detail::g_tracker.sequence;
    watchdog_detail::g_tracker.since = watchdog_detail::now();
  }
  // Test-only fault injection (see the header).
  static const int rank = watchdog_detail::process_rank();
  static const watchdog_detail::Fault stall = watchdog_detail::fault_for("A2D_FAULT_STALL", rank);
  static const watchdog_detail::Fault exit_fault =
      watchdog_detail::fault_for("A2D_FAULT_EXIT", rank);
  if (stall.set && stall.phase == phase) {
    std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  }
  if (exit_fault.set && exit_fault.phase == phase) {
    std::fprintf(stderr, "a2d: A2D_FAULT_EXIT: rank %d exits in phase %s\n", rank, phase.c_str());
    std::_Exit(9);
  }
}

}  // namespace a2d
