// a2d calibrate: measures this machine for the cost model's `local` preset, with every rank of the
// MPI job working at once (so sharing cores between ranks is part of the numbers).
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/tools/data.hpp"
#include "attention2d/tools/progress.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "calibration.hpp"
#include "commands.hpp"
#include "run_support.hpp"

namespace a2d::commands {
namespace {

// One call of `body` on every rank, started together: the slowest rank's seconds.
double slowest_seconds_once(Communicator& world, const std::function<void()>& body) {
  world.barrier();
  const double start = seconds_now();
  body();
  double elapsed = seconds_now() - start;
  world.all_reduce(&elapsed, 1, Reduction::max);
  return elapsed;
}

// Seconds per call of each body on the slowest rank, median of `iters` timed calls after one
// untimed round; the bodies are timed in turn within each round, so that a drift of the
// machine's speed over the rounds moves them alike (where their differences are used).
std::vector<double> slowest_seconds_each(Communicator& world, int64_t iters,
                                         const std::vector<std::function<void()>>& bodies) {
  std::vector<std::vector<double>> samples(bodies.size());
  for (int64_t i = 0; i <= iters; ++i) {
    for (size_t b = 0; b < bodies.size(); ++b) {
      const double elapsed = slowest_seconds_once(world, bodies[b]);
      if (i > 0) samples[b].push_back(elapsed);  // the first round is a warm-up
    }
  }
  std::vector<double> medians;
  for (const auto& s : samples)
    medians.push_back(summarize(s).median);
  return medians;
}

double slowest_seconds(Communicator& world, int64_t iters, const std::function<void()>& body) {
  return slowest_seconds_each(world, iters, {body})[0];
}

// The calibration's kernel call: a block x block problem of generated inputs and its outputs.
struct KernelBlock {
  explicit KernelBlock(const CalibrationSettings& settings)
      : block(settings.block), heads(settings.heads), head_dim(settings.head_dim) {
    const GlobalTokens shape{1, block, heads, head_dim};
    q = generate_tokens(1, TensorTag::q, shape);
    k = generate_tokens(1, TensorTag::k, shape);
    v = generate_tokens(1, TensorTag::v, shape);
    d_out = generate_tokens(1, TensorTag::d_out, shape);
    o.resize(q.size());
    lse.resize(static_cast<size_t>(heads * block));
    dq.resize(q.size());
    dk.resize(q.size());
    dv.resize(q.size());
    fwd.shape = {1, heads, heads, block, block, head_dim};
    fwd.scale = default_scale(head_dim);
    fwd.q = tokens(q);
    fwd.k = tokens(k);
    fwd.v = tokens(v);
    fwd.threads = static_cast<int>(settings.threads);
    o_view = tokens(o);
    lse_view = dense_rows(lse.data(), heads, block);
    bwd.shape = fwd.shape;
    bwd.scale = fwd.scale;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = o_view;
    bwd.d_out = tokens(d_out);
    bwd.lse = lse_view;
    bwd.threads = fwd.threads;
  }
  KernelBlock(const KernelBlock&) = delete;
  KernelBlock& operator=(const KernelBlock&) = delete;

  void forward() { attention_forward(fwd, o_view, lse_view); }
  void backward() { attention_backward(bwd, tokens(dq), tokens(dk), tokens(dv)); }

  TokenView<float> tokens(std::vector<float>& data) {
    return dense_tokens(data.data(), block, heads, head_dim);
  }

  int64_t block, heads, head_dim;
  std::vector<float> q, k, v, d_out, o, lse, dq, dk, dv;
  ForwardArgs fwd;
  BackwardArgs bwd;
  TokenView<float> o_view;
  RowView<float> lse_view;
};

// A kernel body to time, the unmasked FLOPs of one call, its calls per timed region, and the
// slowest rank's seconds of each timed region so far.
struct KernelBody {
  double call_flops = 0;
  std::function<void()> body;
  int64_t calls = 1;
  std::vector<double> region_s;

