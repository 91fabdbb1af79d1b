// Options shared by the distributed subcommands (run, bench, model, plan): the problem and the
// plan, declared once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm_kind.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/tools/cli.hpp"

namespace a2d::cli {

struct ProblemOptions {
  int64_t batch = 1;
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t seq = 4096;
  int64_t head_dim = 64;
  int64_t window = 0;
  double scale = 0.0;
  bool causal = false;
  std::string window_size;  // --window-size LEFT,RIGHT; "" = none
  std::string doc_lens;     // "" = one document
  std::string mask_ranges;  // --mask-ranges FILE or generator; "" = none
  bool sinks = false;       // --sinks: sink logits from the seed
  std::string sink_file;    // --sink FILE.npy: sink logits [heads]
  double softcap = 0.0;
  std::string dtype;  // "" = the default: bf16 on GPUs, fp32 on CPUs (docs/usage.md, "Defaults")
  // The help's words for that default: the machine's (a2d model, plan) or the device's.
  bool dtype_by_machine = false;
  // The --dtype help's default where neither rule applies (a2d sim: always bf16); null: by them.
  const char* dtype_default = nullptr;

  void declare(Options& options);
  // Validated; `default_dtype` where --dtype was not given (the device's or the machine's).
  Problem problem(DType default_dtype) const;
  // These options as a command line gives them (every one, with `dtype`), for a2d plan's
  // "run it" line.
  std::string command_line(DType dtype) const;
  // The sink logits [heads] of --sink (rank 0 reads the file: call it collectively; every rank
  // gets them) or, with --sinks, generated from `seed`. Empty without sinks.
  std::vector<float> sink_values(Communicator& world, int64_t head_count, uint64_t seed) const;
};

// --device: the backend the algorithms compute with.
struct DeviceOptions {
  std::string device;  // "" = default_device(dtype): cuda for bf16/fp16 when built with it and a
                       // GPU is visible

  std::string comm;  // "" = default_comm_kind(backend): nccl on cuda, else mpi

  void declare(Options& options);
  // The dtype without --dtype: the device's first (BackendCapabilities::dtypes): bf16 for
  // --device cuda (or fenced-cuda), whose kernels take 16-bit inputs only, else fp32.
  DType default_dtype() const;
  // --comm, for the commands that run distributed algorithms.
  void declare_comm(Options& options);
  std::string name(DType dtype) const;  // the chosen device for inputs of dtype
  // Throws a2d::Error for an unknown device, or cuda where there is none.
  std::unique_ptr<Backend> backend(DType dtype) const;
  // The chosen communicator for `backend`; throws a2d::Error for an unknown name.
  CommKind comm_kind(const Backend& backend) const;
};

// Whether the buffers of `device` (a --device value) are this host's memory, which the memory
// checks count (BackendCapabilities::host_memory; not a GPU's).
bool memory_on_host(const std::string& device);

// --shards, --shard-counts, --shard-stripe: the caller's layout of the sequence over the ranks,
// when it is not the plan's. a2d run generates (or scatters) the inputs in it, the engine
// exchanges them into the plan's layout and back (relayout.hpp), and the outputs come back in it;
// a2d model and a2d plan charge those exchanges (with --shards-backward: which backward).
struct ShardOptions {
  std::string kind;    // "" = none: the plan's own layout
  std::string counts;  // "5,0,7": a contiguous cut, one count per rank
  int64_t stripe = 1;
  std::string backward = "saved";  // a2d model / plan: RelayoutBackward

  // with_backward: also --shards-backward (the model's commands; a2d run's backward is stateless).
  void declare(Options& options, bool with_backward);
  bool given() const { return !kind.empty() || !counts.empty(); }
  // The layout of `seq` tokens over `ranks` ranks, or none. Throws a2d::Error naming the option
  // for a bad value.
  std::optional<TokenLayout> layout(int64_t seq, int ranks) const;
  // For the cost model: the layout with --shards-backward (or `backward` when given).
  std::optional<UserShards> user_shards(int64_t seq, int ranks) const;
};

// --machine, --calibration, --machine-file (and --max-memory): the machine the cost model
// predicts for, declared once. Without --machine or --machine-file: this machine's calibration for
// the job's rank count, else kDefaultMachine (planner.hpp), as every output says.
struct MachineOptions {
  std::string name;         // "" = the default
  std::string calibration;  // "" = default_calibration_file()
  std::string file;
  std::string max_memory;  // "" = the machine's memory per rank; "none" = no cap

  // presets: also --machine; memory: also --max-memory; per_node: the command has
  // --gpus-per-node (refused beside a machine file, whose ranks_per_node says it).
  void declare(Options& options, bool presets, bool memory, bool per_node);
  // Throws a2d::Error for a bad --max-memory or --machine with --machine-file.
  MachineChoice choice() const;
};

// A size in bytes: a number with an optional unit B, KiB, MiB, GiB, TiB (or K, M, G, T, also
// powers of 1024), or "none" for no cap (0: none returned); 0 bytes, which would exclude every
// plan, is refused. Throws a2d::Error naming `option`.
int64_t parse_size(const std::string& option, const std::string& text);

struct PlanOptions {
  std::string algo;    // "" = the fastest by the cost model (a2d plan)
  std::string grid;    // "" = the fastest grid by the cost model
  std::string layout;  // "" = the algorithm's default
  int64_t stripe = 1;
  int64_t threads = 1;
  bool no_kv_transpose = false;
  int64_t heads_parallel = 0;  // hybrid's U; 0 = from --grid, else the fastest by the model
  MachineOptions machine;      // the planner's machine

  void declare(Options& options);
  // The options as the library's PlanRequest.
  PlanRequest request() const;
  // resolve_plan(request(), ...): checked against the problem and ranks. Without --algo or --grid
  // the cost model chooses
  // (this machine's calibration if there is one), charging the exchanges from and to `shards`
  // where given; `chosen` then says so.
  Plan plan(const Problem& problem, int ranks, std::string* chosen = nullptr,
            const UserShards* shards = nullptr) const;
  // Whether plan() leaves the choice to the cost model (no --algo, or no --grid where the grid
  // matters).
  bool chosen_by_planner() const;
};

// The JSON row fields every a2d table writes alike, in this order. A plan's: algo, grid, layout,
// kv_transpose, heads_parallel; a problem's shape and mask: batch, seq, heads, kv_heads,
// head_dim, causal (plain or windowed), documents, window, mask (Mask::describe).
void add_plan_fields(JsonLine& line, const Plan& plan);
void add_problem_fields(JsonLine& line, const Problem& problem);

}  // namespace a2d::cli
