// The C++ door's example of docs/usage.md ("From C++"), built against the installed package and
// run: the lines between the markers are that example, character for character (install.sh
// compares them). With q = k = 0 every visible key gets the same weight, so out[t] is the mean of
// v[0..t]; the backward of a zero dO is zero.
#include <cmath>
#include <cstdio>

// usage.md begin
#include <attention2d/attention2d.hpp>

int main(int argc, char** argv) {
  a2d::MpiSession mpi(&argc, &argv);
  auto world = a2d::make_mpi_communicator(MPI_COMM_WORLD);
  a2d::Problem problem;  // batch 1, fp32, no mask unless set
  problem.seq = 1000, problem.heads = 4, problem.kv_heads = 2, problem.head_dim = 16;
  problem.mask = a2d::Mask::causal();
  a2d::ShardAttention attention(*world, problem);  // collective: the plan a2d run would choose
  const int64_t n = attention.tokens(), H = 4, G = 2, D = 16;  // n: this rank's tokens
  std::vector<float> q(n * H * D), k(n * G * D), v(k.size()), out(q.size()), lse(H * n),
      d_out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  auto t = [&](std::vector<float>& x, int64_t heads) {
    return a2d::HostTensor(x.data(), {1, n, heads, D}); };
  // ... q, k, v of the tokens attention.layout().tokens_of(world->rank()) ...
// usage.md end
  const std::vector<int64_t> tokens = attention.layout().tokens_of(world->rank());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < G * D; ++j) v[i * G * D + j] = static_cast<float>(tokens[i]);
// usage.md begin
  attention.forward(t(q, H), t(k, G), t(v, G), t(out, H), {lse.data(), {1, H, n}});
  attention.backward(t(q, H), t(k, G), t(v, G), t(out, H), t(d_out, H), {lse.data(), {1, H, n}},
                     t(dq, H), t(dk, G), t(dv, G));
// usage.md end
  for (int64_t i = 0; i < n; ++i) {
    const float expected = static_cast<float>(tokens[i]) / 2.0f;  // mean of 0..t
    if (std::fabs(out[i * H * D] - expected) > 1e-4f * (1 + expected) || dq[i * H * D] != 0) {
      std::printf("door: token %lld: %g, expected %g\n", static_cast<long long>(tokens[i]),
                  out[i * H * D], expected);
      return 1;
    }
  }
  if (mpi.rank() == 0) std::printf("door: %s, checked\n", attention.plan().describe().c_str());
  return 0;
}
