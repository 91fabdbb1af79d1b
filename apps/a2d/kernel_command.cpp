// a2d kernel: runs the local attention kernel on seeded inputs, times it and optionally checks
// every output against the fp64 reference.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include "attention2d/check.hpp"
#include "attention2d/data.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/timing.hpp"
#include "cli.hpp"
#include "commands.hpp"

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
  int64_t warmup = 1;
  int64_t repeats = 5;
  double scale = 0.0;  // 0: 1/sqrt(head_dim)
  bool causal = false;
  bool backward = false;
  bool check = false;
  bool json = false;
};

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

template <typename F>
Summary time_repeats(const KernelOptions& o, F&& body) {
  for (int64_t i = 0; i < o.warmup; ++i) body();
  std::vector<double> ms;
  for (int64_t i = 0; i < o.repeats; ++i) {
    const double start = seconds_now();
    body();
    ms.push_back(1e3 * (seconds_now() - start));
  }
  return summarize(ms);
}

}  // namespace

int kernel(int argc, char** argv, int first) {
  KernelOptions o;
  cli::Options options(
      "a2d kernel [options]",
      "Runs the local (single-process) attention kernel on generated inputs and reports its time\n"
      "and GFLOP/s, counting only unmasked work: 4*Nq*Nk*D per head forward, 2.5x that backward.");
  options.add_int("--seq", &o.seq, "query sequence length N");
  options.add_int("--kv-seq", &o.kv_seq, "key/value sequence length (0 = --seq)");
  options.add_int("--heads", &o.heads, "query heads H");
  options.add_int("--kv-heads", &o.kv_heads, "key/value heads; H must be a multiple (0 = --heads)");
  options.add_int("--head-dim", &o.head_dim, "head dimension D");
  options.add_int("--batch", &o.batch, "batch size B");
  options.add_flag("--causal", &o.causal, "causal mask (key position <= query position)");
  options.add_int("--window", &o.window, "causal with a window of W tokens (implies --causal; 0 = none)");
  options.add_double("--scale", &o.scale, "softmax scale (0 = 1/sqrt(D))");
  options.add_flag("--backward", &o.backward, "also time the backward pass");
  options.add_int("--threads", &o.threads, "threads of the kernel");
  options.add_int("--seed", &o.seed, "seed of the generated inputs");
  options.add_int("--warmup", &o.warmup, "untimed runs before timing");
  options.add_int("--repeats", &o.repeats, "timed runs; the median is reported");
  options.add_flag("--check", &o.check, "compare every output with the fp64 reference; exit 1 over the bound");
  options.add_flag("--json", &o.json, "one JSON object per line instead of the table");
  if (!options.parse(argc, argv, first)) return 0;

  if (o.kv_seq == 0) o.kv_seq = o.seq;
  if (o.kv_heads == 0) o.kv_heads = o.heads;
  A2D_REQUIRE(o.seq >= 1 && o.kv_seq >= 1, "--seq and --kv-seq must be at least 1");
  A2D_REQUIRE(o.warmup >= 0 && o.repeats >= 1, "--warmup must be >= 0 and --repeats >= 1");
  A2D_REQUIRE(o.window >= 0, "--window must be >= 1 (or 0 for no window), got ", o.window);
  A2D_REQUIRE(o.threads >= 1, "--threads must be at least 1, got ", o.threads);

  AttentionShape shape{o.batch, o.heads, o.kv_heads, o.seq, o.kv_seq, o.head_dim};
  shape.validate();
  const Mask mask = o.window > 0 ? Mask::causal_window(o.window)
                                 : (o.causal ? Mask::causal() : Mask::none());
  const float scale = o.scale > 0 ? static_cast<float>(o.scale) : default_scale(o.head_dim);
  A2D_REQUIRE(o.scale >= 0 && std::isfinite(o.scale), "--scale must be positive, got ", o.scale);

  const uint64_t seed = static_cast<uint64_t>(o.seed);
  const GlobalTokens q_global{o.batch, o.seq, o.heads, o.head_dim};
  const GlobalTokens kv_global{o.batch, o.kv_seq, o.kv_heads, o.head_dim};
  const std::vector<float> q = generate_tokens(seed, TensorTag::q, q_global);
  const std::vector<float> k = generate_tokens(seed, TensorTag::k, kv_global);
  const std::vector<float> v = generate_tokens(seed, TensorTag::v, kv_global);
  std::vector<float> out(q.size()), lse(static_cast<size_t>(o.batch * o.heads * o.seq));

  ForwardArgs fwd;
  fwd.shape = shape;
  fwd.mask = mask;
  fwd.scale = scale;
  fwd.q = dense_tokens(q.data(), o.seq, o.heads, o.head_dim);
  fwd.k = dense_tokens(k.data(), o.kv_seq, o.kv_heads, o.head_dim);
  fwd.v = dense_tokens(v.data(), o.kv_seq, o.kv_heads, o.head_dim);
  fwd.threads = static_cast<int>(o.threads);
  const auto out_view = dense_tokens(out.data(), o.seq, o.heads, o.head_dim);
  const auto lse_view = dense_rows(lse.data(), o.heads, o.seq);

  const double pairs = static_cast<double>(count_visible_pairs(mask, nullptr, o.seq, nullptr, o.kv_seq));
  const double fwd_flops = 4.0 * pairs * static_cast<double>(o.head_dim * o.heads * o.batch);
  const Summary fwd_ms = time_repeats(o, [&] { attention_forward(fwd, out_view, lse_view); });

  std::vector<float> d_out, dq, dk, dv;
  Summary bwd_ms;
  if (o.backward) {
    d_out = generate_tokens(seed, TensorTag::d_out, q_global);
    dq.resize(q.size());
    dk.resize(k.size());
    dv.resize(v.size());
    BackwardArgs bwd;
    bwd.shape = shape;
    bwd.mask = mask;
    bwd.scale = scale;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = dense_tokens(out.data(), o.seq, o.heads, o.head_dim);
    bwd.d_out = dense_tokens(d_out.data(), o.seq, o.heads, o.head_dim);
    bwd.lse = dense_rows(lse.data(), o.heads, o.seq);
    bwd.threads = static_cast<int>(o.threads);
    bwd_ms = time_repeats(o, [&] {
      attention_backward(bwd, dense_tokens(dq.data(), o.seq, o.heads, o.head_dim),
                         dense_tokens(dk.data(), o.kv_seq, o.kv_heads, o.head_dim),
                         dense_tokens(dv.data(), o.kv_seq, o.kv_heads, o.head_dim));
    });
  }

  // Errors against the fp64 reference, on the same (fp32) inputs.
  struct Error {
    const char* name;  // table column; the JSON key is "err_" + lower-case name
    const char* key;
    double value;
  };
  std::vector<Error> fwd_errors, bwd_errors;
  bool pass = true;
  if (o.check) {
    const std::vector<double> q64 = widen(q), k64 = widen(k), v64 = widen(v);
    reference::Inputs in{shape, mask, static_cast<double>(scale), q64.data(), k64.data(),
                         v64.data(), nullptr, nullptr, static_cast<int>(o.threads)};
    std::vector<double> out64(q.size()), lse64(lse.size());
    reference::forward(in, out64.data(), lse64.data());
    fwd_errors = {{"O", "err_o", relative_error(out.data(), out64.data(), static_cast<int64_t>(out.size()))},
                  {"LSE", "err_lse", relative_error(lse.data(), lse64.data(), static_cast<int64_t>(lse.size()))}};
    if (o.backward) {
      const std::vector<double> do64 = widen(d_out);
      std::vector<double> dq64(q.size()), dk64(k.size()), dv64(v.size());
      reference::backward(in, do64.data(), dq64.data(), dk64.data(), dv64.data());
      bwd_errors = {{"dQ", "err_dq", relative_error(dq.data(), dq64.data(), static_cast<int64_t>(dq.size()))},
                    {"dK", "err_dk", relative_error(dk.data(), dk64.data(), static_cast<int64_t>(dk.size()))},
                    {"dV", "err_dv", relative_error(dv.data(), dv64.data(), static_cast<int64_t>(dv.size()))}};
    }
    for (const auto* errors : {&fwd_errors, &bwd_errors}) {
      for (const Error& e : *errors) pass = pass && e.value <= kFp32RelativeBound;
    }
  }

  auto report = [&](const char* mode, const Summary& ms, double flops,
                    const std::vector<Error>& errors) {
    const double gflops = flops / (ms.median * 1e-3) / 1e9;
    if (o.json) {
      cli::JsonLine line;
      line.add("mode", mode).add("threads", o.threads).add("batch", o.batch).add("seq", o.seq)
          .add("kv_seq", o.kv_seq).add("heads", o.heads).add("kv_heads", o.kv_heads)
          .add("head_dim", o.head_dim).add("causal", mask.is_causal()).add("window", o.window)
          .add("ms", ms.median).add("ms_min", ms.min).add("ms_max", ms.max)
          .add("repeats", o.repeats).add("gflops", gflops);
      if (o.check) {
        for (const Error& e : errors) line.add(e.key, e.value);
        line.add("bound", kFp32RelativeBound);
        bool ok = true;
        for (const Error& e : errors) ok = ok && e.value <= kFp32RelativeBound;
        line.add("pass", ok);
      }
      std::cout << line.str() << "\n";
    } else {
      std::printf("%-9s %10.3f %10.3f %10.3f %10.2f", mode, ms.median, ms.min, ms.max, gflops);
      for (const Error& e : errors) std::printf("   %s %.2e", e.name, e.value);
      std::printf("\n");
    }
  };

  if (!o.json) {
    std::printf("a2d kernel: %s mask=%s scale=%.6g threads=%lld\n", shape.describe().c_str(),
                mask.describe().c_str(), static_cast<double>(scale),
                static_cast<long long>(o.threads));
    std::printf("%-9s %10s %10s %10s %10s%s\n", "mode", "ms(med)", "ms(min)", "ms(max)", "GFLOP/s",
                o.check ? "   relative error vs fp64 reference" : "");
  }
  report("forward", fwd_ms, fwd_flops, fwd_errors);
  if (o.backward) report("backward", bwd_ms, 2.5 * fwd_flops, bwd_errors);
  if (o.check && !o.json) {
    std::printf("check: %s (bound %.0e on every output)\n", pass ? "PASS" : "FAIL",
                kFp32RelativeBound);
  }
  return pass ? 0 : 1;
}

}  // namespace a2d::commands
