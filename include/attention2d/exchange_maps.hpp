// attention2d: the index maps of an exchange between two layouts of the same N tokens over the
// same P parts (relayout.hpp shows the exchange with a worked example; LayoutExchange runs it).
// Pure functions of the two layouts, tested without MPI over thousands of virtual ranks; the
// ground floor (tests/layers/check_layers.py). src/layout/exchange_maps.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/traffic.hpp"

namespace a2d {

// ---- Index maps: pure functions of two layouts of the same N tokens over the same P parts ----

// |a(part_a) ∩ b(part_b)|: the tokens the two parts share. O(1) where one of the layouts is
// contiguous or zigzag; for two periodic layouts of stripes w1 < w2, O(lcm(w1, w2) / w2).
int64_t shared_tokens(const TokenLayout& a, int64_t part_a, const TokenLayout& b, int64_t part_b);
// Whether every part holds the same tokens in both, in O(P) (e.g. cyclic and striped(1), any two
// layouts over one part, contiguous_counts of the even split and contiguous).
bool same_assignment(const TokenLayout& a, const TokenLayout& b);

// What `part` sends and receives in the exchange from `from` to `to`.
struct ExchangePlan {
  std::vector<int64_t> send_counts;  // tokens to each part (P entries; its own block included)
  std::vector<int64_t> recv_counts;  // tokens from each part
  // Position s of the packed send records holds row send_order[s] of the part's `from` shard
  // (records grouped by destination, each group in increasing token order); empty: the identity.
  std::vector<int64_t> send_order;
  // Row m of the part's `to` shard is received record recv_order[m] (records grouped by source);
  // empty: the identity.
  std::vector<int64_t> recv_order;
};
ExchangePlan exchange_plan(const TokenLayout& from, const TokenLayout& to, int64_t part);

// Bytes and messages `part` sends in that exchange at `bytes_per_token` bytes per token, by the
// counting convention of comm.hpp (nothing to itself, no message for an empty block).
Traffic exchange_traffic(const TokenLayout& from, const TokenLayout& to, int64_t part,
                         int64_t bytes_per_token);

// The record one token's rows travel in: every field (a tensor's batch x heads x width elements,
// or an LSE's batch x heads fp32 values, per token) at an offset that is a multiple of its element
// size, fields of larger elements first, in the given order otherwise; the record is rounded up
// to its largest element size (so that the next record's fields are aligned too). E.g. bf16 O of
// B·H·D elements and fp32 LSE: LSE at 0, O at 4·B·H, 4·B·H + 2·B·H·D bytes, rounded up to 4.
struct ExchangeField {
  DType dtype = DType::f32;
  int64_t elements = 0;  // per token
};
struct ExchangeRecord {
  int64_t bytes = 0;             // per token
  std::vector<int64_t> offsets;  // of the fields, in their given order
};
ExchangeRecord exchange_record(std::span<const ExchangeField> fields);

}  // namespace a2d
