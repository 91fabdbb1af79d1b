// a2d run: one distributed attention job under mpiexec, with its report.
//
//   mpirun -np P a2d run --algo attention2d --grid RxC --seq N --heads H --head-dim D
//          [--causal] [--backward] [--check] [--json] [--q q.npy --k k.npy --v v.npy [--do do.npy]]
//          [--out DIR [--force]] [--shards contiguous|zigzag|cyclic|striped | --shard-counts 5,0,7]
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/harness.hpp"
#include "attention2d/tools/npy.hpp"
#include "attention2d/tools/progress.hpp"
#include "attention2d/watchdog.hpp"
#include "commands.hpp"
#include "memory_needs.hpp"
#include "problem_options.hpp"
#include "run_support.hpp"

namespace a2d::commands {
namespace {

struct RunOptions {
  cli::ProblemOptions problem;
  cli::PlanOptions plan;
  cli::ShardOptions shards;
  cli::DeviceOptions device;
  bool backward = false;
  bool check = false;
  bool json = false;
  bool force = false;
  bool check_finite = false;
  bool no_memory_check = false;
  bool quiet = false;
  std::string q_file, k_file, v_file, do_file, out_dir;
  std::string out_dtype = "float32";
  int64_t seed = 42;
  int64_t warmup = 1;
  int64_t iters = 3;
  double timeout = kDefaultTimeout;
};

// Rank 0 reads the input files' headers (no data yet: the memory check comes first); every rank
// learns the problem sizes from them. Returns the largest file's data bytes.
int64_t read_input_sizes(Communicator& world, RunOptions& o) {
  int64_t sizes[6] = {0, 0, 0, 0, 0, 0};  // batch, seq, heads, kv_heads, head_dim, largest file
  collective_check(world, [&] {
    if (world.rank() != 0) return;
    A2D_REQUIRE(!o.k_file.empty() && !o.v_file.empty(), "--q needs --k and --v as well");
    A2D_REQUIRE(o.do_file.empty() || o.backward, "--do is the gradient of O: it needs --backward");
    A2D_REQUIRE(!o.backward || !o.do_file.empty(),
                "--backward with input files needs --do (the gradient of O)");
    // require_shape on a header (an array without data).
    const auto require = [](const npy::Header& h, const std::vector<int64_t>& shape,
                            const char* what) {
      npy::require_shape(npy::Array{h.dtype, h.shape, {}}, shape, what);
    };
    const npy::Header q = npy::read_header(o.q_file);
    A2D_REQUIRE(q.shape.size() == 4, "--q ", o.q_file, " has shape ", npy::shape_string(q.shape),
                "; it must be [batch, seq, heads, head_dim]");
    const npy::Header k = npy::read_header(o.k_file);
    A2D_REQUIRE(k.shape.size() == 4, "--k ", o.k_file, " has shape ", npy::shape_string(k.shape),
                "; it must be [batch, seq, kv_heads, head_dim]");
    const int64_t batch = q.shape[0], seq = q.shape[1], heads = q.shape[2], dim = q.shape[3];
    const int64_t kv_heads = k.shape[2];
    require(k, {batch, seq, kv_heads, dim}, "--k");
    const npy::Header v = npy::read_header(o.v_file);
    require(v, {batch, seq, kv_heads, dim}, "--v");
    int64_t largest = std::max({q.data_bytes(), k.data_bytes(), v.data_bytes()});
    if (!o.do_file.empty()) {
      const npy::Header d_out = npy::read_header(o.do_file);
      require(d_out, q.shape, "--do");
      largest = std::max(largest, d_out.data_bytes());
    }
    const int64_t from_files[6] = {batch, seq, heads, kv_heads, dim, largest};
    std::copy(from_files, from_files + 6, sizes);
  });
  world.broadcast(sizes, sizeof sizes, 0);
  o.problem.batch = sizes[0];
  o.problem.seq = sizes[1];
  o.problem.heads = sizes[2];
  o.problem.kv_heads = sizes[3];
  o.problem.head_dim = sizes[4];
  return sizes[5];
}

// Rank 0 reads the input files; every rank learns the problem sizes from them.
void load_inputs(Communicator& world, RunOptions& o, GlobalTensors& global) {
  int64_t sizes[5] = {0, 0, 0, 0, 0};  // batch, seq, heads, kv_heads, head_dim
  collective_check(world, [&] {
    if (world.rank() != 0) return;
    A2D_REQUIRE(!o.k_file.empty() && !o.v_file.empty(), "--q needs --k and --v as well");
    A2D_REQUIRE(o.do_file.empty() || o.backward, "--do is the gradient of O: it needs --backward");
    A2D_REQUIRE(!o.backward || !o.do_file.empty(),
                "--backward with input files needs --do (the gradient of O)");
    const npy::Array q = npy::read(o.q_file);
    A2D_REQUIRE(q.shape.size() == 4, "--q ", o.q_file, " has shape ", npy::shape_string(q.shape),
                "; it must be [batch, seq, heads, head_dim]");
    const npy::Array k = npy::read(o.k_file);
    A2D_REQUIRE(k.shape.size() == 4, "--k ", o.k_file, " has shape ", npy::shape_string(k.shape),
                "; it must be [batch, seq, kv_heads, head_dim]");
    const int64_t batch = q.shape[0], seq = q.shape[1], heads = q.shape[2], dim = q.shape[3];
    const int64_t kv_heads = k.shape[2];
    npy::require_shape(k, {batch, seq, kv_heads, dim}, "--k");
    const npy::Array v = npy::read(o.v_file);
    npy::require_shape(v, {batch, seq, kv_heads, dim}, "--v");
    global.q = q.to_float();
    global.k = k.to_float();
    global.v = v.to_float();
    if (!o.do_file.empty()) {
      const npy::Array d_out = npy::read(o.do_file);
      npy::require_shape(d_out, q.shape, "--do");
      global.d_out = d_out.to_float();
    }
    const int64_t from_files[5] = {batch, seq, heads, kv_heads, dim};
    std::copy(from_files, from_files + 5, sizes);
  });
  world.broadcast(sizes, sizeof sizes, 0);
  o.problem.batch = sizes[0];
  o.problem.seq = sizes[1];
  o.problem.heads = sizes[2];
  o.problem.kv_heads = sizes[3];
  o.problem.head_dim = sizes[4];
}

std::vector<std::string> output_names(bool backward, bool sinks) {
  std::vector<std::string> names = {"o.npy", "lse.npy"};
  if (backward) names.insert(names.end(), {"dq.npy", "dk.npy", "dv.npy"});
  if (backward && sinks) names.push_back("dsink.npy");
  return names;
}

// Before any work: the output directory exists (or is created, with its parents), is a
// writable directory, and holds none of the output files unless --force.
void prepare_output_dir(const RunOptions& o) {
  cli::prepare_output_directory("--out", o.out_dir);
  if (o.force) return;
  for (const std::string& name :
       output_names(o.backward, o.problem.sinks || !o.problem.sink_file.empty())) {
    const std::string path = o.out_dir + "/" + name;
    A2D_REQUIRE(::access(path.c_str(), F_OK) != 0, path,
                " already exists; pass --force to overwrite it or choose another --out");
  }
}

// --out-dtype: float32 (exact for every dtype: numpy has no bfloat16) or float16 (exact for an
// fp16 run only; for the others it would round the outputs a second time, so it is refused).
void check_out_dtype(const RunOptions& o, const Problem& p) {
  A2D_REQUIRE(o.out_dtype == "float32" || o.out_dtype == "float16",
              "--out-dtype must be float32 or float16, got '", o.out_dtype, "'");
  A2D_REQUIRE(o.out_dtype == "float32" || p.dtype == DType::f16,
              "--out-dtype float16 writes an fp16 run's outputs exactly; with --dtype ",
              dtype_name(p.dtype),
              " it would round them again (bf16 and fp32 outputs are written as float32, "
              "exactly)");
}

void write_outputs(const RunOptions& o, const Problem& p, const GlobalOutputs& g) {
  const auto overwrite = o.force ? npy::Overwrite::allow : npy::Overwrite::refuse;
  const std::vector<int64_t> q_shape = {p.batch, p.seq, p.heads, p.head_dim};
  const std::vector<int64_t> kv_shape = {p.batch, p.seq, p.kv_heads, p.head_dim};
  const std::string dir = o.out_dir + "/";
  const bool half = o.out_dtype == "float16";
  // The tensors as binary16 bits where asked (their values are fp16 values: exact); LSE stays
  // float32, as it is computed.
  std::vector<std::vector<uint16_t>> bits;
  const auto file = [&](const std::string& name, const std::vector<int64_t>& shape,
                        const std::vector<float>& values) -> npy::File {
    if (!half) return {dir + name, shape, values.data()};
    bits.emplace_back(values.size());
    from_float(DType::f16, values.data(), bits.back().data(), static_cast<int64_t>(values.size()));
    return {dir + name, shape, npy::DType::float16, bits.back().data()};
  };
  bits.reserve(4);
  std::vector<npy::File> files = {file("o.npy", q_shape, g.out),
                                  {dir + "lse.npy", {p.batch, p.heads, p.seq}, g.lse.data()}};
  if (o.backward) {
    files.push_back(file("dq.npy", q_shape, g.dq));
    files.push_back(file("dk.npy", kv_shape, g.dk));
    files.push_back(file("dv.npy", kv_shape, g.dv));
    if (p.sinks) files.push_back({dir + "dsink.npy", {p.heads}, g.dsink.data()});
  }
  npy::write_all(files, overwrite);
}

}  // namespace

int run(int argc, char** argv, int first) {
  return run_counted(&argc, &argv, [&](auto& world, const auto& log) -> int {
    RunOptions o;
    cli::Options options(
        "a2d run [options]",
        "Runs distributed attention on every rank of the MPI job (start it with mpiexec) and\n"
        "reports the slowest rank's time, the bytes each rank sent and, with --check, the error\n"
        "of every output against a single-process fp64 reference.");
    o.problem.declare(options);
    o.plan.declare(options);
    o.shards.declare(options, false);
    o.device.declare(options);
    o.device.declare_comm(options);
    options.add_flag("--backward", &o.backward, "also run and time the backward pass");
    options.add_string("--q", &o.q_file,
                       "Q as .npy [batch, seq, heads, head_dim] (float16/32/64; rounded to "
                       "--dtype as it is read)");
    options.add_string("--k", &o.k_file, "K as .npy [batch, seq, kv_heads, head_dim]");
    options.add_string("--v", &o.v_file, "V as .npy [batch, seq, kv_heads, head_dim]");
    options.add_string("--do", &o.do_file,
                       "dO as .npy [batch, seq, heads, head_dim] (with --backward)");
    options.add_string("--out", &o.out_dir,
                       "write o.npy, lse.npy (dq, dk, dv.npy) into this directory, global order "
                       "(created with its parents if missing)");
    options.add_flag("--force", &o.force, "overwrite existing output files");
    options.add_string("--out-dtype", &o.out_dtype,
                       "element type of o, dq, dk, dv.npy: float32 (exact for every --dtype) or "
                       "float16 (for --dtype fp16); lse.npy is float32 (default float32)");
    options.add_flag("--check", &o.check,
                     "compare every output with the fp64 reference; exit 1 over the bound");
    options.add_flag("--json", &o.json, "one JSON object per line instead of the report");
    options.add_flag("--check-finite", &o.check_finite,
                     "refuse inputs holding NaN or Inf, naming the first one and its rank");
    options.add_int("--seed", &o.seed, "seed of the generated inputs");
    options.add_int("--warmup", &o.warmup, "untimed iterations");
    options.add_int("--iters", &o.iters, "timed iterations; the median is reported");
    options.add_flag("--no-memory-check", &o.no_memory_check, kNoMemoryCheckHelp);
    options.add_flag("--quiet", &o.quiet, kQuietHelp);
    options.add_double("--timeout", &o.timeout,
                       "watchdog: abort the job, naming the phase and the ranks that did not "
                       "arrive, when no rank made progress for this many seconds (0 = off; "
                       "default 300, which outlasts a network outage of up to 120 s, whose TCP "
                       "backoff stalls a job up to twice as long: docs/reliability.md)");
    bool asked_help = false;
    collective_check(world, [&] {
      asked_help = !options.parse(argc, argv, first);
      A2D_REQUIRE(o.timeout >= 0, "--timeout must be >= 0 seconds (0 turns the watchdog off)");
    });
    if (asked_help) return 0;
    Progress progress("a2d run", world.rank() == 0 && !o.quiet);
    auto watchdog = std::make_unique<Watchdog>(MPI_COMM_WORLD, o.timeout);

    const bool from_files = !o.q_file.empty();
    GlobalTensors global;
    int64_t largest_file_bytes = 0;
    if (from_files) {
      for (const char* option : {"--batch", "--seq", "--heads", "--kv-heads", "--head-dim"}) {
        collective_check(world, [&] {
          A2D_REQUIRE(!options.given(option), option,
                      " conflicts with --q: with input files the "
                      "sizes come from the files");
        });
      }
      largest_file_bytes = read_input_sizes(world, o);
    } else {
      collective_check(world, [&] {
        A2D_REQUIRE(o.k_file.empty() && o.v_file.empty() && o.do_file.empty(),
                    "--k, --v and --do need --q");
      });
    }

    Problem problem;
    Plan plan;
    std::string chosen;
    std::unique_ptr<Backend> backend;
    CommKind comm_kind = CommKind::mpi;
    // --shards: the inputs and outputs in the caller's layout, exchanged inside (make_attention's
    // stateless backward, which the planner charges).
    std::optional<UserShards> user_shards;
    collective_check(world, [&] {
      A2D_REQUIRE(o.warmup >= 0 && o.iters >= 1, "--warmup must be >= 0 and --iters >= 1");
      problem = o.problem.problem(o.device.default_dtype());
      const std::optional<TokenLayout> user = o.shards.layout(problem.seq, world.size());
      if (user) user_shards = UserShards{*user, RelayoutBackward::stateless};
      check_out_dtype(o, problem);
    });
    // Before any data moves or anything large is allocated: the memory each rank needs against
    // what its host has (attention2d/memory_check.hpp). Where the cost model chooses the plan,
    // the plan needing the least memory first (the planner itself caps the plans by the
    // modelled machine's memory, not this host's).
    const std::string device = o.device.name(problem.dtype);
    RunArrays arrays;
    arrays.backward = o.backward;
    arrays.check = o.check;
    arrays.out = !o.out_dir.empty();
    arrays.half_out = o.out_dtype == "float16";
    arrays.from_files = from_files;
    arrays.largest_file_bytes = largest_file_bytes;
    const auto run_check = [&](const Plan* chosen_plan) {
      MemoryCheck check;
      check.request = {world.size(), problem.seq, problem.dtype};
      check.seq_may_change = !from_files && o.shards.counts.empty();
      check.ranks_may_change = o.shards.counts.empty();
      check.enabled = !o.no_memory_check;
      check.model = [&, chosen_plan](const MemoryRequest& r) {
        const Problem p = varied_problem(problem, r);
        MemoryNeed need;
        // GPU buffers are not the host's memory: only the harness's host copies are.
        const bool on_host = cli::memory_on_host(device);
        const bool copies = p.dtype != DType::f32 || !on_host;
        const std::optional<TokenLayout> user = o.shards.layout(p.seq, r.ranks);
        const std::optional<UserShards> shards =
            user ? std::optional<UserShards>(UserShards{*user, RelayoutBackward::stateless})
                 : std::nullopt;
        if (chosen_plan) {
          const Plan varied = varied_plan(*chosen_plan, p, r.ranks);
          for (MemoryPart& part :
               plan_parts(p, varied, shards ? &*shards : nullptr, o.backward, copies)) {
            if (on_host || part.what == "fp32 host copies of the shards")
              need.every_rank.push_back(part);
          }
        } else {
          const int64_t least = least_memory_per_rank(p, r.ranks);
          A2D_REQUIRE(least >= 0, "no plan can run it");
          if (on_host) {
            need.every_rank.push_back(
                {"shards and the algorithm's buffers (the plan needing the least memory)",
                 least});
          }
          if (copies) {
            const int64_t tokens = (p.seq + r.ranks - 1) / r.ranks;
            need.every_rank.push_back(
                {"fp32 host copies of the shards", harness_copy_bytes(p, tokens, o.backward)});
          }
        }
        need.rank0 = run_rank0_parts(p, arrays);
        return need;
      };
      check_memory(world, check);
    };
    if (o.plan.chosen_by_planner()) run_check(nullptr);
    collective_check(world, [&] {
      plan = o.plan.plan(problem, world.size(), &chosen, user_shards ? &*user_shards : nullptr);
      backend = o.device.backend(problem.dtype);
      comm_kind = o.device.comm_kind(*backend);
    });
    run_check(&plan);
    // The prediction (rank 0): this machine's calibration or an estimate from its FMA peak.
    const double rank0_entries =
        rank_forward_flops(problem, plan, 0) / (4.0 * static_cast<double>(problem.head_dim));
    double forward_s = 0, backward_s = 0, check_s = 0;
    if (progress.enabled()) {
      const int64_t calls = o.warmup + o.iters;
      const double flops = busiest_forward_flops(problem, plan) * (o.backward ? 3.5 : 1.0);
      const double reference_flops = forward_flops(problem) * (o.backward ? 4.5 : 1.0);
      if (could_take_longer(static_cast<double>(calls) * flops, plan.threads,
                            ProgressSettings::from_environment().predict_s) ||
          (o.check && reference_flops / (2e9 * reference_threads()) >
                          ProgressSettings::from_environment().predict_s)) {
        const std::string file = o.plan.machine.calibration.empty()
                                     ? default_calibration_file()
                                     : o.plan.machine.calibration;
        const LocalMachine local =
            local_machine_for_prediction(world.size(), plan.threads, file, nullptr, problem.dtype);
        const Prediction predicted = predict(problem, plan, local.machine, world.size());
        forward_s = predicted.forward_s;
        backward_s = o.backward ? predicted.backward_s : 0;
        if (o.check)
          check_s = reference_flops / (kReferenceFlopsPerThread * reference_threads());
        std::string what = std::to_string(calls) + (calls == 1 ? " call" : " calls") +
                           (o.backward ? " of forward and backward" : " of the forward");
        if (o.check) what += ", then the fp64 reference on rank 0 (--check)";
        progress.predict(static_cast<double>(calls) * (forward_s + backward_s) + check_s, what,
                         local.source);
      }
    }
    if (from_files) load_inputs(world, o, global);
    const std::unique_ptr<Session> session =
        make_session(world, log, std::move(backend), comm_kind, std::move(watchdog), o.timeout);
    // Inputs read from files hold what the dtype stores (the reference sees the same values).
    if (from_files && world.rank() == 0) round_inputs(global, problem.dtype);
    if (!o.out_dir.empty()) {
      collective_check(world, [&] {
        if (world.rank() == 0) prepare_output_dir(o);
      });
    }

    // The phase a std::bad_alloc while the shards are made and filled names.
    world.set_phase("setup");
    progress.stage("setup: the shards", 0, 0, 0);
    const std::unique_ptr<DistributedAttention> attention =
        session->attention(problem, plan, user_shards ? &user_shards->layout : nullptr);
    ShardSet shards =
        make_shards(problem, attention->layout(), world.rank(), static_cast<uint64_t>(o.seed),
                    !from_files, o.backward, session->backend());
    // Sink logits: generated from the seed (--sinks) or read from --sink, the same on every rank.
    std::vector<float> sinks;
    if (problem.sinks) {
      world.set_phase("io");
      sinks = o.problem.sink_values(world, problem.heads, static_cast<uint64_t>(o.seed));
      shards.sinks = sinks;
      if (from_files) global.sinks = sinks;
    }
    if (from_files) {
      world.set_phase("io");
      scatter_inputs(world, 0, problem, attention->layout(), global, shards, o.backward);
    }

    if (o.check_finite) {
      world.set_phase("io");
      const NonFiniteInput bad =
          find_nonfinite(world, problem, attention->layout(), shards, o.backward);
      collective_check(world, [&] {
        A2D_REQUIRE(!bad.found || world.rank() != bad.rank, bad.describe(),
                    " (--check-finite; global index order [batch, seq, heads, head_dim])");
      });
    }

    const Timings timings = time_attention(
        world, *log, *attention, problem, shards, o.backward, o.warmup, o.iters,
        [&](const std::string& direction, int64_t call) {
          const bool forward = direction == "forward";
          const int64_t start = session->backend().kernel_work();
          progress.stage(
              direction, call + 1, o.warmup + o.iters, forward ? forward_s : backward_s,
              [&session, start, rank0_entries] {
                return static_cast<double>(session->backend().kernel_work() - start) /
                       std::max(1.0, rank0_entries);
              },
              [] { return Watchdog::current_phase(); });
        });

    // Outputs in global order on rank 0, then the check and the files.
    OutputErrors errors;
    GlobalOutputs outputs;
    const bool need_outputs = o.check || !o.out_dir.empty();
    if (need_outputs) {
      world.set_phase("io");
      progress.stage("io: gathering the outputs on rank 0", 0, 0, 0);
      outputs = gather_outputs(world, 0, problem, attention->layout(), shards, o.backward);
    }
    double error_values[6] = {-1, -1, -1, -1, -1, -1};
    if (o.check) {
      // Rank 0 computes the fp64 reference (minutes at long sequences; it beats the watchdog's
      // heart as it goes) while the others sleep.
      world.set_phase("check");
      const int64_t rows_before = reference_rows_done();
      const double rows = reference_rows(problem, o.backward);
      progress.stage("check: the fp64 reference on rank 0", 0, 0, check_s, [rows_before, rows] {
        return static_cast<double>(reference_rows_done() - rows_before) / rows;
      });
      if (world.rank() == 0) {
        if (!from_files) {
          global = generate_global(problem, static_cast<uint64_t>(o.seed), o.backward);
          global.sinks = sinks;
        }
        const ReferenceOutputs reference =
            reference_outputs(problem, global, o.backward, reference_threads());
        errors = compare_outputs(outputs, reference, o.backward);
        const double values[6] = {errors.out, errors.lse, errors.dq,
                                  errors.dk,  errors.dv,  errors.dsink};
        std::copy(values, values + 6, error_values);
      }
      sleeping_barrier(MPI_COMM_WORLD);  // the other ranks sleep while rank 0 computes
      world.broadcast(error_values, sizeof error_values, 0);
      errors = {error_values[0], error_values[1], error_values[2],
                error_values[3], error_values[4], error_values[5]};
    }
    const bool pass = !o.check || errors.within(output_bounds(problem.dtype));
    // A failed check writes nothing: a failed run leaves no output behind.
    if (!o.out_dir.empty() && pass) {
      collective_check(world, [&] {
        if (world.rank() == 0) write_outputs(o, problem, outputs);
      });
    }
    progress.finish();
    if (world.rank() == 0) {
      RunReport report{problem,
                       plan,
                       world.size(),
                       o.backward,
                       timings,
                       o.check,
                       errors,
                       session->backend().name(),
                       comm_kind_name(comm_kind),
                       user_shards ? attention->layout().describe() : std::string(),
                       user_shards ? plan_layout(problem, plan).describe() : std::string()};
      if (o.json) {
        std::cout << report.json() << std::endl;
      } else {
        if (!chosen.empty()) std::cout << chosen << "\n";
        std::cout << report.text();
        if (!o.out_dir.empty()) {
          std::cout << (pass ? "outputs written to " : "check failed: nothing written to ")
                    << o.out_dir << "\n";
        }
      }
    }
    return pass ? 0 : 1;
  }, startup_timeout(argc, argv, first, kDefaultTimeout));
}

}  // namespace a2d::commands
