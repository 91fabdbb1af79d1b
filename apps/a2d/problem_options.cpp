#include "problem_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/tools/data.hpp"
#include "attention2d/tools/npy.hpp"

namespace a2d::cli {

void ProblemOptions::declare(Options& options) {
  options.add_int("--batch", &batch, "batch size B");
  options.add_int("--heads", &heads, "query heads H");
  options.add_int("--kv-heads", &kv_heads,
                  "key/value heads; H must be a multiple (default 0: as many as --heads)");
  options.add_int("--seq", &seq, "sequence length N");
  options.add_int("--head-dim", &head_dim, "head dimension D");
  options.add_flag("--causal", &causal, "causal mask (key position <= query position)");
  options.add_int("--window", &window,
                  "causal with a window of W tokens: q - W < k <= q (implies --causal; default 0: "
                  "none)");
  options.add_string("--window-size", &window_size, kWindowSizeHelp);
  options.add_string("--doc-lens", &doc_lens, kDocLensHelp);
  options.add_string("--mask-ranges", &mask_ranges, kMaskRangesHelp);
  options.add_flag("--sinks", &sinks,
                   "attention sinks: a logit per query head joining every softmax (gpt-oss), "
                   "values generated from the seed");
  options.add_string("--sink", &sink_file,
                     "attention sinks with these logits: float32 [heads] .npy");
  options.add_double("--softcap", &softcap,
                     "logit softcapping: scores s -> CAP tanh(s / CAP) (default 0: off)");
  options.add_double("--scale", &scale, "softmax scale (default 0: 1/sqrt(D))");
  options.add_string("--dtype", &dtype,
                     std::string("element type of Q, K, V, O and the gradients: fp32, bf16 or "
                                 "fp16; statistics and partial sums stay fp32 (default: ") +
                         (dtype_default      ? dtype_default
                          : dtype_by_machine ? "bf16 on a GPU machine, fp32 on a CPU one"
                                             : "bf16 with --device cuda, else fp32") +
                         "; docs/usage.md, \"Defaults\")");
}

Problem ProblemOptions::problem(DType default_dtype) const {
  A2D_REQUIRE(scale >= 0, "--scale must be positive (or 0 for 1/sqrt(D)), got ", scale);
  Problem p;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads == 0 ? heads : kv_heads;
  p.seq = seq;
  p.head_dim = head_dim;
  p.mask = mask_from_options(causal, window, window_size, doc_lens, mask_ranges, seq);
  p.scale = static_cast<float>(scale);
  A2D_REQUIRE(softcap >= 0, "--softcap must be positive (or 0 for none), got ", softcap);
  p.softcap = static_cast<float>(softcap);
  p.sinks = sinks || !sink_file.empty();
  p.dtype = dtype.empty() ? default_dtype : parse_dtype(dtype);
  p.validate();
  return p;
}

std::string ProblemOptions::command_line(DType chosen) const {
  std::string out = "--batch " + std::to_string(batch) + " --seq " + std::to_string(seq) +
                    " --heads " + std::to_string(heads) + " --kv-heads " +
                    std::to_string(kv_heads == 0 ? heads : kv_heads) + " --head-dim " +
                    std::to_string(head_dim);
  out += mask_options_text(causal, window, window_size, doc_lens, mask_ranges);
  if (!sink_file.empty()) {
    out += " --sink " + sink_file;
  } else if (sinks) {
    out += " --sinks";
  }
  if (softcap > 0) out += " --softcap " + format_double(softcap, 9);
  if (scale > 0) out += " --scale " + format_double(scale, 9);
  return out + " --dtype " + dtype_name(chosen);
}

std::vector<float> ProblemOptions::sink_values(Communicator& world, int64_t head_count,
                                               uint64_t seed) const {
  if (sink_file.empty()) return sinks ? generate_sinks(seed, head_count) : std::vector<float>{};
  std::vector<float> values(static_cast<size_t>(head_count));
  collective_check(world, [&] {
    if (world.rank() != 0) return;
    const npy::Array array = npy::read(sink_file);
    npy::require_shape(array, {head_count}, "--sink");
    values = array.to_float();
  });
  world.broadcast(values.data(), head_count * static_cast<int64_t>(sizeof(float)), 0);
  return values;
}

void DeviceOptions::declare(Options& options) {
  options.add_string("--device", &device,
                     "the backend: cpu, cuda (an NVIDIA GPU; bf16/fp16, head_dim 64/80/96/128),\n"
                     "fenced: the CPU's kernels on memory only the backend may touch, staged\n"
                     "through host memory (a test of the engine), or fenced-cuda: fenced,\n"
                     "refusing every kernel call the CUDA backend would refuse. Default: cuda\n"
                     "for bf16/fp16 when this build has it and a GPU is visible, else cpu");
}

void DeviceOptions::declare_comm(Options& options) {
  options.add_string("--comm", &comm,
                     "what carries the algorithms' messages: mpi (host memory; a GPU's buffers\n"
                     "staged through pinned host buffers, so several ranks may share a GPU),\n"
                     "nccl (GPU memory; --device cuda, one GPU per rank under NCCL < 2.30) or\n"
                     "gloo (Gloo's TCP transport on host memory, staged as for mpi: one mesh of\n"
                     "connections, set up over MPI; as torchrun jobs run; needs a build with\n"
                     "libgloo-dev). Default: nccl with --device cuda, else mpi");
}

DType DeviceOptions::default_dtype() const {
  return a2d::default_dtype(device);
}

bool memory_on_host(const std::string& device) {
  const BackendEntry* entry = find_backend(device);
  return !entry || entry->capabilities.host_memory;
}

CommKind DeviceOptions::comm_kind(const Backend& backend) const {
  return comm.empty() ? default_comm_kind(backend) : parse_comm_kind(comm);
}

std::string DeviceOptions::name(DType dtype) const {
  return device.empty() ? default_device(dtype) : device;
}

std::unique_ptr<Backend> DeviceOptions::backend(DType dtype) const {
  return make_backend(name(dtype));
}

void MachineOptions::declare(Options& options, bool presets, bool memory, bool per_node) {
  if (presets) {
    options.add_string("--machine", &name,
                       "the machine the cost model predicts for: a100-hdr, h100-ndr (GPU "
                       "presets) or local (this machine's calibration, a2d calibrate) (default: "
                       "local where calibrated for the job's rank count, else " +
                           std::string(kDefaultMachine) + ")");
  }
  options.add_string("--calibration", &calibration,
                     "the calibration file of this machine (default: $A2D_CALIBRATION, else "
                     "./a2d-calibration.txt)");
  options.add_string("--machine-file", &file,
                     "a machine described in a file (links, ranks per node, memory, kernel "
                     "rates; docs/cost-model.md, \"Machine files\"; scripts/cluster/cluster.sh "
                     "writes one): the whole machine" +
                         std::string(presets ? ", instead of --machine" : "") +
                         (per_node ? ", and its ranks_per_node instead of --gpus-per-node" : ""));
  if (memory) {
    options.add_string("--max-memory", &max_memory,
                       "plans needing more memory per rank are excluded: a size such as 60GiB "
                       "or 500MiB, or none (default: the machine's memory per rank)");
  }
}

MachineChoice MachineOptions::choice() const {
  MachineChoice c;
  c.name = name;
  c.calibration_file = calibration.empty() ? default_calibration_file() : calibration;
  c.machine_file = file;
  c.max_memory = max_memory.empty() ? -1 : parse_size("--max-memory", max_memory);
  A2D_REQUIRE(file.empty() || name.empty(), "--machine ", name, " and --machine-file ", file,
              " contradict each other: the file describes the whole machine; give one of them");
  return c;
}

int64_t parse_size(const std::string& option, const std::string& text) {
  if (text == "none") return 0;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  std::string unit = end ? std::string(end) : std::string();
  while (!unit.empty() && unit.front() == ' ')
    unit.erase(0, 1);
  double scale = -1;
  const char* const units[][2] = {
      {"", "B"}, {"K", "KiB"}, {"M", "MiB"}, {"G", "GiB"}, {"T", "TiB"}};
  for (int i = 0; i < 5; ++i) {
    if (unit == units[i][0] || unit == units[i][1]) scale = std::ldexp(1.0, 10 * i);
  }
  A2D_REQUIRE(!text.empty() && end != text.c_str() && errno == 0 && std::isfinite(value) &&
                  value >= 0 && scale > 0,
              option, " expects a size such as 80GiB, 500MiB or 4096 (bytes), or none; got '", text,
              "'");
  // 0 bytes would exclude every plan; "none" is the way to lift the cap: a 0 is refused rather
  // than read as either.
  A2D_REQUIRE(value * scale >= 1, option, " of ", text,
              value == 0 ? " would exclude every plan: give a size, or none for no cap"
                         : " is less than a byte");
  return static_cast<int64_t>(value * scale);
}

void PlanOptions::declare(Options& options) {
  // The choices from the table of algorithms (src/table/), not a list of our own.
  options.add_string("--algo", &algo,
                     algorithm_list(", ", " or ") + " (default: the fastest by the cost model)");
  options.add_string("--grid", &grid,
                     "process grid RxC of ATTENTION2D, or of each heads group of the hybrid\n"
                     "(default: the fastest by the cost model)");
  options.add_int("--heads-parallel", &heads_parallel,
                  "hybrid: U, the ranks of each heads all-to-all, with U x R x C = P (default:\n"
                  "P / (R C) with --grid, else the fastest by the cost model)");
  machine.declare(options, true, false, false);
  options.add_string(
      "--layout", &layout,
      "token layout: cyclic, striped, contiguous or zigzag (default: the algorithm's)");
  options.add_int("--stripe", &stripe, "stripe width of the striped layout");
  options.add_flag("--no-kv-transpose", &no_kv_transpose,
                   "ATTENTION2D: gather K/V where they are instead of the paper's transpose");
  options.add_int("--threads", &threads, "kernel threads per rank");
}

void ShardOptions::declare(Options& options, bool with_backward) {
  options.add_string("--shards", &kind,
                     "the caller's layout of the sequence: contiguous, zigzag, cyclic or striped\n"
                     "(default: the plan's own). The engine exchanges the shards into the plan's\n"
                     "layout and back, one all-to-all each way, charged by the cost model");
  options.add_string("--shard-counts", &counts,
                     "an uneven contiguous cut: tokens of every rank, e.g. 5,0,7 (implies\n"
                     "--shards contiguous; zeros allowed; they sum to --seq)");
  options.add_int("--shard-stripe", &stripe, "stripe width of --shards striped");
  if (with_backward) {
    options.add_string("--shards-backward", &backward,
                       "what the backward moves with --shards: saved (the Python layer keeps\n"
                       "the forward's exchanged Q, K, V, O, LSE: dO in, dQ, dK, dV out) or\n"
                       "stateless (the C++ make_attention: Q, K, V, O, dO, LSE in)");
  }
}

std::optional<TokenLayout> ShardOptions::layout(int64_t seq, int ranks) const {
  if (!given()) {
    A2D_REQUIRE(stripe == 1, "--shard-stripe applies to --shards striped");
    return std::nullopt;
  }
  const LayoutKind shard_kind = kind.empty() ? LayoutKind::contiguous : [&] {
    try {
      return parse_layout(kind);
    } catch (const Error& e) {
      A2D_FAIL("--shards: ", e.message());
    }
  }();
  A2D_REQUIRE(stripe >= 1, "--shard-stripe must be at least 1, got ", stripe);
  A2D_REQUIRE(stripe == 1 || shard_kind == LayoutKind::striped,
              "--shard-stripe applies to --shards striped, not ", layout_name(shard_kind));
  if (counts.empty()) return TokenLayout(shard_kind, seq, ranks, stripe);
  A2D_REQUIRE(shard_kind == LayoutKind::contiguous,
              "--shard-counts cuts the sequence into contiguous blocks; it cannot be combined with "
              "--shards ",
              kind);
  std::vector<int64_t> values;
  int64_t total = 0;
  for (size_t at = 0; at <= counts.size();) {
    const size_t comma = std::min(counts.find(',', at), counts.size());
    const std::string item = counts.substr(at, comma - at);
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    A2D_REQUIRE(!item.empty() && end && *end == '\0' && errno == 0 && value >= 0 &&
                    value <= (int64_t{1} << 50),
                "--shard-counts: '", item, "' is not a token count (an integer >= 0)");
    values.push_back(value);
    total += value;
    at = comma + 1;
  }
  A2D_REQUIRE(static_cast<int64_t>(values.size()) == ranks, "--shard-counts gives ", values.size(),
              " counts for ", ranks, " ranks; give one count per rank");
  A2D_REQUIRE(total == seq, "--shard-counts sum to ", total, " tokens, but the sequence has ", seq);
  return TokenLayout::contiguous_counts(values);
}

std::optional<UserShards> ShardOptions::user_shards(int64_t seq, int ranks) const {
  const std::optional<TokenLayout> shards = layout(seq, ranks);
  if (!shards) return std::nullopt;
  RelayoutBackward variant = RelayoutBackward::saved;
  try {
    variant = parse_relayout_backward(backward);
  } catch (const Error& e) {
    A2D_FAIL("--shards-backward: ", e.message());
  }
  return UserShards{*shards, variant};
}

PlanRequest PlanOptions::request() const {
  PlanRequest r;
  r.algo = algo;
  r.grid = grid;
  r.layout = layout;
  r.stripe = stripe;
  r.threads = threads;
  r.kv_transpose = !no_kv_transpose;
  r.heads_parallel = heads_parallel;
  r.machine = machine.choice();  // (the model may choose where the options leave it open)
  return r;
}

bool PlanOptions::chosen_by_planner() const {
  PlanRequest r;  // the algorithm and the grid decide it, not the machine
  r.algo = algo;
  r.grid = grid;
  return r.chosen_by_planner();
}

Plan PlanOptions::plan(const Problem& problem, int ranks, std::string* chosen,
                       const UserShards* shards) const {
  return resolve_plan(request(), problem, ranks, chosen, shards);
}

void add_plan_fields(JsonLine& line, const Plan& plan) {
  line.add("algo", algorithm_name(plan.algorithm))
      .add("grid", plan.grid.describe())
      .add("layout", layout_name(plan.layout))
      .add("kv_transpose", plan.kv_transpose)
      .add("heads_parallel", plan.heads_parallel);
}

void add_problem_fields(JsonLine& line, const Problem& problem) {
  line.add("batch", problem.batch)
      .add("seq", problem.seq)
      .add("heads", problem.heads)
      .add("kv_heads", problem.kv_heads)
      .add("head_dim", problem.head_dim)
      .add("causal", problem.mask.is_causal())
      .add("documents", problem.mask.documents())
      .add("window", problem.mask.window)
      .add("mask", problem.mask.describe());
}

}  // namespace a2d::cli
