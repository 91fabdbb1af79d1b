// a2d_tile_gemm: a tuned BLAS (OpenBLAS, one thread) on the tile products of the attention
// kernels, next to the machine's FMA peak, so that the choice between calling a BLAS per tile and
// the own micro-kernels rests on a measurement (docs/performance.md).
//
//   build/bench/a2d_tile_gemm [--seconds S]
//   build/bench/a2d_tile_gemm [--seconds S] --shapes MxNxK[t],...
//
// Each row multiplies row-major tiles the way a BLAS-based flash kernel would (PyTorch and IPEX
// call sgemm per tile): S = Q K^T and O += P V of the forward with a 192-query, 256-key tile,
// and the backward's five products with a 48-query, 96-key block, for D = 64 and 128. The
// operands are reused across calls (they stay in cache, as in the kernel), so the numbers are an
// upper bound for a BLAS-based kernel: they leave out the softmax, the copies and the calls'
// share of the tile loop.
//
// --shapes times the given products instead (row-major C[M][N] = A[M][K] B[K][N], or B^T with a
// trailing t: B stored [N][K], like K in S = Q K^T) and prints one JSON line per product, best of
// five tries of S / 5 seconds each; scripts/bench/kernel_sgemm_table.sh compares the kernels with
// the square 2048^3 product and attention's shapes this way.
#include <cblas.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "attention2d/peak.hpp"
#include "attention2d/timing.hpp"

extern "C" void openblas_set_num_threads(int threads);
extern "C" char* openblas_get_corename();

namespace {

struct Product {
  std::string name;
  int m, n, k;
  bool transpose_b;  // C[m][n] = A[m][k] B[n][k]^T instead of A[m][k] B[k][n]
  float beta;        // 0: overwrite C, 1: accumulate
};

// Best GFLOP/s of five tries, over wall-clock time (the return value) and over the process's CPU
// time (*cpu_gflops, where given: what a run on a shared machine was actually given).
double time_product(const Product& p, double seconds, double* cpu_gflops = nullptr) {
  std::vector<float> a(static_cast<size_t>(p.m) * p.k, 0.01f),
      b(static_cast<size_t>(p.k) * p.n, 0.02f), c(static_cast<size_t>(p.m) * p.n, 0.0f);
  // Large products are timed one call at a time, small ones 16 at a time (the clock's cost).
  const int batch = 2.0 * p.m * p.n * p.k > 1e8 ? 1 : 16;
  auto once = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, p.transpose_b ? CblasTrans : CblasNoTrans, p.m, p.n,
                p.k, 1.0f, a.data(), p.k, b.data(), p.transpose_b ? p.k : p.n, p.beta, c.data(),
                p.n);
  };
  double best = 0.0, best_cpu = 0.0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    int64_t calls = 0;
    const double start = a2d::seconds_now();
    const double cpu_start = a2d::cpu_seconds_now();
    double elapsed = 0.0;
    while (elapsed < seconds / 5) {
      for (int i = 0; i < batch; ++i)
        once();
      calls += batch;
      elapsed = a2d::seconds_now() - start;
    }
    const double flops = 2.0 * p.m * p.n * p.k * static_cast<double>(calls);
    const double rate = flops / elapsed / 1e9;
    const double cpu_rate = flops / (a2d::cpu_seconds_now() - cpu_start) / 1e9;
    if (rate > best) best = rate;
    if (cpu_rate > best_cpu) best_cpu = cpu_rate;
  }
  if (cpu_gflops) *cpu_gflops = best_cpu;
  return best;
}

// "MxNxK[t],..." -> products; an empty list for a malformed one.
std::vector<Product> parse_shapes(const std::string& list) {
  std::vector<Product> products;
  std::stringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    Product p{item, 0, 0, 0, false, 0.0f};
    if (!item.empty() && item.back() == 't') {
      p.transpose_b = true;
      item.pop_back();
    }
    char x1 = 0, x2 = 0;
    std::stringstream fields(item);
    if (!(fields >> p.m >> x1 >> p.n >> x2 >> p.k) || x1 != 'x' || x2 != 'x' || p.m < 1 ||
        p.n < 1 || p.k < 1) {
      return {};
    }
    products.push_back(p);
  }
  return products;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  std::string shapes;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--seconds") {
      seconds = std::stod(argv[i + 1]);
    } else if (option == "--shapes") {
      shapes = argv[i + 1];
    } else {
      std::fprintf(stderr, "a2d_tile_gemm: unknown option %s\n", option.c_str());
      return 2;
    }
  }
  openblas_set_num_threads(1);
  if (!shapes.empty()) {
    const std::vector<Product> products = parse_shapes(shapes);
    if (products.empty()) {
      std::fprintf(stderr, "a2d_tile_gemm: --shapes expects MxNxK[t],... got %s\n", shapes.c_str());
      return 2;
    }
    for (const Product& p : products) {
      double cpu_gflops = 0.0;
      const double gflops = time_product(p, seconds, &cpu_gflops);
      std::printf(
          "{\"product\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"transpose_b\": %s, "
          "\"gflops\": %.2f, \"cpu_gflops\": %.2f, \"blas\": \"OpenBLAS %s\"}\n",
          p.name.c_str(), p.m, p.n, p.k, p.transpose_b ? "true" : "false", gflops, cpu_gflops,
          openblas_get_corename());
      std::fflush(stdout);
    }
    return 0;
  }
  const a2d::FmaPeak peak = a2d::measure_fma_peak(1);
  std::printf(
      "a2d_tile_gemm: OpenBLAS cblas_sgemm (%s kernels), 1 thread; FMA peak %.1f GFLOP/s (%s)\n",
      openblas_get_corename(), peak.gflops, peak.isa.c_str());
  std::printf("%-34s %5s %5s %5s %9s %7s\n", "product", "M", "N", "K", "GFLOP/s", "%peak");
  for (const int d : {128, 64}) {
    const std::string tag = " (D=" + std::to_string(d) + ")";
    const std::vector<Product> products = {
        {"forward S = Q K^T" + tag, 192, 256, d, true, 0.0f},
        {"forward O += P V" + tag, 192, d, 256, false, 1.0f},
        {"forward S, one 24-row panel" + tag, 24, 256, d, true, 0.0f},
        {"backward S = Q K^T" + tag, 48, 96, d, true, 0.0f},
        {"backward dV += P^T dO" + tag, 96, d, 48, false, 1.0f},
        {"backward dQ += dS K" + tag, 48, d, 96, false, 1.0f},
    };
    for (const Product& p : products) {
      const double gflops = time_product(p, seconds);
      std::printf("%-34s %5d %5d %5d %9.1f %6.1f%%\n", p.name.c_str(), p.m, p.n, p.k, gflops,
                  100.0 * gflops / peak.gflops);
    }
  }
  return 0;
}
