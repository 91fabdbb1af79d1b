// The MPI communicator's collectives on uneven blocks (zero-sized ones included): the blocking
// forms (MPI_Allgatherv, the ring reduce-scatter of src/comm/mpi_comm.cpp) give exactly what
// every rank's contribution implies, and the same as the non-blocking forms (MPI's own). Byte
// counts of any size move exactly (2-byte elements, odd byte counts). The staged communicator
// gives the same results on buffers the host cannot touch (the fenced backend's), which the MPI
// communicator refuses with a message naming the remedy.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/mpi_comm.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "mpi_checks.hpp"

namespace a2d {
namespace {

// Block sizes in records: rank i's block has (2i + 1) mod 4 records, so some are empty.
std::vector<int64_t> uneven_counts(int ranks) {
  std::vector<int64_t> counts;
  for (int i = 0; i < ranks; ++i)
    counts.push_back((2 * i + 1) % 4);
  return counts;
}

std::vector<int64_t> in_bytes(const std::vector<int64_t>& counts, size_t element) {
  std::vector<int64_t> out(counts);
  for (auto& c : out)
    c *= static_cast<int64_t>(element);
  return out;
}

int64_t total(const std::vector<int64_t>& counts) {
  int64_t sum = 0;
  for (const int64_t c : counts)
    sum += c;
  return sum;
}

// The value rank `rank` contributes at float index i: small integers, so sums are exact.
float contribution(int rank, int64_t i) {
  return static_cast<float>((rank * 7 + i * 3) % 11 - 5);
}

TEST(Communicator, AllGatherBlockingAndPostedGiveEveryBlock) {
  auto world = make_test_world();
  const int ranks = world->size(), rank = world->rank();
  const std::vector<int64_t> counts = uneven_counts(ranks);
  std::vector<float> mine(static_cast<size_t>(counts[static_cast<size_t>(rank)]));
  for (size_t i = 0; i < mine.size(); ++i)
    mine[i] = contribution(rank, static_cast<int64_t>(i));
  std::vector<float> expected;
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
      expected.push_back(contribution(r, i));
  }
  std::vector<float> blocking(expected.size(), NAN), posted(expected.size(), NAN);
  const std::vector<int64_t> bytes = in_bytes(counts, sizeof(float));
  world->all_gather(Place::at_host(mine.data()), Place::at_host(blocking.data()), bytes);
  world->all_gather_async(Place::at_host(mine.data()), Place::at_host(posted.data()), bytes)
      ->wait();
  EXPECT_EQ(blocking, expected);
  EXPECT_EQ(posted, expected);
}

TEST(Communicator, RingReduceScatterSumsAndMaximaAreExact) {
  auto world = make_test_world();
  const int ranks = world->size(), rank = world->rank();
  const std::vector<int64_t> counts = uneven_counts(ranks);
  const int64_t record = 3;
  std::vector<float> send(static_cast<size_t>(total(counts) * record));
  for (size_t i = 0; i < send.size(); ++i)
    send[i] = contribution(rank, static_cast<int64_t>(i));
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r)
    offset += counts[static_cast<size_t>(r)] * record;
  const size_t own = static_cast<size_t>(counts[static_cast<size_t>(rank)] * record);
  for (const Reduction reduction : {Reduction::sum, Reduction::max}) {
    std::vector<float> expected(own);
    for (size_t i = 0; i < own; ++i) {
      const int64_t at = offset + static_cast<int64_t>(i);
      float value = contribution(0, at);
      for (int r = 1; r < ranks; ++r) {
        value = reduction == Reduction::sum ? value + contribution(r, at)
                                            : std::max(value, contribution(r, at));
      }
      expected[i] = value;
    }
    std::vector<float> blocking(own, NAN), posted(own, NAN);
    world->reduce_scatter(Place::at_host(send.data()), Place::at_host(blocking.data()), counts,
                          record, reduction);
    world
        ->reduce_scatter_async(Place::at_host(send.data()), Place::at_host(posted.data()), counts,
                               record, reduction)
        ->wait();
    EXPECT_EQ(blocking, expected) << (reduction == Reduction::sum ? "sum" : "max");
    EXPECT_EQ(posted, expected) << (reduction == Reduction::sum ? "sum" : "max");
  }
}

