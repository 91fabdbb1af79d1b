// attention2d: moving token shards between two layouts of the same sequence over the same ranks,
// so that callers keep their own sharding (a contiguous slice per rank, possibly uneven; zigzag)
// while a plan computes in its own (cyclic for ATTENTION2D, zigzag or contiguous for Ring, ...).
//
// One all-to-all moves every tensor of a bundle. Each rank packs, for every other rank j, the rows
// of the tokens it holds in `from` that j holds in `to`, in increasing token order; a token's rows
// of all tensors travel together in one record (ExchangeRecord). Example, N = 10, P = 3, from
// contiguous to cyclic (layout.hpp's example):
//
//   rank   holds (contiguous)   sends to 0   to 1   to 2      holds after (cyclic)
//   0      0 1 2 3              0 3          1      2         0 3 6 9
//   1      4 5 6                6            4      5         1 4 7
//   2      7 8 9                9            7      8         2 5 8
//
// Rank 0 keeps tokens 0 and 3 (its own block: a local copy, not counted) and sends one token to
// each of ranks 1 and 2. With r the rank and c(r) its tokens in `from`, it sends
// (c(r) - |from(r) ∩ to(r)|) records in one message per other rank j with from(r) ∩ to(j) not
// empty: exchange_traffic, what the counting communicator counts and the cost model charges
// (docs/cost-model.md, "Relayout").
//
// The index maps (shared_tokens, exchange_plan, exchange_traffic) are pure functions of the two
// layouts, tested without MPI over thousands of virtual ranks; LayoutExchange runs them with a
// backend's operations and a communicator only, so it works on every backend (the fenced one
// included) and on tensors in any caller memory the backend holds (the CPU backend's wrap_host).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/exchange_maps.hpp"
#include "attention2d/layout.hpp"

namespace a2d {

// ---- The exchange on a backend ---------------------------------------------------------------

// Moves token rows between two layouts of the same N tokens over the same P ranks, in one
// all_to_all.
class LayoutExchange {
 public:
  // Collective only in that every rank must construct it with the same layouts (it communicates
  // nothing); uploads this rank's index maps to `backend`, which must outlive it.
  LayoutExchange(const TokenLayout& from, const TokenLayout& to, int rank, Backend& backend);

  // True when every rank holds the same tokens in both layouts: nothing would move (the same
  // answer on every rank). exchange() then only copies `from` to `to` where they differ.
  bool moves_nothing() const { return moves_nothing_; }

  // [batch, tokens, heads, width] shards: `from` holds this rank's tokens of the `from` layout,
  // `to` receives those of the `to` layout, each in increasing token order. Any strides, any
  // dtype, but the same dtype on both sides (the exchange moves elements, it does not convert).
  struct TokenMove {
    TokenTensor from, to;
    int64_t batch = 1, heads = 1, width = 0;
  };
  // fp32 [batch, heads, tokens] rows (LSE).
  struct RowMove {
    RowTensor from, to;
    int64_t batch = 1, heads = 1;
  };
  // Collective over `world` (its ranks = the layouts' parts; every rank passes the same number of
  // moves with the same batch, heads, width and dtypes): every tensor of the bundle in ONE
  // all_to_all of ExchangeRecord records, charged to phase `phase` (Communicator::set_phase, set
  // before the packing). `to` must not overlap `from` partly (the same tensor is fine). Only the
  // backend's operations touch the tensors; `world` is staged through host memory where the
  // backend's buffers are not host-accessible and `world` cannot move them itself.
  void exchange(Communicator& world, std::span<const TokenMove> tokens,
                std::span<const RowMove> rows, const std::string& phase) const;

  // Bytes and messages this rank sends in an exchange of `bytes_per_token` bytes per token
  // (comm.hpp's counting convention: nothing to itself, no message for an empty block).
  Traffic traffic(int64_t bytes_per_token) const;
  // The record bytes per token of a bundle (what traffic() takes for it).
  static int64_t record_bytes(std::span<const TokenMove> tokens, std::span<const RowMove> rows);

