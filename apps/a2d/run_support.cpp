#include "run_support.hpp"

#include <mpi.h>

#include <unistd.h>

#include <malloc.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <cstring>
#include <iostream>
#include <new>
#include <sstream>
#include <thread>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/tools/npy.hpp"
#include "attention2d/watchdog.hpp"
#include "commands.hpp"
#include "problem_options.hpp"

namespace a2d::commands {

namespace {
// One write per message, so that the lines of several ranks sharing a terminal do not interleave.
void print_error(const std::string& text) {
  std::fflush(stdout);
  const ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
  (void)written;
}
}  // namespace

std::unique_ptr<Session> make_session(Communicator& world, const std::shared_ptr<TrafficLog>& log,
                                      std::unique_ptr<Backend> backend, CommKind kind,
                                      std::unique_ptr<Watchdog> watchdog, double timeout) {
  auto session = std::make_unique<Session>(world, std::move(backend));
  if (kind != CommKind::mpi) {
    // The phase name is `world`'s, so that the phases set on either communicator (the
    // algorithms' here, the program's control and io phases on `world`) time one sequence of
    // phases.
    auto* counting = dynamic_cast<CountingCommunicator*>(&world);
    Backend& device = session->backend();
    session->connect(kind, [&]() -> std::unique_ptr<Communicator> {
      return std::make_unique<CountingCommunicator>(make_communicator(MPI_COMM_WORLD, device, kind),
                                                    log,
                                                    counting ? counting->shared_phase() : nullptr);
    });
  }
  session->watch(std::move(watchdog), timeout);
  return session;
}

int run_counted(int* argc, char*** argv, const CountedBody& body, double startup_timeout) {
  MpiSession mpi(argc, argv, startup_timeout);
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_mpi_communicator(MPI_COMM_WORLD), log);
  return run_collectively(world, [&]() -> int { return body(world, log); });
}

double startup_timeout(int argc, char** argv, int first, double fallback) {
  double timeout = fallback;
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (arg == "--timeout" && i + 1 < argc) {
      value = argv[++i];
    } else if (arg.rfind("--timeout=", 0) == 0) {
      value = arg.substr(10);
    } else {
      continue;
    }
    char* end = nullptr;
    const double parsed = std::strtod(value.c_str(), &end);
    timeout = end && *end == '\0' && !value.empty() ? parsed : fallback;
  }
  return timeout;
}

int run_collectively(Communicator& world, const std::function<int()>& body) {
  // SIGTERM and SIGINT end the whole job with one line naming the signal, exit 143 or 130, and
  // outputs complete or absent (docs/reliability.md, "Signals").
  Watchdog::stop_on_signals(true, npy::hold_commits);
  const std::string who =
      "a2d (rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) + "): ";
  try {
    return body();
  } catch (const CollectiveError& e) {
    // The same error on every rank: printed once (every rank's with --verbose).
    if (g_verbose) {
      print_error(who + e.what() + "\n");
    } else if (world.rank() == 0) {
      print_error(std::string("a2d: ") + e.brief() + "\n");
    }
    return 2;
  } catch (const std::bad_alloc&) {
    // One line: the rank and where it was (docs/reliability.md, "Too big for memory").
    print_error("a2d: rank " + std::to_string(world.rank()) + " of " +
                std::to_string(world.size()) + " ran out of memory (std::bad_alloc) in phase " +
                phase_now() + "; aborting the job\n");
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  } catch (const std::exception& e) {
    print_error(who + error_text(e) + "\na2d: aborting the job so that no rank waits forever\n");
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
}

int reference_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

namespace {

// One timed call on every rank: a barrier, the call, and the slowest rank's time.
double timed(Communicator& world, const std::string& direction, const std::function<void()>& call,
             double& my_ms) {
  world.set_phase("control");
  world.barrier();
  world.set_phase(direction + ".setup");
  const double start = seconds_now();
  call();
  my_ms = 1e3 * (seconds_now() - start);
  world.set_phase("control");  // the timing's own all-reduce is not the algorithm's traffic
  double slowest = my_ms;
  world.all_reduce(&slowest, 1, Reduction::max);
  return slowest;
}

PhaseTiming summarize_phase(Communicator& world, const std::vector<double>& slowest,
                            const std::vector<double>& mine, const Traffic& traffic,
                            const Traffic& relayout) {
  PhaseTiming t;
  t.median_ms = summarize(slowest).median;
  const double my_median = summarize(mine).median;
  double stats[3] = {my_median, -my_median, my_median};
  world.all_reduce(&stats[0], 2, Reduction::max);
  world.all_reduce(&stats[2], 1, Reduction::sum);
  t.rank_max_ms = stats[0];
  t.rank_min_ms = -stats[1];
  t.rank_avg_ms = stats[2] / world.size();
  int64_t sent[4] = {traffic.bytes, traffic.messages, relayout.bytes, relayout.messages};
  world.all_reduce(sent, 4, Reduction::max);
  t.bytes = sent[0];
  t.messages = sent[1];
  t.relayout_bytes = sent[2];
  t.relayout_messages = sent[3];
  return t;
}

// Per phase named by rank 0 (except "control"): the largest over the ranks of each rank's median.
std::map<std::string, double> slowest_phase_medians(
    Communicator& world, const std::map<std::string, std::vector<double>>& samples) {
  std::string names;
  if (world.rank() == 0) {
    for (const auto& entry : samples)
      if (entry.first != "control") names += entry.first + "\n";
  }
  int64_t length = static_cast<int64_t>(names.size());
  world.broadcast(&length, sizeof length, 0);
  names.resize(static_cast<size_t>(length));
  if (length > 0) world.broadcast(names.data(), length, 0);
  std::map<std::string, double> out;
  std::istringstream lines(names);
  for (std::string name; std::getline(lines, name);) {
    const auto it = samples.find(name);
    double ms = it == samples.end() ? 0.0 : summarize(it->second).median;
    world.all_reduce(&ms, 1, Reduction::max);
    out[name] = ms;
  }
  return out;
}

}  // namespace

