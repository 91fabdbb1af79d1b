// The checks of a call's shards, and the wrapper that runs them on every rank together before any
// data moves (attention.hpp: make_attention returns it).
//
// A tensor is a buffer, a byte offset and strides; its dimensions come from the problem and the
// rank's share of the layout. Three things can be wrong with it that the data movement would
// otherwise meet halfway through a collective, on one rank only (and the others would wait for
// that rank forever): it is not there (no buffer, another backend's buffer, another dtype), it
// reaches past its buffer, or two of its elements share an address (strides of a tensor made for
// fewer heads or tokens: reads give a silently wrong result, writes overwrite each other).
#include <array>
#include <memory>
#include <span>
#include <sstream>
#include <string>

#include "algorithms/algorithms.hpp"
#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"

namespace a2d {
namespace {

struct Dim {
  const char* name;
  int64_t size;
  int64_t stride;  // elements
};

std::string describe(const char* name, std::span<const Dim> dims) {
  std::ostringstream out;
  out << "the " << name << " shard [";
  for (size_t i = dims.size(); i-- > 0;) out << dims[i].size << (i ? ", " : "]");
  out << " (strides";
  for (size_t i = dims.size(); i-- > 0;)
    out << " " << dims[i].name << " " << dims[i].stride << (i ? "," : ")");
  return out.str();
}

// `dims` innermost first. Throws unless the strides are not negative, no two elements share an
// address and every element lies inside `buffer` from `offset` on.
void check_extent(const char* name, const Buffer& buffer, int64_t offset, int64_t element_bytes,
                  std::span<const Dim> dims) {
  for (const Dim& d : dims)
    A2D_REQUIRE(d.stride >= 0, describe(name, dims), " has a negative ", d.name, " stride");
  A2D_REQUIRE(offset >= 0, describe(name, dims), " starts at byte offset ", offset,
              ", before its buffer");
  for (const Dim& d : dims)
    if (d.size == 0) return;  // no element: nothing to reach
  // Sorted by stride, each dimension that repeats must step past everything the dimensions
  // below it span (the condition under which distinct indices give distinct addresses).
  std::array<Dim, 4> order{};
  size_t n = 0;
  for (const Dim& d : dims) {
    if (d.size <= 1 || n == order.size()) continue;
    size_t i = n++;  // insertion by stride: at most four dimensions
    for (; i > 0 && order[i - 1].stride > d.stride; --i) order[i] = order[i - 1];
    order[i] = d;
  }
  // Distances in elements; a sum or product past 2^63 is as far past any buffer as it gets.
  int64_t span = 0;  // the last element's distance from the first
  bool huge = false;
  for (size_t i = 0; i < n && !huge; ++i) {
    A2D_REQUIRE(order[i].stride > span, describe(name, dims), " lays two elements at one address: ",
                "its ", order[i].name, " stride ", order[i].stride,
                " does not step past the ", span + 1,
                " elements its smaller strides span (made for fewer heads, tokens or a shorter ",
                "head_dim than the problem's?)");
    int64_t step = 0;
    huge = __builtin_mul_overflow(order[i].size - 1, order[i].stride, &step) ||
           __builtin_add_overflow(span, step, &span);
  }
  int64_t end = 0;
  huge = huge || __builtin_mul_overflow(span + 1, element_bytes, &end) ||
         __builtin_add_overflow(end, offset, &end);
  A2D_REQUIRE(!huge && end <= buffer.bytes(), describe(name, dims), " at byte offset ", offset,
              " ends at byte ", huge ? std::string("beyond 2^63") : std::to_string(end),
              ", past the end of its buffer of ", buffer.bytes(), " bytes");
}

void check_buffer(const Backend& backend, const Buffer* buffer, const char* name) {
  A2D_REQUIRE(buffer, "the ", name, " shard has no buffer");
  A2D_REQUIRE(&buffer->backend() == &backend, "the ", name, " shard is a buffer of the ",
              buffer->backend().name(), " backend, but the attention computes with the ",
              backend.name(), " backend");
}

void check_type(const Problem& problem, const Backend& backend, const TokenTensor& t,
                const char* name) {
  check_buffer(backend, t.buffer, name);
  A2D_REQUIRE(t.dtype == problem.dtype, "the ", name, " shard holds ", dtype_name(t.dtype),
              " but the problem's dtype is ", dtype_name(problem.dtype));
}

void check_tokens(const Problem& problem, const Backend& backend, int64_t tokens, int64_t heads,
                  const TokenTensor& t, const char* name) {
  check_type(problem, backend, t, name);
  const Dim dims[4] = {{"head_dim", problem.head_dim, 1},
                       {"head", heads, t.head_stride},
                       {"token", tokens, t.token_stride},
                       {"batch", problem.batch, t.batch_stride}};
  check_extent(name, *t.buffer, t.offset, dtype_bytes(t.dtype), dims);
}

void check_rows(const Problem& problem, const Backend& backend, int64_t tokens,
                const RowTensor& t, const char* name) {
  check_buffer(backend, t.buffer, name);
  const Dim dims[3] = {{"token", tokens, t.token_stride},
                       {"head", problem.heads, t.head_stride},
                       {"batch", problem.batch, t.batch_stride}};
  check_extent(name, *t.buffer, t.offset, static_cast<int64_t>(sizeof(float)), dims);
}

// Checks every call of `inner` with check_shards on every rank of a private copy of `world` and
// raises what any rank found on all of them (collective_check: one all-reduce when all is well).
class CheckedCalls final : public DistributedAttention {
 public:
  CheckedCalls(std::unique_ptr<DistributedAttention> inner, Communicator& world)
      : inner_(std::move(inner)), comm_(world.split(0, world.rank())) {}

