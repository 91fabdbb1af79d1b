// Exchanges between the caller's shards and a plan's layout (relayout.hpp): LayoutExchange on a
// backend, and the attention that wraps a plan's with one exchange in and one out per call.
#include "attention2d/relayout.hpp"

#include <vector>

#include "algorithms.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "core/enum_names.hpp"

namespace a2d {
namespace {

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

// A communicator that forwards everything to one it does not own: lets a call stage the
// caller's communicator for one exchange (make_staged_communicator takes ownership).
class Borrowed final : public Communicator {
 public:
  explicit Borrowed(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return inner_.split(color, key);
  }
  RequestPtr all_gather_async(Place send, Place recv, std::span<const int64_t> bytes) override {
    return inner_.all_gather_async(send, recv, bytes);
  }
  RequestPtr reduce_scatter_async(Place send, Place recv, std::span<const int64_t> counts,
                                  int64_t record, Reduction reduction) override {
    return inner_.reduce_scatter_async(send, recv, counts, record, reduction);
  }
  RequestPtr send_recv_async(Place send, int64_t send_bytes, int dest, Place recv,
                             int64_t recv_bytes, int source, int tag) override {
    return inner_.send_recv_async(send, send_bytes, dest, recv, recv_bytes, source, tag);
  }
  RequestPtr all_to_all_async(Place send, std::span<const int64_t> send_bytes, Place recv,
                              std::span<const int64_t> recv_bytes) override {
    return inner_.all_to_all_async(send, send_bytes, recv, recv_bytes);
  }
  void all_gather(Place send, Place recv, std::span<const int64_t> bytes) override {
    inner_.all_gather(send, recv, bytes);
  }
  void reduce_scatter(Place send, Place recv, std::span<const int64_t> counts, int64_t record,
                      Reduction reduction) override {
    inner_.reduce_scatter(send, recv, counts, record, reduction);
  }
  void all_to_all(Place send, std::span<const int64_t> send_bytes, Place recv,
                  std::span<const int64_t> recv_bytes) override {
    inner_.all_to_all(send, send_bytes, recv, recv_bytes);
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    inner_.broadcast(data, bytes, root);
  }
  void all_reduce(float* data, int64_t count, Reduction reduction) override {
    inner_.all_reduce(data, count, reduction);
  }
  void all_reduce(double* data, int64_t count, Reduction reduction) override {
    inner_.all_reduce(data, count, reduction);
  }
  void all_reduce(int64_t* data, int64_t count, Reduction reduction) override {
    inner_.all_reduce(data, count, reduction);
  }
  void barrier() override { inner_.barrier(); }
  void progress() override { inner_.progress(); }
  void set_phase(const std::string& phase) override { inner_.set_phase(phase); }
  bool moves_backend_buffers() const override { return inner_.moves_backend_buffers(); }

