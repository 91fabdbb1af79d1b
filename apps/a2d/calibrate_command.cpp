// a2d calibrate: measures this machine for the cost model's `local` preset, with every rank of the
// MPI job working at once (so sharing cores between ranks is part of the numbers).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/data.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/timing.hpp"
#include "calibration.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "run_support.hpp"

namespace a2d::commands {
namespace {

// Seconds per call of `body` on the slowest rank, median of `iters` timed calls.
double slowest_seconds(Communicator& world, int64_t iters, const std::function<void()>& body) {
  body();  // warm-up
  std::vector<double> samples;
  for (int64_t i = 0; i < iters; ++i) {
    world.barrier();
    const double start = seconds_now();
    body();
    double elapsed = seconds_now() - start;
    world.all_reduce(&elapsed, 1, Reduction::max);
    samples.push_back(elapsed);
  }
  return summarize(samples).median;
}

}  // namespace

void CalibrationSettings::validate() const {
  A2D_REQUIRE(
      block >= 64 && heads >= 1 && head_dim >= 1 && iters >= 1 && threads >= 1,
      "calibration: the block must be >= 64 rows and heads, head dim, iterations, threads >= 1");
}

Calibration measure_calibration(Communicator& world, const CalibrationSettings& settings) {
  const int64_t block = settings.block, heads = settings.heads, head_dim = settings.head_dim;
  const int64_t iters = settings.iters, threads = settings.threads;
  // The kernel, on every rank at once.
  const GlobalTokens shape{1, block, heads, head_dim};
  const std::vector<float> q = generate_tokens(1, TensorTag::q, shape);
  const std::vector<float> k = generate_tokens(1, TensorTag::k, shape);
  const std::vector<float> v = generate_tokens(1, TensorTag::v, shape);
  const std::vector<float> d_out = generate_tokens(1, TensorTag::d_out, shape);
  std::vector<float> o(q.size()), lse(static_cast<size_t>(heads * block)), dq(q.size()),
      dk(q.size()), dv(q.size());
  ForwardArgs fwd;
  fwd.shape = {1, heads, heads, block, block, head_dim};
  fwd.scale = default_scale(head_dim);
  fwd.q = dense_tokens(q.data(), block, heads, head_dim);
  fwd.k = dense_tokens(k.data(), block, heads, head_dim);
  fwd.v = dense_tokens(v.data(), block, heads, head_dim);
  fwd.threads = static_cast<int>(threads);
  const auto o_view = dense_tokens(o.data(), block, heads, head_dim);
  const auto lse_view = dense_rows(lse.data(), heads, block);
  const double flops = 4.0 * static_cast<double>(block * block * head_dim * heads);
  const double forward_s =
      slowest_seconds(world, iters, [&] { attention_forward(fwd, o_view, lse_view); });
  BackwardArgs bwd;
  bwd.shape = fwd.shape;
  bwd.scale = fwd.scale;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.out = o_view;
  bwd.d_out = dense_tokens(d_out.data(), block, heads, head_dim);
  bwd.lse = lse_view;
  bwd.threads = fwd.threads;
  const double backward_s = slowest_seconds(world, iters, [&] {
    attention_backward(bwd, dense_tokens(dq.data(), block, heads, head_dim),
                       dense_tokens(dk.data(), block, heads, head_dim),
                       dense_tokens(dv.data(), block, heads, head_dim));
  });
  // The same block under a causal mask (positions 0..block-1 for queries and keys: a diagonal
  // block), per unmasked FLOP: the tiles on the diagonal are computed whole and masked.
  ForwardArgs fwd_causal = fwd;
  fwd_causal.mask = Mask::causal();
  BackwardArgs bwd_causal = bwd;
  bwd_causal.mask = Mask::causal();
  const double causal_flops = 4.0 * static_cast<double>(block * (block + 1) / 2 * head_dim * heads);
  const double forward_causal_s =
      slowest_seconds(world, iters, [&] { attention_forward(fwd_causal, o_view, lse_view); });
  const double backward_causal_s = slowest_seconds(world, iters, [&] {
    attention_backward(bwd_causal, dense_tokens(dq.data(), block, heads, head_dim),
                       dense_tokens(dk.data(), block, heads, head_dim),
                       dense_tokens(dv.data(), block, heads, head_dim));
  });
  // What a rank waiting in MPI costs the computing ones: the even ranks compute while the odd
  // ones wait in a barrier. With n ranks computing and m waiting on fewer cores, each computing
  // rank gets a 1 / (n + w m) share, so half waiting takes (1 + w) / 2 of the all-computing
  // time: w = 2 t_half / t_all - 1 (0: waiting is free, 1: it costs as much as computing).
  double wait_share = 0;
  if (world.size() > 1) {
    const double half_s = slowest_seconds(world, iters, [&] {
      if (world.rank() % 2 == 0) attention_forward(fwd, o_view, lse_view);
      world.barrier();
    });
    wait_share = std::clamp(2 * half_s / forward_s - 1, 0.0, 1.0);
  }

  // Latency: an 8-byte ring shift on every rank at once. Bandwidth: the all-gather the
  // algorithms use, 1 MiB from every rank, which the model charges as P - 1 messages and
  // (P - 1) MiB sent per rank; measuring the collective itself (rather than one repeated
  // shift of a buffer that stays in cache) includes what it costs when ranks share cores.
  const int next = (world.rank() + 1) % world.size();
  const int prev = (world.rank() - 1 + world.size()) % world.size();
  const int64_t large = int64_t{1} << 18;  // floats: 1 MiB per rank
  std::vector<float> send(static_cast<size_t>(large), 1.0f), recv(send.size());
  double latency_s = 0, bytes_per_s = 1e12;
  if (world.size() > 1) {
    const int repeats = 200;
    latency_s = slowest_seconds(world, 5,
                                [&] {
                                  for (int i = 0; i < repeats; ++i)
                                    world.send_recv(send.data(), 2, next, recv.data(), 2, prev);
                                }) /
                repeats;
    std::vector<float> gathered(send.size() * static_cast<size_t>(world.size()));
    const std::vector<int64_t> counts(static_cast<size_t>(world.size()), large);
    const double gather_s =
        slowest_seconds(world, 5, [&] { world.all_gather(send.data(), gathered.data(), counts); });
    const double steps = world.size() - 1;
    bytes_per_s =
        steps * 4.0 * static_cast<double>(large) / std::max(gather_s - steps * latency_s, 1e-9);
  }

  Calibration c;
  c.ranks = world.size();
  c.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  c.head_dim = head_dim;
  c.block = block;
  c.kernel_forward_flops = flops / forward_s;
  c.kernel_backward_flops = 2.5 * flops / backward_s;
  c.kernel_forward_causal_flops = causal_flops / forward_causal_s;
  c.kernel_backward_causal_flops = 2.5 * causal_flops / backward_causal_s;
  c.wait_share = wait_share;
  c.latency_s = latency_s;
  c.bytes_per_s = bytes_per_s;
  return c;
}

void print_calibration(const Calibration& c, const CalibrationSettings& settings,
                       const std::string& file) {
  std::printf(
      "a2d calibrate: %d ranks on %d cores, kernel %lldx%lld rows, %lld heads, D=%lld\n"
      "  kernel forward  %.3f GFLOP/s per rank (causal %.3f)\n"
      "  kernel backward %.3f GFLOP/s per rank (causal %.3f)\n"
      "  a waiting rank takes %.2f of a computing rank's CPU share\n"
      "  latency %.2f us per message, bandwidth %.3f GB/s per rank\nsaved to %s [ranks %d]\n",
      c.ranks, c.cores, static_cast<long long>(settings.block),
      static_cast<long long>(settings.block), static_cast<long long>(settings.heads),
      static_cast<long long>(settings.head_dim), c.kernel_forward_flops / 1e9,
      c.kernel_forward_causal_flops / 1e9, c.kernel_backward_flops / 1e9,
      c.kernel_backward_causal_flops / 1e9, c.wait_share, c.latency_s * 1e6, c.bytes_per_s / 1e9,
      file.c_str(), c.ranks);
}

int calibrate(int argc, char** argv, int first) {
  MpiSession mpi(&argc, &argv);
  auto world_ptr = make_mpi_communicator(MPI_COMM_WORLD);
  Communicator& world = *world_ptr;
  return run_collectively(world, [&]() -> int {
    std::string out = default_calibration_file();
    CalibrationSettings settings;
    cli::Options options(
        "a2d calibrate [options]",
        "Measures, with every rank of the MPI job busy at once, the attention kernel's throughput\n"
        "per rank (forward and backward, unmasked and on a causal diagonal block), the CPU share "
        "a\n"
        "rank waiting in MPI takes from computing ranks, the latency of a ring shift and the\n"
        "bandwidth of an all-gather of 1 MiB per rank, and saves them as the section for this "
        "rank\n"
        "count in the calibration file that `a2d model --machine local` and the planner read. Run\n"
        "it at every rank count you benchmark (mpirun -np P a2d calibrate), or let `a2d bench\n"
        "--calibrate` measure in the same run.");
    options.add_string("--out", &out, "calibration file (a section per rank count is kept)");
    options.add_int("--block", &settings.block, "query and key rows of the timed kernel call");
    options.add_int("--heads", &settings.heads, "heads of the timed kernel call");
    options.add_int("--head-dim", &settings.head_dim, "head dimension of the timed kernel call");
    options.add_int("--iters", &settings.iters, "timed repetitions (median)");
    options.add_int("--threads", &settings.threads, "kernel threads per rank");
    bool help = false;
    collective_check(world, [&] {
      help = !options.parse(argc, argv, first);
      settings.validate();
    });
    if (help) return 0;

    const Calibration c = measure_calibration(world, settings);
    collective_check(world, [&] {
      if (world.rank() == 0) save_calibration(out, c);
    });
    if (world.rank() == 0) print_calibration(c, settings, out);
    return 0;
  });
}

}  // namespace a2d::commands
