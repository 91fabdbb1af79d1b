// Open MPI's collectives against the communicator's, side by side in one run (the collectives
// table of docs/benchmarks.md): all-gather and reduce-scatter (float sum) with B bytes per rank's
// block, blocking and non-blocking MPI, and attention2d's blocking forms (MPI_Allgatherv and the
// ring reduce-scatter of src/comm/mpi_comm.cpp). Median of 5 repeats of the slowest rank.
//   mpiexec -np P a2d_collectives [BLOCK_BYTES...]     (default 8 65536 1048576 4194304)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "attention2d/mpi_comm.hpp"

namespace {

double slowest_median_ms(MPI_Comm comm, const std::function<void()>& body) {
  std::vector<double> times;
  body();  // warm-up
  for (int i = 0; i < 5; ++i) {
    MPI_Barrier(comm);
    const double start = MPI_Wtime();
    body();
    double mine = MPI_Wtime() - start, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    times.push_back(slowest);
  }
  std::sort(times.begin(), times.end());
  return 1e3 * times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<long> sizes;
  for (int i = 1; i < argc; ++i)
    sizes.push_back(std::atol(argv[i]));
  if (sizes.empty()) sizes = {8, 65536, 1048576, 4194304};
  {
    const auto comm = a2d::make_mpi_communicator(MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf(
          "%d ranks; ms, median of 5, slowest rank\n%12s %12s %12s %12s %14s %12s %12s %12s\n",
          size, "block bytes", "Allgatherv", "Iallgatherv", "a2d gather", "Reduce_scatter",
          "Ireduce_sc.", "a2d ring RS", "RS speedup");
    }
    for (const long bytes : sizes) {
      const int n = static_cast<int>(std::max(1L, bytes / 4));
      std::vector<float> block(static_cast<size_t>(n), 1.0f),
          all(static_cast<size_t>(n) * size, 1.0f);
      std::vector<float> out(all.size()), mine(block.size());
      std::vector<int> counts(static_cast<size_t>(size), n), offsets(static_cast<size_t>(size));
      for (int i = 0; i < size; ++i)
        offsets[static_cast<size_t>(i)] = i * n;
      const std::vector<int64_t> counts64(static_cast<size_t>(size), n);
      const std::vector<int64_t> bytes64(static_cast<size_t>(size), 4 * int64_t{n});
      const double ag = slowest_median_ms(MPI_COMM_WORLD, [&] {
        MPI_Allgatherv(block.data(), n, MPI_FLOAT, out.data(), counts.data(), offsets.data(),
                       MPI_FLOAT, MPI_COMM_WORLD);
      });
      const double iag = slowest_median_ms(MPI_COMM_WORLD, [&] {
        MPI_Request request;
        MPI_Iallgatherv(block.data(), n, MPI_FLOAT, out.data(), counts.data(), offsets.data(),
                        MPI_FLOAT, MPI_COMM_WORLD, &request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
      });
      const double a2d_ag = slowest_median_ms(MPI_COMM_WORLD, [&] {
        comm->all_gather(a2d::Place::at_host(block.data()), a2d::Place::at_host(out.data()),
                         bytes64);
      });
      const double rs = slowest_median_ms(MPI_COMM_WORLD, [&] {
        MPI_Reduce_scatter(all.data(), mine.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD);
      });
      const double irs = slowest_median_ms(MPI_COMM_WORLD, [&] {
        MPI_Request request;
        MPI_Ireduce_scatter(all.data(), mine.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                            MPI_COMM_WORLD, &request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
      });
      const double ring = slowest_median_ms(MPI_COMM_WORLD, [&] {
        comm->reduce_scatter(a2d::Place::at_host(all.data()), a2d::Place::at_host(mine.data()),
                             counts64, 1, a2d::Reduction::sum);
      });
      if (rank == 0) {
        std::printf("%12ld %12.2f %12.2f %12.2f %14.2f %12.2f %12.2f %11.1fx\n", bytes, ag, iag,
                    a2d_ag, rs, irs, ring, std::min(rs, irs) / ring);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