 private:
  Communicator& inner_;
};

std::vector<ExchangeField> fields_of(std::span<const LayoutExchange::TokenMove> tokens,
                                     std::span<const LayoutExchange::RowMove> rows) {
  std::vector<ExchangeField> fields;
  for (const auto& m : tokens)
    fields.push_back({m.from.dtype, m.batch * m.heads * m.width});
  for (const auto& m : rows)
    fields.push_back({DType::f32, m.batch * m.heads});
  return fields;
}

bool same_tensor(const TokenTensor& a, const TokenTensor& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.dtype == b.dtype &&
         a.batch_stride == b.batch_stride && a.token_stride == b.token_stride &&
         a.head_stride == b.head_stride;
}
bool same_rows(const RowTensor& a, const RowTensor& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.batch_stride == b.batch_stride &&
         a.head_stride == b.head_stride && a.token_stride == b.token_stride;
}

void require_buffer(const Backend& backend, Buffer* buffer, int64_t tokens, const char* side,
                    size_t index, const char* kind) {
  if (tokens == 0) return;  // an empty shard may have no memory at all
  A2D_REQUIRE(buffer, "exchange: ", kind, " ", index, " has no ", side, " buffer");
  A2D_REQUIRE(&buffer->backend() == &backend, "exchange: the ", side, " of ", kind, " ", index,
              " is a buffer of the ", buffer->backend().name(),
              " backend, but the exchange runs on ", backend.name());
}

}  // namespace

// ---- LayoutExchange ---------------------------------------------------------------------------

LayoutExchange::LayoutExchange(const TokenLayout& from, const TokenLayout& to, int rank,
                               Backend& backend)
    : from_(from), to_(to), rank_(rank), backend_(backend) {
  A2D_REQUIRE(from.tokens() == to.tokens() && from.parts() == to.parts(), "exchange from ",
              from.describe(), " to ", to.describe(),
              ": the layouts must split the same tokens over the same ranks");
  A2D_REQUIRE(rank >= 0 && rank < from.parts(), "exchange: rank ", rank, " is outside 0..",
              from.parts() - 1);
  moves_nothing_ = same_assignment(from, to);
  if (moves_nothing_) return;
  plan_ = exchange_plan(from, to, rank);
  if (!plan_.send_order.empty()) send_order_ = upload_indices(backend, plan_.send_order);
  if (!plan_.recv_order.empty()) recv_order_ = upload_indices(backend, plan_.recv_order);
}

Traffic LayoutExchange::traffic(int64_t bytes_per_token) const {
  if (moves_nothing_) return {};
  return exchange_traffic(from_, to_, rank_, bytes_per_token);
}

int64_t LayoutExchange::record_bytes(std::span<const TokenMove> tokens,
                                     std::span<const RowMove> rows) {
  const std::vector<ExchangeField> fields = fields_of(tokens, rows);
  return exchange_record(fields).bytes;
}

void LayoutExchange::exchange(Communicator& world, std::span<const TokenMove> tokens,
                              std::span<const RowMove> rows, const std::string& phase) const {
  A2D_REQUIRE(world.size() == from_.parts() && world.rank() == rank_, "exchange of ", from_.parts(),
              " ranks built for rank ", rank_, " run as rank ", world.rank(), " of ", world.size());
  const int64_t own_from = from_.count(rank_), own_to = to_.count(rank_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenMove& m = tokens[i];
    A2D_REQUIRE(m.batch >= 1 && m.heads >= 1 && m.width >= 1, "exchange: tensor ", i, " has batch ",
                m.batch, ", heads ", m.heads, ", width ", m.width, "; each must be at least 1");
    A2D_REQUIRE(m.from.dtype == m.to.dtype, "exchange: tensor ", i, " moves ",
                dtype_name(m.from.dtype), " into ", dtype_name(m.to.dtype),
                "; the exchange moves elements without converting them");
    require_buffer(backend_, m.from.buffer, own_from, "source", i, "tensor");
    require_buffer(backend_, m.to.buffer, own_to, "destination", i, "tensor");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowMove& m = rows[i];
    A2D_REQUIRE(m.batch >= 1 && m.heads >= 1, "exchange: rows ", i, " have batch ", m.batch,
                " and heads ", m.heads, "; each must be at least 1");
    require_buffer(backend_, m.from.buffer, own_from, "source", i, "rows");
    require_buffer(backend_, m.to.buffer, own_to, "destination", i, "rows");
  }
  if (tokens.empty() && rows.empty()) return;
  world.set_phase(phase);
  if (moves_nothing_) {
    // Every token stays where it is: at most a copy into the destination tensors.
    for (const TokenMove& m : tokens) {
      if (!same_tensor(m.from, m.to))
        backend_.copy_tokens(m.from, m.to, {m.batch, own_from, m.heads, m.width});
    }
    for (const RowMove& m : rows) {
      if (!same_rows(m.from, m.to)) backend_.copy_rows(m.from, m.to, m.batch, m.heads, own_from);
    }
    return;
  }

  // Records of `record.bytes` per token, [token][field...], each field [batch, heads, width] of
  // its dtype (exchange_record).
  const std::vector<ExchangeField> fields = fields_of(tokens, rows);
  const ExchangeRecord record = exchange_record(fields);
  const int64_t w = record.bytes;
  const auto token_view = [&](Buffer& buffer, size_t field, const TokenMove& m) {
    const int64_t e = dtype_bytes(m.from.dtype);
    return TokenTensor{&buffer, record.offsets[field], m.from.dtype, m.heads * m.width, w / e,
                       m.width};
  };
  const auto row_view = [&](Buffer& buffer, size_t field) {
    return RowTensor{&buffer, record.offsets[field], 0, 1, w / kFloatBytes};
  };
  const auto rows_view = [&](Buffer& buffer, size_t field, const RowMove& m) {
    RowTensor t = row_view(buffer, field);
    t.batch_stride = m.heads;
    return t;
  };

  // Pack this rank's `from` rows in shard order, then group them by destination.
  const BufferPtr send = backend_.allocate(own_from * w);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenMove& m = tokens[i];
    backend_.copy_tokens(m.from, token_view(*send, i, m), {m.batch, own_from, m.heads, m.width});
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowMove& m = rows[i];
    backend_.copy_rows(m.from, rows_view(*send, tokens.size() + i, m), m.batch, m.heads, own_from);
  }
  if (send_order_) backend_.permute_tokens(Place::in(*send), own_from, w, Place::in(*send_order_));