  double seconds_per_call() const {
    return summarize(region_s).median / static_cast<double>(calls);
  }
};

}  // namespace

// The block's inputs and O stored in bf16, and the four calls on them: where the bf16 kernels run
// on other instructions than the fp32 ones (bf16_kernels_round_like_tensor_cores: the amx path's
// tiles, the avx512bf16 path's VDPBF16PS), bf16 has rates of its own.
struct Bf16Calls {
  explicit Bf16Calls(KernelBlock& kb) : fwd(kb.fwd), bwd(kb.bwd) {
    const auto stored = [&](const std::vector<float>& x) {
      std::vector<uint16_t> bits(x.size());
      from_float(DType::bf16, x.data(), bits.data(), static_cast<int64_t>(x.size()));
      return bits;
    };
    q = stored(kb.q), k = stored(kb.k), v = stored(kb.v), d_out = stored(kb.d_out);
    o.resize(kb.o.size());
    const int64_t heads = kb.heads, dim = kb.head_dim, rows = kb.block;
    const auto in = [&](const std::vector<uint16_t>& x) {
      return InTokens{x.data(), DType::bf16, rows * heads * dim, heads * dim, dim};
    };
    o_view = OutTokens{o.data(), DType::bf16, rows * heads * dim, heads * dim, dim};
    fwd.q = bwd.q = in(q);
    fwd.k = bwd.k = in(k);
    fwd.v = bwd.v = in(v);
    bwd.d_out = in(d_out);
    bwd.out = in(o);
    fwd_causal = fwd;
    bwd_causal = bwd;
    fwd_causal.mask = Mask::causal();
    bwd_causal.mask = Mask::causal();
  }
  std::vector<uint16_t> q, k, v, d_out, o;
  OutTokens o_view;
  ForwardArgs fwd, fwd_causal;
  BackwardArgs bwd, bwd_causal;
};

// The calibration's four kernel timings on one block: forward and backward, unmasked and under a
// causal mask (positions 0..block-1 for queries and keys: a diagonal block, counted in unmasked
// FLOPs; the tiles on the diagonal are computed whole and masked); and the same four with bf16
// inputs where bf16 runs on its own instructions.
struct KernelSampler::State {
  explicit State(const CalibrationSettings& settings)
      : kb(settings),
        flops(4.0 * static_cast<double>(kb.block * kb.block * kb.head_dim * kb.heads)),
        causal_flops(4.0 *
                     static_cast<double>(kb.block * (kb.block + 1) / 2 * kb.head_dim * kb.heads)),
        fwd_causal(kb.fwd),
        bwd_causal(kb.bwd) {
    fwd_causal.mask = Mask::causal();
    bwd_causal.mask = Mask::causal();
    if (bf16_kernels_round_like_tensor_cores()) bf16 = std::make_unique<Bf16Calls>(kb);
    const auto add = [this](double call_flops, std::function<void()> body) {
      KernelBody k;
      k.call_flops = call_flops;
      k.body = std::move(body);
      bodies.push_back(std::move(k));
    };
    add(flops, [this] { kb.forward(); });
    add(flops, [this] { kb.backward(); });
    add(causal_flops, [this] { attention_forward(fwd_causal, kb.o_view, kb.lse_view); });
    add(causal_flops, [this] {
      attention_backward(bwd_causal, kb.tokens(kb.dq), kb.tokens(kb.dk), kb.tokens(kb.dv));
    });
    if (!bf16) return;
    add(flops, [this] { attention_forward(bf16->fwd, bf16->o_view, kb.lse_view); });
    add(flops, [this] {
      attention_backward(bf16->bwd, kb.tokens(kb.dq), kb.tokens(kb.dk), kb.tokens(kb.dv));
    });
    add(causal_flops, [this] { attention_forward(bf16->fwd_causal, bf16->o_view, kb.lse_view); });
    add(causal_flops, [this] {
      attention_backward(bf16->bwd_causal, kb.tokens(kb.dq), kb.tokens(kb.dk), kb.tokens(kb.dv));
    });
  }
  KernelBlock kb;
  std::unique_ptr<Bf16Calls> bf16;
  double flops, causal_flops;
  ForwardArgs fwd_causal;
  BackwardArgs bwd_causal;
  std::vector<KernelBody> bodies;  // forward, backward, causal forward, causal backward
};

// Each timed region is made of as many calls as do `kernel_region_flops` of work (0: no such
// limit) but last no longer than `kernel_region_s` together (judged from an untimed call on the
// slowest rank; at least one call). The rows the model predicts are as long as their problem's
// work per rank and timed on their slowest rank: a core slowed for a spell of seconds (this
// machine is shared) slows a long call's slowest rank, but only some of a short call's samples,
// whose median then misses it.
KernelSampler::KernelSampler(Communicator& world, const CalibrationSettings& settings)
    : world_(world), state_(std::make_unique<State>(settings)) {
  for (KernelBody& k : state_->bodies) {
    const double once = slowest_seconds_once(world, k.body);
    int64_t calls = static_cast<int64_t>(settings.kernel_region_s / once);
    if (settings.kernel_region_flops > 0) {
      calls = std::min(
          calls, static_cast<int64_t>(std::ceil(settings.kernel_region_flops / k.call_flops)));
    }
    k.calls = std::max<int64_t>(1, calls);
  }
}

KernelSampler::~KernelSampler() = default;

// The timings in turn, as slowest_seconds_each has them, so that a slow spell of the machine
// falls on the same samples of every timing, which their medians drop.
void KernelSampler::sample(bool keep) {
  for (KernelBody& k : state_->bodies) {
    const double elapsed = slowest_seconds_once(world_, [&k] {
      for (int64_t c = 0; c < k.calls; ++c)
        k.body();
    });
    if (keep) k.region_s.push_back(elapsed);
  }
}

int64_t KernelSampler::samples() const {
  return static_cast<int64_t>(state_->bodies[0].region_s.size());
}

void KernelSampler::apply(Calibration& c) const {
  A2D_REQUIRE(samples() > 0, "calibration: no kernel samples were taken");
  const std::vector<KernelBody>& k = state_->bodies;
  const double forward_flops = state_->flops / k[0].seconds_per_call();
  // The forward's per-panel and per-key costs were scaled to the forward's time with every rank
  // computing; they follow it.
  if (c.kernel_forward_flops > 0) {
    const double slower = c.kernel_forward_flops / forward_flops;
    c.kernel_forward_panel_s *= slower;
    c.kernel_forward_key_s *= slower;
  }
  c.kernel_forward_flops = forward_flops;
  c.kernel_backward_flops = 2.5 * state_->flops / k[1].seconds_per_call();
  c.kernel_forward_causal_flops = state_->causal_flops / k[2].seconds_per_call();
  c.kernel_backward_causal_flops = 2.5 * state_->causal_flops / k[3].seconds_per_call();
  if (k.size() == 8) {
    c.kernel_forward_flops_bf16 = state_->flops / k[4].seconds_per_call();
    c.kernel_backward_flops_bf16 = 2.5 * state_->flops / k[5].seconds_per_call();
    c.kernel_forward_causal_flops_bf16 = state_->causal_flops / k[6].seconds_per_call();
    c.kernel_backward_causal_flops_bf16 = 2.5 * state_->causal_flops / k[7].seconds_per_call();
  }
}

namespace {

// The forward kernel's cost per call and head (fit_forward_call_costs) from calls of six shapes
// within the block, timed on world rank 0 alone while every other rank sleeps: on a core of its
// own a call's time is its work, where with ranks sharing cores the time slices of the other
// ranks, not the call, decide a short call's time. The costs are returned scaled to the ranks'
// shared cores by `shared_block_s`, the block's time with every rank computing, over its time
// alone: sharing a core slows a call's parts alike.
ForwardCallCosts measure_forward_call_costs(Communicator& world, KernelBlock& kb, int64_t iters,
                                            double shared_block_s) {
  const int64_t block = kb.block;
  const int64_t eighth = std::max<int64_t>(block / 8, 1), quarter = std::max<int64_t>(block / 4, 1);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{block, block},   {block, quarter},
                                                           {quarter, block}, {block, eighth},
                                                           {eighth, block},  {quarter, quarter}};
  std::vector<double> seconds(shapes.size(), 0.0);
  if (world.rank() == 0) {
    std::vector<ForwardArgs> calls(shapes.size(), kb.fwd);
    for (size_t i = 0; i < shapes.size(); ++i) {
      calls[i].shape.q_tokens = shapes[i].first;
      calls[i].shape.kv_tokens = shapes[i].second;
    }
    // The fastest of the timed calls of each shape (on an otherwise idle core, noise only adds),
    // the shapes in turn in every round.
    std::vector<double> best(shapes.size(), 1e30);
    for (int64_t round = 0; round <= 2 * iters; ++round) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        const double start = seconds_now();
        attention_forward(calls[i], kb.o_view, kb.lse_view);
        if (round > 0) best[i] = std::min(best[i], seconds_now() - start);
      }
    }
    for (size_t i = 0; i < shapes.size(); ++i)
      seconds[i] = best[i] / static_cast<double>(kb.heads);
  }
  // The calibration's world spans MPI_COMM_WORLD. Sleeping up to 20 ms, the waiting ranks wake
  // rarely enough not to slow rank 0 (polling every 0.5 ms, its calls took a third longer at 16
  // ranks).
  sleeping_barrier(MPI_COMM_WORLD);
  world.broadcast(seconds.data(), static_cast<int64_t>(sizeof(double) * seconds.size()), 0);
  const double shared = shared_block_s / (seconds[0] * static_cast<double>(kb.heads));
  ForwardCallCosts costs = fit_forward_call_costs(shapes, seconds);
  costs.entry_s *= shared;
  costs.panel_s *= shared;
  costs.key_s *= shared;
  return costs;
}