// The attention merge of partial records is the backend's (Communicator::merge_scatter): the
// same bits as merging every rank's block here, in the ring's order.
TEST(Communicator, MergeScatterMergesAttentionRecordsInTheRingsOrder) {
  auto world = make_test_world();
  const int ranks = world->size(), rank = world->rank();
  const std::vector<int64_t> counts = uneven_counts(ranks);
  const int64_t record = 2 + 4;  // [row max, row sum, acc(4)]
  std::vector<float> send(static_cast<size_t>(total(counts) * record));
  for (int64_t row = 0; row < total(counts); ++row) {
    float* r = send.data() + row * record;
    r[0] = 0.25f * contribution(rank, row);                        // row max
    r[1] = 1.0f + 0.125f * std::abs(contribution(rank, row + 1));  // row sum > 0
    for (int d = 0; d < 4; ++d)
      r[2 + d] = 0.5f * contribution(rank, row * 4 + d);
  }
  const size_t own = static_cast<size_t>(counts[static_cast<size_t>(rank)] * record);
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::vector<float> merged(own, NAN);
  world->merge_scatter(Place::at_host(send.data()), Place::at_host(merged.data()), counts, record,
                       *cpu);
  // The ring's order, merged here: rank + 1's contribution first, each next rank's own
  // contribution merged with the partial that arrives (into = own), this rank's last.
  int64_t first = 0;
  for (int r = 0; r < rank; ++r)
    first += counts[static_cast<size_t>(r)];
  const auto contributed = [&](int from) {
    std::vector<float> block(own);
    for (size_t i = 0; i < own; ++i) {
      const int64_t row = first + static_cast<int64_t>(i) / record;
      const int64_t at = static_cast<int64_t>(i) % record;
      block[i] = at == 0   ? 0.25f * contribution(from, row)
                 : at == 1 ? 1.0f + 0.125f * std::abs(contribution(from, row + 1))
                           : 0.5f * contribution(from, row * 4 + (at - 2));
    }
    return block;
  };
  std::vector<float> partial = contributed((rank + 1) % ranks);
  for (int k = 2; k <= ranks; ++k) {
    std::vector<float> into = contributed((rank + k) % ranks);
    merge_partial_records(into.data(), partial.data(), counts[static_cast<size_t>(rank)], record);
    partial = into;
  }
  EXPECT_EQ(merged, partial);
}

// The byte rank `rank` contributes at index i.
std::byte byte_of(int rank, int64_t i) {
  return static_cast<std::byte>((rank * 37 + i * 11 + 5) % 251);
}

// Blocks of odd byte counts (rank i: 2i + 1 bytes, some ranks 0) and of 2-byte elements move
// exactly: all-gather, all-to-all and shifts, blocking and posted.
TEST(Communicator, ByteCountsOfAnySizeMoveExactly) {
  auto world = make_test_world();
  const int ranks = world->size(), rank = world->rank();
  for (const int64_t unit : {1, 2, 3}) {  // bytes per element: odd, bf16-sized, odd
    std::vector<int64_t> bytes;
    for (int r = 0; r < ranks; ++r)
      bytes.push_back(unit * ((2 * r + 1) % 5));
    std::vector<std::byte> mine(static_cast<size_t>(bytes[static_cast<size_t>(rank)]));
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] = byte_of(rank, static_cast<int64_t>(i));
    std::vector<std::byte> expected;
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = 0; i < bytes[static_cast<size_t>(r)]; ++i)
        expected.push_back(byte_of(r, i));
    std::vector<std::byte> blocking(expected.size()), posted(expected.size());
    world->all_gather(Place::at_host(mine.data()), Place::at_host(blocking.data()), bytes);
    world->all_gather_async(Place::at_host(mine.data()), Place::at_host(posted.data()), bytes)
        ->wait();
    EXPECT_EQ(blocking, expected) << "unit " << unit;
    EXPECT_EQ(posted, expected) << "unit " << unit;

    // All-to-all: rank r sends block j of `unit * (r + j + 1)` bytes to rank j.
    std::vector<int64_t> send_bytes, recv_bytes;
    for (int j = 0; j < ranks; ++j) {
      send_bytes.push_back(unit * (rank + j + 1));
      recv_bytes.push_back(unit * (j + rank + 1));
    }
    std::vector<std::byte> send, want;
    for (int j = 0; j < ranks; ++j)
      for (int64_t i = 0; i < send_bytes[static_cast<size_t>(j)]; ++i)
        send.push_back(byte_of(rank * ranks + j, i));
    for (int j = 0; j < ranks; ++j)
      for (int64_t i = 0; i < recv_bytes[static_cast<size_t>(j)]; ++i)
        want.push_back(byte_of(j * ranks + rank, i));
    std::vector<std::byte> got(want.size());
    world->all_to_all(Place::at_host(send.data()), send_bytes, Place::at_host(got.data()),
                      recv_bytes);
    EXPECT_EQ(got, want) << "unit " << unit;

    // A shift to the next rank.
    const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
    std::vector<std::byte> out(static_cast<size_t>(unit * (rank + 2))),
        in(static_cast<size_t>(unit * (prev + 2)));
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = byte_of(rank, static_cast<int64_t>(i));
    world->send_recv(Place::at_host(out.data()), static_cast<int64_t>(out.size()), next,
                     Place::at_host(in.data()), static_cast<int64_t>(in.size()), prev);
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(in[i], byte_of(prev, static_cast<int64_t>(i))) << "unit " << unit;
  }
}

