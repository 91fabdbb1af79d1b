// a2d kernel: runs the local attention kernel on seeded inputs, times it, measures the machine's
// FMA peak in the same run, and optionally checks every output against the fp64 reference. With
// --dtype bf16 or fp16 the inputs are rounded to the dtype and stored in it, O is written in it,
// and the reference runs on the rounded values.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "attention2d/backend.hpp"
#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/peak.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/tools/data.hpp"
#include "attention2d/tools/progress.hpp"
#include "attention2d/watchdog.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "commands.hpp"
#include "memory_needs.hpp"

namespace a2d::commands {
namespace {

struct KernelOptions {
  int64_t seq = 1024;
  int64_t kv_seq = 0;  // 0: same as seq
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t head_dim = 64;
  int64_t batch = 1;
  int64_t window = 0;
  int64_t threads = 1;
  int64_t seed = 42;
  int64_t shuffle = 0;  // 0: positions 0, 1, 2, ...; else the seed of shuffled positions
  int64_t warmup = 1;
  int64_t repeats = 5;
  int64_t parts = 1;   // > 1: the keys in this many parts, through the partial/merge operations
  double scale = 0.0;  // 0: 1/sqrt(head_dim)
  bool causal = false;
  std::string window_size;  // --window-size LEFT,RIGHT; "" = none
  std::string doc_lens;     // "" = one document
  std::string mask_ranges;  // --mask-ranges; "" = none
  bool sinks = false;
  double softcap = 0.0;
  bool backward = false;
  bool check = false;
  bool json = false;
  bool huge_pages = false;
  bool no_memory_check = false;
  bool quiet = false;
  std::string path;    // empty: A2D_KERNEL_PATH, else auto
  std::string device;  // empty: default_device(dtype)
  std::string dtype;   // "": bf16 with --device cuda or fenced-cuda, else fp32
};

// Memory of the command's tensors. With --huge-pages every tensor is a 2 MiB-aligned block
// advised as transparent huge pages (Linux madvise), so that an experiment can show what the
// TLB misses of rows that lie one page apart cost the kernel (docs/performance.md).
bool g_huge_pages = false;

template <typename T>
struct TensorAllocator {
  using value_type = T;
  TensorAllocator() = default;
  template <typename U>
  TensorAllocator(const TensorAllocator<U>&) {}
  T* allocate(std::size_t count) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t bytes = (count * sizeof(T) + kHuge - 1) / kHuge * kHuge;
    void* memory = g_huge_pages ? std::aligned_alloc(kHuge, bytes) : std::malloc(count * sizeof(T));
    if (!memory) throw std::bad_alloc();
#ifdef __linux__
    if (g_huge_pages) madvise(memory, bytes, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(memory);
  }
  void deallocate(T* memory, std::size_t) {
    std::free(memory);
  }
  template <typename U>
  bool operator==(const TensorAllocator<U>&) const {
    return true;
  }
};
using Tensor = std::vector<float, TensorAllocator<float>>;
using Tensor16 = std::vector<uint16_t, TensorAllocator<uint16_t>>;  // bf16 or fp16 elements

Tensor tensor(const std::vector<float>& values) {
  return {values.begin(), values.end()};
}

// A tensor of `dtype`: fp32 values in `wide`; for bf16 and fp16 the stored elements in `stored`
// and, in `wide`, the same values widened (what the fp64 reference reads).
struct TypedTensor {
  DType dtype = DType::f32;
  Tensor wide;
  Tensor16 stored;

  // Generated values rounded to `dtype`.
  TypedTensor(DType dtype_, const std::vector<float>& values)
      : dtype(dtype_), wide(tensor(values)) {
    if (dtype == DType::f32) return;
    stored.resize(wide.size());
    from_float(dtype, wide.data(), stored.data(), static_cast<int64_t>(wide.size()));
    to_float(dtype, stored.data(), wide.data(), static_cast<int64_t>(wide.size()));
  }
  // An output of `count` elements.
  TypedTensor(DType dtype_, size_t count) : dtype(dtype_) {
    if (dtype == DType::f32) {
      wide.resize(count);
    } else {
      stored.resize(count);
    }
  }
  size_t size() const { return dtype == DType::f32 ? wide.size() : stored.size(); }
  void* data() {
    return dtype == DType::f32 ? static_cast<void*>(wide.data())
                               : static_cast<void*>(stored.data());
  }
  const void* data() const {
    return dtype == DType::f32 ? static_cast<const void*>(wide.data())
                               : static_cast<const void*>(stored.data());
  }
  // Dense [batch, tokens, heads, dim] views.
  InTokens in(int64_t tokens, int64_t heads, int64_t dim) const {
    return {data(), dtype, tokens * heads * dim, heads * dim, dim};
  }
  OutTokens out(int64_t tokens, int64_t heads, int64_t dim) {
    return {data(), dtype, tokens * heads * dim, heads * dim, dim};
  }
  // The values as fp32 (an output's, widened).
  std::vector<float> floats() const {
    std::vector<float> x(size());
    to_float(dtype, data(), x.data(), static_cast<int64_t>(x.size()));
    return x;
  }
};

// Resident memory of this process from /proc/self/status (Linux). The peak (VmHWM) can be reset
// to the current size by writing 5 to /proc/self/clear_refs, which lets the command report how
// much memory one kernel call added on top of its inputs and outputs.
class RssProbe {
 public:
  // Resets the peak; false where /proc does not allow it (then no growth is reported).
  bool start() {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    started_ = static_cast<bool>(clear) && read_kib("VmRSS:").has_value();
    if (started_) before_kib_ = *read_kib("VmRSS:");
    return started_;
  }
  // Peak minus the size at start(), in bytes.
  std::optional<int64_t> growth_bytes() const {
    if (!started_) return std::nullopt;
    const std::optional<int64_t> peak = read_kib("VmHWM:");
    if (!peak) return std::nullopt;
    return (*peak - before_kib_) * 1024;
  }

 private:
  static std::optional<int64_t> read_kib(const std::string& key) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind(key, 0) != 0) continue;
      std::istringstream fields(line.substr(key.size()));
      int64_t kib = 0;
      if (fields >> kib) return kib;
    }
    return std::nullopt;
  }
  bool started_ = false;
  int64_t before_kib_ = 0;
};