// Whether this rank computes in the wait-share measurement: half the ranks of every core, so that
// each core holds computing and waiting ranks alike (launchers place consecutive ranks on
// different cores, so even and odd ranks alone would put all computing ranks on some cores).
// Ranks not bound to one CPU count as one group.
bool computes_in_half(Communicator& world) {
  int64_t cpu = -1;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) == 1) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpu = c;
  }
  std::vector<int64_t> cpus(static_cast<size_t>(world.size()), 0);
  cpus[static_cast<size_t>(world.rank())] = cpu + 1;  // 0 stays "not set" in the sum
  world.all_reduce(cpus.data(), static_cast<int64_t>(cpus.size()), Reduction::sum);
  int64_t before = 0;  // ranks before this one on the same CPU
  for (int r = 0; r < world.rank(); ++r)
    if (cpus[static_cast<size_t>(r)] == cpu + 1) ++before;
  return before % 2 == 0;
}

}  // namespace

void CalibrationSettings::validate() const {
  A2D_REQUIRE(
      block >= 64 && heads >= 1 && head_dim >= 1 && iters >= 1 && threads >= 1 &&
          kernel_region_s >= 0 && kernel_region_flops >= 0,
      "calibration: the block must be >= 64 rows, heads, head dim, iterations, threads >= 1 and "
      "the kernel's timed region >= 0 seconds");
}

