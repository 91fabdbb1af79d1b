// The MPI communicator's collectives on uneven blocks (zero-sized ones included): the blocking
// forms (MPI_Allgatherv, the ring reduce-scatter of src/comm/mpi_comm.cpp) give exactly what
// every rank's contribution implies, and the same as the non-blocking forms (MPI's own).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention2d/mpi_comm.hpp"

namespace a2d {
namespace {

// Block sizes in records: rank i's block has (2i + 1) mod 4 records, so some are empty.
std::vector<int64_t> uneven_counts(int ranks) {
  std::vector<int64_t> counts;
  for (int i = 0; i < ranks; ++i)
    counts.push_back((2 * i + 1) % 4);
  return counts;
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
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
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
  world->all_gather(mine.data(), blocking.data(), counts);
  world->all_gather_async(mine.data(), posted.data(), counts)->wait();
  EXPECT_EQ(blocking, expected);
  EXPECT_EQ(posted, expected);
}

TEST(Communicator, RingReduceScatterSumsAndMaximaAreExact) {
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
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
    world->reduce_scatter(send.data(), blocking.data(), counts, record, reduction);
    world->reduce_scatter_async(send.data(), posted.data(), counts, record, reduction)->wait();
    EXPECT_EQ(blocking, expected) << (reduction == Reduction::sum ? "sum" : "max");
    EXPECT_EQ(posted, expected) << (reduction == Reduction::sum ? "sum" : "max");
  }
}

TEST(Communicator, RingReduceScatterMergesAttentionRecordsAsMpiDoes) {
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
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
  std::vector<float> blocking(own, NAN), posted(own, NAN);
  world->reduce_scatter(send.data(), blocking.data(), counts, record, Reduction::attention_merge);
  world
      ->reduce_scatter_async(send.data(), posted.data(), counts, record, Reduction::attention_merge)
      ->wait();
  // The two merge the records in different orders: equal up to fp32 rounding.
  for (size_t i = 0; i < own; ++i) {
    EXPECT_NEAR(blocking[i], posted[i], 1e-5f * (1 + std::abs(posted[i]))) << i;
  }
}

}  // namespace
}  // namespace a2d