// The fenced backend's buffers move through a staged communicator exactly as host memory moves
// through MPI (every operation, blocking and posted, with in-place all-gathers), and the MPI
// communicator alone refuses them before anything is sent.
TEST(Communicator, StagedCommunicatorMovesFencedBuffersAsMpiMovesHostMemory) {
  const std::unique_ptr<Backend> fenced = make_backend("fenced");
  auto staged = make_staged_communicator(make_test_world(), *fenced);
  auto direct = make_test_world();
  const int ranks = staged->size(), rank = staged->rank();
  const std::vector<int64_t> counts = uneven_counts(ranks);
  const std::vector<int64_t> bytes = in_bytes(counts, sizeof(float));
  const int64_t total_bytes = total(bytes);
  int64_t own_offset = 0;
  for (int r = 0; r < rank; ++r)
    own_offset += bytes[static_cast<size_t>(r)];
  std::vector<float> mine(static_cast<size_t>(counts[static_cast<size_t>(rank)]));
  for (size_t i = 0; i < mine.size(); ++i)
    mine[i] = contribution(rank, static_cast<int64_t>(i));

  // All-gather in place, blocking and posted: the own block at its offset of the fenced buffer.
  std::vector<float> expected(static_cast<size_t>(total(counts)));
  direct->all_gather(Place::at_host(mine.data()), Place::at_host(expected.data()), bytes);
  for (const bool posted : {false, true}) {
    BufferPtr gathered = fenced->allocate(total_bytes);
    fenced->upload(mine.data(), Place::in(*gathered, own_offset), bytes[static_cast<size_t>(rank)]);
    if (posted) {
      staged->all_gather_async(Place::in(*gathered, own_offset), Place::in(*gathered), bytes)
          ->wait();
    } else {
      staged->all_gather(Place::in(*gathered, own_offset), Place::in(*gathered), bytes);
    }
    std::vector<float> got(expected.size(), NAN);
    fenced->download(Place::in(*gathered), got.data(), total_bytes);
    EXPECT_EQ(got, expected) << (posted ? "posted" : "blocking");
  }

  // Reduce-scatter (a sum) and the merge, from and into fenced buffers.
  const int64_t record = 6;
  std::vector<float> send(static_cast<size_t>(total(counts) * record));
  for (int64_t row = 0; row < total(counts); ++row) {
    float* r = send.data() + row * record;
    r[0] = 0.25f * contribution(rank, row);
    r[1] = 1.0f + 0.125f * std::abs(contribution(rank, row + 1));
    for (int d = 0; d < 4; ++d)
      r[2 + d] = 0.5f * contribution(rank, row * 4 + d);
  }
  const int64_t own = counts[static_cast<size_t>(rank)] * record;
  BufferPtr send_buffer = fenced->allocate(static_cast<int64_t>(send.size() * sizeof(float)));
  fenced->upload(send.data(), Place::in(*send_buffer), send_buffer->bytes());
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (const bool merge : {false, true}) {  // a sum, then the attention merge (merge_scatter)
    std::vector<float> want(static_cast<size_t>(own), NAN), got(want.size(), NAN);
    BufferPtr recv = fenced->allocate(own * static_cast<int64_t>(sizeof(float)));
    if (merge) {
      direct->merge_scatter(Place::at_host(send.data()), Place::at_host(want.data()), counts,
                            record, *cpu);
      staged->merge_scatter(Place::in(*send_buffer), Place::in(*recv), counts, record, *fenced);
    } else {
      direct->reduce_scatter(Place::at_host(send.data()), Place::at_host(want.data()), counts,
                             record, Reduction::sum);
      staged->reduce_scatter(Place::in(*send_buffer), Place::in(*recv), counts, record,
                             Reduction::sum);
    }
    fenced->download(Place::in(*recv), got.data(), recv->bytes());
    EXPECT_EQ(got, want);
  }

  // A posted shift and an all-to-all.
  const int next = (rank + 1) % ranks, prev = (rank + ranks - 1) % ranks;
  BufferPtr out = fenced->allocate(12), in = fenced->allocate(12);
  const float values[3] = {float(rank), float(rank) + 0.5f, -float(rank)};
  fenced->upload(values, Place::in(*out), 12);
  RequestPtr shift = staged->send_recv_async(Place::in(*out), 12, next, Place::in(*in), 12, prev);
  shift->wait();
  float arrived[3] = {0, 0, 0};
  fenced->download(Place::in(*in), arrived, 12);
  EXPECT_EQ(arrived[0], float(prev));
  EXPECT_EQ(arrived[2], -float(prev));
  std::vector<int64_t> block(static_cast<size_t>(ranks), 4);
  BufferPtr a2a_send = fenced->allocate(4 * ranks), a2a_recv = fenced->allocate(4 * ranks);
  std::vector<float> outgoing(static_cast<size_t>(ranks));
  for (int j = 0; j < ranks; ++j)
    outgoing[static_cast<size_t>(j)] = static_cast<float>(100 * rank + j);
  fenced->upload(outgoing.data(), Place::in(*a2a_send), 4 * ranks);
  staged->all_to_all(Place::in(*a2a_send), block, Place::in(*a2a_recv), block);
  std::vector<float> incoming(static_cast<size_t>(ranks));
  fenced->download(Place::in(*a2a_recv), incoming.data(), 4 * ranks);
  for (int j = 0; j < ranks; ++j)
    EXPECT_EQ(incoming[static_cast<size_t>(j)], static_cast<float>(100 * j + rank));

  // MPI alone refuses a buffer the host cannot touch, before sending anything.
  try {
    direct->send_recv(Place::in(*out), 12, rank, Place::in(*in), 12, rank);
    ADD_FAILURE() << "the MPI communicator moved a fenced buffer";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("make_staged_communicator"), std::string::npos) << e.message();
  }
}

