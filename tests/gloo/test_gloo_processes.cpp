// Faults over Gloo, with the ranks started as plain processes (no mpirun; forked here, as torchrun
// would start them) and the mesh bootstrapped through files (make_gloo_communicator's
// AllGatherBytes): a rank that exits mid-operation is named by the others within seconds
// (a2d::Error without a watchdog; with one, every rank ends with code 124 and one report), a
// stalled rank and an idle one are reported by the watchdog, a rank that says goodbye is no
// failure, and a rank that cannot open its device stops every rank.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/watchdog.hpp"

namespace a2d {
namespace {

namespace fs = std::filesystem;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The bootstrap all-gather through a directory: each rank writes its bytes to a file (renamed
// into place when complete) and reads everyone's.
AllGatherBytes file_exchange(const fs::path& dir, int rank, int size) {
  return [dir, rank, size](const std::string& mine) {
    const fs::path own = dir / ("card." + std::to_string(rank));
    {
      std::ofstream out(own.string() + ".tmp", std::ios::binary);
      out << mine;
    }
    fs::rename(own.string() + ".tmp", own);
    std::vector<std::string> all;
    for (int r = 0; r < size; ++r) {
      const fs::path card = dir / ("card." + std::to_string(r));
      const double deadline = now() + 60;
      while (!fs::exists(card)) {
        A2D_REQUIRE(now() < deadline, "rank ", r, " never wrote its card");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      all.push_back(read_file(card));
    }
    return all;
  };
}

struct Outcome {
  int code = -1;  // exit code, or 128 + signal
  std::string err;
};

// Runs body(rank, world) in `size` processes, the world a Gloo mesh made through files; returns
// every process's exit code (2 for an a2d::Error, whose message goes to its stderr) and stderr.
// Processes still running after `limit` seconds are killed (code 128 + 9).
std::vector<Outcome> run_ranks(int size, const std::function<int(int, Communicator&)>& body,
                               const std::function<GlooOptions(int)>& options = nullptr,
                               double limit = 60) {
  char pattern[] = "/tmp/a2d-gloo-XXXXXX";
  const fs::path dir = mkdtemp(pattern);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string err = (dir / ("stderr." + std::to_string(rank))).string();
      std::FILE* file = std::freopen(err.c_str(), "w", stderr);
      (void)file;
      int code = 0;
      try {
        auto world = make_gloo_communicator(rank, size, file_exchange(dir, rank, size),
                                            options ? options(rank) : GlooOptions{});
        code = body(rank, *world);
      } catch (const Error& e) {
        std::fprintf(stderr, "a2d::Error: %s\n", e.message().c_str());
        code = 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "exception: %s\n", e.what());
        code = 3;
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<Outcome> outcomes(static_cast<size_t>(size));
  std::vector<bool> done(static_cast<size_t>(size), false);
  const double deadline = now() + limit;
  for (int finished = 0; finished < size;) {
    for (int rank = 0; rank < size; ++rank) {
      if (done[static_cast<size_t>(rank)]) continue;
      int status = 0;
      if (waitpid(pids[static_cast<size_t>(rank)], &status, WNOHANG) <= 0) continue;
      done[static_cast<size_t>(rank)] = true;
      ++finished;
      outcomes[static_cast<size_t>(rank)].code =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (now() > deadline) {
      for (int rank = 0; rank < size; ++rank) {
        if (!done[static_cast<size_t>(rank)]) kill(pids[static_cast<size_t>(rank)], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int rank = 0; rank < size; ++rank)
    outcomes[static_cast<size_t>(rank)].err = read_file(dir / ("stderr." + std::to_string(rank)));
  fs::remove_all(dir);
  return outcomes;
}

std::string all_of(const std::vector<Outcome>& outcomes) {
  std::string text;
  for (size_t r = 0; r < outcomes.size(); ++r)
    text += "--- rank " + std::to_string(r) + " (exit " + std::to_string(outcomes[r].code) +
            "):\n" + outcomes[r].err;
  return text;
}

// All-gathers of 4 KB per rank in a loop, phase `phase`; rank `leaving` exits (code 7) after
// posting its 20th.
int gather_loop(Communicator& world, int leaving, const std::string& phase, int iterations) {
  world.set_phase(phase);
  const int ranks = world.size(), rank = world.rank();
  std::vector<char> mine(4096, static_cast<char>(rank)), all(4096 * static_cast<size_t>(ranks));
  const std::vector<int64_t> bytes(static_cast<size_t>(ranks), 4096);
  for (int i = 0; i < iterations; ++i) {
    RequestPtr gathered =
        world.all_gather_async(Place::at_host(mine.data()), Place::at_host(all.data()), bytes);
    if (rank == leaving && i == 20) _exit(7);
    gathered->wait();
    world.progress();
  }
  return 0;
}

TEST(GlooProcesses, APeerThatExitsMidOperationIsNamedWithinSeconds) {
  const double start = now();
  const std::vector<Outcome> outcomes = run_ranks(
      4, [](int, Communicator& world) { return gather_loop(world, 2, "test.gather", 100000); });
  const double seconds = now() - start;
  const std::string text = all_of(outcomes);
  EXPECT_LT(seconds, 15) << text;
  EXPECT_EQ(outcomes[2].code, 7) << text;
  for (const int rank : {0, 1, 3}) {
    EXPECT_EQ(outcomes[static_cast<size_t>(rank)].code, 2) << text;
    EXPECT_NE(outcomes[static_cast<size_t>(rank)].err.find(
                  "rank 2 closed its connection (exited or killed?) while this rank waited in "
                  "phase test.gather"),
              std::string::npos)
        << text;
  }
}

// Rank 1 exits while 64 MB go each way between it and rank 0: Gloo does not fail the send it is
// writing or the receive it is reading when a connection closes; rank 0 must not wait forever.
TEST(GlooProcesses, APeerThatExitsDuringLargeTransfersIsNamed) {
  const double start = now();
  const std::vector<Outcome> outcomes = run_ranks(2, [](int rank, Communicator& world) {
    world.set_phase("test.large");
    const int64_t bytes = int64_t{64} << 20;
    std::vector<char> out(static_cast<size_t>(bytes), 'x'), in(static_cast<size_t>(bytes));
    RequestPtr exchange = world.send_recv_async(Place::at_host(out.data()), bytes, 1 - rank,
                                                Place::at_host(in.data()), bytes, 1 - rank);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      _exit(7);
    }
    exchange->wait();
    return 0;
  });
  const std::string text = all_of(outcomes);
  EXPECT_LT(now() - start, 15) << text;
  EXPECT_EQ(outcomes[1].code, 7) << text;
  EXPECT_EQ(outcomes[0].code, 2) << text;
  EXPECT_NE(outcomes[0].err.find("rank 1 closed its connection (exited or killed?) while this "
                                 "rank waited in phase test.large"),
            std::string::npos)
      << text;
}

// Rank 1 sends its last message and leaves; rank 0 waits for it only after rank 1's connection
// closed: the message arrived, and that is no failure.
TEST(GlooProcesses, AMessageThatArrivedBeforeItsSenderLeftIsReceived) {
  const std::vector<Outcome> outcomes = run_ranks(2, [](int rank, Communicator& world) {
    std::vector<int> data(1 << 18, rank == 1 ? 7 : 0);
    const auto bytes = static_cast<int64_t>(data.size() * sizeof(int));
    if (rank == 1) {
      world.send_recv(Place::at_host(data.data()), bytes, 0, {}, 0, 0);
      return 0;  // the world, and its connections, end here
    }
    RequestPtr arriving = world.send_recv_async({}, 0, 1, Place::at_host(data.data()), bytes, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    arriving->wait();
    return data.front() == 7 && data.back() == 7 ? 0 : 5;
  });
  const std::string text = all_of(outcomes);
  EXPECT_EQ(outcomes[0].code, 0) << text;
  EXPECT_EQ(outcomes[1].code, 0) << text;
}

TEST(GlooProcesses, WithAWatchdogEveryRankEndsWhenOneExits) {
  const double start = now();
  const std::vector<Outcome> outcomes = run_ranks(3, [](int, Communicator& world) {
    Watchdog watchdog(world, 60);
    return gather_loop(world, 1, "test.loop", 100000);
  });
  const double seconds = now() - start;
  const std::string text = all_of(outcomes);
  EXPECT_LT(seconds, 15) << text;
  EXPECT_EQ(outcomes[1].code, 7) << text;
  int reports = 0;
  for (const int rank : {0, 2}) {
    const Outcome& o = outcomes[static_cast<size_t>(rank)];
    EXPECT_EQ(o.code, 124) << text;
    EXPECT_EQ(o.err.find("a2d::Error"), std::string::npos) << text;  // the watchdog reports it
    if (o.err.find("a2d watchdog: rank 1 is gone (its connection closed) while this rank was in "
                   "phase test.loop") != std::string::npos) {
      ++reports;
    } else {
      EXPECT_NE(o.err.find("ends: the job was aborted by rank"), std::string::npos) << text;
    }
  }
  EXPECT_GE(reports, 1) << text;
}

TEST(GlooProcesses, TheWatchdogReportsAStalledRankAndEndsEveryRank) {
  const double start = now();
  const std::vector<Outcome> outcomes = run_ranks(3, [](int rank, Communicator& world) {
    Watchdog watchdog(world, 1.0);
    world.set_phase("test.start");
    if (rank == 1) {
      world.set_phase("test.stall");
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    world.set_phase("test.other");
    world.set_phase("test.wait");
    world.barrier();
    return 0;
  });
  const double seconds = now() - start;
  const std::string text = all_of(outcomes);
  EXPECT_LT(seconds, 20) << text;
  for (const Outcome& o : outcomes)
    EXPECT_EQ(o.code, 124) << text;
  EXPECT_NE(text.find("did not arrive (furthest behind): rank 1 (phase 2 test.stall, "),
            std::string::npos)
      << text;
  // Rank 0 reports at once and the others end on its abort, or (on a loaded machine, the abort
  // late) report the same themselves; either way every rank ended with 124.
}

// Ranks 1 and 2 are idle (note_idle) past the timeout while rank 0 waits inside: only rank 0
// triggers, and its report shows the idle ranks with the phase they left.
// Ranks idle past the idle limit (here 3 s; by default torch's 30 minutes) while rank 0 waits
// for one of them inside: reported as idle, never triggering themselves.
TEST(GlooProcesses, IdleRanksAreReportedButNeverTrigger) {
  const std::vector<Outcome> outcomes = run_ranks(3, [](int rank, Communicator& world) {
    Watchdog watchdog(world, 1.0, 3.0);
    if (rank == 0) {
      world.set_phase("test.waits_for_rank_2");
      int x = 0;
      world.send_recv({}, 0, 0, Place::at_host(&x), sizeof x, 2);  // rank 2 never sends
    } else {
      world.set_phase("test.last_call");
      Watchdog::note_idle();
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    return 0;
  });
  const std::string text = all_of(outcomes);
  for (const Outcome& o : outcomes)
    EXPECT_EQ(o.code, 124) << text;
  EXPECT_NE(outcomes[0].err.find("a2d watchdog: rank 0 made no progress for"), std::string::npos)
      << text;
  EXPECT_NE(outcomes[0].err.find("idle: ranks 1, 2 (outside attention2d since "), std::string::npos)
      << text;
  EXPECT_NE(outcomes[0].err.find(" s, after phase test.last_call)"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 1 made no progress"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 2 made no progress"), std::string::npos) << text;
}

// A rank alive outside attention2d for 4 timeouts (a checkpoint save) while the others wait for
// it inside: no hang; the job finishes.
TEST(GlooProcesses, ARankBusyOutsideTheLibraryIsWaitedFor) {
  const std::vector<Outcome> outcomes = run_ranks(3, [](int rank, Communicator& world) {
    Watchdog watchdog(world, 1.0);
    world.set_phase("test.step");
    int64_t x = 1;
    world.all_reduce(&x, 1, Reduction::sum);
    if (rank == 2) {
      Watchdog::note_idle();
      std::this_thread::sleep_for(std::chrono::seconds(4));
      world.set_phase("test.step");
    }
    x = 1;
    world.all_reduce(&x, 1, Reduction::sum);
    return x == 3 ? 0 : 5;
  });
  const std::string text = all_of(outcomes);
  for (const Outcome& o : outcomes)
    EXPECT_EQ(o.code, 0) << text;
  EXPECT_EQ(text.find("a2d watchdog"), std::string::npos) << text;
}

// Rank 2 destroys its watchdog (goodbye) and its mesh, and exits; ranks 0 and 1 stay inside,
// working on between themselves: no one is aborted.
TEST(GlooProcesses, ARankThatSaysGoodbyeIsNoFailure) {
  const std::vector<Outcome> outcomes = run_ranks(3, [](int rank, Communicator& world) {
    auto pair = world.split(rank < 2 ? 0 : 1, rank);
    {
      Watchdog watchdog(world, 30);
      if (rank == 2) return 0;  // the watchdog says goodbye, then the mesh closes
      pair->set_phase("test.pair");
      for (int i = 0; i < 150; ++i) {
        int64_t x = 1;
        pair->all_reduce(&x, 1, Reduction::sum);
        if (x != 2) return 5;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return 0;
  });
  const std::string text = all_of(outcomes);
  for (const Outcome& o : outcomes)
    EXPECT_EQ(o.code, 0) << text;
}

TEST(GlooProcesses, ARankThatCannotOpenItsDeviceStopsEveryRank) {
  const std::vector<Outcome> outcomes = run_ranks(
      2, [](int, Communicator&) { return 0; },
      [](int rank) {
        GlooOptions options;
        if (rank == 1) options.interface = "a2d-no-such-interface";
        return options;
      });
  const std::string text = all_of(outcomes);
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.code, 2) << text;
    EXPECT_NE(o.err.find("rank 1 could not open its Gloo device"), std::string::npos) << text;
    EXPECT_NE(o.err.find("a2d-no-such-interface"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace a2d
