// a2d_kernel_parts: what each part of the AVX2 or AVX-512 kernels costs, measured by switching
// parts off (cpu::Skip) and timing what is left, in one run next to the machine's FMA peak.
//
//   build/bench/a2d_kernel_parts --seq 4096 --heads 8 --head-dim 128 [--causal] [--backward]
//                                [--path avx2|avx512] [--cpu-time]
//
// Each row is one variant of the real kernel on the same inputs: the best of --repeats rounds,
// each round timing every variant once, after one warm-up round. "share" is (full - variant) /
// full: the part of the full time the switched-off part took. Rows that keep only one tile product
// report that product's own GFLOP/s and % of peak (2 Nq Nk D FLOPs per head and product). Variants
// compute wrong results by design.
#include <cstdio>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/peak.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/tools/data.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "backends/cpu/kernels/paths.hpp"

namespace a2d {
namespace {

using namespace cpu;

struct Variant {
  const char* name;
  unsigned skip;
  double product_share;  // fraction of the counted FLOPs this variant still does; 0 = report none
};

int run(int argc, char** argv) {
  int64_t seq = 4096, heads = 8, head_dim = 128, threads = 1, repeats = 3;
  bool causal = false, backward = false, cpu_clock = false;
  std::string path_name = "avx2";
  cli::Options options("a2d_kernel_parts [options]",
                       "Times the AVX2 or AVX-512 kernel with parts switched off, to show what "
                       "each costs.");
  options.add_int("--seq", &seq, "sequence length N (queries and keys)");
  options.add_int("--heads", &heads, "heads H (K/V heads = H)");
  options.add_int("--head-dim", &head_dim, "head dimension D");
  options.add_flag("--causal", &causal, "causal mask");
  options.add_flag("--backward", &backward, "the backward kernel instead of the forward");
  options.add_flag("--cpu-time", &cpu_clock,
                   "time by the CPU time the process was given (a machine busy with other work)");
  options.add_int("--threads", &threads, "threads");
  options.add_int("--repeats", &repeats, "rounds; each times every variant once (best kept)");
  options.add_string("--path", &path_name, "kernel path: avx2 or avx512");
  if (!options.parse(argc, argv, 1)) return 0;
  const KernelPath path = parse_kernel_path(path_name);
  A2D_REQUIRE(path != KernelPath::portable, "--path must be avx2 or avx512");
  A2D_REQUIRE(kernel_path_supported(path), "this CPU or build has no ", path_name, " path");
  const bool wide = path == KernelPath::avx512;
#if !A2D_HAVE_AVX512_PATH
  A2D_REQUIRE(!wide, "this build has no AVX-512 path");
#endif
  const auto forward = [&](const ForwardArgs& args, const cpu::ForwardResult& out, unsigned skip) {
#if A2D_HAVE_AVX512_PATH
    if (wide) return cpu::avx512::forward(args, out, skip);
#endif
    cpu::avx2::forward(args, out, skip);
  };
  const auto backward_kernel = [&](const cpu::BackwardInputs& in, TokenView<float> dq,
                                   TokenView<float> dk, TokenView<float> dv, unsigned skip) {
#if A2D_HAVE_AVX512_PATH
    if (wide) return cpu::avx512::backward(in, dq, dk, dv, skip);
#endif
    cpu::avx2::backward(in, dq, dk, dv, skip);
  };

  const AttentionShape shape{1, heads, heads, seq, seq, head_dim};
  const Mask mask = causal ? Mask::causal() : Mask::none();
  const GlobalTokens global{1, seq, heads, head_dim};
  const std::vector<float> q = generate_tokens(1, TensorTag::q, global);
  const std::vector<float> k = generate_tokens(1, TensorTag::k, global);
  const std::vector<float> v = generate_tokens(1, TensorTag::v, global);
  const std::vector<float> d_out = generate_tokens(1, TensorTag::d_out, global);
  std::vector<float> out(q.size()), lse(static_cast<size_t>(heads * seq)), delta(lse.size());
  std::vector<float> dq(q.size()), dk(q.size()), dv(q.size());
  const auto tokens = [&](const std::vector<float>& x) {
    return dense_tokens(x.data(), seq, heads, head_dim);
  };
  const auto tokens_out = [&](std::vector<float>& x) {
    return dense_tokens(x.data(), seq, heads, head_dim);
  };

  ForwardArgs fwd;
  fwd.shape = shape;
  fwd.mask = mask;
  fwd.scale = default_scale(head_dim);
  fwd.q = tokens(q);
  fwd.k = tokens(k);
  fwd.v = tokens(v);
  fwd.threads = static_cast<int>(threads);
  const cpu::ForwardResult result{tokens_out(out), dense_rows(lse.data(), heads, seq), nullptr,
                                  false};
  forward(fwd, result, kSkipNothing);  // the real LSE, for the backward
  BackwardArgs bwd;
  bwd.shape = shape;
  bwd.mask = mask;
  bwd.scale = fwd.scale;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.d_out = tokens(d_out);
  bwd.lse = dense_rows(lse.data(), heads, seq);
  bwd.threads = fwd.threads;
  compute_delta({1, seq, heads, head_dim}, tokens(out), tokens(d_out),
                dense_rows(delta.data(), heads, seq));
  const cpu::BackwardInputs in{&bwd,
                               dense_rows(static_cast<const float*>(delta.data()), heads, seq)};

  std::vector<Variant> variants;
  if (!backward) {
    variants = {{"full forward", kSkipNothing, 0},
                {"without exp (P = S)", kSkipExp, 0},
                {"without softmax (max, exp, sum, rescale)", kSkipSoftmax, 0},
                {"without the K and V tile copies", kSkipCopies, 0},
                {"S = K Qt alone", kSkipSoftmax | kSkipValues | kSkipCopies, 0.5},
                {"O += P^T V alone (with the copies)", kSkipSoftmax | kSkipScores, 0.5},
                {"both products alone", kSkipSoftmax | kSkipCopies, 1.0}};
  } else {
    const unsigned products = kSkipScores | kSkipScoreGradients | kSkipKeyValueGradients |
                              kSkipQueryGradients | kSkipCopies | kSkipExp;
    variants = {{"full backward", kSkipNothing, 0},
                {"without exp (P = S)", kSkipExp, 0},
                {"without the tile copies", kSkipCopies, 0},
                {"without P = exp(Q Kt - LSE)", kSkipScores, 0},
                {"without dS = P (dO Vt - delta)", kSkipScoreGradients, 0},
                {"without dV += Pt dO, dK += dSt Q", kSkipKeyValueGradients, 0},
                {"without dQ += dS K", kSkipQueryGradients, 0},
                {"S = Q Kt alone", products & ~kSkipScores, 0.2},
                {"dP = dO Vt alone", products & ~kSkipScoreGradients, 0.2},
                {"dV, dK products alone", products & ~kSkipKeyValueGradients, 0.4},
                {"dQ = dS K alone", products & ~kSkipQueryGradients, 0.2},
                {"five products alone", kSkipExp | kSkipCopies, 1.0}};
  }

  const FmaPeak peak = measure_fma_peak(static_cast<int>(threads));
  const double pairs = static_cast<double>(count_visible_pairs(mask, nullptr, seq, nullptr, seq));
  const double flops = (backward ? 2.5 : 1.0) * 4.0 * pairs * static_cast<double>(head_dim * heads);
  std::printf("a2d_kernel_parts: %s %s %s mask=%s threads=%lld; FMA peak %.1f GFLOP/s (%s)\n",
              path_name.c_str(), backward ? "backward" : "forward", shape.describe().c_str(),
              mask.describe().c_str(), static_cast<long long>(threads), peak.gflops,
              peak.isa.c_str());
  std::printf("%-42s %10s %9s %8s %10s %7s\n", "variant", "ms(best)", "GFLOP/s", "share",
              "part GF/s", "%peak");
  // Rounds: every round times every variant once, so that interference from other work on the
  // machine spreads over all variants instead of hitting a few; the best round of each variant
  // is reported (interference only ever adds time).
  auto run_variant = [&](const Variant& variant) {
    if (backward) {
      backward_kernel(in, tokens_out(dq), tokens_out(dk), tokens_out(dv), variant.skip);
    } else {
      forward(fwd, result, variant.skip);
    }
  };
  std::vector<std::vector<double>> ms(variants.size());
  for (const Variant& variant : variants)
    run_variant(variant);  // warm-up
  for (int64_t round = 0; round < repeats; ++round) {
    for (size_t which = 0; which < variants.size(); ++which) {
      const double start = cpu_clock ? cpu_seconds_now() : seconds_now();
      run_variant(variants[which]);
      ms[which].push_back(1e3 * ((cpu_clock ? cpu_seconds_now() : seconds_now()) - start));
    }
  }
  const double full_ms = summarize(ms[0]).min;
  for (size_t which = 0; which < variants.size(); ++which) {
    const double best = summarize(ms[which]).min;
    std::printf("%-42s %10.2f %9.2f %7.1f%%", variants[which].name, best, flops / best / 1e6,
                100.0 * (full_ms - best) / full_ms);
    if (variants[which].product_share > 0) {
      const double part = variants[which].product_share * flops / best / 1e6;
      std::printf(" %10.2f %6.1f%%", part, 100.0 * part / peak.gflops);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace a2d

int main(int argc, char** argv) {
  try {
    return a2d::run(argc, argv);
  } catch (const a2d::Error& e) {
    std::fprintf(stderr, "a2d_kernel_parts: %s\n", e.what());
    return 2;
  }
}
