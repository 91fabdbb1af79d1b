// Prefill into a distributed KV cache, then decode steps with the split-KV reduction
// (inference.hpp; docs/inference.md).
#include <algorithm>
#include <queue>
#include <utility>

#include "algorithms/algorithms.hpp"
#include "algorithms/records.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"
#include "attention2d/inference.hpp"

namespace a2d {

void check_decodable(const Problem& problem) {
  const Mask& mask = problem.mask;
  A2D_REQUIRE(!mask.has_documents(),
              "decoding does not take packed documents: the new tokens would belong to none");
  A2D_REQUIRE(!mask.has_ranges(), "decoding does not take a range mask (", mask.describe(),
              "): its slices are defined for the ",
              "prefill's tokens only, and say nothing of "
              "the tokens appended after them");
  A2D_REQUIRE(mask.window_right() <= 0, "decoding cannot extend ", mask.describe(),
              ": its right side shows keys after the "
              "query, which a new token does not have yet; use --window-size L,0 (or --window)");
  A2D_REQUIRE(mask.extends_causally(),
              "decoding needs a causal mask (--causal, --window or --window-size L,0): a new token "
              "sees only the keys at or before its position");
}

std::vector<int> append_owners(std::vector<int64_t> cached_counts, int64_t tokens) {
  A2D_REQUIRE(!cached_counts.empty(), "append_owners needs at least one rank");
  A2D_REQUIRE(tokens >= 0, "cannot append ", tokens, " tokens");
  // (count, rank), smallest first: the fewest cached tokens, then the lowest rank.
  using Entry = std::pair<int64_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> least;
  for (size_t r = 0; r < cached_counts.size(); ++r)
    least.emplace(cached_counts[r], static_cast<int>(r));
  std::vector<int> owners(static_cast<size_t>(tokens));
  for (int& owner : owners) {
    auto [count, rank] = least.top();
    least.pop();
    owner = rank;
    least.emplace(count + 1, rank);
  }
  return owners;
}

std::vector<int64_t> DecodeStep::positions_of(int rank) const {
  const auto r = static_cast<size_t>(rank);
  return {positions.begin() + offsets[r], positions.begin() + offsets[r + 1]};
}

DecodeStep plan_decode_step(const std::vector<int64_t>& cached_counts, int64_t tokens) {
  A2D_REQUIRE(tokens >= 1, "a decode step appends at least one token, got ", tokens);
  DecodeStep step;
  step.tokens = tokens;
  for (const int64_t c : cached_counts)
    step.first_position += c;
  step.owners = append_owners(cached_counts, tokens);
  const size_t ranks = cached_counts.size();
  step.counts.assign(ranks, 0);
  for (const int owner : step.owners)
    ++step.counts[static_cast<size_t>(owner)];
  step.offsets = algorithms::prefix_offsets(step.counts);
  step.positions.resize(static_cast<size_t>(tokens));
  std::vector<int64_t> next(step.offsets.begin(), step.offsets.end() - 1);
  for (int64_t i = 0; i < tokens; ++i) {
    const auto owner = static_cast<size_t>(step.owners[static_cast<size_t>(i)]);
    step.positions[static_cast<size_t>(next[owner]++)] = step.first_position + i;
  }
  return step;
}

DecodeTraffic decode_step_traffic(const Problem& problem, const std::vector<int64_t>& step_counts,
                                  int rank) {
  const WireRecords wire = wire_records(problem);
  const int64_t rows = problem.batch * problem.heads;  // records per token
  const RingCharge gather =
      ring_all_gather_charge(algorithms::scaled(step_counts, rows * wire.q), rank);
  const RingCharge merge = ring_reduce_scatter_charge(algorithms::scaled(step_counts, rows), rank);
  DecodeTraffic t;
  t.q_allgather = {gather.elements, gather.messages};
  t.merge = {merge.elements * wire.partial, merge.messages};
  return t;
}

namespace {

using algorithms::kFloatBytes;
using algorithms::kIndexBytes;
using algorithms::RecordLayout;

class Decoder final : public DistributedDecoder {
 public:
  Decoder(const Problem& problem, const Plan& plan, Communicator& world, Backend& backend,
          int64_t capacity)
      : problem_(problem), plan_(plan), backend_(backend) {
    attention_ = make_attention(problem, plan, world, backend);
    comm_ = algorithms::private_communicator(world, backend);
    rank_ = comm_->rank();
    ranks_ = comm_->size();
    const TokenLayout& layout = attention_->layout();
    counts_.resize(static_cast<size_t>(ranks_));
    for (int r = 0; r < ranks_; ++r)
      counts_[static_cast<size_t>(r)] = layout.count(r);
    const int64_t e = dtype_bytes(problem_.dtype), d = problem_.head_dim;
    kv_rec_ = {problem_.batch, problem_.kv_heads, 2 * d * e};
    q_rec_ = {problem_.batch, problem_.heads, d * e};
    state_rec_ = {problem_.batch, problem_.heads, (d + 2) * kFloatBytes};
    grow(std::max({capacity, layout.count(rank_), int64_t{1}}));
    reallocations_ = 0;  // the first allocation is not a growth
  }