std::vector<double> widen(const Tensor& x) {
  return {x.begin(), x.end()};
}

// Times `body` (warm-up runs, then the median of the timed ones). `rss` measures the growth of
// the peak resident set over the first call only: the memory one call needs. (Later calls can
// only look larger, by what the allocator keeps from earlier calls without returning it.)
// `cpu_ms` receives the same summary of the process's CPU time per run (all threads together).
template <typename F>
Summary time_repeats(const KernelOptions& o, std::optional<int64_t>* rss_growth, Summary* cpu_ms,
                     const std::function<void(int64_t)>& before_each, F&& body) {
  RssProbe probe;
  probe.start();
  std::vector<double> ms, cpu;
  for (int64_t i = 0; i < o.warmup + o.repeats; ++i) {
    before_each(i);
    const double start = seconds_now();
    const double cpu_start = cpu_seconds_now();
    body();
    if (i >= o.warmup) {
      ms.push_back(1e3 * (seconds_now() - start));
      cpu.push_back(1e3 * (cpu_seconds_now() - cpu_start));
    }
    if (i == 0) *rss_growth = probe.growth_bytes();
  }
  *cpu_ms = summarize(cpu);
  return summarize(ms);
}

// Rows of the fp64 reference computed so far (its progress callback), for the progress lines.
std::atomic<int64_t> g_reference_rows{0};
void count_reference_row() {
  g_reference_rows.fetch_add(1, std::memory_order_relaxed);
}

// What the command allocates for `r` (its sequence and dtype; one process). Host memory only:
// with --device cuda the backend's copies are the GPU's.
MemoryNeed kernel_memory(const KernelOptions& o, const MemoryRequest& r, bool backend_copies,
                         bool on_host_device, bool in_parts) {
  const int64_t seq = r.seq, kv_seq = o.kv_seq == o.seq ? r.seq : o.kv_seq;
  const int64_t heads = o.heads, kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  const int64_t q = o.batch * seq * heads * o.head_dim;
  const int64_t kv = o.batch * kv_seq * kv_heads * o.head_dim;
  const int64_t lse = o.batch * heads * seq;
  const int64_t e = dtype_bytes(r.dtype);
  // Inputs keep fp32 values (what the reference reads) and, in 16 bits, the stored elements.
  const int64_t typed_in = 4 + (r.dtype == DType::f32 ? 0 : e);
  int64_t arrays = typed_in * (q + 2 * kv) + e * q + 4 * lse;
  if (o.backward) arrays += typed_in * q + 4 * (q + 2 * kv);
  AttentionShape shape{o.batch, heads, kv_heads, seq, kv_seq, o.head_dim};
  MemoryNeed need;
  need.every_rank.push_back({"inputs and outputs", arrays});
  need.every_rank.push_back({"the generator's scratch", 4 * std::max(q, kv)});
  int64_t workspace = forward_workspace_bytes(shape, static_cast<int>(o.threads));
  if (o.backward) {
    workspace =
        std::max(workspace, backward_workspace_bytes(shape, static_cast<int>(o.threads), true));
  }
  need.every_rank.push_back({"the kernel's workspace", workspace});
  if (o.shuffle != 0) need.every_rank.push_back({"positions (--shuffle)", 8 * (seq + kv_seq)});
  if (backend_copies && on_host_device) {
    int64_t copies = e * (2 * q + 2 * kv) + 4 * lse;
    if (in_parts) copies += 4 * (2 * q * (o.head_dim + 2) / o.head_dim + q + 2 * lse) + e * q;
    if (o.backward) copies += e * q + 4 * (q + 2 * kv + lse) + (in_parts ? 8 * lse + 2 * e * q : 0);
    need.every_rank.push_back({"the backend's copies (--device, --parts)", copies});
  }
  if (o.check) {
    int64_t reference = 8 * (q + 2 * kv + q + lse) + 4 * q;
    if (o.backward) reference += 8 * (q + q + 2 * kv);
    need.every_rank.push_back({"the fp64 reference (--check)", reference});
  }
  return need;
}

}  // namespace

