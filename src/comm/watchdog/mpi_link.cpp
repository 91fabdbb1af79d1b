// The watchdog's link over MPI (watchdog_link.hpp): a duplicate of the communicator, served by
// the watchdog's thread, and MPI_Abort to end the job.
#ifdef A2D_WITH_MPI
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "shared.hpp"

namespace a2d::watchdog_detail {
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

std::unique_ptr<Link> make_mpi_link(MPI_Comm comm) {
  return std::make_unique<MpiLink>(comm);
}

}  // namespace a2d::watchdog_detail
#endif