Calibration measure_calibration(Communicator& world, const CalibrationSettings& settings) {
  const int64_t block = settings.block, heads = settings.heads, head_dim = settings.head_dim;
  const int64_t iters = settings.iters;
  const auto stage = [&](int k, const char* what) {
    if (settings.progress) settings.progress(std::to_string(k) + "/7: " + what);
  };
  // The kernel, on every rank at once; the first round is a warm-up.
  stage(1, "the kernel's forward and backward rates, unmasked and causal");
  KernelSampler sampler(world, settings);
  KernelBlock& kb = sampler.state_->kb;
  const ForwardArgs& fwd = kb.fwd;
  const auto& o_view = kb.o_view;
  const auto& lse_view = kb.lse_view;
  for (int64_t i = 0; i <= iters; ++i)
    sampler.sample(i > 0);
  const KernelBody& forward = sampler.state_->bodies[0];
  const double forward_s = forward.seconds_per_call();
  // What each call pays beside its score entries, per 24-row panel (loading its queries, keeping
  // and storing its running state) and per key (copying it into the kernel's tiles).
  stage(2, "the forward's cost per panel and per key");
  const ForwardCallCosts call_costs = measure_forward_call_costs(world, kb, iters, forward_s);

  // Sorting gathered rows by position (in place, as the algorithms do under a causal mask): 4
  // blocks of rows gathered from 4 cyclic shards, interleaved back into position order. Repeated
  // 16 times per timed call: one pass takes less than a time slice, and a body that short would
  // run alone on its core and not show the sharing the algorithms' sorts run under.
  double permute_bytes_per_s = 0;
  stage(3, "sorting gathered rows");
  {
    const int64_t tokens = 4 * block, per_token = heads * head_dim, parts = 4;
    std::vector<float> rows(static_cast<size_t>(tokens * per_token), 1.0f);
    std::vector<int64_t> from(static_cast<size_t>(tokens));
    for (int64_t j = 0; j < tokens; ++j)
      from[static_cast<size_t>(j)] = (j % parts) * (tokens / parts) + j / parts;
    const double permute_s = slowest_seconds(world, iters, [&] {
      for (int pass = 0; pass < 16; ++pass)
        permute_tokens(rows.data(), per_token * static_cast<int64_t>(sizeof(float)), from.data(),
                       tokens);
    });
    permute_bytes_per_s = 16 * 4.0 * static_cast<double>(tokens * per_token) / permute_s;
  }

  // The reductions of reduce-scatters and reduction rings, per received float, as the MPI
  // communicator's ring does them between its transfers: copy this rank's contribution, then add
  // the received words to it (sum) or merge the received partial attention records [max, sum,
  // acc(D)] with it (merge). 4 passes over 4·block rows of every head per timed call, every rank
  // at once, the two timed in turn.
  double sum_bytes_per_s = 0, merge_bytes_per_s = 0;
  stage(4, "the reductions' rates");
  {
    const int64_t records = 4 * block * heads, record = head_dim + 2;
    const size_t floats = static_cast<size_t>(records * record);
    std::vector<float> own(floats, 0.5f), received(floats, 1.0f), result(floats);
    constexpr int kPasses = 4;
    const std::vector<double> times = slowest_seconds_each(
        world, iters,
        {[&] {
           for (int pass = 0; pass < kPasses; ++pass) {
             std::copy(own.begin(), own.end(), result.begin());
             for (size_t i = 0; i < floats; ++i)
               result[i] += received[i];
           }
         },
         [&] {
           for (int pass = 0; pass < kPasses; ++pass) {
             std::copy(own.begin(), own.end(), result.begin());
             merge_partial_records(result.data(), received.data(), records, record);
           }
         }});
    const double bytes = kPasses * 4.0 * static_cast<double>(floats);
    sum_bytes_per_s = bytes / times[0];
    merge_bytes_per_s = bytes / times[1];
  }

  // What a rank waiting in MPI costs the computing ones: half the ranks of every core compute
  // while the others wait in a barrier. With n ranks computing and m waiting on fewer cores, each
  // computing rank gets a 1 / (n + w m) share, so half waiting takes (1 + w) / 2 of the
  // all-computing time: w = 2 t_half / t_all - 1 (0: waiting is free, 1: it costs as much as
  // computing).
  double wait_share = 0;
  stage(5, "what a waiting rank takes from computing ones");
  if (world.size() > 1) {
    const bool computes = computes_in_half(world);
    // As many calls per timed region as the forward's timing had, so that the two compare.
    const double half_s = slowest_seconds(world, iters,
                                          [&] {
                                            if (computes)
                                              for (int64_t c = 0; c < forward.calls; ++c)
                                                kb.forward();
                                            world.barrier();
                                          }) /
                          static_cast<double>(forward.calls);
    wait_share = std::clamp(2 * half_s / forward_s - 1, 0.0, 1.0);
  }

  // Latency: an 8-byte ring shift on every rank at once, repeated back to back (the ranks stay
  // inside MPI). Bandwidth: the all-gather the algorithms use, 1 MiB from every rank.
  stage(6, "latency, bandwidth and synchronisation");
  const int next = (world.rank() + 1) % world.size();
  const int prev = (world.rank() - 1 + world.size()) % world.size();
  const int64_t large = int64_t{1} << 18, small = int64_t{1} << 12;  // floats: 1 MiB, 16 KiB
  std::vector<float> send(static_cast<size_t>(large), 1.0f), recv(send.size());
  double latency_s = 0, bytes_per_s = 1e12, sync_s = 0, step_sync_s = 0;
  if (world.size() > 1) {
    const int repeats = 200;
    latency_s = slowest_seconds(world, 5,
                                [&] {
                                  for (int i = 0; i < repeats; ++i)
                                    world.send_recv(Place::at_host(send.data()), 8, next,
                                                    Place::at_host(recv.data()), 8, prev);
                                }) /
                repeats;
    std::vector<float> gathered(send.size() * static_cast<size_t>(world.size()));
    const std::vector<int64_t> large_counts(static_cast<size_t>(world.size()), 4 * large);
    const std::vector<int64_t> small_counts(static_cast<size_t>(world.size()), 4 * small);
    const auto gather = [&](const std::vector<int64_t>& bytes) {
      world.all_gather(Place::at_host(send.data()), Place::at_host(gathered.data()), bytes);
    };
    const double steps = world.size() - 1;
    const double large_bytes = steps * 4.0 * static_cast<double>(large);
    const double small_bytes = steps * 4.0 * static_cast<double>(small);
    const double gather_s = slowest_seconds(world, 5, [&] { gather(large_counts); });
    bytes_per_s = large_bytes / std::max(gather_s - steps * latency_s, 1e-9);

    // Synchronisation. When ranks share cores, a rank that waits for others right after
    // computing waits for them to be scheduled: the last one to finish its kernel holds its core
    // until its time slice ends, and ranks that leave first take the cores from those still in
    // the exchange. Two kinds, as the algorithms have them, each as 8 steps of (kernel call of a
    // quarter of the block's rows and keys; exchange) against 8 kernel calls alone, timed in turn
    // (slowest rank, median), less the exchange's latencies and bytes:
    //   - a blocking all-gather of 16 KiB per rank after each call (ATTENTION2D-NO, all-gather
    //     K/V, Ulysses: their collectives), and
    //   - a ring step: a 16 KiB shift to the next rank posted before each call and waited for
    //     after it, progressed from inside the kernel (Ring Attention, ATTENTION2D-O).
    const int64_t quarter_rows = std::max<int64_t>(block / 4, 1);
    ForwardArgs quarter = fwd;
    quarter.shape.q_tokens = quarter.shape.kv_tokens = quarter_rows;
    quarter.progress = [](void* context) { static_cast<Communicator*>(context)->progress(); };
    quarter.progress_context = &world;
    constexpr int kSteps = 8;
    const std::vector<double> times = slowest_seconds_each(
        world, iters,
        {[&] {
           for (int step = 0; step < kSteps; ++step)
             attention_forward(quarter, o_view, lse_view);
         },
         [&] {
           for (int step = 0; step < kSteps; ++step) {
             attention_forward(quarter, o_view, lse_view);
             gather(small_counts);
           }
         },
         [&] {
           for (int step = 0; step < kSteps; ++step) {
             RequestPtr shift = world.send_recv_async(Place::at_host(send.data()), 4 * small, next,
                                                      Place::at_host(recv.data()), 4 * small, prev);
             attention_forward(quarter, o_view, lse_view);
             shift->wait();
           }
         }});
    sync_s = std::max(
        0.0, (times[1] - times[0]) / kSteps - steps * latency_s - small_bytes / bytes_per_s);
    step_sync_s =
        std::max(0.0, (times[2] - times[0]) / kSteps - latency_s - 4.0 * small / bytes_per_s);
  }

  stage(7, "done");
  Calibration c;
  c.ranks = world.size();
  c.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  c.head_dim = head_dim;
  c.block = block;
  c.wait_share = wait_share;
  c.latency_s = latency_s;
  c.bytes_per_s = bytes_per_s;
  c.kernel_forward_panel_s = call_costs.panel_s;
  c.kernel_forward_key_s = call_costs.key_s;
  c.permute_bytes_per_s = permute_bytes_per_s;
  c.sum_bytes_per_s = sum_bytes_per_s;
  c.merge_bytes_per_s = merge_bytes_per_s;
  c.sync_s = sync_s;
  c.step_sync_s = step_sync_s;
  // The kernel rates; c has none yet, so the call costs, scaled by these very timings, stay.
  sampler.apply(c);
  return c;
}