  // The one all-to-all, through host staging where the backend's memory needs it.
  const BufferPtr received = backend_.allocate(own_to * w);
  std::unique_ptr<Communicator> staged;
  Communicator* comm = &world;
  if (!backend_.host_accessible() && !world.moves_backend_buffers()) {
    staged = make_staged_communicator(std::make_unique<Borrowed>(world), backend_);
    comm = staged.get();
  }
  std::vector<int64_t> send_bytes(plan_.send_counts), recv_bytes(plan_.recv_counts);
  for (int64_t& b : send_bytes)
    b *= w;
  for (int64_t& b : recv_bytes)
    b *= w;
  comm->all_to_all(Place::in(*send), send_bytes, Place::in(*received), recv_bytes);

  // Into `to` shard order, then out to the destination tensors.
  if (recv_order_)
    backend_.permute_tokens(Place::in(*received), own_to, w, Place::in(*recv_order_));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenMove& m = tokens[i];
    backend_.copy_tokens(token_view(*received, i, m), m.to, {m.batch, own_to, m.heads, m.width});
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowMove& m = rows[i];
    backend_.copy_rows(rows_view(*received, tokens.size() + i, m), m.to, m.batch, m.heads, own_to);
  }
}

// ---- Plans and records ------------------------------------------------------------------------

TokenLayout plan_layout(const Problem& problem, const Plan& plan) {
  if (algorithm_traits(plan.algorithm).cyclic_only)
    return TokenLayout(LayoutKind::cyclic, problem.seq, plan.ranks());
  return TokenLayout(plan.layout, problem.seq, plan.ranks(), plan.stripe);
}

constexpr EnumName<RelayoutBackward> kRelayoutBackwardNames[] = {
    {RelayoutBackward::saved, "saved"}, {RelayoutBackward::stateless, "stateless"}};

RelayoutBackward parse_relayout_backward(const std::string& name) {
  return parse_enum(kRelayoutBackwardNames, name, "relayout backward");
}

std::string relayout_backward_name(RelayoutBackward backward) {
  return enum_name(kRelayoutBackwardNames, backward);
}

RelayoutRecords relayout_records(const Problem& p, RelayoutBackward backward) {
  const ExchangeField q{p.dtype, p.batch * p.heads * p.head_dim};
  const ExchangeField kv{p.dtype, p.batch * p.kv_heads * p.head_dim};
  const ExchangeField lse{DType::f32, p.batch * p.heads};
  const auto bytes = [](std::initializer_list<ExchangeField> fields) {
    return exchange_record(std::span<const ExchangeField>(fields.begin(), fields.size())).bytes;
  };
  RelayoutRecords r;
  r.forward_in = bytes({q, kv, kv});
  r.forward_out = bytes({q, lse});
  r.backward_in = backward == RelayoutBackward::saved ? bytes({q}) : bytes({q, kv, kv, q, q, lse});
  r.backward_out = bytes({q, kv, kv});
  return r;
}

// ---- Attention on the caller's shards ---------------------------------------------------------

namespace {

// The plan's attention between two exchanges per call (relayout.hpp's make_attention). Nothing
// is kept between calls: the plan-layout shards live in buffers of the call.
class RelayoutAttention final : public DistributedAttention {
 public:
  RelayoutAttention(std::unique_ptr<DistributedAttention> inner, const TokenLayout& shards,
                    Communicator& world, Backend& backend)
      : inner_(std::move(inner)),
        shards_(shards),
        comm_(algorithms::private_communicator(world, backend)),
        in_(shards, inner_->layout(), comm_->rank(), backend),
        out_(inner_->layout(), shards, comm_->rank(), backend) {}

  const Problem& problem() const override { return inner_->problem(); }
  const Plan& plan() const override { return inner_->plan(); }
  const TokenLayout& layout() const override { return shards_; }
  Backend& backend() const override { return inner_->backend(); }

  void forward(const ForwardShards& s) override {
    algorithms::check_shard_types(problem(), backend(), s);
    const Problem& p = problem();
    Shard q = shard(p.heads), k = shard(p.kv_heads), v = shard(p.kv_heads), out = shard(p.heads);
    Rows lse = lse_rows();
    const LayoutExchange::TokenMove in[3] = {token_move(s.q, q, p.heads),
                                             token_move(s.k, k, p.kv_heads),
                                             token_move(s.v, v, p.kv_heads)};
    in_.exchange(*comm_, in, {}, kRelayoutForwardIn);
    ForwardShards planned{q.tensor, k.tensor, v.tensor, out.tensor, lse.tensor, s.sinks};
    inner_->forward(planned);
    const LayoutExchange::TokenMove back[1] = {token_move(out.tensor, s.out, p.heads)};
    const LayoutExchange::RowMove back_rows[1] = {{lse.tensor, s.lse, p.batch, p.heads}};
    out_.exchange(*comm_, back, back_rows, kRelayoutForwardOut);
  }

