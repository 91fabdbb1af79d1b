// attention2d: running decode end to end, for a2d decode, a2d bench --decode, the tests and the
// Python tests: generated tokens, their buffers, and the fp64 reference of the new tokens.
//
// Token t of a run of `total` tokens (prompt and every step) holds rows t of global Q, K, V
// tensors of `total` tokens generated from (seed, global index) (data.hpp) and rounded to the
// problem's dtype, so any rank can make and check any token without communication.
#pragma once

#include <cstdint>
#include <vector>

#include "attention2d/inference.hpp"

namespace a2d {

// The Q, K, V of some tokens (host fp32 copies and buffers of a backend in the problem's
// dtype), and their O and LSE once computed.
struct DecodeTokens {
  Problem problem;
  Backend* backend = nullptr;
  std::vector<int64_t> positions;
  std::vector<float> q, k, v;  // [batch, tokens, heads or kv_heads, head_dim], dtype values
  std::vector<float> out,
      lse;                   // after download(): [batch, tokens, heads, D], [batch, heads, tokens]
  std::vector<float> sinks;  // [heads] with Problem::sinks
  BufferPtr q_buffer, k_buffer, v_buffer, out_buffer, lse_buffer;

  int64_t tokens() const { return static_cast<int64_t>(positions.size()); }
  ForwardShards forward();
  DecodeShards decode();
  void download();
};

// The tokens at `positions` of a run of `total` tokens.
DecodeTokens make_decode_tokens(const Problem& problem, Backend& backend, uint64_t seed,
                                int64_t total, const std::vector<int64_t>& positions);

// Squared sums of the relative Frobenius errors of O and LSE (check.hpp's relative_error),
// added over tokens, steps and ranks before the square root.
struct DecodeErrors {
  double out_error = 0, out_norm = 0, lse_error = 0, lse_norm = 0;
  void add(const DecodeErrors& other);
  double out() const;  // sqrt(out_error / out_norm)
  double lse() const;
};

// The fp64 reference: the queries of some tokens against every key of the run with the
// problem's (causal) mask, i.e. against the whole sequence up to each of them.
class DecodeReference {
 public:
  DecodeReference(const Problem& problem, uint64_t seed, int64_t total);
  // The errors of `tokens`' downloaded outputs.
  DecodeErrors errors(const DecodeTokens& tokens, int threads = 1) const;

 private:
  Problem problem_;
  int64_t total_;
  std::vector<double> k_, v_, sinks_;
};

}  // namespace a2d