  const TokenLayout& from() const { return from_; }
  const TokenLayout& to() const { return to_; }
  int rank() const { return rank_; }

 private:
  TokenLayout from_;
  TokenLayout to_;
  int rank_ = 0;
  Backend& backend_;
  bool moves_nothing_ = false;
  ExchangePlan plan_;
  BufferPtr send_order_;  // plan_.send_order on the backend (null: the identity)
  BufferPtr recv_order_;
};

// ---- Attention on the caller's shards ---------------------------------------------------------

// The layout a plan computes in: cyclic over the world for ATTENTION2D (both variants) and the
// hybrid, the plan's layout (and stripe) for the others.
TokenLayout plan_layout(const Problem& problem, const Plan& plan);

// What the backward of an attention on the caller's shards moves:
//   saved      the Python layer: its forward keeps the plan-layout Q, K, V, O and LSE it exchanged,
//              so the backward moves dO in and dQ, dK, dV out;
//   stateless  make_attention(..., shards): only the caller's shards exist between the calls, so
//              the backward moves Q, K, V, O, dO and LSE in and dQ, dK, dV out.
// The forward moves Q, K, V in and O, LSE out in both.
enum class RelayoutBackward { saved, stateless };
RelayoutBackward parse_relayout_backward(const std::string& name);  // saved or stateless
std::string relayout_backward_name(RelayoutBackward backward);

// The caller's shards, for the cost model (cost_model.hpp, model.hpp): their layout (N = the
// problem's sequence, P = the plan's ranks) and which backward moves data; by default what
// make_attention(..., shards) does (stateless). The Python layer's backward is saved.
struct UserShards {
  TokenLayout layout;
  RelayoutBackward backward = RelayoutBackward::stateless;
};

// Record bytes per token of the four exchanges (exchange_record of their fields), with B, H,
// Hkv, D, e of the problem:
//   forward in    Q, K, V                 B (H + 2 Hkv) D e
//   forward out   O, LSE                  B H (D e + 4)                        (rounded up to 4)
//   backward in   saved:  dO              B H D e
//                 stateless: Q K V O dO LSE  B ((3 H + 2 Hkv) D e + 4 H)       (rounded up to 4)
//   backward out  dQ, dK, dV              B (H + 2 Hkv) D e
// (rounded up to 4 only changes anything in 16 bits with B·H·D odd).
struct RelayoutRecords {
  int64_t forward_in = 0, forward_out = 0, backward_in = 0, backward_out = 0;
};
RelayoutRecords relayout_records(const Problem& problem, RelayoutBackward backward);

// The phases the relayout's all-to-alls are charged to.
inline constexpr const char* kRelayoutForwardIn = "forward.relayout_in_all_to_all";
inline constexpr const char* kRelayoutForwardOut = "forward.relayout_out_all_to_all";
inline constexpr const char* kRelayoutBackwardIn = "backward.relayout_in_all_to_all";
inline constexpr const char* kRelayoutBackwardOut = "backward.relayout_out_all_to_all";

// A DistributedAttention whose layout() is `shards` (the caller's) and whose forward/backward
// exchange into the plan's layout and back (stateless: forward moves Q, K, V in and O, LSE out;
// backward moves Q, K, V, O, dO, LSE in and dQ, dK, dV out; sinks and dsink as in the plan's
// attention, which computes them on its own rows). When every rank holds the same tokens in both
// layouts it is the plain attention. Collective like make_attention: validation (the shards cover
// the problem's N tokens over the world's ranks) and agreement (check_agreement with the shards)
// before any data moves; disagreeing `shards` between ranks is a CollectiveError on every rank.
std::unique_ptr<DistributedAttention> make_attention(const Problem& problem, const Plan& plan,
                                                     Communicator& world, Backend& backend,
                                                     const TokenLayout& shards);

// check_agreement (attention.hpp) that also compares the shards' layout (kind, stripe, counts).
void check_agreement(Communicator& world, const Problem& problem, const Plan& plan,
                     const TokenLayout& shards);

}  // namespace a2d