void print_calibration(const Calibration& c, const CalibrationSettings& settings,
                       const std::string& file) {
  std::printf(
      "a2d calibrate: %d ranks on %d cores, kernel %lldx%lld rows, %lld heads, D=%lld\n"
      "  kernel forward  %.3f GFLOP/s per rank (causal %.3f)\n"
      "  kernel backward %.3f GFLOP/s per rank (causal %.3f)\n"
      "  forward kernel per call and head: %.2f us per 24-row panel, %.3f us per key\n"
      "  sorting rows %.3f GB/s; reducing received words %.3f GB/s (sum), %.3f GB/s (merge)\n"
      "  a waiting rank takes %.2f of a computing rank's CPU share\n"
      "  latency %.2f us per message, bandwidth %.3f GB/s per rank\n"
      "  synchronising after a kernel call: %.2f ms per blocking collective, %.2f ms per ring "
      "step\n"
      "saved to %s, section [ranks %d]\n",
      c.ranks, c.cores, static_cast<long long>(settings.block),
      static_cast<long long>(settings.block), static_cast<long long>(settings.heads),
      static_cast<long long>(settings.head_dim), c.kernel_forward_flops / 1e9,
      c.kernel_forward_causal_flops / 1e9, c.kernel_backward_flops / 1e9,
      c.kernel_backward_causal_flops / 1e9, c.kernel_forward_panel_s * 1e6,
      c.kernel_forward_key_s * 1e6, c.permute_bytes_per_s / 1e9, c.sum_bytes_per_s / 1e9,
      c.merge_bytes_per_s / 1e9, c.wait_share, c.latency_s * 1e6, c.bytes_per_s / 1e9,
      c.sync_s * 1e3, c.step_sync_s * 1e3, file.c_str(), c.ranks);
  if (c.kernel_forward_flops_bf16 > 0) {
    std::printf("  bf16 on its own instructions (%s path): kernel forward %.3f GFLOP/s per rank "
                "(causal %.3f), backward %.3f (causal %.3f)\n",
                kernel_path_name(kernel_path()), c.kernel_forward_flops_bf16 / 1e9,
                c.kernel_forward_causal_flops_bf16 / 1e9, c.kernel_backward_flops_bf16 / 1e9,
                c.kernel_backward_causal_flops_bf16 / 1e9);
  }
}

