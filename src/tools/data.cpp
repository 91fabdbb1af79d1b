// Counter-based generation: a value is a hash of (seed, tensor, global index), so no state is
// carried between elements and any rank can produce any element.
#include "attention2d/tools/data.hpp"

#include <cmath>

#include <omp.h>

#include "attention2d/error.hpp"

namespace a2d {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1], from the top 53 bits.
double unit_interval(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

}  // namespace

float generated_value(uint64_t seed, TensorTag tag, uint64_t global_index) {
  const uint64_t stream = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(tag)));
  const uint64_t a = splitmix64(stream ^ (2 * global_index));
  const uint64_t b = splitmix64(stream ^ (2 * global_index + 1));
  // Box-Muller: one standard normal sample from two uniforms.
  const double radius = std::sqrt(-2.0 * std::log(unit_interval(a)));
  const double angle = 6.283185307179586 * unit_interval(b);
  return static_cast<float>(radius * std::cos(angle));
}

void fill_generated(uint64_t seed, TensorTag tag, const GlobalTokens& global,
                    const int64_t* token_indices, int64_t n, TokenView<float> out,
                    float amplitude, int threads) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t token = token_indices ? token_indices[i] : i;
    A2D_REQUIRE(token >= 0 && token < global.tokens, "generated token index ", token,
                " is outside the global sequence of ", global.tokens, " tokens");
  }
  // Each value depends only on (seed, tag, global index), so the rows can be filled in any order
  // by any number of threads with bit-identical results (test_data.cpp checks it). Below about
  // 64 Ki values a parallel region costs more than it saves.
  const int64_t values = global.batch * n * global.heads * global.head_dim;
  const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for collapse(2) schedule(static) num_threads(team) if (values >= (1 << 16))
  for (int64_t b = 0; b < global.batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t token = token_indices ? token_indices[i] : i;
      for (int64_t h = 0; h < global.heads; ++h) {
        float* row = out.at(b, i, h);
        const uint64_t base = static_cast<uint64_t>(
            ((b * global.tokens + token) * global.heads + h) * global.head_dim);
        for (int64_t d = 0; d < global.head_dim; ++d) {
          row[d] = amplitude * generated_value(seed, tag, base + static_cast<uint64_t>(d));
        }
      }
    }
  }
}

std::vector<float> generate_tokens(uint64_t seed, TensorTag tag, const GlobalTokens& global,
                                   float amplitude, int threads) {
  std::vector<float> data(
      static_cast<size_t>(global.batch * global.tokens * global.heads * global.head_dim));
  fill_generated(seed, tag, global, nullptr, global.tokens,
                 dense_tokens(data.data(), global.tokens, global.heads, global.head_dim),
                 amplitude, threads);
  return data;
}

std::vector<float> generate_sinks(uint64_t seed, int64_t heads) {
  std::vector<float> sinks(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h)
    sinks[static_cast<size_t>(h)] = 1.5f + generated_value(seed, TensorTag::sink, h);
  return sinks;
}

}  // namespace a2d