AttentionTimer::AttentionTimer(Communicator& world, TrafficLog& log,
                               DistributedAttention& attention, const Problem& problem,
                               ShardSet& shards, bool backward)
    : world_(world),
      log_(log),
      attention_(attention),
      problem_(problem),
      shards_(shards),
      with_backward_(backward) {}

void AttentionTimer::call(bool measured) {
  time_direction(
      "forward", [&] { attention_.forward(shards_.forward(problem_)); }, measured, forward_);
  if (with_backward_) {
    time_direction(
        "backward", [&] { attention_.backward(shards_.backward(problem_)); }, measured, backward_);
  }
}

void AttentionTimer::time_direction(const std::string& direction, const std::function<void()>& body,
                                    bool measured, Samples& samples) {
  if (before_call) before_call(direction);
  double mine = 0;
  log_.clear();
  const double slowest = timed(world_, direction, body, mine);
  if (!measured) return;
  samples.slowest.push_back(slowest);
  samples.mine.push_back(mine);
  samples.traffic = log_.total(direction);
  samples.relayout = log_.total(direction + ".relayout");
  for (const auto& [name, s] : log_.seconds())
    phase_samples_[name].push_back(1e3 * s);
}

Timings AttentionTimer::finish() {
  A2D_REQUIRE(!forward_.slowest.empty(), "no timed call to summarize");
  Timings timings;
  timings.phase_ms = slowest_phase_medians(world_, phase_samples_);
  timings.forward =
      summarize_phase(world_, forward_.slowest, forward_.mine, forward_.traffic, forward_.relayout);
  if (with_backward_) {
    timings.backward = summarize_phase(world_, backward_.slowest, backward_.mine, backward_.traffic,
                                       backward_.relayout);
  }
  return timings;
}

Timings time_attention(Communicator& world, TrafficLog& log, DistributedAttention& attention,
                       const Problem& problem, ShardSet& shards, bool backward, int64_t warmup,
                       int64_t iters,
                       const std::function<void(const std::string&, int64_t)>& before_call) {
  AttentionTimer timer(world, log, attention, problem, shards, backward);
  for (int64_t i = 0; i < warmup + iters; ++i) {
    if (before_call) timer.before_call = [&](const std::string& d) { before_call(d, i); };
    timer.call(i >= warmup);
  }
  return timer.finish();
}

namespace {
// A "VmXXX:  1234 kB" line of /proc/self/status, in bytes; -1 if absent.
int64_t proc_status_bytes(const char* key) {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (!status) return -1;
  char line[256];
  int64_t value = -1;
  const size_t length = std::strlen(key);
  while (std::fgets(line, sizeof line, status)) {
    if (std::strncmp(line, key, length) == 0) {
      value = 1024 * std::atoll(line + length + 1);
      break;
    }
  }
  std::fclose(status);
  return value;
}
}  // namespace

int64_t peak_memory_growth(const std::function<void()>& body) {
  // Free heap memory goes back to the system first, so that reusing it counts as growth.
  malloc_trim(0);
  // "5" resets the peak resident set size (Linux >= 4.0).
  std::FILE* clear = std::fopen("/proc/self/clear_refs", "w");
  const bool reset = clear && std::fputs("5", clear) >= 0;
  if (clear) std::fclose(clear);
  const int64_t before = proc_status_bytes("VmRSS:");
  body();
  const int64_t peak = proc_status_bytes("VmHWM:");
  if (!reset || before < 0 || peak < 0) return -1;
  return std::max<int64_t>(0, peak - before);
}

int64_t shard_bytes(const ShardSet& s) {
  return s.device_bytes();
}

double forward_flops(const Problem& p) {
  const double pairs =
      static_cast<double>(count_visible_pairs(p.mask, nullptr, p.seq, nullptr, p.seq));
  return 4.0 * pairs * static_cast<double>(p.head_dim * p.heads * p.batch);
}

