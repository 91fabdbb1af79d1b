// Causal load balance of every algorithm and layout, from the pure decomposition functions (no
// MPI, no computation): for each P and N, the busiest rank's unmasked score entries over the mean
// and, for Ring Attention, the step-synchronous critical path over the mean. docs/baselines.md
// quotes this table.
//
//   build/bench/a2d_causal_balance [P ...]      (default P = 2 4 8 16 32 64)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "attention2d/decomposition.hpp"

namespace {

using namespace a2d;

double busiest_over_mean(const std::vector<double>& work) {
  const double mean =
      std::accumulate(work.begin(), work.end(), 0.0) / static_cast<double>(work.size());
  return *std::max_element(work.begin(), work.end()) / mean;
}

void row(int ranks, int64_t seq) {
  Problem problem;
  problem.seq = seq;
  problem.head_dim = 64;
  problem.mask = Mask::causal();
  std::printf("%4d %7lld", ranks, static_cast<long long>(seq));
  const double mean = static_cast<double>(seq) * static_cast<double>(seq + 1) / 2 / ranks;
  const std::pair<LayoutKind, int64_t> layouts[] = {{LayoutKind::zigzag, 1},
                                                    {LayoutKind::striped, 1},
                                                    {LayoutKind::striped, 4},
                                                    {LayoutKind::contiguous, 1}};
  for (const auto& [layout, stripe] : layouts) {
    Plan plan = default_plan(Algorithm::ring, problem, ranks);
    plan.layout = layout;
    plan.stripe = stripe;
    std::vector<double> work;
    for (int rank = 0; rank < ranks; ++rank) {
      work.push_back(static_cast<double>(sequence_parallel_unmasked_pairs(problem, plan, rank)));
    }
    std::printf(" %8.4f %8.4f", busiest_over_mean(work),
                static_cast<double>(ring_critical_path_pairs(problem, plan)) / mean);
  }
  const Plan grid = default_plan(Algorithm::attention2d, problem, ranks);
  std::vector<double> work;
  for (int rank = 0; rank < ranks; ++rank) {
    work.push_back(static_cast<double>(attention2d_unmasked_pairs(problem, grid, rank)));
  }
  std::printf(" %8.4f\n", busiest_over_mean(work));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks_list;
  for (int i = 1; i < argc; ++i)
    ranks_list.push_back(std::atoi(argv[i]));
  if (ranks_list.empty()) ranks_list = {2, 4, 8, 16, 32, 64};
  std::printf(
      "# busiest rank / mean unmasked work (max), ring critical path / mean (crit);\n"
      "# ring and allgather-kv share 'max'; attention2d on its default grid for comparison\n");
  std::printf("%4s %7s %17s %17s %17s %17s %8s\n", "P", "N", "zigzag max crit", "striped1 max crit",
              "striped4 max crit", "contig max crit", "a2d max");
  for (const int ranks : ranks_list) {
    if (ranks < 1) {
      std::fprintf(stderr, "a2d_causal_balance: P must be a positive integer\n");
      return 2;
    }
    for (const int64_t seq :
         {int64_t{64} * ranks, int64_t{64} * ranks + 37, int64_t{1024} * ranks}) {
      row(ranks, seq);
    }
  }
  return 0;
}
