// The Gloo communicator (gloo_comm.hpp) at the process count this program was started with,
// bootstrapped over MPI: the operations test_comm.cpp does not cover (broadcast, all_reduce of
// every type, barrier, all_to_all with empty blocks, all_gather_bytes), tags and concurrent
// operations, nested splits as the grid and the hybrid make them, duplicates that open no
// connection, two threads on two views at once, bitwise determinism, the watchdog over the mesh
// with every rank idle past its timeout, and the I/O thread's scheduling policy.
// (test_gloo_processes.cpp has the faults.)
#include <gtest/gtest.h>
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/watchdog.hpp"

namespace a2d {
namespace {

// One Gloo world per program (its connections are made once); tests take views of it.
Communicator& gloo_world() {
  static std::unique_ptr<Communicator> world = make_gloo_communicator(MPI_COMM_WORLD);
  return *world;
}

std::unique_ptr<Communicator> view() {
  return gloo_world().split(0, gloo_world().rank());
}

// Small integers: sums in any order are exact.
float value(int rank, int64_t i) {
  return static_cast<float>((rank * 13 + i * 7) % 17 - 8);
}

int open_files() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++count;
  return count;
}

// Whether every rank passed `ok` (so that a failure on one rank fails the test on all).
bool everywhere(Communicator& comm, bool ok) {
  int64_t bad = ok ? 0 : 1;
  comm.all_reduce(&bad, 1, Reduction::sum);
  return bad == 0;
}

TEST(Gloo, BroadcastAllReduceBarrierAndBytesOnUnevenAndEmptyParts) {
  auto comm = view();
  const int ranks = comm->size(), rank = comm->rank();
  // Broadcast from every root, of 0, 1 and 1001 bytes.
  for (int root = 0; root < ranks; ++root) {
    for (const int64_t bytes : {0, 1, 1001}) {
      std::vector<char> data(static_cast<size_t>(bytes), rank == root ? 'a' : 'z');
      for (int64_t i = 0; i < bytes && rank == root; ++i)
        data[static_cast<size_t>(i)] = static_cast<char>('a' + (i + root) % 26);
      comm->broadcast(data.data(), bytes, root);
      for (int64_t i = 0; i < bytes; ++i)
        ASSERT_EQ(data[static_cast<size_t>(i)], static_cast<char>('a' + (i + root) % 26));
    }
  }
  // All-reduce of counts below, at and above the rank count (parts of 0 elements included).
  for (const int64_t count : {0, 1, 2, 5, 1003}) {
    std::vector<float> f(static_cast<size_t>(count));
    std::vector<double> d(f.size());
    std::vector<int64_t> n(f.size());
    for (int64_t i = 0; i < count; ++i) {
      f[static_cast<size_t>(i)] = value(rank, i);
      d[static_cast<size_t>(i)] = 0.5 * value(rank, i + 1);
      n[static_cast<size_t>(i)] = (int64_t{1} << 40) * value(rank, i + 2);
    }
    std::vector<float> fmax = f;
    comm->all_reduce(f.data(), count, Reduction::sum);
    comm->all_reduce(fmax.data(), count, Reduction::max);
    comm->all_reduce(d.data(), count, Reduction::sum);
    comm->all_reduce(n.data(), count, Reduction::max);
    for (int64_t i = 0; i < count; ++i) {
      float sum = 0, max = -1e30f;
      double dsum = 0;
      int64_t nmax = INT64_MIN;
      for (int r = 0; r < ranks; ++r) {
        sum += value(r, i);
        max = std::max(max, value(r, i));
        dsum += 0.5 * value(r, i + 1);
        nmax = std::max(nmax, (int64_t{1} << 40) * static_cast<int64_t>(value(r, i + 2)));
      }
      ASSERT_EQ(f[static_cast<size_t>(i)], sum) << count << " " << i;
      ASSERT_EQ(fmax[static_cast<size_t>(i)], max) << count << " " << i;
      ASSERT_EQ(d[static_cast<size_t>(i)], dsum) << count << " " << i;
      ASSERT_EQ(n[static_cast<size_t>(i)], nmax) << count << " " << i;
    }
  }
  comm->barrier();

  // All-to-all: rank r sends (r + j) % 3 bytes to rank j (some blocks empty, its own included).
  std::vector<int64_t> send_bytes, recv_bytes;
  std::vector<char> send, want;
  for (int j = 0; j < ranks; ++j) {
    send_bytes.push_back((rank + j) % 3);
    recv_bytes.push_back((j + rank) % 3);
    for (int64_t i = 0; i < send_bytes.back(); ++i)
      send.push_back(static_cast<char>(rank * 16 + j * 4 + i));
  }
  for (int j = 0; j < ranks; ++j) {
    for (int64_t i = 0; i < recv_bytes[static_cast<size_t>(j)]; ++i)
      want.push_back(static_cast<char>(j * 16 + rank * 4 + i));
  }
  std::vector<char> got(want.size(), 'x');
  comm->all_to_all_async(Place::at_host(send.data()), send_bytes, Place::at_host(got.data()),
                         recv_bytes)
      ->wait();
  EXPECT_EQ(got, want);

  // all_gather_bytes: lengths 0, 1, ... including an empty string.
  const std::string mine(static_cast<size_t>(rank), static_cast<char>('A' + rank));
  const std::vector<std::string> all = all_gather_bytes(*comm, mine);
  ASSERT_EQ(static_cast<int>(all.size()), ranks);
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(all[static_cast<size_t>(r)], std::string(static_cast<size_t>(r), 'A' + r));
  // Around the first round's slot (1016 bytes inline): some ranks' bytes fit, others' take the
  // second round; and one rank with 100 kB while the others send nothing.
  const auto pattern = [](int r, int64_t n) {
    std::string text(static_cast<size_t>(n), '\0');
    for (int64_t i = 0; i < n; ++i)
      text[static_cast<size_t>(i)] = static_cast<char>((i * 7 + r * 13) % 251);
    return text;
  };
  for (const int64_t base : {int64_t{1000}, int64_t{1016}, int64_t{100000}}) {
    const int64_t n = base == 100000 ? (rank == ranks - 1 ? base : 0) : base + 9 * rank;
    const std::vector<std::string> gathered = all_gather_bytes(*comm, pattern(rank, n));
    for (int r = 0; r < ranks; ++r) {
      const int64_t length = base == 100000 ? (r == ranks - 1 ? base : 0) : base + 9 * r;
      EXPECT_EQ(gathered[static_cast<size_t>(r)], pattern(r, length))
          << "base " << base << " rank " << r;
    }
  }
}

// Exchanges told apart by tag, posted in opposite orders on the two sides, and several posted
// collectives of one communicator waited for in reverse order.
TEST(Gloo, TagsAndConcurrentOperationsKeepTheirMessagesApart) {
  auto comm = view();
  const int ranks = comm->size(), rank = comm->rank();
  const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
  std::vector<int> out1(100, rank * 10 + 1), out2(7, rank * 10 + 2), in1(100, -1), in2(7, -1);
  const int64_t b1 = 100 * sizeof(int), b2 = 7 * sizeof(int);
  RequestPtr r2 = comm->send_recv_async({}, 0, next, Place::at_host(in2.data()), b2, prev, 2);
  RequestPtr s1 = comm->send_recv_async(Place::at_host(out1.data()), b1, next, {}, 0, prev, 1);
  RequestPtr r1 = comm->send_recv_async({}, 0, next, Place::at_host(in1.data()), b1, prev, 1);
  RequestPtr s2 = comm->send_recv_async(Place::at_host(out2.data()), b2, next, {}, 0, prev, 2);
  r1->wait();
  r2->wait();
  s2->wait();
  s1->wait();
  EXPECT_EQ(in1, std::vector<int>(100, prev * 10 + 1));
  EXPECT_EQ(in2, std::vector<int>(7, prev * 10 + 2));

  const std::vector<int64_t> bytes(static_cast<size_t>(ranks), sizeof(int));
  std::vector<int> gathered[3];
  int own[3];
  RequestPtr posted[3];
  for (int k = 0; k < 3; ++k) {
    own[k] = 1000 * k + rank;
    gathered[k].assign(static_cast<size_t>(ranks), -1);
    posted[k] =
        comm->all_gather_async(Place::at_host(&own[k]), Place::at_host(gathered[k].data()), bytes);
  }
  for (int k = 2; k >= 0; --k) {
    posted[k]->wait();
    for (int r = 0; r < ranks; ++r)
      EXPECT_EQ(gathered[k][static_cast<size_t>(r)], 1000 * k + r) << k;
  }
  // A request destroyed without wait() waits for itself.
  std::vector<int> late(static_cast<size_t>(ranks), -1);
  comm->all_gather_async(Place::at_host(&rank), Place::at_host(late.data()), bytes);
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(late[static_cast<size_t>(r)], r);
  try {
    comm->send_recv(Place::at_host(&rank), sizeof rank, next, {}, 0, prev, 0x8000);
    ADD_FAILURE() << "a tag of the collectives' range was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("tags must be in [0, 32768)"), std::string::npos) << e.message();
  }
}

// Rows then columns of an R x C grid (Grid's splits), the hybrid's heads groups and a grid inside
// each, and a split of a split: every view holds the ranks it should, in key order.
TEST(Gloo, NestedSplitsHoldTheirRanksInKeyOrder) {
  auto world = view();
  const int ranks = world->size(), rank = world->rank();
  const auto members = [](Communicator& c, int id) {
    std::vector<int> all(static_cast<size_t>(c.size()));
    c.all_gather(Place::at_host(&id), Place::at_host(all.data()),
                 std::vector<int64_t>(all.size(), sizeof(int)));
    return all;
  };
  const int cols = ranks % 2 == 0 ? 2 : 1, rows = ranks / cols;
  const int row = rank / cols, col = rank % cols;
  auto row_comm = world->split(row, col);
  auto col_comm = world->split(rows + col, row);
  std::vector<int> want_row, want_col;
  for (int c = 0; c < cols; ++c)
    want_row.push_back(row * cols + c);
  for (int r = 0; r < rows; ++r)
    want_col.push_back(r * cols + col);
  EXPECT_EQ(members(*row_comm, rank), want_row);
  EXPECT_EQ(members(*col_comm, rank), want_col);
  // Reversed keys reverse the order; a split of a split.
  auto reversed = world->split(0, ranks - rank);
  std::vector<int> backwards(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    backwards[static_cast<size_t>(r)] = ranks - 1 - r;
  EXPECT_EQ(members(*reversed, rank), backwards);
  auto halves = reversed->split(rank % 2, rank);
  std::vector<int> same_parity;
  for (int r = rank % 2; r < ranks; r += 2)
    same_parity.push_back(r);
  EXPECT_EQ(members(*halves, rank), same_parity);
  auto single = halves->split(rank, 0);
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(members(*single, rank), std::vector<int>{rank});
  // The hybrid: heads groups of U consecutive-in-sequence ranks, a grid in each.
  const int groups = ranks % 2 == 0 ? 2 : 1;
  auto heads = world->split(rank % groups, rank / groups);
  auto grid = world->split(rank / groups, rank % groups);
  auto grid_rows = grid->split(0, grid->rank());
  EXPECT_EQ(heads->size(), ranks / groups);
  EXPECT_EQ(grid->size(), groups);
  EXPECT_EQ(members(*grid_rows, rank), members(*grid, rank));
  // Messages of parent and children posted together do not mix.
  std::vector<int> a(static_cast<size_t>(world->size())), b(static_cast<size_t>(row_comm->size()));
  RequestPtr pa = world->all_gather_async(Place::at_host(&rank), Place::at_host(a.data()),
                                          std::vector<int64_t>(a.size(), sizeof(int)));
  const int tagged = -rank;
  RequestPtr pb = row_comm->all_gather_async(Place::at_host(&tagged), Place::at_host(b.data()),
                                             std::vector<int64_t>(b.size(), sizeof(int)));
  pb->wait();
  pa->wait();
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(a[static_cast<size_t>(r)], r);
  for (int c = 0; c < cols; ++c)
    EXPECT_EQ(b[static_cast<size_t>(c)], -(row * cols + c));
}

// split(0, rank()) is how an engine duplicates its communicator: 50 of them, used and destroyed,
// leave the number of open files where it was (no socket is opened).
TEST(Gloo, FiftyDuplicatesOpenNoConnection) {
  auto comm = view();
  comm->barrier();
  const int before = open_files();
  for (int i = 0; i < 50; ++i) {
    auto duplicate = comm->split(0, comm->rank());
    int64_t x = i;
    duplicate->all_reduce(&x, 1, Reduction::sum);
    ASSERT_EQ(x, int64_t{i} * comm->size());
  }
  const int after = open_files();
  EXPECT_EQ(after, before);
  EXPECT_TRUE(everywhere(*comm, after == before));
}

// Two threads, each with its own view, run collectives and shifts at the same time.
TEST(Gloo, TwoThreadsUseTwoViewsAtOnce) {
  auto first = view();
  auto second = view();
  const int ranks = first->size(), rank = first->rank();
  std::atomic<int> wrong{0};
  const auto work = [&](Communicator& comm, int salt) {
    for (int i = 0; i < 100; ++i) {
      std::vector<float> data(37);
      for (size_t k = 0; k < data.size(); ++k)
        data[k] = value(rank + salt, static_cast<int64_t>(k) + i);
      comm.all_reduce(data.data(), static_cast<int64_t>(data.size()), Reduction::sum);
      for (size_t k = 0; k < data.size(); ++k) {
        float sum = 0;
        for (int r = 0; r < ranks; ++r)
          sum += value(r + salt, static_cast<int64_t>(k) + i);
        if (data[k] != sum) ++wrong;
      }
      const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
      int out = rank * 1000 + i + salt, in = -1;
      comm.send_recv(Place::at_host(&out), sizeof out, next, Place::at_host(&in), sizeof in, prev,
                     5);
      if (in != prev * 1000 + i + salt) ++wrong;
    }
  };
  std::thread other([&] { work(*second, 500); });
  work(*first, 0);
  other.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Sums of values whose order matters in fp32, and attention merges: the same bits in two runs,
// and all_reduce's result the same bits on every rank.
TEST(Gloo, ResultsAreBitwiseTheSameEveryRun) {
  auto comm = view();
  const int ranks = comm->size(), rank = comm->rank();
  std::vector<int64_t> counts;
  for (int r = 0; r < ranks; ++r)
    counts.push_back((3 * r + 2) % 5);
  int64_t total = 0;
  for (const int64_t c : counts)
    total += c;
  const int64_t record = 6;
  std::vector<float> send(static_cast<size_t>(total * record));
  for (size_t i = 0; i < send.size(); ++i)
    send[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank)) *
                  (i % record == 1 ? 0.5f : 3.0f) +
              (i % record == 1 ? 2.0f : 0.0f);
  const size_t own = static_cast<size_t>(counts[static_cast<size_t>(rank)] * record);
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (const bool merge : {false, true}) {  // a sum, then the attention merge (merge_scatter)
    std::vector<float> first(own), second(own), blocking(own);
    const auto run = [&](std::vector<float>& into, bool posted) {
      const Place from = Place::at_host(send.data()), to = Place::at_host(into.data());
      if (merge) {
        comm->merge_scatter(from, to, counts, record, *cpu);  // blocking only
      } else if (posted) {
        comm->reduce_scatter_async(from, to, counts, record, Reduction::sum)->wait();
      } else {
        comm->reduce_scatter(from, to, counts, record, Reduction::sum);
      }
    };
    run(first, true);
    run(second, true);
    run(blocking, false);
    EXPECT_EQ(first.size(), own);  // compared as bytes (memcmp), NaN or not
    for (size_t i = 0; i < own; ++i) {
      EXPECT_EQ(std::memcmp(&first[i], &second[i], sizeof(float)), 0) << i;
      EXPECT_EQ(std::memcmp(&first[i], &blocking[i], sizeof(float)), 0) << i;
    }
  }
  std::vector<float> reduced(1001);
  for (size_t i = 0; i < reduced.size(); ++i)
    reduced[i] = std::exp(0.01f * static_cast<float>(i * (rank + 1))) / 7.0f;
  comm->all_reduce(reduced.data(), static_cast<int64_t>(reduced.size()), Reduction::sum);
  std::vector<float> everyone(reduced.size() * static_cast<size_t>(ranks));
  comm->all_gather(Place::at_host(reduced.data()), Place::at_host(everyone.data()),
                   std::vector<int64_t>(static_cast<size_t>(ranks),
                                        static_cast<int64_t>(reduced.size() * sizeof(float))));
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(std::memcmp(everyone.data() + static_cast<size_t>(r) * reduced.size(), reduced.data(),
                          reduced.size() * sizeof(float)),
              0)
        << "rank " << r;
}

// With every rank outside attention2d (note_idle) for longer than the timeout, neither watchdog
// (over the Gloo mesh, over MPI) aborts; afterwards the ranks work on.
TEST(Gloo, IdleRanksDoNotTriggerTheWatchdog) {
  auto comm = view();
  for (const bool over_gloo : {true, false}) {
    {
      std::unique_ptr<Watchdog> watchdog = over_gloo
                                               ? std::make_unique<Watchdog>(*comm, 0.5)
                                               : std::make_unique<Watchdog>(MPI_COMM_WORLD, 0.5);
      ASSERT_TRUE(watchdog->active());
      Watchdog::note_idle();
      EXPECT_NE(Watchdog::current_phase().find("outside attention2d"), std::string::npos);
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      Watchdog::note_phase("test.after_idle");
      EXPECT_EQ(Watchdog::current_phase(), "test.after_idle");
      int64_t x = 1;
      comm->all_reduce(&x, 1, Reduction::sum);
      EXPECT_EQ(x, comm->size());
      Watchdog::note_idle();
      comm->barrier();
    }
    comm->barrier();
  }
}

// The mesh's I/O thread runs under SCHED_BATCH from a post until the wait for it, and at its own
// policy otherwise (comm/io_threads.hpp: an I/O thread that preempted a caller posting a transfer
// spun until the scheduler's tick); the calling thread keeps its policy.
TEST(Gloo, ItsIoThreadDoesNotPreemptACallerThatPosts) {
  auto comm = view();
  const auto batch_threads = [] {
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      const auto id = static_cast<pid_t>(std::stol(entry.path().filename().string()));
      if (sched_getscheduler(id) == SCHED_BATCH) ++count;
    }
    return count;
  };
  const int at_rest = batch_threads();
  const int64_t mine = comm->rank();
  std::vector<int64_t> all(static_cast<size_t>(comm->size()));
  const std::vector<int64_t> bytes(all.size(), sizeof mine);
  RequestPtr request =
      comm->all_gather_async(Place::at_host(&mine), Place::at_host(all.data()), bytes);
  const int posted = batch_threads();
  request->wait();
  const int waited = batch_threads();
  const bool posts = comm->size() > 1;  // one rank posts nothing
  EXPECT_TRUE(everywhere(*comm, at_rest == 0 && posted == (posts ? 1 : 0) && waited == 0))
      << "threads under SCHED_BATCH: " << at_rest << " at rest, " << posted << " posted, " << waited
      << " after the wait";
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
}

TEST(Gloo, RefusesWhatItCannotDo) {
  auto comm = view();
  try {
    comm->split(-1, 0);
    ADD_FAILURE() << "a negative color was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("must not be negative"), std::string::npos) << e.message();
  }
  auto mpi = make_mpi_communicator(MPI_COMM_WORLD);
  try {
    Watchdog watchdog(*mpi, 5.0);
    ADD_FAILURE() << "a watchdog over Gloo accepted an MPI communicator";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("needs a Gloo communicator"), std::string::npos) << e.message();
  }
  int x = 0;
  try {
    comm->send_recv(Place::at_host(&x), sizeof x, comm->rank(), Place::at_host(&x), 2,
                    comm->rank());
    ADD_FAILURE() << "a mismatched send to itself was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("a send to oneself of 4 bytes met a receive from oneself of 2"),
              std::string::npos)
        << e.message();
  }
  try {
    comm->send_recv({}, 0, 0, Place::at_host(&x), sizeof x, comm->rank(), 9);
    ADD_FAILURE() << "a receive from itself that nothing sent completed";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("no send to itself was posted for it"), std::string::npos)
        << e.message();
  }
}

}  // namespace
}  // namespace a2d
