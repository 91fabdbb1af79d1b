// attention2d._core's engines, internal to python/src (module.cpp includes it): Engine (one
// DistributedAttention through a Session, per problem, plan and transport) and DecoderEngine,
// with the ordering of a call on the caller's stream.
#pragma once

#include "transport.hpp"

namespace a2d::pymodule {

// Orders one call's operations on a device backend after the caller's stream's work so far, and
// the caller's stream's later work after them (backend.hpp, follow_stream / lead_stream): torch's
// current stream then sees the outputs without the host or the device waiting as a whole. Nothing
// on the host backends (synchronous).
class OnCallerStream {
 public:
  OnCallerStream(a2d::Backend& backend, uintptr_t stream)
      : backend_(backend), stream_(reinterpret_cast<void*>(stream)) {
    backend_.follow_stream(stream_);
  }
  ~OnCallerStream() {
    try {
      backend_.lead_stream(stream_);
    } catch (...) {  // a destructor must not throw; the call's own error is the one to report
    }
  }
  OnCallerStream(const OnCallerStream&) = delete;
  OnCallerStream& operator=(const OnCallerStream&) = delete;

 private:
  a2d::Backend& backend_;
  void* stream_;
};

// The engine's backend on `device` ("cpu", "cuda:N", or "fenced-cuda" standing in for a GPU in
// tests) and its world: a duplicate of the transport, or with `nccl` the project's NCCL
// communicator on the backend's GPU, bootstrapped through the transport (which keeps carrying the
// host operations: group_comm.hpp, make_nccl_communicator).
inline std::unique_ptr<a2d::Communicator> engine_world(Transport& transport, a2d::Backend& backend,
                                                       bool nccl) {
  if (!nccl) return transport.duplicate();
  py::gil_scoped_release release;
  return a2d::make_nccl_communicator(transport.duplicate(), backend);
}

// One distributed attention of a fixed problem and plan over a transport, on the backend of the
// caller's tensors' device (cpu, or cuda:N for torch CUDA tensors).
// With the caller's layout (`shards`: contiguous with counts, zigzag, cyclic) different from the
// plan's, exchange_in() moves tensors from the caller's layout into the plan's and
// exchange_out() back, each in one all-to-all (relayout.hpp); forward() and backward() take
// plan-layout shards.
// The engine's Session (attention2d/session.hpp): its world a duplicate of the transport (or the
// NCCL communicator over it), its backend on `device`; the watchdog is the transport's.
inline std::unique_ptr<a2d::Session> engine_session(Transport& transport, const std::string& device,
                                                    bool nccl) {
  std::unique_ptr<a2d::Backend> backend = a2d::make_backend(device);
  std::unique_ptr<a2d::Communicator> world = engine_world(transport, *backend, nccl);
  return std::make_unique<a2d::Session>(std::move(world), std::move(backend));
}

class Engine {
 public:
  Engine(const a2d::Problem& problem, const a2d::Plan& plan, Transport& transport,
         const std::string& device = "cpu", bool nccl = false) {
    CallScope scope;
    session_ = engine_session(transport, device, nccl);
    a2d::set_error_rank(session_->world().rank());
    // Collective, before any buffer exists: refused on every rank when a host cannot hold what a
    // forward call allocates (attention2d/memory_check.hpp); the backward's at its first call.
    // A device backend's buffers are not the host's (every rank agrees: the device kind is
    // checked collectively before an engine is made).
    if (session_->backend().host_accessible())
      a2d::check_memory(session_->world(), a2d::attention_memory_check(problem, plan, false));
    attention_ = session_->attention(problem, plan);
  }

  // slots: engine rank e holds the caller's shard slots[e] (empty: the identity; transport.hpp,
  // caller_layout).
  Engine(const a2d::Problem& problem, const a2d::Plan& plan, Transport& transport,
         const std::string& kind, const std::vector<int64_t>& counts,
         const std::string& device = "cpu", bool nccl = false,
         const std::vector<int64_t>& slots = {})
      : Engine(problem, plan, transport, device, nccl) {
    CallScope scope;
    const a2d::TokenLayout shards = caller_layout(kind, counts, problem.seq, size(), slots);
    const a2d::TokenLayout& planned = attention_->layout();
    to_plan_ = session_->relayout(shards, planned);
    if (to_plan_) to_user_ = session_->relayout(planned, shards);
  }

