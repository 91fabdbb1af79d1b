// a2d kernel, the report (kernel_command.hpp): the table, or one JSON object per mode.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "attention2d/tools/check.hpp"
#include "attention2d/tools/cli.hpp"
#include "kernel_command.hpp"

namespace a2d::commands::kernel_cmd {
namespace {

void report_mode(const KernelOptions& o, const KernelSetup& setup, const FmaPeak& peak,
                 const KernelRun& run, const char* mode, const Summary& ms, const Summary& cpu_ms,
                 double flops, const std::vector<CheckError>& errors, int64_t workspace,
                 const std::optional<int64_t>& rss_growth) {
  const Mask& mask = setup.mask;
  const double gflops = flops / (ms.median * 1e-3) / 1e9;
  // The same rate over the CPU time each thread was given (process CPU time / threads).
  const double cpu_gflops = flops / (cpu_ms.median * 1e-3 / static_cast<double>(o.threads)) / 1e9;
  const double pct_peak = setup.cpu_kernels ? 100.0 * gflops / peak.gflops : 0.0;
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
        .add("causal", mask.is_causal())
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
        .add("path", kernel_path_name(setup.path))
        .add("device", setup.device)
        .add("dtype", dtype_name(setup.dtype))
        .add("peak_gflops", peak.gflops)
        .add("peak_gflops_per_thread", peak.gflops_per_thread)
        .add("peak_isa", peak.isa)
        .add("pct_peak", pct_peak)
        .add("workspace_bytes", workspace)
        .add("generate_ms", 1e3 * run.generate_seconds);
    if (rss_growth) line.add("peak_rss_delta_bytes", *rss_growth);
    if (o.check) {
      double bound = 0.0;  // the largest of the mode's bounds
      bool ok = true;
      for (const CheckError& e : errors) {
        line.add(std::string("err_") + e.key, e.value);
        line.add(std::string("bound_") + e.key, e.bound);
        bound = std::max(bound, e.bound);
        ok = ok && e.value <= e.bound;
      }
      line.add("bound", bound);
      line.add("pass", ok);
    }
    std::cout << line.str() << "\n";
    return;
  }
  std::printf("%-9s %10.3f %10.3f %10.3f %10.2f %6.1f%% %9.2f %9s", mode, ms.median, ms.min, ms.max,
              gflops, pct_peak, static_cast<double>(workspace) / (1 << 20),
              rss_growth
                  ? cli::format_double(static_cast<double>(*rss_growth) / (1 << 20), 2).c_str()
                  : "n/a");
  for (const CheckError& e : errors)
    std::printf("   %s %.2e", e.name, e.value);
  std::printf("\n");
}

}  // namespace

void report_kernels(const KernelOptions& o, const KernelSetup& setup, const FmaPeak& peak,
                    const KernelRun& run, const KernelCheck& check) {
  if (!o.json) {
    std::printf("a2d kernel: %s mask=%s scale=%.6g threads=%lld path=%s dtype=%s device=%s\n",
                setup.shape.describe().c_str(), setup.mask.describe().c_str(),
                static_cast<double>(setup.scale), static_cast<long long>(o.threads),
                setup.cpu_kernels ? kernel_path_name(setup.path) : "tensor-cores",
                dtype_name(setup.dtype), setup.device.c_str());
    if (setup.cpu_kernels) {
      std::printf("FMA peak (%s, %d thread%s): %.1f GFLOP/s (%.1f per thread)\n", peak.isa.c_str(),
                  peak.threads, peak.threads == 1 ? "" : "s", peak.gflops, peak.gflops_per_thread);
    } else {
      std::printf("(%%peak and memory columns: CPU only)\n");
    }
    std::printf("%-9s %10s %10s %10s %10s %7s %9s %9s%s\n", "mode", "ms(med)", "ms(min)", "ms(max)",
                "GFLOP/s", "%peak", "work MiB", "RSS+ MiB",
                o.check ? "   relative error vs fp64 reference" : "");
  }
  report_mode(o, setup, peak, run, "forward", run.forward_ms, run.forward_cpu_ms, run.forward_flops,
              check.forward, run.forward_workspace, run.forward_rss_growth);
  if (o.backward) {
    report_mode(o, setup, peak, run, "backward", run.backward_ms, run.backward_cpu_ms,
                2.5 * run.forward_flops, check.backward, run.backward_workspace,
                run.backward_rss_growth);
  }
  if (o.check && !o.json) {
    if (setup.dtype == DType::f32) {
      std::printf("check: %s (bound %.0e on every output)\n", check.pass ? "PASS" : "FAIL",
                  kFp32RelativeBound);
    } else {
      std::printf("check: %s (bounds:", check.pass ? "PASS" : "FAIL");
      for (const auto* errors : {&check.forward, &check.backward}) {
        for (const CheckError& e : *errors)
          std::printf(" %s %.2e", e.name, e.bound);
      }
      std::printf("; inputs rounded to %s)\n", dtype_name(setup.dtype));
    }
  }
}

}  // namespace a2d::commands::kernel_cmd
