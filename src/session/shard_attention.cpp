// The C++ door (shard_attention.hpp): host arrays with their shapes in, checked on every rank
// together, then the Session's attention on them.
#include "attention2d/shard_attention.hpp"

#include <sstream>
#include <utility>

#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"

namespace a2d {
namespace {

std::string text(const std::vector<int64_t>& v) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  out << "]";
  return out.str();
}

// `t` checked against the shape this rank's array must have; its strides (dense where none were
// given) and the bytes from its first element to one past its last.
struct Checked {
  std::vector<int64_t> strides;
  int64_t bytes = 0;
};
Checked check_array(const HostTensor& t, const char* name, const std::vector<int64_t>& shape,
                    const char* dims, DType dtype, int64_t tokens) {
  A2D_REQUIRE(t.shape == shape, "the ", name, " array has shape ", text(t.shape),
              ", but this rank's ", name, " is ", text(shape), " (", dims, "; this rank holds ",
              tokens, " tokens: tokens())");
  A2D_REQUIRE(t.dtype == dtype, "the ", name, " array holds ", dtype_name(t.dtype), ", but ",
              name == std::string("LSE") ? "LSE is always fp32" : "the problem's dtype is ",
              name == std::string("LSE") ? "" : dtype_name(dtype));
  Checked c;
  c.strides = t.strides;
  if (c.strides.empty()) {
    c.strides.assign(shape.size(), 1);
    for (size_t i = shape.size() - 1; i-- > 0;) c.strides[i] = c.strides[i + 1] * shape[i + 1];
  }
  A2D_REQUIRE(c.strides.size() == shape.size(), "the ", name, " array has ", t.strides.size(),
              " strides for its ", shape.size(), " dimensions");
  for (const int64_t s : c.strides)
    A2D_REQUIRE(s >= 0, "the ", name, " array has a negative stride: ", text(c.strides));
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return c;  // no element: any pointer, no bytes
    last += (shape[i] - 1) * c.strides[i];
  }
  A2D_REQUIRE(t.data, "the ", name, " array is a null pointer (it holds ", text(shape),
              " elements)");
  c.bytes = (last + 1) * dtype_bytes(t.dtype);
  return c;
}

Plan resolved(Communicator& world, const Problem& problem, const PlanRequest& request,
              const TokenLayout* shards, std::string& chosen) {
  Plan plan;
  collective_check(world, [&] {
    problem.validate();
    if (shards) {
      const UserShards user{*shards, RelayoutBackward::stateless};  // what each call exchanges
      plan = resolve_plan(request, problem, world.size(), &chosen, &user);
    } else {
      plan = resolve_plan(request, problem, world.size(), &chosen);
    }
  });
  return plan;
}

}  // namespace

ShardAttention::ShardAttention(Communicator& world, const Problem& problem,
                               const PlanRequest& request, const TokenLayout* shards)
    : world_(world),
      checks_(world.split(0, world.rank())),
      session_(world, make_backend("cpu")) {
  const Plan plan = resolved(world, problem, request, shards, chosen_);
  attention_ = session_.attention(problem, plan, shards);
}

ShardAttention::ShardAttention(Communicator& world, const Problem& problem, const Plan& plan,
                               const TokenLayout* shards)
    : world_(world),
      checks_(world.split(0, world.rank())),
      session_(world, make_backend("cpu")),
      attention_(session_.attention(problem, plan, shards)) {}

ShardAttention::~ShardAttention() = default;

int64_t ShardAttention::tokens() const {
  return layout().count(world_.rank());
}

namespace {
// The call's arrays as tensors in host buffers of `backend`, checked on every rank of `comm`
// together.
struct Call {
  Call(Backend& backend, const Problem& p, int64_t n) : backend_(backend), p_(p), n_(n) {}

  TokenTensor tokens(const HostTensor& t, const char* name, int64_t heads) {
    const char* dims = heads == p_.heads ? "[batch, tokens, heads, head_dim]"
                                         : "[batch, tokens, kv_heads, head_dim]";
    const Checked c = check_array(t, name, {p_.batch, n_, heads, p_.head_dim}, dims, p_.dtype, n_);
    A2D_REQUIRE(c.strides[3] == 1, "the ", name, " array's head_dim stride is ", c.strides[3],
                ": each head's head_dim elements must be adjacent (stride 1)");
    buffers_.push_back(backend_.wrap_host(c.bytes ? t.data : nullptr, c.bytes));
    return {buffers_.back().get(), 0, p_.dtype, c.strides[0], c.strides[1], c.strides[2]};
  }
  RowTensor rows(const HostTensor& t) {
    const Checked c =
        check_array(t, "LSE", {p_.batch, p_.heads, n_}, "[batch, heads, tokens]", DType::f32, n_);
    buffers_.push_back(backend_.wrap_host(c.bytes ? t.data : nullptr, c.bytes));
    return {buffers_.back().get(), 0, c.strides[0], c.strides[1], c.strides[2]};
  }

 private:
  Backend& backend_;
  const Problem& p_;
  int64_t n_;
  std::vector<BufferPtr> buffers_;
};
}  // namespace

void ShardAttention::forward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                             const HostTensor& out, const HostTensor& lse, const float* sinks) {
  const Problem& p = problem();
  Call call(session_.backend(), p, tokens());
  ForwardShards s;
  collective_check(*checks_, [&] {
    s = {call.tokens(q, "Q", p.heads), call.tokens(k, "K", p.kv_heads),
         call.tokens(v, "V", p.kv_heads), call.tokens(out, "O", p.heads), call.rows(lse), sinks};
  });
  attention_->forward(s);
}

void ShardAttention::backward(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              const HostTensor& out, const HostTensor& d_out,
                              const HostTensor& lse, const HostTensor& dq, const HostTensor& dk,
                              const HostTensor& dv, const float* sinks, float* dsink) {
  const Problem& p = problem();
  Call call(session_.backend(), p, tokens());
  BackwardShards s;
  collective_check(*checks_, [&] {
    s = {call.tokens(q, "Q", p.heads),       call.tokens(k, "K", p.kv_heads),
         call.tokens(v, "V", p.kv_heads),    call.tokens(out, "O", p.heads),
         call.tokens(d_out, "dO", p.heads),  call.rows(lse),
         call.tokens(dq, "dQ", p.heads),     call.tokens(dk, "dK", p.kv_heads),
         call.tokens(dv, "dV", p.kv_heads),  sinks,
         dsink};
  });
  attention_->backward(s);
}

}  // namespace a2d