int calibrate(int argc, char** argv, int first) {
  MpiSession mpi(&argc, &argv);
  auto world_ptr = make_mpi_communicator(MPI_COMM_WORLD);
  Communicator& world = *world_ptr;
  return run_collectively(world, [&]() -> int {
    std::string out;
    CalibrationSettings settings;
    cli::Options options(
        "a2d calibrate [options]",
        "Measures, with every rank of the MPI job busy at once, the attention kernel's throughput\n"
        "per rank (forward and backward, unmasked and on a causal diagonal block), the CPU share "
        "a\n"
        "rank waiting in MPI takes from computing ranks, the rates of sorting rows and of the\n"
        "reductions of reduce-scatters, the latency of a ring shift, and the\n"
        "bandwidth and synchronisation cost of a blocking all-gather (from 1 MiB and 16 KiB per\n"
        "rank), and saves them as the section for this rank count in the calibration file that\n"
        "`a2d model --machine local` and the planner read. Run it at every rank count you\n"
        "benchmark (mpirun -np P a2d calibrate), or let `a2d bench --calibrate` measure in the\n"
        "same run. Progress goes to rank 0's stderr.");
    options.add_string("--out", &out,
                       "the calibration file, created with its directories if missing; its "
                       "sections of other rank counts are kept (default: $A2D_CALIBRATION, else "
                       "./a2d-calibration.txt)");
    options.add_int("--block", &settings.block, "query and key rows of the timed kernel call");
    options.add_int("--heads", &settings.heads, "heads of the timed kernel call");
    options.add_int("--head-dim", &settings.head_dim, "head dimension of the timed kernel call");
    options.add_int("--iters", &settings.iters, "timed repetitions (median)");
    options.add_int("--threads", &settings.threads, "kernel threads per rank");
    options.add_double("--kernel-seconds", &settings.kernel_region_s,
                       "timed regions of kernel calls repeat the call for up to this many seconds\n"
                       "(0: one call per region)");
    bool quiet = false;
    options.add_flag("--quiet", &quiet,
                     "no progress on stderr (the measurements' lines, the prediction, the "
                     "progress lines)");
    bool help = false;
    collective_check(world, [&] {
      help = !options.parse(argc, argv, first);
      if (help) return;
      settings.validate();
      if (out.empty()) out = default_calibration_file();
      // Where it will write, before it measures for a minute.
      if (world.rank() == 0) cli::check_output_file("--out", out, true);
    });
    if (help) return 0;

    const double started = seconds_now();
    // The prediction, from the settings: the kernel's four timings take iters + 1 regions of up
    // to --kernel-seconds each; the other measurements took about 6 s together on 2 cores.
    const double stage_s[8] = {
        0,
        4.0 * static_cast<double>(settings.iters + 1) * std::max(settings.kernel_region_s, 0.05),
        1.0,
        0.3,
        0.3,
        4.0,
        1.5,
        0};
    Progress reporter("a2d calibrate", world.rank() == 0 && !quiet);
    double total_s = 0;
    for (const double s : stage_s)
      total_s += s;
    reporter.predict(total_s, "7 measurements",
                     "an estimate from its settings: --iters and --kernel-seconds");
    settings.progress = [&](const std::string& text) {
      if (world.rank() != 0 || quiet) return;
      const int k = std::atoi(text.c_str());  // "k/7: what"
      reporter.stage(text.substr(std::min(text.size(), text.find(": ") + 2)), k, 7,
                     k >= 1 && k <= 7 ? stage_s[k] : 0.0);
      std::fprintf(stderr, "a2d calibrate [%5.1f s]: %s\n", seconds_now() - started, text.c_str());
      std::fflush(stderr);
    };
    const Calibration c = measure_calibration(world, settings);
    reporter.finish();
    collective_check(world, [&] {
      if (world.rank() == 0) save_calibration(out, c);
    });
    if (world.rank() == 0) print_calibration(c, settings, cli::absolute_path(out));
    return 0;
  });
}

}  // namespace a2d::commands