  const a2d::Problem& problem() const { return attention_->problem(); }
  const a2d::Plan& plan() const { return attention_->plan(); }
  int rank() const { return session_->world().rank(); }
  int size() const { return session_->world().size(); }
  std::vector<int64_t> tokens(int part) const { return attention_->layout().tokens_of(part); }
  bool exchanges() const { return to_plan_ != nullptr; }
  int64_t plan_tokens() const { return attention_->layout().count(rank()); }

  // Token tensors [batch, tokens, heads, width] and fp32 rows [batch, heads, tokens], each pair
  // (caller's layout, plan's layout) for exchange_in and (plan's, caller's) for exchange_out.
  // backward: whether the exchange belongs to the backward (the phase it is charged to).
  // stream: the caller's stream (torch's current cudaStream_t; 0 on the CPU) the call is ordered
  // after and before (OnCallerStream).
  void exchange_in(const TensorPairs& tokens, const TensorPairs& rows, bool backward,
                   uintptr_t stream) {
    exchange(*to_plan_, tokens, rows, backward ? a2d::kRelayoutBackwardIn : a2d::kRelayoutForwardIn,
             stream);
  }
  void exchange_out(const TensorPairs& tokens, const TensorPairs& rows, bool backward,
                    uintptr_t stream) {
    exchange(*to_user_, tokens, rows,
             backward ? a2d::kRelayoutBackwardOut : a2d::kRelayoutForwardOut, stream);
  }
  std::string device() const { return session_->backend().name(); }

  // sinks: the address of the sinks' fp32 logits [heads] (0 without sinks); dsink: where the
  // backward writes their gradient [heads] (the sum over every rank's rows).
  void forward(const py::tuple& q, const py::tuple& k, const py::tuple& v, const py::tuple& out,
               const py::tuple& lse, uintptr_t sinks, uintptr_t stream) {
    Wrapped w(session_->backend());
    a2d::ForwardShards s;
    wrap_common(w, s, q, k, v, out, lse, sinks);
    CallScope scope;
    py::gil_scoped_release release;
    OnCallerStream ordered(session_->backend(), stream);
    attention_->forward(s);
  }

  void backward(const py::tuple& q, const py::tuple& k, const py::tuple& v, const py::tuple& out,
                const py::tuple& d_out, const py::tuple& lse, const py::tuple& dq,
                const py::tuple& dk, const py::tuple& dv, uintptr_t sinks, uintptr_t dsink,
                uintptr_t stream) {
    Wrapped w(session_->backend());
    a2d::BackwardShards s;
    wrap_common(w, s, q, k, v, out, lse, sinks);
    s.d_out = w.token(host_tensor(d_out, 4, "d_out"));
    s.dq = w.token(host_tensor(dq, 4, "dq"));
    s.dk = w.token(host_tensor(dk, 4, "dk"));
    s.dv = w.token(host_tensor(dv, 4, "dv"));
    s.dsink = reinterpret_cast<float*>(dsink);
    CallScope scope;
    py::gil_scoped_release release;
    OnCallerStream ordered(session_->backend(), stream);
    if (!backward_checked_ && session_->backend().host_accessible()) {
      a2d::check_memory(session_->world(), a2d::attention_memory_check(problem(), plan(), true));
      backward_checked_ = true;
    }
    attention_->backward(s);
  }