  const Problem& problem() const override { return problem_; }
  const Plan& plan() const override { return plan_; }
  const TokenLayout& prompt_layout() const override { return attention_->layout(); }
  Backend& backend() const override { return backend_; }

  void prefill(const ForwardShards& shards) override {
    A2D_REQUIRE(!prefilled_, "prefill() runs once per decoder; make a new one for a new prompt");
    attention_->forward(shards);
    comm_->set_phase("prefill.cache");
    const int64_t own = attention_->layout().count(rank_);
    if (own > 0) append_kv(shards.k, shards.v, own);
    for (const int64_t t : attention_->layout().tokens_of(rank_))
      positions_.push_back(t);
    upload_positions(0, own);
    cached_ = own;
    prefilled_ = true;
  }

  DecodeStep next_step(int64_t tokens) const override { return plan_decode_step(counts_, tokens); }

  void step(int64_t tokens, const DecodeShards& s) override {
    A2D_REQUIRE(prefilled_, "step() needs the cache: call prefill() first");
    const DecodeStep st = next_step(tokens);
    const int64_t own = st.counts[static_cast<size_t>(rank_)];
    const int64_t own_at = st.offsets[static_cast<size_t>(rank_)];
    const int64_t b = problem_.batch, h = problem_.heads, d = problem_.head_dim;
    if (own > 0) {
      check_tensor(s.q, "q");
      check_tensor(s.k, "k");
      check_tensor(s.v, "v");
      check_tensor(s.out, "out");
      A2D_REQUIRE(s.lse.buffer && &s.lse.buffer->backend() == &backend_,
                  "the decode step's lse must lie in a buffer of the ", backend_.name(),
                  " backend");
      A2D_REQUIRE(!problem_.sinks || s.sinks, "the problem has sinks: pass DecodeShards::sinks");
    }
    reserve_scratch(tokens);

    // 1. The rank's new K and V join its cache (grown by doubling when full).
    comm_->set_phase("decode.append");
    if (own > 0) {
      if (cached_ + own > capacity_) grow(std::max(2 * capacity_, cached_ + own));
      append_kv(s.k, s.v, own);
      const std::vector<int64_t> mine = st.positions_of(rank_);
      positions_.insert(positions_.end(), mine.begin(), mine.end());
      upload_positions(cached_, own);
      cached_ += own;
    }

    // 2. Q of all T new tokens on every rank, owners' parts in rank order.
    const int64_t q_slot = q_rec_.bytes(own_at);
    if (own > 0) {
      backend_.copy_tokens(s.q, q_rec_.tokens(*q_, q_slot, 0, problem_.dtype), {b, own, h, d});
    }
    comm_->set_phase("decode.q_allgather");
    if (ranks_ > 1) {
      comm_->all_gather(Place::in(*q_, q_slot), Place::in(*q_),
                        algorithms::scaled(st.counts, q_rec_.per_token()));
    }
    backend_.upload(st.positions.data(), Place::in(*q_positions_), tokens * kIndexBytes);

    // 3. Their partial softmax state over this rank's cached keys (the causal mask by position
    // also hides the new tokens after each query, wherever they are cached).
    comm_->set_phase("decode.kernel");
    auto call = algorithms::kernel_call<ForwardCall>(
        problem_, plan_, *comm_, tokens, Place::in(*q_positions_), kv_field(0), kv_field(1),
        cached_, Place::in(*kv_positions_));
    call.q = q_rec_.tokens(*q_, 0, 0, problem_.dtype);
    backend_.attention_forward_partial(call, algorithms::partial_records(state_rec_, *state_, 0),
                                       false);

    // 4. Merged across ranks, each token's at its owner (the split-KV reduction).
    comm_->set_phase("decode.merge");
    Buffer* merged = state_.get();
    int64_t merged_at = state_rec_.bytes(own_at);
    if (ranks_ > 1) {
      comm_->merge_scatter(Place::in(*state_), Place::in(*own_state_),
                           algorithms::scaled(st.counts, b * h), state_rec_.record / kFloatBytes,
                           backend_);
      merged = own_state_.get();
      merged_at = 0;
    }

    // 5. O and LSE of the rank's new tokens.
    comm_->set_phase("decode.finalize");
    if (own > 0) {
      const RowsShape rows{b, own, h, d};
      backend_.finalize(rows, algorithms::partial_records(state_rec_, *merged, merged_at), s.out,
                        s.lse);
      if (problem_.sinks) backend_.add_sinks(rows, s.sinks, 0, s.out, s.lse);
    }
    for (int r = 0; r < ranks_; ++r)
      counts_[static_cast<size_t>(r)] += st.counts[static_cast<size_t>(r)];
  }

