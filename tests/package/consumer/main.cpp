// Uses the installed library: one causal attention over MPI on the CPU backend, checked. With
// q = k = 0 every visible key gets the same weight, so out[t] is the mean of v[0..t].
#include <attention2d/attention2d.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  a2d::MpiSession mpi(&argc, &argv);
  auto world = a2d::make_mpi_communicator(MPI_COMM_WORLD);
  auto backend = a2d::make_backend("cpu");
  a2d::Problem problem;
  problem.heads = problem.kv_heads = 2;
  problem.seq = 9;
  problem.head_dim = 4;
  problem.mask = a2d::Mask::causal();
  const a2d::Plan plan = a2d::default_plan(a2d::Algorithm::attention2d, problem, world->size());
  auto attention = a2d::make_attention(problem, plan, *world, *backend);
  const std::vector<int64_t> tokens = attention->layout().tokens_of(world->rank());
  const int64_t n = static_cast<int64_t>(tokens.size()), row = problem.heads * problem.head_dim;
  std::vector<float> zeros(n * row, 0.0f), v(n * row), out(n * row), lse(problem.heads * n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < row; ++j)
      v[i * row + j] = static_cast<float>(tokens[i]);
  auto wrap = [&](std::vector<float>& x) {
    return backend->wrap_host(x.data(), static_cast<int64_t>(x.size() * sizeof(float)));
  };
  auto qk_buffer = wrap(zeros), v_buffer = wrap(v), out_buffer = wrap(out), lse_buffer = wrap(lse);
  auto tensor = [&](a2d::Buffer& b) {
    return a2d::dense_token_tensor(b, a2d::DType::f32, n, problem.heads, problem.head_dim);
  };
  attention->forward({tensor(*qk_buffer), tensor(*qk_buffer), tensor(*v_buffer),
                      tensor(*out_buffer), a2d::dense_row_tensor(*lse_buffer, problem.heads, n)});
  for (int64_t i = 0; i < n; ++i) {
    const float expected = static_cast<float>(tokens[i]) / 2.0f;  // mean of 0..t
    if (std::fabs(out[i * row] - expected) > 1e-5f) {
      std::printf("consumer: token %lld: %g, expected %g\n", static_cast<long long>(tokens[i]),
                  out[i * row], expected);
      return 1;
    }
  }
  if (mpi.rank() == 0) std::printf("consumer: attention2d %s works\n", A2D_VERSION_STRING);
  return 0;
}
