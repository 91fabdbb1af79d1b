// attention2d: the attention problem, a plain value: its shapes, its mask and its element type.
//
// The ground floor of the library (tests/layers/check_layers.py): this header includes nothing
// of the project but other values (dtype.hpp, mask.hpp, error.hpp).
//   Problem         the global problem every rank agrees on (batch, heads, K/V heads, sequence,
//                   head dim, mask, scale, dtype, sinks, softcap)
//   AttentionShape  one local kernel call's shape (q_tokens x kv_tokens rows of a problem)
//   RowsShape       a set of rows for the merge functions [batch, tokens, heads, head_dim]
// and the mask helpers that count and classify (query, key) pairs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/mask.hpp"

namespace a2d {

// Document lengths from text: "100,3000,17", "@file" (lengths separated by commas, spaces or
// newlines), or a generated mix of `seq` tokens: "skewed[:SEED]" or "heavy[:SEED]" (seed 1 by
// default; generated_document_lengths). Throws a2d::Error naming the bad entry.
std::vector<int64_t> parse_document_lengths(const std::string& text, int64_t seq);
std::vector<int64_t> generated_document_lengths(const std::string& kind, int64_t seq,
                                                uint64_t seed);

// How a block of queries (positions in [q_min, q_max]) relates to a block of keys
// (MaskView::classify).
inline BlockVisibility classify_block(const Mask& mask, int64_t q_min, int64_t q_max, int64_t k_min,
                                      int64_t k_max) {
  return mask.view().classify(q_min, q_max, k_min, k_max);
}

// Number of (query, key) pairs the mask leaves visible, per batch and head. This is what the
// FLOP counts use: forward 4 * pairs * head_dim per head, backward 2.5 times that.
int64_t count_visible_pairs(const Mask& mask, const int64_t* q_positions, int64_t q_tokens,
                            const int64_t* kv_positions, int64_t kv_tokens);

struct AttentionShape {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t q_tokens = 0;
  int64_t kv_tokens = 0;
  int64_t head_dim = 0;

  int64_t group_size() const { return heads / kv_heads; }  // query heads per K/V head
  int64_t kv_head_of(int64_t head) const { return head / group_size(); }
  // Zero tokens are allowed (a rank may own nothing); everything else must be positive and
  // heads a multiple of kv_heads.
  void validate() const;
  std::string describe() const;
};

float default_scale(int64_t head_dim);  // 1 / sqrt(head_dim)

// Shape of a set of rows for the merge functions: [batch, tokens, heads, head_dim].
struct RowsShape {
  int64_t batch = 1;
  int64_t tokens = 0;
  int64_t heads = 1;
  int64_t head_dim = 0;
};

struct Problem {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t seq = 0;
  int64_t head_dim = 0;
  Mask mask;
  float scale = 0.0f;  // 0: 1/sqrt(head_dim)
  // Element type of Q, K, V, O, dO, dQ, dK, dV (the shards and what is sent of them); row
  // statistics and partial sums are fp32 whatever it is (dtype.hpp).
  DType dtype = DType::f32;
  // Attention sinks (kernel.hpp's add_sinks): the forward then needs ForwardShards::sinks and
  // the backward BackwardShards::sinks and ::dsink.
  bool sinks = false;
  // Logit softcapping: scaled scores s -> softcap * tanh(s / softcap); 0 = off.
  float softcap = 0.0f;

  float softmax_scale() const;
  void validate() const;  // throws a2d::Error saying what to change
  std::string describe() const;
  // Shape of a local kernel call on q_tokens x kv_tokens rows of this problem.
  AttentionShape local_shape(int64_t q_tokens, int64_t kv_tokens) const;
};

}  // namespace a2d
