// What the kernels' work counter (ForwardArgs::work_done, BackwardArgs::work_done) costs: the
// forward and backward kernels on the same inputs, with the counter and without, interleaved
// round by round in one process (docs/reliability.md, "Long runs"); and that the counter ends at
// the call's score entries.
//
//   a2d_work_counter [--seq N] [--heads H] [--head-dim D] [--rounds R] [--only on|off]
//
// --only runs one variant once (for `valgrind --tool=callgrind`, whose instruction counts compare
// the two without timing noise).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attention2d/kernel.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/data.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace {

struct Inputs {
  int64_t seq = 4096, heads = 4, dim = 64;
  std::vector<float> q, k, v, d_out, out, lse, dq, dk, dv;
};

double forward_ms(Inputs& in, std::atomic<int64_t>* counter) {
  a2d::ForwardArgs args;
  args.shape = {1, in.heads, in.heads, in.seq, in.seq, in.dim};
  args.scale = a2d::default_scale(in.dim);
  args.q = a2d::dense_tokens(in.q.data(), in.seq, in.heads, in.dim);
  args.k = a2d::dense_tokens(in.k.data(), in.seq, in.heads, in.dim);
  args.v = a2d::dense_tokens(in.v.data(), in.seq, in.heads, in.dim);
  args.work_done = counter;
  const double start = a2d::seconds_now();
  a2d::attention_forward(args, a2d::dense_tokens(in.out.data(), in.seq, in.heads, in.dim),
                         a2d::dense_rows(in.lse.data(), in.heads, in.seq));
  return 1e3 * (a2d::seconds_now() - start);
}

double backward_ms(Inputs& in, std::atomic<int64_t>* counter) {
  a2d::BackwardArgs args;
  args.shape = {1, in.heads, in.heads, in.seq, in.seq, in.dim};
  args.scale = a2d::default_scale(in.dim);
  args.q = a2d::dense_tokens(in.q.data(), in.seq, in.heads, in.dim);
  args.k = a2d::dense_tokens(in.k.data(), in.seq, in.heads, in.dim);
  args.v = a2d::dense_tokens(in.v.data(), in.seq, in.heads, in.dim);
  args.out = a2d::dense_tokens(in.out.data(), in.seq, in.heads, in.dim);
  args.d_out = a2d::dense_tokens(in.d_out.data(), in.seq, in.heads, in.dim);
  args.lse = a2d::dense_rows(in.lse.data(), in.heads, in.seq);
  args.work_done = counter;
  const double start = a2d::seconds_now();
  a2d::attention_backward(args, a2d::dense_tokens(in.dq.data(), in.seq, in.heads, in.dim),
                          a2d::dense_tokens(in.dk.data(), in.seq, in.heads, in.dim),
                          a2d::dense_tokens(in.dv.data(), in.seq, in.heads, in.dim));
  return 1e3 * (a2d::seconds_now() - start);
}

}  // namespace

int main(int argc, char** argv) {
  Inputs in;
  int64_t rounds = 7;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--seq") {
      in.seq = std::atoll(argv[i + 1]);
    } else if (option == "--heads") {
      in.heads = std::atoll(argv[i + 1]);
    } else if (option == "--head-dim") {
      in.dim = std::atoll(argv[i + 1]);
    } else if (option == "--rounds") {
      rounds = std::atoll(argv[i + 1]);
    } else if (option == "--only") {
      only = argv[i + 1];
    } else {
      std::fprintf(stderr, "a2d_work_counter: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const a2d::GlobalTokens shape{1, in.seq, in.heads, in.dim};
  in.q = a2d::generate_tokens(1, a2d::TensorTag::q, shape);
  in.k = a2d::generate_tokens(1, a2d::TensorTag::k, shape);
  in.v = a2d::generate_tokens(1, a2d::TensorTag::v, shape);
  in.d_out = a2d::generate_tokens(1, a2d::TensorTag::d_out, shape);
  in.out.resize(in.q.size());
  in.dq.resize(in.q.size());
  in.dk.resize(in.q.size());
  in.dv.resize(in.q.size());
  in.lse.resize(static_cast<size_t>(in.heads * in.seq));
  std::atomic<int64_t> counter{0};
  const int64_t entries = in.seq * in.seq * in.heads;
  if (!only.empty()) {
    std::atomic<int64_t>* c = only == "on" ? &counter : nullptr;
    forward_ms(in, c);
    backward_ms(in, c);
    std::printf("%s: counter %lld (expected %lld)\n", only.c_str(),
                static_cast<long long>(counter.load()), static_cast<long long>(2 * entries));
    return 0;
  }
  std::vector<double> forward_on, forward_off, backward_on, backward_off;
  forward_ms(in, nullptr);  // warm-up
  backward_ms(in, nullptr);
  bool counted = true;
  for (int64_t r = 0; r < rounds; ++r) {
    // Alternate which variant goes first, so that neither always follows the other.
    for (int turn = 0; turn < 2; ++turn) {
      const bool on = (turn == 0) == (r % 2 == 0);
      counter = 0;
      (on ? forward_on : forward_off).push_back(forward_ms(in, on ? &counter : nullptr));
      counted = counted && counter.load() == (on ? entries : 0);
      counter = 0;
      (on ? backward_on : backward_off).push_back(backward_ms(in, on ? &counter : nullptr));
      counted = counted && counter.load() == (on ? entries : 0);
    }
  }
  const auto median = [](std::vector<double> x) { return a2d::summarize(std::move(x)).median; };
  std::printf("N=%lld H=%lld D=%lld, path %s, %lld rounds, medians (ms):\n",
              static_cast<long long>(in.seq), static_cast<long long>(in.heads),
              static_cast<long long>(in.dim), a2d::kernel_path_name(a2d::kernel_path()),
              static_cast<long long>(rounds));
  std::printf("forward   without %.2f  with %.2f  ratio %.4f\n", median(forward_off),
              median(forward_on), median(forward_on) / median(forward_off));
  std::printf("backward  without %.2f  with %.2f  ratio %.4f\n", median(backward_off),
              median(backward_on), median(backward_on) / median(backward_off));
  std::printf("counter: %s (%lld entries per call)\n", counted ? "exact" : "WRONG",
              static_cast<long long>(entries));
  return counted ? 0 : 1;
}