int kernel(int argc, char** argv, int first) {
  KernelOptions o;
  cli::Options options(
      "a2d kernel [options]",
      "Runs the local (single-process) attention kernel on generated inputs and reports its time\n"
      "and GFLOP/s, counting only unmasked work: 4*Nq*Nk*D per head forward, 2.5x that backward.\n"
      "It also measures the FP32 FMA peak of --threads cores (12 independent FMA chains per\n"
      "thread, best of 5, before and after the timings) and reports the kernel's share of it\n"
      "(GFLOP/s / peak of all threads), and the memory one kernel call\n"
      "adds (its workspace, and the growth of the process's peak resident set where Linux "
      "allows).");
  options.add_int("--seq", &o.seq, "query sequence length N");
  options.add_int("--kv-seq", &o.kv_seq, "key/value sequence length (default 0: --seq)");
  options.add_int("--heads", &o.heads, "query heads H");
  options.add_int("--kv-heads", &o.kv_heads,
                  "key/value heads; H must be a multiple (default 0: as many as --heads)");
  options.add_int("--head-dim", &o.head_dim, "head dimension D");
  options.add_int("--batch", &o.batch, "batch size B");
  options.add_flag("--causal", &o.causal, "causal mask (key position <= query position)");
  options.add_int("--window", &o.window,
                  "causal with a window of W tokens (implies --causal; default 0: none)");
  options.add_string("--window-size", &o.window_size, cli::kWindowSizeHelp);
  options.add_string("--doc-lens", &o.doc_lens, cli::kDocLensHelp);
  options.add_string("--mask-ranges", &o.mask_ranges, cli::kMaskRangesHelp);
  options.add_flag(
      "--sinks", &o.sinks,
      "attention sinks (values generated from --seed), added to O and LSE after the kernel\n"
      "(timed with it); the backward also computes dsink");
  options.add_double("--softcap", &o.softcap,
                     "logit softcapping CAP tanh(s / CAP) (default 0: off)");
  options.add_double("--scale", &o.scale, "softmax scale (default 0: 1/sqrt(D))");
  options.add_flag("--backward", &o.backward, "also time the backward pass");
  options.add_int("--threads", &o.threads,
                  "threads of the kernel (and of the FMA peak measurement)");
  options.add_string("--path", &o.path,
                     "kernel implementation: auto (fastest this CPU supports), portable, avx2 or\n"
                     "avx512 (default: the environment variable A2D_KERNEL_PATH, else auto)");
  options.add_string(
      "--device", &o.device,
      "where the kernel runs: cpu (the CPU kernels called directly), cuda (the CUDA\n"
      "backend: bf16/fp16, head_dim 64/80/96/128; no FMA peak then) or fenced\n"
      "(the CPU kernels through the backend interface). Default: cuda for bf16/fp16\n"
      "when this build has it and a GPU is visible, else cpu");
  options.add_string("--dtype", &o.dtype,
                     "element type of Q, K, V, dO and O: fp32, bf16 or fp16 (inputs generated\n"
                     "in fp32, rounded and stored in it; LSE, dQ, dK, dV stay fp32) (default: "
                     "bf16 on GPUs, fp32 on CPUs; docs/usage.md, \"Defaults\")");
  options.add_int("--seed", &o.seed, "seed of the generated inputs");
  options.add_int("--shuffle", &o.shuffle,
                  "global positions of the query and key rows: a random permutation from this\n"
                  "seed (the order of a gathered or striped layout; default 0: rows in order)");
  options.add_int("--warmup", &o.warmup, "untimed runs before timing");
  options.add_int("--repeats", &o.repeats, "timed runs; the median is reported");
  options.add_int(
      "--parts", &o.parts,
      "split the keys into K contiguous parts (K >= 2; through the backend, also for cpu) and\n"
      "compute as the distributed algorithms do: forward = partial state of part 0, then\n"
      "partial with accumulate for each further part, then finalize (timed); once more with\n"
      "each part's partial state in flat [max, sum, acc] records merged (merge_partials) and\n"
      "finalized (checked as O(merge), LSE(merge)); backward = delta, then Q, dO, LSE and delta\n"
      "copied into records [lse, delta, q, dO] (misaligned 16-bit rows), then one call per part\n"
      "(the first overwriting dQ, the others accumulating). 1 = the plain kernels");
  options.add_flag("--check", &o.check,
                   "compare every output with the fp64 reference; exit 1 over the bound");
  options.add_flag("--json", &o.json, "one JSON object per line instead of the table");
  options.add_flag("--huge-pages", &o.huge_pages,
                   "put the tensors on transparent huge pages (Linux), for TLB experiments");
  options.add_flag("--no-memory-check", &o.no_memory_check, kNoMemoryCheckHelp);
  options.add_flag("--quiet", &o.quiet, kQuietHelp);
  if (!options.parse(argc, argv, first)) return 0;
  Progress progress("a2d kernel", !o.quiet);
  // The phase a std::bad_alloc names (main.cpp).
  Watchdog::note_phase("setup");

  if (o.kv_seq == 0) o.kv_seq = o.seq;
  if (o.kv_heads == 0) o.kv_heads = o.heads;
  A2D_REQUIRE(o.seq >= 1 && o.kv_seq >= 1, "--seq and --kv-seq must be at least 1");
  A2D_REQUIRE(o.warmup >= 0 && o.repeats >= 1, "--warmup must be >= 0 and --repeats >= 1");
  A2D_REQUIRE(o.threads >= 1, "--threads must be at least 1, got ", o.threads);
  A2D_REQUIRE(o.parts >= 1 && o.parts <= o.kv_seq, "--parts must be between 1 and the ", o.kv_seq,
              " keys, got ", o.parts);
  const bool in_parts = o.parts > 1;
  const DType dtype =
      !o.dtype.empty()
          ? parse_dtype(o.dtype)
          : (o.device == "cuda" || o.device == "fenced-cuda" ? DType::bf16 : DType::f32);
  if (!o.path.empty()) set_kernel_path(parse_kernel_path(o.path));
  const KernelPath path = kernel_path();
  const std::string device = o.device.empty() ? default_device(dtype) : o.device;
  // Another device than cpu runs the kernels through its backend (buffers uploaded once, each
  // timed call ended by synchronize()).
  // --parts goes through the backend's partial and merge operations, so on cpu too.
  std::unique_ptr<Backend> backend = device == "cpu" && !in_parts ? nullptr : make_backend(device);
  const bool on_cpu = device != "cuda";
  // The peak is measured before and after the kernel timings and the higher value is kept: on a
  // machine shared with other work, a peak measured while something else ran would flatter the
  // kernel's share of it. (Not for a GPU: it is the CPU's FMA peak.)
  FmaPeak peak = on_cpu ? measure_fma_peak(static_cast<int>(o.threads)) : FmaPeak{};

  AttentionShape shape{o.batch, o.heads, o.kv_heads, o.seq, o.kv_seq, o.head_dim};
  shape.validate();
  A2D_REQUIRE((o.doc_lens.empty() && o.mask_ranges.empty()) || o.kv_seq == o.seq,
              o.doc_lens.empty() ? "--mask-ranges" : "--doc-lens",
              " needs --kv-seq equal to --seq (self-attention)");
  const Mask mask =
      cli::mask_from_options(o.causal, o.window, o.window_size, o.doc_lens, o.mask_ranges, o.seq);
  const float scale = o.scale > 0 ? static_cast<float>(o.scale) : default_scale(o.head_dim);
  A2D_REQUIRE(o.scale >= 0 && std::isfinite(o.scale), "--scale must be positive, got ", o.scale);
  A2D_REQUIRE(o.softcap >= 0, "--softcap must be positive (or 0 for none), got ", o.softcap);

  // Before anything large is allocated: what the command needs against what this host has
  // (attention2d/memory_check.hpp).
  {
    MemoryCheck check;
    check.request = {1, o.seq, dtype};
    check.ranks_may_change = false;
    check.dtype_may_change = device != "cuda";
    check.enabled = !o.no_memory_check;
    check.override_hint = "--no-memory-check or A2D_NO_MEMORY_CHECK=1";
    const bool copies = backend != nullptr;
    check.model = [&, copies](const MemoryRequest& r) {
      return kernel_memory(o, r, copies, on_cpu, in_parts);
    };
    check_memory(check);
  }

  // The prediction (on the CPU: this machine's FMA peak times the kernels' efficiency) and what
  // the progress lines count: the score entries the kernels compute, the reference's rows.
  const double pairs_per_head =
      static_cast<double>(count_visible_pairs(mask, nullptr, o.seq, nullptr, o.kv_seq));
  const double call_entries = pairs_per_head * static_cast<double>(o.heads * o.batch);
  const double call_flops = 4.0 * call_entries * static_cast<double>(o.head_dim);
  const int64_t calls = o.warmup + o.repeats;
  double forward_s = 0, backward_s = 0, check_s = 0;
  if (on_cpu) {
    const KernelEfficiency efficiency = kernel_efficiency(peak);
    forward_s = call_flops / (1e9 * peak.gflops * efficiency.forward);
    backward_s = o.backward ? 2.5 * call_flops / (1e9 * peak.gflops * efficiency.backward) : 0;
    // The fp64 reference: plain loops, about kReferenceFlopsPerThread on every thread.
    if (o.check) {
      check_s = (o.backward ? 4.5 : 1.0) * call_flops /
                (kReferenceFlopsPerThread * static_cast<double>(o.threads));
    }
    const double total = static_cast<double>(calls) * (forward_s + backward_s) +
                         (in_parts ? forward_s : 0) + check_s;
    std::string what = std::to_string(calls) + (calls == 1 ? " forward call" : " forward calls");
    if (o.backward) what += " and as many backward calls";
    if (o.check) what += ", then the fp64 reference (--check)";
    char source[300];
    std::snprintf(source, sizeof source,
                  "an estimate: this machine's FMA peak, %.0f GFLOP/s on %d thread%s (%s), times "
                  "the kernels' efficiency, %.2f forward and %.2f backward (docs/performance.md)",
                  peak.gflops, peak.threads, peak.threads == 1 ? "" : "s", peak.isa.c_str(),
                  efficiency.forward, efficiency.backward);
    progress.predict(total, what, source);
  }
  std::atomic<int64_t> work{0};  // the kernels' work counter (ForwardArgs::work_done)
  const auto kernel_stage = [&](const char* name, int64_t i, double seconds, double entries) {
    const int64_t start = backend ? backend->kernel_work() : work.load();
    progress.stage(name, i + 1, calls, seconds, [&, start, entries] {
      const int64_t now = backend ? backend->kernel_work() : work.load();
      return static_cast<double>(now - start) / std::max(1.0, entries);
    });
    Watchdog::note_phase(name);
  };
  progress.stage("generating the inputs", 0, 0, 0);
  Watchdog::note_phase("generating the inputs");

  const uint64_t seed = static_cast<uint64_t>(o.seed);
  const GlobalTokens q_global{o.batch, o.seq, o.heads, o.head_dim};
  const GlobalTokens kv_global{o.batch, o.kv_seq, o.kv_heads, o.head_dim};
  g_huge_pages = o.huge_pages;
  // The inputs' generation (all cores, data.hpp) is timed for the GPU runs' time budget.
  const double generate_start = seconds_now();
  const TypedTensor q(dtype, generate_tokens(seed, TensorTag::q, q_global));
  const TypedTensor k(dtype, generate_tokens(seed, TensorTag::k, kv_global));
  const TypedTensor v(dtype, generate_tokens(seed, TensorTag::v, kv_global));
  double generate_seconds = seconds_now() - generate_start;
  TypedTensor out(dtype, q.size());
  Tensor lse(static_cast<size_t>(o.batch * o.heads * o.seq));

  ForwardArgs fwd;
  fwd.shape = shape;
  fwd.mask = mask;
  fwd.scale = scale;
  fwd.softcap = static_cast<float>(o.softcap);
  fwd.q = q.in(o.seq, o.heads, o.head_dim);
  fwd.k = k.in(o.kv_seq, o.kv_heads, o.head_dim);
  fwd.v = v.in(o.kv_seq, o.kv_heads, o.head_dim);
  fwd.threads = static_cast<int>(o.threads);
  fwd.work_done = &work;
  const OutTokens out_view = out.out(o.seq, o.heads, o.head_dim);
  const auto lse_view = dense_rows(lse.data(), o.heads, o.seq);

  // Shuffled positions: each query and key row's global position, a permutation (the mask
  // follows the positions, so the kernel must classify its tiles by their position bounds).
  std::vector<int64_t> q_positions, kv_positions;
  if (o.shuffle != 0) {
    std::mt19937_64 random(static_cast<uint64_t>(o.shuffle));
    q_positions.resize(static_cast<size_t>(o.seq));
    kv_positions.resize(static_cast<size_t>(o.kv_seq));
    std::iota(q_positions.begin(), q_positions.end(), int64_t{0});
    std::iota(kv_positions.begin(), kv_positions.end(), int64_t{0});
    std::shuffle(q_positions.begin(), q_positions.end(), random);
    std::shuffle(kv_positions.begin(), kv_positions.end(), random);
    fwd.q_positions = q_positions.data();
    fwd.kv_positions = kv_positions.data();
  }
  const double pairs = static_cast<double>(
      count_visible_pairs(mask, fwd.q_positions, o.seq, fwd.kv_positions, o.kv_seq));
  const double fwd_flops = 4.0 * pairs * static_cast<double>(o.head_dim * o.heads * o.batch);
  const int64_t fwd_workspace = forward_workspace_bytes(shape, fwd.threads);
  std::optional<int64_t> fwd_rss_growth;
  const std::vector<float> sinks = o.sinks ? generate_sinks(seed, o.heads) : std::vector<float>{};
  const RowsShape q_rows{o.batch, o.seq, o.heads, o.head_dim};
  // The backend path: the same tensors in the backend's buffers.
  const int64_t q_bytes = static_cast<int64_t>(q.size()) * dtype_bytes(dtype);
  const int64_t kv_bytes = static_cast<int64_t>(k.size()) * dtype_bytes(dtype);
  const int64_t lse_bytes = static_cast<int64_t>(lse.size() * sizeof(float));
  BufferPtr q_buf, k_buf, v_buf, out_buf, lse_buf, q_pos_buf, kv_pos_buf;
  ForwardCall call;
  TokenTensor out_tensor;
  RowTensor lse_tensor;
  if (backend) {
    q_buf = backend->allocate(q_bytes);
    k_buf = backend->allocate(kv_bytes);
    v_buf = backend->allocate(kv_bytes);
    out_buf = backend->allocate(q_bytes);
    lse_buf = backend->allocate(lse_bytes);
    backend->upload(q.data(), Place::in(*q_buf), q_bytes);
    backend->upload(k.data(), Place::in(*k_buf), kv_bytes);
    backend->upload(v.data(), Place::in(*v_buf), kv_bytes);
    call.shape = shape;
    call.mask = mask;
    call.scale = scale;
    call.softcap = fwd.softcap;
    call.q = dense_token_tensor(*q_buf, dtype, o.seq, o.heads, o.head_dim);
    call.k = dense_token_tensor(*k_buf, dtype, o.kv_seq, o.kv_heads, o.head_dim);
    call.v = dense_token_tensor(*v_buf, dtype, o.kv_seq, o.kv_heads, o.head_dim);
    call.threads = fwd.threads;
    if (o.shuffle != 0) {
      q_pos_buf = upload_indices(*backend, q_positions);
      kv_pos_buf = upload_indices(*backend, kv_positions);
      call.q_positions = Place::in(*q_pos_buf);
      call.kv_positions = Place::in(*kv_pos_buf);
    } else if (in_parts) {
      // Each part's keys carry their global positions (a part's own 0, 1, 2, ... would be wrong).
      std::vector<int64_t> in_order(static_cast<size_t>(o.kv_seq));
      std::iota(in_order.begin(), in_order.end(), int64_t{0});
      kv_pos_buf = upload_indices(*backend, in_order);
      call.kv_positions = Place::in(*kv_pos_buf);
    }
    out_tensor = dense_token_tensor(*out_buf, dtype, o.seq, o.heads, o.head_dim);
    lse_tensor = dense_row_tensor(*lse_buf, o.heads, o.seq);
  }
  // --parts: the keys [first, first + tokens) of each part, and a call on them alone.
  struct KeyPart {
    int64_t first = 0;
    int64_t tokens = 0;
  };
  std::vector<KeyPart> key_parts;
  for (int64_t p = 0; p < o.parts; ++p) {
    const int64_t first_key = p * o.kv_seq / o.parts;
    key_parts.push_back({first_key, (p + 1) * o.kv_seq / o.parts - first_key});
  }
  auto keys_of = [&](const KeyPart& part, TokenTensor t) {
    t.offset += part.first * t.token_stride * dtype_bytes(t.dtype);
    return t;
  };
  auto part_call = [&](const KeyPart& part) {
    ForwardCall c = call;
    c.shape.kv_tokens = part.tokens;
    c.k = keys_of(part, call.k);
    c.v = keys_of(part, call.v);
    c.kv_positions = call.kv_positions + part.first * static_cast<int64_t>(sizeof(int64_t));
    return c;
  };
  // The partial state: dense (accumulated across parts), and as the algorithms hold it, flat
  // fp32 records [row max, row sum, acc[D]] per (batch, token, head) (merged across parts).
  const int64_t record = o.head_dim + 2;
  const int64_t records = o.batch * o.seq * o.heads;
  BufferPtr acc_buf, max_buf, sum_buf, merged_buf, part_buf, out2_buf, lse2_buf;
  PartialTensor dense_state;
  auto record_state = [&](Buffer& buffer) {
    PartialTensor state;
    const int64_t token = o.heads * record;
    state.acc = {&buffer, 2 * static_cast<int64_t>(sizeof(float)), DType::f32, o.seq * token, token,
                 record};
    state.row_max = {&buffer, 0, o.seq * token, record, token};
    state.row_sum = state.row_max;
    state.row_sum.offset = static_cast<int64_t>(sizeof(float));
    return state;
  };
  if (in_parts) {
    const int64_t acc_bytes = static_cast<int64_t>(q.size() * sizeof(float));
    acc_buf = backend->allocate(acc_bytes);
    max_buf = backend->allocate(lse_bytes);
    sum_buf = backend->allocate(lse_bytes);
    dense_state = {dense_token_tensor(*acc_buf, DType::f32, o.seq, o.heads, o.head_dim),
                   dense_row_tensor(*max_buf, o.heads, o.seq),
                   dense_row_tensor(*sum_buf, o.heads, o.seq)};
    const int64_t record_bytes = records * record * static_cast<int64_t>(sizeof(float));
    merged_buf = backend->allocate(record_bytes);
    part_buf = backend->allocate(record_bytes);
    out2_buf = backend->allocate(q_bytes);
    lse2_buf = backend->allocate(lse_bytes);
  }
  Summary fwd_cpu_ms, bwd_cpu_ms;
  const Summary fwd_ms = time_repeats(
      o, &fwd_rss_growth, &fwd_cpu_ms,
      [&](int64_t i) { kernel_stage("forward", i, forward_s, call_entries); },
      [&] {
        if (in_parts) {
          for (size_t p = 0; p < key_parts.size(); ++p)
            backend->attention_forward_partial(part_call(key_parts[p]), dense_state, p > 0);
          backend->finalize(q_rows, dense_state, out_tensor, lse_tensor);
          if (o.sinks) backend->add_sinks(q_rows, sinks.data(), 0, out_tensor, lse_tensor);
          backend->synchronize();
          return;
        }
        if (backend) {
          backend->attention_forward(call, out_tensor, lse_tensor);
          if (o.sinks) backend->add_sinks(q_rows, sinks.data(), 0, out_tensor, lse_tensor);
          backend->synchronize();
          return;
        }
        attention_forward(fwd, out_view, lse_view);
        if (o.sinks) add_sinks(q_rows, sinks.data(), 0, out_view, lse_view);
      });
  if (backend) {
    backend->download(Place::in(*out_buf), out.data(), q_bytes);
    backend->download(Place::in(*lse_buf), lse.data(), lse_bytes);
  }
  // --parts, untimed: each part's partial state in records, merged into part 0's, finalized.
  TypedTensor out_merged(dtype, in_parts ? q.size() : 0);
  Tensor lse_merged(in_parts ? lse.size() : 0);
  if (in_parts) {
    progress.stage("forward through merged records (--parts)", 0, 0, forward_s);
    const PartialTensor merged = record_state(*merged_buf), single = record_state(*part_buf);
    for (size_t p = 0; p < key_parts.size(); ++p) {
      backend->attention_forward_partial(part_call(key_parts[p]), p == 0 ? merged : single, false);
      if (p > 0) {
        backend->merge_partials(Place::in(*merged_buf), Place::in(*part_buf), records, record);
      }
    }
    const TokenTensor out2 = dense_token_tensor(*out2_buf, dtype, o.seq, o.heads, o.head_dim);
    const RowTensor lse2 = dense_row_tensor(*lse2_buf, o.heads, o.seq);
    backend->finalize(q_rows, merged, out2, lse2);
    if (o.sinks) backend->add_sinks(q_rows, sinks.data(), 0, out2, lse2);
    backend->download(Place::in(*out2_buf), out_merged.data(), q_bytes);
    backend->download(Place::in(*lse2_buf), lse_merged.data(), lse_bytes);
  }

  std::optional<TypedTensor> d_out;
  Tensor dq, dk, dv;
  std::vector<float> dsink;
  Summary bwd_ms;
  int64_t bwd_workspace = 0;
  std::optional<int64_t> bwd_rss_growth;
  if (o.backward) {
    progress.stage("generating dO", 0, 0, 0);
    Watchdog::note_phase("generating dO");
    const double d_out_start = seconds_now();
    d_out.emplace(dtype, generate_tokens(seed, TensorTag::d_out, q_global));
    generate_seconds += seconds_now() - d_out_start;
    dq.resize(q.size());
    dk.resize(k.size());
    dv.resize(v.size());
    BackwardArgs bwd;
    bwd.shape = shape;
    bwd.mask = mask;
    bwd.scale = scale;
    bwd.softcap = fwd.softcap;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    // delta comes from O as the forward wrote it, in the dtype.
    bwd.out = out.in(o.seq, o.heads, o.head_dim);
    bwd.d_out = d_out->in(o.seq, o.heads, o.head_dim);
    bwd.lse = dense_rows(lse.data(), o.heads, o.seq);
    bwd.threads = static_cast<int>(o.threads);
    bwd.work_done = &work;
    bwd.q_positions = fwd.q_positions;
    bwd.kv_positions = fwd.kv_positions;
    bwd_workspace = backward_workspace_bytes(shape, bwd.threads, /*delta_from_out=*/true);
    BufferPtr do_buf, dq_buf, dk_buf, dv_buf, delta_buf;
    BackwardCall bcall;
    TokenTensor dq_t, dk_t, dv_t;
    const int64_t dq_bytes = static_cast<int64_t>(dq.size() * sizeof(float));
    const int64_t dkv_bytes = static_cast<int64_t>(dk.size() * sizeof(float));
    if (backend) {
      do_buf = backend->allocate(q_bytes);
      backend->upload(d_out->data(), Place::in(*do_buf), q_bytes);
      dq_buf = backend->allocate(dq_bytes);
      dk_buf = backend->allocate(dkv_bytes);
      dv_buf = backend->allocate(dkv_bytes);
      delta_buf = backend->allocate(lse_bytes);
      bcall.shape = shape;
      bcall.mask = mask;
      bcall.scale = scale;
      bcall.softcap = fwd.softcap;
      bcall.q = call.q;
      bcall.k = call.k;
      bcall.v = call.v;
      bcall.d_out = dense_token_tensor(*do_buf, dtype, o.seq, o.heads, o.head_dim);
      bcall.lse = lse_tensor;
      bcall.out = out_tensor;  // delta from O as the forward wrote it
      bcall.threads = bwd.threads;
      bcall.q_positions = call.q_positions;
      bcall.kv_positions = call.kv_positions;
      dq_t = dense_token_tensor(*dq_buf, DType::f32, o.seq, o.heads, o.head_dim);
      dk_t = dense_token_tensor(*dk_buf, DType::f32, o.kv_seq, o.kv_heads, o.head_dim);
      dv_t = dense_token_tensor(*dv_buf, DType::f32, o.kv_seq, o.kv_heads, o.head_dim);
    }
    // --parts: records [lse, delta, q[D], dO[D]] per (batch, token, head), as ATTENTION2D's
    // backward packs them: the fp32 fields first put the 16-bit rows 8 and 8 + 2D bytes in, not
    // on the 16 bytes cp.async reads (the CUDA backend copies such inputs to dense scratch).
    BufferPtr pack_buf;
    BackwardCall packed = bcall;
    const int64_t pack_record = 8 + 2 * o.head_dim * dtype_bytes(dtype);  // bytes
    if (in_parts) {
      pack_buf = backend->allocate(records * pack_record);
      const int64_t floats = pack_record / static_cast<int64_t>(sizeof(float));
      const int64_t elements = pack_record / dtype_bytes(dtype);
      const RowTensor lse_field{pack_buf.get(), 0, o.seq * o.heads * floats, floats,
                                o.heads * floats};
      RowTensor delta_field = lse_field;
      delta_field.offset = static_cast<int64_t>(sizeof(float));
      const TokenTensor q_field{pack_buf.get(),     8,       dtype, o.seq * o.heads * elements,
                                o.heads * elements, elements};
      TokenTensor do_field = q_field;
      do_field.offset += o.head_dim * dtype_bytes(dtype);
      packed.q = q_field;
      packed.d_out = do_field;
      packed.lse = lse_field;
      packed.delta = delta_field;
      packed.out = {};
    }
    const TokenBlock q_block{o.batch, o.seq, o.heads, o.head_dim};
    bwd_ms = time_repeats(
        o, &bwd_rss_growth, &bwd_cpu_ms,
        [&](int64_t i) { kernel_stage("backward", i, backward_s, call_entries); },
        [&] {
          if (in_parts) {
            backend->copy_tokens(bcall.q, packed.q, q_block);
            backend->copy_tokens(bcall.d_out, packed.d_out, q_block);
            backend->copy_rows(lse_tensor, packed.lse, o.batch, o.heads, o.seq);
            backend->delta(q_rows, out_tensor, packed.d_out, packed.delta);
            // The parts after the first add into their dK, dV rows: zero first.
            backend->fill_zero(Place::in(*dk_buf), dkv_bytes);
            backend->fill_zero(Place::in(*dv_buf), dkv_bytes);
            for (size_t p = 0; p < key_parts.size(); ++p) {
              const KeyPart& part = key_parts[p];
              BackwardCall c = packed;
              c.shape.kv_tokens = part.tokens;
              c.k = keys_of(part, bcall.k);
              c.v = keys_of(part, bcall.v);
              c.kv_positions =
                  bcall.kv_positions + part.first * static_cast<int64_t>(sizeof(int64_t));
              c.accumulate = p > 0;
              backend->attention_backward(c, dq_t, keys_of(part, dk_t), keys_of(part, dv_t));
            }
            if (o.sinks) {
              std::vector<double> sums(static_cast<size_t>(o.heads), 0.0);
              backend->add_sink_gradient(q_rows, sinks.data(), 0, lse_tensor, packed.delta,
                                         sums.data());
              dsink.assign(sums.begin(), sums.end());
            }
            backend->synchronize();
            return;
          }
          if (backend) {
            backend->attention_backward(bcall, dq_t, dk_t, dv_t);
            if (o.sinks) {
              const RowTensor delta_t = dense_row_tensor(*delta_buf, o.heads, o.seq);
              backend->delta(q_rows, out_tensor, bcall.d_out, delta_t);
              std::vector<double> sums(static_cast<size_t>(o.heads), 0.0);
              backend->add_sink_gradient(q_rows, sinks.data(), 0, lse_tensor, delta_t, sums.data());
              dsink.assign(sums.begin(), sums.end());
            }
            backend->synchronize();
            return;
          }
          attention_backward(bwd, dense_tokens(dq.data(), o.seq, o.heads, o.head_dim),
                             dense_tokens(dk.data(), o.kv_seq, o.kv_heads, o.head_dim),
                             dense_tokens(dv.data(), o.kv_seq, o.kv_heads, o.head_dim));
          if (o.sinks) {
            std::vector<float> delta(lse.size());
            const auto delta_view = dense_rows(delta.data(), o.heads, o.seq);
            compute_delta(q_rows, bwd.out, bwd.d_out, delta_view);
            std::vector<double> sums(static_cast<size_t>(o.heads), 0.0);
            add_sink_gradient(q_rows, sinks.data(), 0, bwd.lse, delta_view, sums.data());
            dsink.assign(sums.begin(), sums.end());
          }
        });
    if (backend) {
      backend->download(Place::in(*dq_buf), dq.data(), dq_bytes);
      backend->download(Place::in(*dk_buf), dk.data(), dkv_bytes);
      backend->download(Place::in(*dv_buf), dv.data(), dkv_bytes);
    }
  }

  if (on_cpu) {
    if (const FmaPeak again = measure_fma_peak(static_cast<int>(o.threads));
        again.gflops > peak.gflops) {
      peak = again;
    }
  }

  // Errors against the fp64 reference, on the same inputs (the rounded values, widened). Bounds
  // (check.hpp): fp32 outputs kFp32RelativeBound; a 16-bit O its dtype's rounding bound; dQ and
  // dK, whose delta comes from that O, the delta-gradient bound of the dtype.
  // On the GPU, the tensor-core kernels' bounds (check.hpp: P and dS rounded to the dtype too).
  const bool tensor_cores = device == "cuda";
  const double output_bound =
      dtype == DType::bf16  ? (tensor_cores ? kTensorCoreBf16OutputBound : kBf16OutputBound)
      : dtype == DType::f16 ? (tensor_cores ? kTensorCoreF16OutputBound : kF16OutputBound)
                            : kFp32RelativeBound;
  const double delta_gradient_bound =
      dtype == DType::bf16
          ? (tensor_cores ? kTensorCoreBf16DeltaGradientBound : kBf16DeltaGradientBound)
      : dtype == DType::f16
          ? (tensor_cores ? kTensorCoreF16DeltaGradientBound : kF16DeltaGradientBound)
          : kFp32RelativeBound;
  const double value_gradient_bound = !tensor_cores          ? kFp32RelativeBound
                                      : dtype == DType::bf16 ? kTensorCoreBf16ValueGradientBound
                                                             : kTensorCoreF16ValueGradientBound;
  struct Error {
    const char* name;  // table column; the JSON keys are "err_" and "bound_" + lower-case name
    const char* key;
    double value;
    double bound;
  };
  std::vector<Error> fwd_errors, bwd_errors;
  bool pass = true;
  if (o.check) {
    // The reference's rows: B H N query rows forward; backward again, and B Hkv Nkv key rows.
    const double rows = static_cast<double>(o.batch * o.heads * o.seq) * (o.backward ? 2.0 : 1.0) +
                        (o.backward ? static_cast<double>(o.batch * o.kv_heads * o.kv_seq) : 0.0);
    g_reference_rows = 0;
    progress.stage("check: the fp64 reference", 0, 0, check_s,
                   [rows] { return static_cast<double>(g_reference_rows.load()) / rows; });
    Watchdog::note_phase("check");
    const std::vector<double> q64 = widen(q.wide), k64 = widen(k.wide), v64 = widen(v.wide);
    const std::vector<double> sinks64(sinks.begin(), sinks.end());
    reference::Inputs in{shape,
                         mask,
                         static_cast<double>(scale),
                         q64.data(),
                         k64.data(),
                         v64.data(),
                         fwd.q_positions,
                         fwd.kv_positions,
                         static_cast<int>(o.threads)};
    in.softcap = o.softcap;
    in.sinks = o.sinks ? sinks64.data() : nullptr;
    in.progress = &count_reference_row;
    std::vector<double> out64(q.size()), lse64(lse.size());
    reference::forward(in, out64.data(), lse64.data());
    const std::vector<float> out32 = out.floats();
    fwd_errors = {
        {"O", "o", relative_error(out32.data(), out64.data(), static_cast<int64_t>(out32.size())),
         output_bound},
        {"LSE", "lse", relative_error(lse.data(), lse64.data(), static_cast<int64_t>(lse.size())),
         kFp32RelativeBound}};
    if (in_parts) {
      const std::vector<float> merged32 = out_merged.floats();
      fwd_errors.push_back(
          {"O(merge)", "o_merge",
           relative_error(merged32.data(), out64.data(), static_cast<int64_t>(merged32.size())),
           output_bound});
      fwd_errors.push_back(
          {"LSE(merge)", "lse_merge",
           relative_error(lse_merged.data(), lse64.data(), static_cast<int64_t>(lse_merged.size())),
           kFp32RelativeBound});
    }
    if (o.backward) {
      const std::vector<double> do64 = widen(d_out->wide);
      std::vector<double> dq64(q.size()), dk64(k.size()), dv64(v.size());
      std::vector<double> dsink64(static_cast<size_t>(o.heads));
      // The exact delta, as for dQ and dK (dsink, like them, has the delta-gradient bound).
      reference::backward(in, do64.data(), dq64.data(), dk64.data(), dv64.data(), nullptr,
                          dsink64.data());
      bwd_errors = {
          {"dQ", "dq", relative_error(dq.data(), dq64.data(), static_cast<int64_t>(dq.size())),
           delta_gradient_bound},
          {"dK", "dk", relative_error(dk.data(), dk64.data(), static_cast<int64_t>(dk.size())),
           delta_gradient_bound},
          {"dV", "dv", relative_error(dv.data(), dv64.data(), static_cast<int64_t>(dv.size())),
           value_gradient_bound}};
      if (o.sinks) {
        bwd_errors.push_back({"dsink", "dsink",
                              relative_error(dsink.data(), dsink64.data(), o.heads),
                              delta_gradient_bound});
      }
    }
    for (const auto* errors : {&fwd_errors, &bwd_errors}) {
      for (const Error& e : *errors)
        pass = pass && e.value <= e.bound;
    }
  }

  auto report = [&](const char* mode, const Summary& ms, const Summary& cpu_ms, double flops,
                    const std::vector<Error>& errors, int64_t workspace,
                    const std::optional<int64_t>& rss_growth) {
    const double gflops = flops / (ms.median * 1e-3) / 1e9;
    // The same rate over the CPU time each thread was given (process CPU time / threads).
    const double cpu_gflops = flops / (cpu_ms.median * 1e-3 / static_cast<double>(o.threads)) / 1e9;
    const double pct_peak = on_cpu ? 100.0 * gflops / peak.gflops : 0.0;
    if (o.json) {
      cli::JsonLine line;
      line.add("mode", mode)
          .add("threads", o.threads)
          .add("batch", o.batch)
          .add("seq", o.seq)
          .add("kv_seq", o.kv_seq)
          .add("heads", o.heads)
          .add("kv_heads", o.kv_heads)
          .add("head_dim", o.head_dim)
          .add("causal", mask.kind == MaskKind::causal || mask.kind == MaskKind::causal_window)
          .add("mask", mask.describe())
          .add("documents", mask.documents())
          .add("window", o.window)
          .add("shuffle", o.shuffle)
          .add("parts", o.parts)
          .add("ms", ms.median)
          .add("ms_min", ms.min)
          .add("ms_max", ms.max)
          .add("repeats", o.repeats)
          .add("gflops", gflops)
          .add("cpu_ms", cpu_ms.median)
          .add("cpu_gflops", cpu_gflops)
          .add("path", kernel_path_name(path))
          .add("device", device)
          .add("dtype", dtype_name(dtype))
          .add("peak_gflops", peak.gflops)
          .add("peak_gflops_per_thread", peak.gflops_per_thread)
          .add("peak_isa", peak.isa)
          .add("pct_peak", pct_peak)
          .add("workspace_bytes", workspace)
          .add("generate_ms", 1e3 * generate_seconds);
      if (rss_growth) line.add("peak_rss_delta_bytes", *rss_growth);
      if (o.check) {
        double bound = 0.0;  // the largest of the mode's bounds
        bool ok = true;
        for (const Error& e : errors) {
          line.add(std::string("err_") + e.key, e.value);
          line.add(std::string("bound_") + e.key, e.bound);
          bound = std::max(bound, e.bound);
          ok = ok && e.value <= e.bound;
        }
        line.add("bound", bound);
        line.add("pass", ok);
      }
      std::cout << line.str() << "\n";
    } else {
      std::printf("%-9s %10.3f %10.3f %10.3f %10.2f %6.1f%% %9.2f %9s", mode, ms.median, ms.min,
                  ms.max, gflops, pct_peak, static_cast<double>(workspace) / (1 << 20),
                  rss_growth
                      ? cli::format_double(static_cast<double>(*rss_growth) / (1 << 20), 2).c_str()
                      : "n/a");
      for (const Error& e : errors)
        std::printf("   %s %.2e", e.name, e.value);
      std::printf("\n");
    }
  };

  progress.finish();
  if (!o.json) {
    std::printf("a2d kernel: %s mask=%s scale=%.6g threads=%lld path=%s dtype=%s device=%s\n",
                shape.describe().c_str(), mask.describe().c_str(), static_cast<double>(scale),
                static_cast<long long>(o.threads), on_cpu ? kernel_path_name(path) : "tensor-cores",
                dtype_name(dtype), device.c_str());
    if (on_cpu) {
      std::printf("FMA peak (%s, %d thread%s): %.1f GFLOP/s (%.1f per thread)\n", peak.isa.c_str(),
                  peak.threads, peak.threads == 1 ? "" : "s", peak.gflops, peak.gflops_per_thread);
    } else {
      std::printf("(%%peak and memory columns: CPU only)\n");
    }
    std::printf("%-9s %10s %10s %10s %10s %7s %9s %9s%s\n", "mode", "ms(med)", "ms(min)", "ms(max)",
                "GFLOP/s", "%peak", "work MiB", "RSS+ MiB",
                o.check ? "   relative error vs fp64 reference" : "");
  }
  report("forward", fwd_ms, fwd_cpu_ms, fwd_flops, fwd_errors, fwd_workspace, fwd_rss_growth);
  if (o.backward) {
    report("backward", bwd_ms, bwd_cpu_ms, 2.5 * fwd_flops, bwd_errors, bwd_workspace,
           bwd_rss_growth);
  }
  if (o.check && !o.json) {
    if (dtype == DType::f32) {
      std::printf("check: %s (bound %.0e on every output)\n", pass ? "PASS" : "FAIL",
                  kFp32RelativeBound);
    } else {
      std::printf("check: %s (bounds:", pass ? "PASS" : "FAIL");
      for (const auto* errors : {&fwd_errors, &bwd_errors}) {
        for (const Error& e : *errors)
          std::printf(" %s %.2e", e.name, e.bound);
      }
      std::printf("; inputs rounded to %s)\n", dtype_name(dtype));
    }
  }
  return pass ? 0 : 1;
}

}  // namespace a2d::commands