  void backward(const BackwardShards& s) override {
    algorithms::check_shard_types(problem(), backend(), s);
    const Problem& p = problem();
    Shard q = shard(p.heads), k = shard(p.kv_heads), v = shard(p.kv_heads), out = shard(p.heads),
          d_out = shard(p.heads), dq = shard(p.heads), dk = shard(p.kv_heads),
          dv = shard(p.kv_heads);
    Rows lse = lse_rows();
    const LayoutExchange::TokenMove in[5] = {
        token_move(s.q, q, p.heads), token_move(s.k, k, p.kv_heads), token_move(s.v, v, p.kv_heads),
        token_move(s.out, out, p.heads), token_move(s.d_out, d_out, p.heads)};
    const LayoutExchange::RowMove in_rows[1] = {{s.lse, lse.tensor, p.batch, p.heads}};
    in_.exchange(*comm_, in, in_rows, kRelayoutBackwardIn);
    BackwardShards planned{q.tensor,   k.tensor,  v.tensor,  out.tensor, d_out.tensor,
                           lse.tensor, dq.tensor, dk.tensor, dv.tensor};
    planned.sinks = s.sinks;
    planned.dsink = s.dsink;
    inner_->backward(planned);
    const LayoutExchange::TokenMove back[3] = {token_move(dq.tensor, s.dq, p.heads),
                                               token_move(dk.tensor, s.dk, p.kv_heads),
                                               token_move(dv.tensor, s.dv, p.kv_heads)};
    out_.exchange(*comm_, back, {}, kRelayoutBackwardOut);
  }

 private:
  // A dense shard of the plan's layout on this rank, in a buffer of the call.
  struct Shard {
    BufferPtr buffer;
    TokenTensor tensor;
  };
  struct Rows {
    BufferPtr buffer;
    RowTensor tensor;
  };
  int64_t planned_tokens() const { return inner_->layout().count(comm_->rank()); }
  Shard shard(int64_t heads) const {
    const Problem& p = problem();
    const int64_t n = planned_tokens();
    Shard s;
    s.buffer = backend().allocate(p.batch * n * heads * p.head_dim * dtype_bytes(p.dtype));
    s.tensor = dense_token_tensor(*s.buffer, p.dtype, n, heads, p.head_dim);
    return s;
  }
  Rows lse_rows() const {
    const Problem& p = problem();
    const int64_t n = planned_tokens();
    Rows r;
    r.buffer = backend().allocate(p.batch * p.heads * n * kFloatBytes);
    r.tensor = dense_row_tensor(*r.buffer, p.heads, n);
    return r;
  }
  LayoutExchange::TokenMove token_move(const TokenTensor& from, const TokenTensor& to,
                                       int64_t heads) const {
    return {from, to, problem().batch, heads, problem().head_dim};
  }
  LayoutExchange::TokenMove token_move(const TokenTensor& from, const Shard& to,
                                       int64_t heads) const {
    return token_move(from, to.tensor, heads);
  }

  std::unique_ptr<DistributedAttention> inner_;
  TokenLayout shards_;
  std::unique_ptr<Communicator> comm_;
  LayoutExchange in_;
  LayoutExchange out_;
};

}  // namespace

std::unique_ptr<DistributedAttention> make_attention(const Problem& problem, const Plan& plan,
                                                     Communicator& world, Backend& backend,
                                                     const TokenLayout& shards) {
  collective_check(world, [&] {
    problem.validate();
    check_plan(plan, problem, world.size());
    backend.check_supported(problem.dtype, problem.head_dim, problem.mask, problem.softcap);
    A2D_REQUIRE(shards.tokens() == problem.seq && shards.parts() == world.size(),
                "the shards' layout (", shards.describe(), ") must split the problem's ",
                problem.seq, " tokens over the job's ", world.size(), " ranks");
  });
  check_agreement(world, problem, plan, shards);
  std::unique_ptr<DistributedAttention> attention =
      algorithms::make_checked_attention(problem, plan, world, backend);
  if (!same_assignment(shards, attention->layout()))
    attention = std::make_unique<RelayoutAttention>(std::move(attention), shards, world, backend);
  return algorithms::with_checked_calls(std::move(attention), world);
}

}  // namespace a2d