  int64_t sequence() const override {
    int64_t total = 0;
    for (const int64_t c : counts_)
      total += c;
    return total;
  }
  std::vector<int64_t> cached_counts() const override { return counts_; }
  const std::vector<int64_t>& positions() const override { return positions_; }
  int64_t capacity() const override { return capacity_; }
  int64_t reallocations() const override { return reallocations_; }

 private:
  void check_tensor(const TokenTensor& t, const char* name) const {
    A2D_REQUIRE(t.buffer && &t.buffer->backend() == &backend_, "the decode step's ", name,
                " must lie in a buffer of the ", backend_.name(), " backend");
    A2D_REQUIRE(t.dtype == problem_.dtype, "the decode step's ", name, " is ", dtype_name(t.dtype),
                " but the problem is ", dtype_name(problem_.dtype));
  }

  // Field 0 (K) or 1 (V) of the cache's [k v] records.
  TokenTensor kv_field(int field) const {
    return kv_rec_.tokens(*cache_, 0, field * problem_.head_dim * dtype_bytes(problem_.dtype),
                          problem_.dtype);
  }

  // `tokens` new K and V rows after the cached ones.
  void append_kv(const TokenTensor& k, const TokenTensor& v, int64_t tokens) {
    const TokenBlock rows{problem_.batch, tokens, problem_.kv_heads, problem_.head_dim};
    const int64_t at = kv_rec_.bytes(cached_);
    TokenTensor k_to = kv_field(0), v_to = kv_field(1);
    k_to.offset += at;
    v_to.offset += at;
    backend_.copy_tokens(k, k_to, rows);
    backend_.copy_tokens(v, v_to, rows);
  }

  void upload_positions(int64_t first, int64_t count) {
    if (count > 0) {
      backend_.upload(positions_.data() + first, Place::in(*kv_positions_, first * kIndexBytes),
                      count * kIndexBytes);
    }
  }

  // A cache of `capacity` tokens holding the cached ones.
  void grow(int64_t capacity) {
    BufferPtr cache = backend_.allocate(kv_rec_.bytes(capacity));
    BufferPtr positions = backend_.allocate(capacity * kIndexBytes);
    if (cached_ > 0) {
      // Whole [k v] records, 2D elements each.
      const TokenTensor from = kv_rec_.tokens(*cache_, 0, 0, problem_.dtype);
      const TokenTensor to = kv_rec_.tokens(*cache, 0, 0, problem_.dtype);
      backend_.copy_tokens(from, to,
                           {problem_.batch, cached_, problem_.kv_heads, 2 * problem_.head_dim});
      backend_.upload(positions_.data(), Place::in(*positions), cached_ * kIndexBytes);
    }
    cache_ = std::move(cache);
    kv_positions_ = std::move(positions);
    capacity_ = capacity;
    positions_.reserve(static_cast<size_t>(capacity));
    ++reallocations_;
  }

  // Per-step buffers for up to `tokens` new tokens, kept from step to step.
  void reserve_scratch(int64_t tokens) {
    if (tokens <= scratch_tokens_) return;
    q_ = backend_.allocate(q_rec_.bytes(tokens));
    state_ = backend_.allocate(state_rec_.bytes(tokens));
    own_state_ = backend_.allocate(state_rec_.bytes(tokens));
    q_positions_ = backend_.allocate(tokens * kIndexBytes);
    scratch_tokens_ = tokens;
  }

  Problem problem_;
  Plan plan_;
  Backend& backend_;
  std::unique_ptr<DistributedAttention> attention_;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0;
  int ranks_ = 1;
  RecordLayout kv_rec_, q_rec_, state_rec_;
  std::vector<int64_t> counts_;     // cached tokens per rank
  std::vector<int64_t> positions_;  // this rank's cached positions (host copy)
  BufferPtr cache_, kv_positions_;
  int64_t cached_ = 0;
  int64_t capacity_ = 0;
  int64_t reallocations_ = 0;
  bool prefilled_ = false;
  BufferPtr q_, state_, own_state_, q_positions_;
  int64_t scratch_tokens_ = 0;
};

}  // namespace

std::unique_ptr<DistributedDecoder> make_decoder(const Problem& prompt, const Plan& plan,
                                                 Communicator& world, Backend& backend,
                                                 int64_t capacity) {
  // Every rank fails together, before anything moves, on a problem it cannot decode.
  collective_check(world, [&] {
    check_decodable(prompt);
    A2D_REQUIRE(capacity >= 0, "the cache capacity must be >= 0 tokens, got ", capacity);
  });
  return std::make_unique<Decoder>(prompt, plan, world, backend, capacity);
}

}  // namespace a2d