  const Problem& problem() const override { return inner_->problem(); }
  const Plan& plan() const override { return inner_->plan(); }
  const TokenLayout& layout() const override { return inner_->layout(); }
  Backend& backend() const override { return inner_->backend(); }

  void forward(const ForwardShards& shards) override {
    comm_->set_phase(kCheckForwardPhase);
    collective_check(*comm_, [&] { check_shards(problem(), backend(), tokens(), shards); });
    inner_->forward(shards);
  }
  void backward(const BackwardShards& shards) override {
    comm_->set_phase(kCheckBackwardPhase);
    collective_check(*comm_, [&] { check_shards(problem(), backend(), tokens(), shards); });
    inner_->backward(shards);
  }

 private:
  int64_t tokens() const { return layout().count(comm_->rank()); }

  std::unique_ptr<DistributedAttention> inner_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace

void check_shards(const Problem& problem, const Backend& backend, int64_t tokens,
                  const ForwardShards& s) {
  check_tokens(problem, backend, tokens, problem.heads, s.q, "Q");
  check_tokens(problem, backend, tokens, problem.kv_heads, s.k, "K");
  check_tokens(problem, backend, tokens, problem.kv_heads, s.v, "V");
  check_tokens(problem, backend, tokens, problem.heads, s.out, "O");
  check_rows(problem, backend, tokens, s.lse, "LSE");
  A2D_REQUIRE(!problem.sinks || s.sinks,
              "the problem has attention sinks but ForwardShards::sinks is null");
}

void check_shards(const Problem& problem, const Backend& backend, int64_t tokens,
                  const BackwardShards& s) {
  check_tokens(problem, backend, tokens, problem.heads, s.q, "Q");
  check_tokens(problem, backend, tokens, problem.kv_heads, s.k, "K");
  check_tokens(problem, backend, tokens, problem.kv_heads, s.v, "V");
  check_tokens(problem, backend, tokens, problem.heads, s.out, "O");
  check_tokens(problem, backend, tokens, problem.heads, s.d_out, "dO");
  check_rows(problem, backend, tokens, s.lse, "LSE");
  check_tokens(problem, backend, tokens, problem.heads, s.dq, "dQ");
  check_tokens(problem, backend, tokens, problem.kv_heads, s.dk, "dK");
  check_tokens(problem, backend, tokens, problem.kv_heads, s.dv, "dV");
  A2D_REQUIRE(!problem.sinks || (s.sinks && s.dsink),
              "the problem has attention sinks but BackwardShards::sinks or ::dsink is null");
}

namespace algorithms {

void check_shard_types(const Problem& problem, const Backend& backend, const ForwardShards& s) {
  check_type(problem, backend, s.q, "Q");
  check_type(problem, backend, s.k, "K");
  check_type(problem, backend, s.v, "V");
  check_type(problem, backend, s.out, "O");
  check_buffer(backend, s.lse.buffer, "LSE");
}

void check_shard_types(const Problem& problem, const Backend& backend, const BackwardShards& s) {
  check_type(problem, backend, s.q, "Q");
  check_type(problem, backend, s.k, "K");
  check_type(problem, backend, s.v, "V");
  check_type(problem, backend, s.out, "O");
  check_type(problem, backend, s.d_out, "dO");
  check_buffer(backend, s.lse.buffer, "LSE");
  check_type(problem, backend, s.dq, "dQ");
  check_type(problem, backend, s.dk, "dK");
  check_type(problem, backend, s.dv, "dV");
}

std::unique_ptr<DistributedAttention> with_checked_calls(
    std::unique_ptr<DistributedAttention> attention, Communicator& world) {
  return std::make_unique<CheckedCalls>(std::move(attention), world);
}

}  // namespace algorithms
}  // namespace a2d