// make_communicator (--comm): mpi on any backend is the MPI communicator; nccl off the GPU, or in
// a build without NCCL, is refused on every rank alike before anything is sent, naming --comm mpi.
// Communicators that move backend buffers themselves say so, through the counting wrapper too,
// so the algorithms stage only what needs it.
TEST(Communicator, MakeCommunicatorRefusesNcclOffTheGpuOnEveryRank) {
  for (const char* device : {"cpu", "fenced"}) {
    const std::unique_ptr<Backend> backend = make_backend(device);
    EXPECT_EQ(default_comm_kind(*backend), CommKind::mpi) << device;
    auto mpi = make_communicator(MPI_COMM_WORLD, *backend, CommKind::mpi);
    EXPECT_EQ(mpi->size(), make_mpi_communicator(MPI_COMM_WORLD)->size());
    EXPECT_FALSE(mpi->moves_backend_buffers());
    int value = mpi->rank() + 1, sum = 0;
    std::vector<int> all(static_cast<size_t>(mpi->size()));
    const std::vector<int64_t> bytes(all.size(), sizeof(int));
    mpi->all_gather(Place::at_host(&value), Place::at_host(all.data()), bytes);
    for (const int v : all)
      sum += v;
    EXPECT_EQ(sum, mpi->size() * (mpi->size() + 1) / 2);

    std::string message;
    try {
      make_communicator(MPI_COMM_WORLD, *backend, CommKind::nccl);
    } catch (const Error& e) {
      message = e.message();
    }
    EXPECT_NE(message.find("use --comm mpi"), std::string::npos) << device << ": " << message;
    int refused = message.empty() ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &refused, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(refused, mpi->size()) << "every rank refuses";
  }
  const std::unique_ptr<Backend> fenced = make_backend("fenced");
  auto staged = make_staged_communicator(make_mpi_communicator(MPI_COMM_WORLD), *fenced);
  EXPECT_TRUE(staged->moves_backend_buffers());
  CountingCommunicator counted(std::move(staged), std::make_shared<TrafficLog>());
  EXPECT_TRUE(counted.moves_backend_buffers());
  EXPECT_TRUE(counted.split(0, counted.rank())->moves_backend_buffers());
}

}  // namespace
}  // namespace a2d
