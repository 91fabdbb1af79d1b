// attention2d: deterministic inputs generated from (seed, tensor, global index).
//
// Every element is a pure function of the seed, the tensor it belongs to and its coordinates in
// the *global* tensor, so every rank and every grid sees identical data and any rank can check
// any block without communication (as nccl-tests does).
#pragma once

#include <cstdint>
#include <vector>

#include "attention2d/kernel.hpp"

namespace a2d {

enum class TensorTag : uint64_t { q = 1, k = 2, v = 3, d_out = 4, sink = 5 };

// Approximately standard normal; identical on every platform for the same arguments.
float generated_value(uint64_t seed, TensorTag tag, uint64_t global_index);

// Global shape of a generated [batch, tokens, heads, head_dim] tensor.
struct GlobalTokens {
  int64_t batch = 1;
  int64_t tokens = 0;
  int64_t heads = 1;
  int64_t head_dim = 0;
};

// Fills `out` ([batch, n, heads, head_dim]) with the rows whose global token indices are
// token_indices[0..n). nullptr means the rows 0..n-1. `amplitude` multiplies every value.
// `threads` OpenMP threads fill the rows (0: omp_get_max_threads()); the values are the same,
// bit for bit, for any number of threads.
void fill_generated(uint64_t seed, TensorTag tag, const GlobalTokens& global,
                    const int64_t* token_indices, int64_t n, TokenView<float> out,
                    float amplitude = 1.0f, int threads = 0);

// The whole global tensor, dense.
std::vector<float> generate_tokens(uint64_t seed, TensorTag tag, const GlobalTokens& global,
                                   float amplitude = 1.0f, int threads = 0);

// Sink logits [heads] (Problem::sinks): 1.5 + an approximately standard normal value per head,
// of the order of the LSE of a short document, so that the sinks take a visible share.
std::vector<float> generate_sinks(uint64_t seed, int64_t heads);

}  // namespace a2d