std::string RunReport::text() const {
  std::ostringstream out;
  out << "a2d run: " << problem.describe() << "\n"
      << "plan: " << plan.describe() << " on " << cli::count_of(ranks, "rank") << ", device "
      << device << ", comm " << comm << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-9s %10s %10s %10s %10s %12s %14s %9s\n", "phase", "ms(slow)",
                "rank min", "rank avg", "rank max", "GFLOP/s/rank", "bytes sent/rank", "messages");
  out << line;
  const double flops = forward_flops(problem);
  auto row = [&](const char* name, const PhaseTiming& t, double phase_flops) {
    std::snprintf(line, sizeof line, "%-9s %10.3f %10.3f %10.3f %10.3f %12.2f %14lld %9lld\n", name,
                  t.median_ms, t.rank_min_ms, t.rank_avg_ms, t.rank_max_ms,
                  phase_flops / (t.median_ms * 1e-3) / 1e9 / ranks, static_cast<long long>(t.bytes),
                  static_cast<long long>(t.messages));
    out << line;
  };
  row("forward", timings.forward, flops);
  if (backward) row("backward", timings.backward, 2.5 * flops);
  if (!shards.empty()) {
    out << "relayout: shards " << shards << " <-> plan " << plan_layout
        << "; of the bytes above, forward " << timings.forward.relayout_bytes << " ("
        << timings.forward.relayout_messages << " messages)";
    if (backward) {
      out << ", backward " << timings.backward.relayout_bytes << " ("
          << timings.backward.relayout_messages << " messages)";
    }
    out << "\n";
  }
  if (checked) {
    std::snprintf(line, sizeof line, "check: O %.2e  LSE %.2e", errors.out, errors.lse);
    out << line;
    if (backward) {
      std::snprintf(line, sizeof line, "  dQ %.2e  dK %.2e  dV %.2e", errors.dq, errors.dk,
                    errors.dv);
      out << line;
      if (problem.sinks) {
        std::snprintf(line, sizeof line, "  dsink %.2e", errors.dsink);
        out << line;
      }
    }
    const OutputBounds bounds = output_bounds(problem.dtype);
    std::snprintf(line, sizeof line,
                  "  (relative Frobenius vs fp64 reference on the %s inputs, bounds O %.1e LSE "
                  "%.1e dQ/dK %.1e dV %.1e): %s\n",
                  dtype_name(problem.dtype), bounds.out, bounds.lse, bounds.dq, bounds.dv,
                  errors.within(bounds) ? "PASS" : "FAIL");
    out << line;
  }
  return out.str();
}

void add_timing_fields(cli::JsonLine& line, const std::string& direction, const PhaseTiming& t,
                       double flops, int ranks) {
  const std::string& d = direction;
  line.add(d + "_ms", t.median_ms)
      .add(d + "_ms_rank_min", t.rank_min_ms)
      .add(d + "_ms_rank_avg", t.rank_avg_ms)
      .add(d + "_ms_rank_max", t.rank_max_ms)
      .add(d + "_gflops_per_rank", flops / (t.median_ms * 1e-3) / 1e9 / ranks)
      .add("bytes_sent_" + d, t.bytes)
      .add("messages_" + d, t.messages);
}

std::string RunReport::json() const {
  cli::JsonLine line;
  const double flops = forward_flops(problem);
  line.add("algo", algorithm_name(plan.algorithm))
      .add("grid", plan.grid.describe())
      .add("ranks", ranks)
      .add("layout", layout_name(plan.layout))
      .add("kv_transpose", plan.kv_transpose)
      .add("heads_parallel", plan.heads_parallel);
  cli::add_problem_fields(line, problem);
  line.add("sinks", problem.sinks)
      .add("softcap", static_cast<double>(problem.softcap))
      .add("threads", plan.threads)
      .add("dtype", dtype_name(problem.dtype))
      .add("device", device)
      .add("comm", comm);
  add_timing_fields(line, "fwd", timings.forward, flops, ranks);
  line.add("relayout_bytes_fwd", timings.forward.relayout_bytes)
      .add("relayout_messages_fwd", timings.forward.relayout_messages);
  if (backward) {
    add_timing_fields(line, "bwd", timings.backward, 2.5 * flops, ranks);
    line.add("relayout_bytes_bwd", timings.backward.relayout_bytes)
        .add("relayout_messages_bwd", timings.backward.relayout_messages);
  }
  if (!shards.empty()) line.add("shards", shards).add("plan_layout", plan_layout);
  if (checked) {
    line.add("err_o", errors.out).add("err_lse", errors.lse);
    if (backward) line.add("err_dq", errors.dq).add("err_dk", errors.dk).add("err_dv", errors.dv);
    if (backward && problem.sinks) line.add("err_dsink", errors.dsink);
    const OutputBounds bounds = output_bounds(problem.dtype);
    line.add("max_rel_err", errors.max())
        .add("bound", std::max({bounds.out, bounds.lse, bounds.dq, bounds.dk, bounds.dv}))
        .add("bound_o", bounds.out)
        .add("bound_lse", bounds.lse)
        .add("bound_dq", bounds.dq)
        .add("bound_dk", bounds.dk)
        .add("bound_dv", bounds.dv)
        .add("pass", errors.within(bounds));
  }
  return line.str();
}

}  // namespace a2d::commands
