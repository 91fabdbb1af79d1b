// The watchdog's pure pieces (src/comm/watchdog_link.hpp): what counts as the job's traffic, the
// report of a stall, and the line naming a connection with data in flight.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/watchdog_link.hpp"

namespace a2d::watchdog_detail {
namespace {

TEST(WatchdogReport, OnlyBytesBeyondTheStatusMessagesAreProgress) {
  EXPECT_FALSE(transport_progress(0, 0));
  EXPECT_FALSE(transport_progress(4096, 0));
  EXPECT_TRUE(transport_progress(4097, 0));
  // Ten status messages may have moved up to 2560 bytes of their own.
  EXPECT_FALSE(transport_progress(4096 + 2560, 10));
  EXPECT_TRUE(transport_progress(4096 + 2561, 10));
}

TEST(WatchdogReport, TheRetransmissionCapIsAQuarterOfTheTimeoutWithinTheKernelsRange) {
  EXPECT_EQ(retransmission_cap_ms(20), 5000);
  EXPECT_EQ(retransmission_cap_ms(300), 75000);
  EXPECT_EQ(retransmission_cap_ms(3), 1000);       // the kernel's least
  EXPECT_EQ(retransmission_cap_ms(1000), 120000);  // the kernel's default, its most
}

TEST(WatchdogReport, AConnectionWithNothingInFlightIsNotNamed) {
  EXPECT_EQ(tcp_state_text(TcpState{}), "");
}

TEST(WatchdogReport, ARetransmittingConnectionShowsItsBackoff) {
  TcpState s;
  s.unacked = 3;
  s.backoff = 5;
  s.rto_seconds = 6.4;
  s.loss_state = true;
  s.last_sent_seconds = 12.5;
  s.last_received_seconds = 20;
  s.last_ack_seconds = 19.5;
  EXPECT_EQ(tcp_state_text(s),
            "3 segments unacknowledged, retransmission backoff 5 (interval 6.4 s), in loss "
            "recovery; last data sent 12.5 s ago, last data received 20 s ago, last ack 19.5 s "
            "ago");
}

TEST(WatchdogReport, AClosedWindowShowsItsProbes) {
  TcpState s;
  s.probes = 1;
  s.backoff = 1;  // probes back off too: the probes are what the line names
  EXPECT_EQ(tcp_state_text(s),
            "0 segments unacknowledged, 1 zero-window probe unanswered (the peer's receive window "
            "is closed); last data sent 0 s ago, last data received 0 s ago, last ack 0 s ago");
}

TEST(WatchdogReport, TheStallReportNamesWhoWaitsAndWhoIsSilent) {
  std::map<int, Status> answers;
  Status waiting;
  waiting.sequence = 12;
  waiting.seconds = 21;
  std::strcpy(waiting.phase, "control");
  Status behind = waiting;
  behind.sequence = 9;
  std::strcpy(behind.phase, "forward.kv_ring");
  answers[0] = waiting;
  answers[1] = behind;
  const std::string report = stall_report(0, 20, answers, {"h0", "h1", "h2"});
  EXPECT_NE(report.find("a2d watchdog: rank 0 made no progress for 21 s in phase control "
                        "(timeout 20 s)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("did not arrive (furthest behind): rank 1 (phase 9 forward.kv_ring"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("not answering (dead or stuck): rank 2"), std::string::npos) << report;
  const std::string last = "a2d watchdog: aborting the job\n";
  EXPECT_EQ(report.rfind(last), report.size() - last.size()) << report;
}

// The start of a job (startup_guard.hpp): ranks seen starting through PMIx, whose time in their
// stage is not known (negative), are listed without one; a rank that did not answer is named.
TEST(WatchdogReport, StartingRanksAreListedWithoutATimeTheyDoNotHave) {
  std::map<int, Status> answers;
  Status own;
  own.sequence = 2;
  own.seconds = 5.5;
  std::strcpy(own.phase, "start.setup");
  Status starting;
  starting.sequence = 1;
  starting.seconds = -1;
  std::strcpy(starting.phase, "start.mpi_init");
  answers[0] = own;
  answers[2] = starting;
  answers[3] = starting;
  const std::string report = stall_report(0, 5, answers, {"h0", "h1", "h1", "h2"});
  EXPECT_NE(report.find("did not arrive (furthest behind): ranks 2, 3 (phase 1 start.mpi_init) "
                        "on hosts h1, h2\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("waiting: rank 0 (phase 2 start.setup, 5.5 s) on host h0\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("not answering (dead or stuck): rank 1 on host h1\n"), std::string::npos)
      << report;
}

// On this process's own connections: none to the given peers, so no lines.
TEST(WatchdogReport, NoConnectionsNoLines) {
  EXPECT_EQ(tcp_stall_lines({"192.0.2.1"}, {"192.0.2.1"}, {"h0"}), "");
}

}  // namespace
}  // namespace a2d::watchdog_detail
