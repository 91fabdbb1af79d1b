#include "attention2d/session.hpp"

#include <utility>

#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"
#include "attention2d/watchdog.hpp"

namespace a2d {

Session::Session(Communicator& world, std::unique_ptr<Backend> backend)
    : world_(&world), backend_(std::move(backend)) {
  A2D_REQUIRE(backend_, "a session needs a backend");
}

Session::Session(std::unique_ptr<Communicator> world, std::unique_ptr<Backend> backend)
    : own_world_(std::move(world)), world_(own_world_.get()), backend_(std::move(backend)) {
  A2D_REQUIRE(world_ && backend_, "a session needs a world and a backend");
}

Session::~Session() = default;

void Session::connect(CommKind kind, const std::function<std::unique_ptr<Communicator>()>& make) {
  kind_ = kind;
  if (!make) {
    A2D_REQUIRE(kind == CommKind::mpi, "the ", comm_kind_name(kind),
                " communicator needs a way to make it");
    return;
  }
  collective_check(*world_, [&] { algorithms_ = make(); });
}

void Session::watch(std::unique_ptr<Watchdog> watchdog, double timeout) {
  watchdog_ = std::move(watchdog);
  if (kind_ != CommKind::gloo || !algorithms_ || timeout <= 0) return;
  watchdog_.reset();  // one watchdog per process
  watchdog_ = std::make_unique<Watchdog>(*algorithms_, timeout);
}

std::unique_ptr<DistributedAttention> Session::attention(const Problem& problem, const Plan& plan,
                                                         const TokenLayout* shards) {
  std::unique_ptr<DistributedAttention> made;
  // make_attention validates, checks support and agreement collectively, and throws the same
  // CollectiveError on every rank; collective_check catches what a rank throws alone after it.
  collective_check(*world_, [&] {
    made = shards ? make_attention(problem, plan, communicator(), *backend_, *shards)
                  : make_attention(problem, plan, communicator(), *backend_);
  });
  return made;
}

std::unique_ptr<DistributedDecoder> Session::decoder(const Problem& problem, const Plan& plan,
                                                     int64_t capacity) {
  std::unique_ptr<DistributedDecoder> made;
  collective_check(
      *world_, [&] { made = make_decoder(problem, plan, communicator(), *backend_, capacity); });
  return made;
}

std::unique_ptr<LayoutExchange> Session::relayout(const TokenLayout& from, const TokenLayout& to) {
  auto exchange = std::make_unique<LayoutExchange>(from, to, world_->rank(), *backend_);
  if (exchange->moves_nothing()) return nullptr;
  return exchange;
}

namespace {

int64_t element_count(const TokenBlock& shape) {
  return shape.batch * shape.tokens * shape.heads * shape.width;
}

// `host`'s fp32 values as a buffer of the backend: the memory itself where the backend can reach
// it, else a copy in the backend's memory (copied back by `back`).
struct Staging {
  Staging(Backend& backend, std::vector<float>& host, bool upload)
      : backend_(backend), host_(host) {
    const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(float));
    if (backend.host_accessible()) {
      buffer = backend.wrap_host(host.data(), bytes);
      return;
    }
    buffer = backend.allocate(bytes);
    if (upload) backend.upload(host.data(), Place::in(*buffer), bytes);
  }
  void back() {
    if (backend_.host_accessible()) return;
    backend_.download(Place::in(*buffer), host_.data(),
                      static_cast<int64_t>(host_.size() * sizeof(float)));
  }
  BufferPtr buffer;

 private:
  Backend& backend_;
  std::vector<float>& host_;
};

}  // namespace

void upload_values(Backend& backend, std::vector<float>& host, Buffer& to, DType dtype,
                   const TokenBlock& shape) {
  A2D_REQUIRE(static_cast<int64_t>(host.size()) == element_count(shape), "upload of ", host.size(),
              " values into a shard of ", element_count(shape));
  if (host.empty()) return;
  if (dtype == DType::f32) {
    backend.upload(host.data(), Place::in(to), static_cast<int64_t>(host.size() * sizeof(float)));
    return;
  }
  Staging wide(backend, host, true);
  const TokenTensor from_host =
      dense_token_tensor(*wide.buffer, DType::f32, shape.tokens, shape.heads, shape.width);
  const TokenTensor shard = dense_token_tensor(to, dtype, shape.tokens, shape.heads, shape.width);
  backend.copy_tokens(from_host, shard, shape);
  backend.copy_tokens(shard, from_host, shape);  // the host copy holds what the shard holds
  wide.back();
}

void download_values(Backend& backend, Buffer& from, DType dtype, const TokenBlock& shape,
                     std::vector<float>& host) {
  A2D_REQUIRE(static_cast<int64_t>(host.size()) == element_count(shape), "download of a shard of ",
              element_count(shape), " values into ", host.size());
  if (host.empty()) return;
  if (dtype == DType::f32) {
    backend.download(Place::in(from), host.data(),
                     static_cast<int64_t>(host.size() * sizeof(float)));
    return;
  }
  Staging wide(backend, host, false);
  backend.copy_tokens(
      dense_token_tensor(from, dtype, shape.tokens, shape.heads, shape.width),
      dense_token_tensor(*wide.buffer, DType::f32, shape.tokens, shape.heads, shape.width), shape);
  wide.back();
}

}  // namespace a2d
