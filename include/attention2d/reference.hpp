// attention2d: the plain double-precision attention that every test and --check compares with.
//
// Deliberately simple: one query row at a time, every score computed, no tiling. Dense layouts:
//   q, out, d_out, dq  [batch, q_tokens, heads, head_dim]
//   k, v, dk, dv       [batch, kv_tokens, kv_heads, head_dim]
//   lse                [batch, heads, q_tokens]
#pragma once

#include <cstdint>

#include "attention2d/kernel.hpp"

namespace a2d::reference {

struct Inputs {
  AttentionShape shape;
  Mask mask;
  double scale = 0.0;
  const double* q = nullptr;
  const double* k = nullptr;
  const double* v = nullptr;
  const int64_t* q_positions = nullptr;  // nullptr = 0, 1, 2, ...
  const int64_t* kv_positions = nullptr;
  int threads = 1;
  double softcap = 0.0;           // 0: off; else scores s -> softcap tanh(s / softcap)
  const double* sinks = nullptr;  // [heads] sink logits (kernel.hpp's add_sinks), or none
  // Called by the computing threads after each row (any thread; it must be thread-safe): the
  // reference of a long sequence runs for minutes, and a watchdog must see it progress
  // (Watchdog::heartbeat).
  void (*progress)() = nullptr;
};

void forward(const Inputs& in, double* out, double* lse);

// Gradients of sum(O * d_out); the reference derives softmax probabilities itself. With
// `out_for_delta` ([batch, q_tokens, heads, head_dim]) the backward's row correction is
// delta_i = rowsum(dO_i * out_i) of that O, as a backward that receives O in 16 bits computes it
// (every fused attention backward does), instead of the exact delta_i = sum_j P_ij dP_ij.
// With sinks, `dsink` (if not null) receives the sinks' gradient [heads]:
// -sum over batch and rows of exp(sink - LSE) delta.
void backward(const Inputs& in, const double* d_out, double* dq, double* dk, double* dv,
              const double* out_for_delta = nullptr, double* dsink = nullptr);

}  // namespace a2d::reference
