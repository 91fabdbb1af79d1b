// a2d kernel: runs the local attention kernel on seeded inputs, times it, measures the machine's
// FMA peak in the same run, and optionally checks every output against the fp64 reference. With
// --dtype bf16 or fp16 the inputs are rounded to the dtype and stored in it, O is written in it,
// and the reference runs on the rounded values. The kernels run through the backend of --device,
// as the distributed algorithms call them (kernel_run.cpp); on the CPU's backend its buffers are
// the command's own arrays, not copies.
//
// This file: the options, their validation, the memory check and the estimate;
// kernel_command.hpp names the other pieces.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "attention2d/backend.hpp"
#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/watchdog.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "commands.hpp"
#include "kernel_command.hpp"
#include "memory_needs.hpp"

namespace a2d::commands {
namespace {

using kernel_cmd::KernelOptions;

// What the command allocates for `r` (its sequence and dtype; one process). Host memory only:
// a device's own memory (a GPU's) holds the backend's copies there. backend_copies: the backend
// cannot use the command's arrays as its buffers (BackendCapabilities::wraps_host).
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
  if (on_host_device) {
    // Copies of the inputs and outputs where the backend cannot use the arrays themselves; the
    // partial states and records of --parts.
    int64_t copies = backend_copies ? e * (2 * q + 2 * kv) + 4 * lse : 0;
    if (in_parts) copies += 4 * (2 * q * (o.head_dim + 2) / o.head_dim + q + 2 * lse) + e * q;
    if (o.backward) {
      if (backend_copies) copies += e * q + 4 * (q + 2 * kv + lse);
      if (in_parts) copies += 8 * lse + 2 * e * q;
    }
    if (copies > 0) need.every_rank.push_back({"the backend's copies (--device, --parts)", copies});
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
                     "kernel implementation: auto (fastest this CPU supports), portable, avx2,\n"
                     "avx512, avx512bf16 or amx (avx512 with the bf16 kernels on VDPBF16PS or on\n"
                     "AMX tiles; default: the environment variable A2D_KERNEL_PATH, else auto)");
  options.add_string(
      "--device", &o.device,
      "the backend the kernel runs on: cpu (the CPU kernels, on the command's own arrays),\n"
      "cuda (the CUDA backend: bf16/fp16, head_dim 64/80/96/128; no FMA peak then) or\n"
      "fenced (the CPU kernels on copies only the backend may touch). Default: cuda for\n"
      "bf16/fp16 when this build has it and a GPU is visible, else cpu");
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
  kernel_cmd::KernelSetup setup;
  // Without --dtype: the device's first dtype (bf16 on cuda and fenced-cuda), else fp32.
  const DType dtype = setup.dtype =
      !o.dtype.empty() ? parse_dtype(o.dtype) : default_dtype(o.device);
  if (!o.path.empty()) set_kernel_path(parse_kernel_path(o.path));
  setup.path = kernel_path();
  const std::string device = setup.device = o.device.empty() ? default_device(dtype) : o.device;
  // The kernels run through the backend: on its buffers (the command's arrays where it wraps host
  // memory, else copies uploaded once), each timed call ended by synchronize().
  const std::unique_ptr<Backend> backend = make_backend(device);
  const BackendCapabilities& capabilities = backend->capabilities();
  const bool on_cpu = setup.cpu_kernels = capabilities.cpu_kernels;
  // The peak is measured before and after the kernel timings and the higher value is kept: on a
  // machine shared with other work, a peak measured while something else ran would flatter the
  // kernel's share of it. (Not for a GPU: it is the CPU's FMA peak.)
  // On the amx and avx512bf16 paths with bf16 inputs, the products run on AMX tiles or VDPBF16PS:
  // the peak is theirs.
  FmaPeak peak = on_cpu ? measure_product_peak(dtype, static_cast<int>(o.threads)) : FmaPeak{};

  AttentionShape& shape = setup.shape;
  shape = {o.batch, o.heads, o.kv_heads, o.seq, o.kv_seq, o.head_dim};
  shape.validate();
  A2D_REQUIRE((o.doc_lens.empty() && o.mask_ranges.empty()) || o.kv_seq == o.seq,
              o.doc_lens.empty() ? "--mask-ranges" : "--doc-lens",
              " needs --kv-seq equal to --seq (self-attention)");
  const Mask& mask = setup.mask =
      cli::mask_from_options(o.causal, o.window, o.window_size, o.doc_lens, o.mask_ranges, o.seq);
  setup.scale = o.scale > 0 ? static_cast<float>(o.scale) : default_scale(o.head_dim);
  A2D_REQUIRE(o.scale >= 0 && std::isfinite(o.scale), "--scale must be positive, got ", o.scale);
  A2D_REQUIRE(o.softcap >= 0, "--softcap must be positive (or 0 for none), got ", o.softcap);

  // Before anything large is allocated: what the command needs against what this host has
  // (attention2d/memory_check.hpp).
  {
    MemoryCheck check;
    check.request = {1, o.seq, dtype};
    check.ranks_may_change = false;
    check.dtype_may_change = capabilities.host_memory;
    check.enabled = !o.no_memory_check;
    check.override_hint = "--no-memory-check or A2D_NO_MEMORY_CHECK=1";
    const bool copies = !capabilities.wraps_host;
    check.model = [&, copies](const MemoryRequest& r) {
      return kernel_memory(o, r, copies, capabilities.host_memory, in_parts);
    };
    check_memory(check);
  }

  // The prediction (on the CPU: this machine's FMA peak times the kernels' efficiency) and what
  // the progress lines count: the score entries the kernels compute, the reference's rows.
  const double pairs_per_head =
      static_cast<double>(count_visible_pairs(mask, nullptr, o.seq, nullptr, o.kv_seq));
  kernel_cmd::KernelEstimate estimate;
  estimate.call_entries = pairs_per_head * static_cast<double>(o.heads * o.batch);
  const double call_flops = 4.0 * estimate.call_entries * static_cast<double>(o.head_dim);
  const int64_t calls = o.warmup + o.repeats;
  double &forward_s = estimate.forward_s, &backward_s = estimate.backward_s,
         &check_s = estimate.check_s;
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

  kernel_cmd::KernelRun run = kernel_cmd::run_kernels(o, setup, estimate, *backend, progress);
  if (on_cpu) {
    if (const FmaPeak again = measure_product_peak(dtype, static_cast<int>(o.threads));
        again.gflops > peak.gflops) {
      peak = again;
    }
  }
  const kernel_cmd::KernelCheck check =
      o.check ? kernel_cmd::check_kernels(o, setup, capabilities, estimate, run, progress)
              : kernel_cmd::KernelCheck{};
  progress.finish();
  kernel_cmd::report_kernels(o, setup, peak, run, check);
  return check.pass ? 0 : 1;
}

}  // namespace a2d::commands
