// The watchdog's view of the job's TCP connections (watchdog_link.hpp): this host's addresses,
// the bytes moved to the job's hosts (read from /proc/self/fd and TCP_INFO), the retransmission
// cap, and the state of the connections with data in flight for a stall's report. Linux only.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#ifdef __linux__
#include <linux/tcp.h>
#endif
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44  // Linux 6.15 and later; older headers lack it
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "comm/watchdog_link.hpp"

namespace a2d::watchdog_detail {
namespace {

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

}  // namespace

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

}  // namespace a2d::watchdog_detail
