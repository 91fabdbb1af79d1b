// attention2d: the C++ door. One object per attention layer, built collectively from the ranks, the
// problem and a plan request (or a plan); its forward and backward take this rank's shards as host
// arrays with their shapes:
//
//   a2d::ShardAttention attention(*world, problem);  // the plan a2d run would choose
//   const int64_t n = attention.tokens();            // this rank's tokens (layout() says which)
//   std::vector<float> q(n * H * D), k(n * Hkv * D), v(n * Hkv * D), out(n * H * D), lse(H * n);
//   attention.forward({q.data(), {1, n, H, D}}, {k.data(), {1, n, Hkv, D}},
//                     {v.data(), {1, n, Hkv, D}}, {out.data(), {1, n, H, D}},
//                     {lse.data(), {1, H, n}});
//
// Every call checks each array's shape, dtype, strides and pointer against the problem and this
// rank's token count, on every rank together before any data moves: a bad argument on one rank is
// the same CollectiveError on all of them (collective.hpp), never a hang. The arrays are computed
// on by the CPU backend in place; outputs are written, inputs only read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/session.hpp"

namespace a2d {

// A caller's array: `shape` [batch, tokens, heads, head_dim] (Q, K, V, O and their gradients) or
// [batch, heads, tokens] (LSE, always fp32); `strides` in elements, one per dimension, empty for
// dense row-major.
struct HostTensor {
  HostTensor(const void* memory, std::vector<int64_t> dims, DType type = DType::f32,
             std::vector<int64_t> steps = {})
      : data(const_cast<void*>(memory)),
        shape(std::move(dims)),
        strides(std::move(steps)),
        dtype(type) {}
  void* data;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DType dtype;
};

class ShardAttention {
 public:
  // Collective over `world` (kept by reference: it must outlive this). The plan: `request`
  // resolved as a2d run resolves its options (resolve_plan: what it leaves empty the cost model
  // chooses, with this machine's calibration where there is one), or `plan` as given. `shards`:
  // the caller's layout, whose tokens each call exchanges to the plan's and back (relayout.hpp,
  // stateless; the planner charges those exchanges); null: the plan's own layout. A refusal on
  // any rank (the problem, the request, ranks that disagree) is a CollectiveError on every rank.
  ShardAttention(Communicator& world, const Problem& problem, const PlanRequest& request = {},
                 const TokenLayout* shards = nullptr);
  ShardAttention(Communicator& world, const Problem& problem, const Plan& plan,
                 const TokenLayout* shards = nullptr);
  ~ShardAttention();
  ShardAttention(const ShardAttention&) = delete;
  ShardAttention& operator=(const ShardAttention&) = delete;

  const Problem& problem() const { return attention_->problem(); }
  const Plan& plan() const { return attention_->plan(); }
  // How the plan was chosen ("plan chosen by the cost model (...)"), or "" where it was given.
  const std::string& chosen() const { return chosen_; }
  // Which global tokens each rank's shards hold, and how many this rank's do.
  const TokenLayout& layout() const { return attention_->layout(); }
  int64_t tokens() const;

  // O and LSE of this rank's tokens. With Problem::sinks, `sinks` is [heads] fp32 logits.
  void forward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
               const HostTensor& out, const HostTensor& lse, const float* sinks = nullptr);
  // dQ, dK, dV of this rank's tokens from the forward's O and LSE and the gradient dO; with
  // Problem::sinks, the sinks' gradient [heads] into `dsink` (the same on every rank).
  void backward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                const HostTensor& out, const HostTensor& d_out, const HostTensor& lse,
                const HostTensor& dq, const HostTensor& dk, const HostTensor& dv,
                const float* sinks = nullptr, float* dsink = nullptr);

 private:
  Communicator& world_;
  std::unique_ptr<Communicator> checks_;  // the calls' shape checks, apart from the caller's
  Session session_;
  std::string chosen_;
  std::unique_ptr<DistributedAttention> attention_;
};

}  // namespace a2d