 private:
  void exchange(a2d::LayoutExchange& exchange, const TensorPairs& tokens, const TensorPairs& rows,
                const std::string& phase, uintptr_t stream) {
    A2D_REQUIRE(to_plan_ != nullptr,
                "this engine's shards are in the plan's layout: nothing to "
                "exchange");
    Wrapped w(session_->backend());
    std::vector<a2d::LayoutExchange::TokenMove> token_moves;
    for (const auto& [from, to] : tokens) {
      const HostTensor f = host_tensor(from, 4, "from"), t = host_tensor(to, 4, "to");
      a2d::LayoutExchange::TokenMove move;
      move.from = w.token(f);
      move.to = w.token(t);
      move.batch = f.shape[0];
      move.heads = f.shape[2];
      move.width = f.shape[3];
      token_moves.push_back(move);
    }
    std::vector<a2d::LayoutExchange::RowMove> row_moves;
    for (const auto& [from, to] : rows) {
      const HostTensor f = host_tensor(from, 3, "from"), t = host_tensor(to, 3, "to");
      a2d::LayoutExchange::RowMove move;
      move.from = w.row(f);
      move.to = w.row(t);
      move.batch = f.shape[0];
      move.heads = f.shape[1];
      row_moves.push_back(move);
    }
    CallScope scope;
    py::gil_scoped_release release;
    OnCallerStream ordered(session_->backend(), stream);
    exchange.exchange(session_->world(), token_moves, row_moves, phase);
  }

  std::unique_ptr<a2d::Session> session_;
  std::unique_ptr<a2d::DistributedAttention> attention_;
  std::unique_ptr<a2d::LayoutExchange> to_plan_, to_user_;
  bool backward_checked_ = false;  // the backward's memory check, made at its first call
};

// A prefill and its decode steps (inference.hpp) over a transport, on the CPU backend: the KV
// cache lives in the decoder; prefill() and step() read the caller's tensors in place.
class DecoderEngine {
 public:
  DecoderEngine(const a2d::Problem& problem, const a2d::Plan& plan, Transport& transport,
                int64_t capacity) {
    CallScope scope;
    session_ = engine_session(transport, "cpu", false);
    a2d::set_error_rank(rank());
    a2d::check_memory(session_->world(), a2d::decoder_memory_check(problem, plan, capacity));
    decoder_ = session_->decoder(problem, plan, capacity);
  }

  int rank() const { return session_->world().rank(); }
  int size() const { return session_->world().size(); }
  std::vector<int64_t> prompt_tokens(int part) const {
    return decoder_->prompt_layout().tokens_of(part);
  }
  // The next step of `tokens` tokens: {"first_position", "owners", "counts", "positions" (this
  // rank's)}.
  py::dict next_step(int64_t tokens) const {
    const a2d::DecodeStep step = decoder_->next_step(tokens);
    py::dict d;
    d["first_position"] = step.first_position;
    d["owners"] = step.owners;
    d["counts"] = step.counts;
    d["positions"] = step.positions_of(rank());
    return d;
  }

  void prefill(const py::tuple& q, const py::tuple& k, const py::tuple& v, const py::tuple& out,
               const py::tuple& lse, uintptr_t sinks) {
    Wrapped w(session_->backend());
    a2d::ForwardShards s;
    wrap_common(w, s, q, k, v, out, lse, sinks);
    CallScope scope;
    py::gil_scoped_release release;
    decoder_->prefill(s);
  }

  void step(int64_t tokens, const py::tuple& q, const py::tuple& k, const py::tuple& v,
            const py::tuple& out, const py::tuple& lse, uintptr_t sinks) {
    Wrapped w(session_->backend());
    a2d::DecodeShards s;
    // A rank that owns none of the step's tokens passes tensors of no tokens (whose strides
    // numpy may give as 0): the decoder reads none of them then.
    const HostTensor hq = host_tensor(q, 4, "q");
    if (hq.shape[1] > 0) wrap_common(w, s, q, k, v, out, lse, sinks);
    s.sinks = reinterpret_cast<const float*>(sinks);
    CallScope scope;
    py::gil_scoped_release release;
    decoder_->step(tokens, s);
  }

  int64_t sequence() const { return decoder_->sequence(); }
  std::vector<int64_t> counts() const { return decoder_->cached_counts(); }
  std::vector<int64_t> positions() const { return decoder_->positions(); }
  int64_t capacity() const { return decoder_->capacity(); }
  int64_t reallocations() const { return decoder_->reallocations(); }

 private:
  std::unique_ptr<a2d::Session> session_;
  std::unique_ptr<a2d::DistributedDecoder> decoder_;
};

}  // namespace a2d::pymodule
