// A communicator that stages buffers the host cannot touch through host memory
// (make_staged_communicator, comm.hpp): the path of a GPU's data under an MPI that is not
// CUDA-aware, and of the fenced test backend's data, which proves it.
//
//   send side  the backend copies the bytes to send into a host staging buffer (download) when
//              the operation is posted, so the sender may reuse its buffer as soon as the inner
//              operation has taken the staging copy
//   recv side  the inner operation receives into a staging buffer; the backend copies it into
//              the destination (upload_async) when the operation completes: in wait() for a
//              posted operation, before returning for a blocking one. The copy is queued, not
//              waited for: on a GPU it runs on a copy stream beside the kernel issued after the
//              post, and the next operation on the stream starts after both; the staging buffer
//              is reused only after the copy's fence
//
// Places in host-accessible memory pass through unchanged, so over the CPU backend this is the
// inner communicator. Staging buffers come from the backend (pinned memory on a GPU) and are
// reused between operations.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "host_forwarding.hpp"

namespace a2d {
namespace {

bool needs_staging(const Place& place) {
  return place.buffer && !place.buffer->host_data();
}

int64_t total(std::span<const int64_t> values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

// Staging buffers of one communicator, reused: a request takes the smallest free buffer that is
// large enough and gives it back when it completes, with the fence after the uploads out of it
// (upload_async may still be reading it); the buffer is handed out again, or freed, only once
// that fence is reached.
class StagingPool {
 public:
  explicit StagingPool(Backend& backend) : backend_(backend) {}
  ~StagingPool() {
    for (Free& f : free_)
      settle(f);
  }
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  BufferPtr take(int64_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->buffer->bytes() >= bytes &&
          (best == free_.end() || it->buffer->bytes() < best->buffer->bytes()))
        best = it;
    }
    if (best == free_.end()) return backend_.allocate_staging(bytes);
    settle(*best);
    BufferPtr buffer = std::move(best->buffer);
    free_.erase(best);
    return buffer;
  }
  void give_back(BufferPtr buffer, std::shared_ptr<Fence> read_until) {
    free_.push_back({std::move(buffer), std::move(read_until)});
    // Keep a few: rings use two or three at a time.
    if (free_.size() > 8) {
      settle(free_.front());
      free_.erase(free_.begin());
    }
  }
  Backend& backend() { return backend_; }

 private:
  struct Free {
    BufferPtr buffer;
    std::shared_ptr<Fence> read_until;  // null: nothing reads it
  };
  static void settle(Free& f) {
    if (f.read_until) f.read_until->wait();
    f.read_until.reset();
  }

  Backend& backend_;
  std::vector<Free> free_;
};

// The host side of one operation: staging copies of its outgoing places, staging targets of its
// incoming ones, and the uploads that deliver them.
class Staging {
 public:
  explicit Staging(std::shared_ptr<StagingPool> pool) : pool_(std::move(pool)) {}
  Staging(Staging&&) = default;
  ~Staging() {
    for (auto& buffer : held_)
      pool_->give_back(std::move(buffer), read_until_);
  }

  // `bytes` at `place` as host memory holding their current contents.
  Place outgoing(const Place& place, int64_t bytes) {
    if (!needs_staging(place) || bytes == 0) return place;
    Buffer& host = hold(bytes);
    pool_->backend().download(place, host.host_data(), bytes);
    return Place::in(host);
  }
  // Host memory for `bytes` that will arrive for `place`; deliver() copies them there. The copy
  // may run beside the backend's operations issued from now on (they must not touch `place`
  // before the operation completes).
  Place incoming(const Place& place, int64_t bytes) {
    if (!needs_staging(place) || bytes == 0) return place;
    if (!posted_) posted_ = pool_->backend().fence();
    Buffer& host = hold(bytes);
    deliveries_.push_back({place, &host, bytes});
    return Place::in(host);
  }
  // Queues the copies of what arrived into the backend's buffers (upload_async); operations
  // issued after this see them, and the staging buffers go back to the pool with the fence after
  // the copies.
  void deliver() {
    if (deliveries_.empty()) return;
    for (const Delivery& d : deliveries_)
      pool_->backend().upload_async(d.from->host_data(), d.to, d.bytes, posted_.get());
    deliveries_.clear();
    read_until_ = pool_->backend().fence();
  }

 private:
  struct Delivery {
    Place to;
    Buffer* from;
    int64_t bytes;
  };
  Buffer& hold(int64_t bytes) {
    held_.push_back(pool_->take(bytes));
    return *held_.back();
  }
  std::shared_ptr<StagingPool> pool_;
  std::vector<BufferPtr> held_;
  std::vector<Delivery> deliveries_;
  std::unique_ptr<Fence> posted_;      // taken when the first receive was staged
  std::shared_ptr<Fence> read_until_;  // after the uploads out of held_
};

class StagedRequest final : public Request {
 public:
  StagedRequest(RequestPtr inner, Staging staging)
      : inner_(std::move(inner)), staging_(std::move(staging)) {}
  void wait() override {
    if (done_) return;
    done_ = true;
    inner_->wait();
    staging_.deliver();
  }
  ~StagedRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (...) {
      // A destructor must not throw; the owner's wait() reports errors.
    }
  }

 private:
  RequestPtr inner_;
  Staging staging_;
  bool done_ = false;
};

class StagedCommunicator final : public comm_detail::HostForwarding {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, Backend& backend)
      : inner_(std::move(inner)), pool_(std::make_shared<StagingPool>(backend)) {
    A2D_REQUIRE(inner_, "a staged communicator needs an inner communicator");
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<StagedCommunicator>(inner_->split(color, key), pool_->backend());
  }

  RequestPtr all_gather_async(Place send, Place recv, std::span<const int64_t> bytes) override {
    return posted(send, own(bytes), recv, total(bytes),
                  [&](Place s, Place r) { return inner_->all_gather_async(s, r, bytes); });
  }
  void all_gather(Place send, Place recv, std::span<const int64_t> bytes) override {
    blocking(send, own(bytes), recv, total(bytes),
             [&](Place s, Place r) { inner_->all_gather(s, r, bytes); });
  }

  RequestPtr reduce_scatter_async(Place send, Place recv, std::span<const int64_t> counts,
                                  int64_t record, Reduction reduction) override {
    const int64_t unit = record * static_cast<int64_t>(sizeof(float));
    return posted(send, total(counts) * unit, recv, own(counts) * unit, [&](Place s, Place r) {
      return inner_->reduce_scatter_async(s, r, counts, record, reduction);
    });
  }
  void reduce_scatter(Place send, Place recv, std::span<const int64_t> counts, int64_t record,
                      Reduction reduction) override {
    const int64_t unit = record * static_cast<int64_t>(sizeof(float));
    blocking(send, total(counts) * unit, recv, own(counts) * unit,
             [&](Place s, Place r) { inner_->reduce_scatter(s, r, counts, record, reduction); });
  }

  RequestPtr send_recv_async(Place send, int64_t send_bytes, int dest, Place recv,
                             int64_t recv_bytes, int source, int tag) override {
    return posted(send, send_bytes, recv, recv_bytes, [&](Place s, Place r) {
      return inner_->send_recv_async(s, send_bytes, dest, r, recv_bytes, source, tag);
    });
  }

  RequestPtr all_to_all_async(Place send, std::span<const int64_t> send_bytes, Place recv,
                              std::span<const int64_t> recv_bytes) override {
    return posted(send, total(send_bytes), recv, total(recv_bytes), [&](Place s, Place r) {
      return inner_->all_to_all_async(s, send_bytes, r, recv_bytes);
    });
  }
  void all_to_all(Place send, std::span<const int64_t> send_bytes, Place recv,
                  std::span<const int64_t> recv_bytes) override {
    blocking(send, total(send_bytes), recv, total(recv_bytes),
             [&](Place s, Place r) { inner_->all_to_all(s, send_bytes, r, recv_bytes); });
  }

 private:
  Communicator& host_side() override { return *inner_; }

  // An operation of the inner communicator on host copies: `op(host_send, host_recv)` posts it
  // (posted) or runs it (blocking); what arrives is delivered when it completes.
  template <typename Op>
  RequestPtr posted(Place send, int64_t send_bytes, Place recv, int64_t recv_bytes, Op&& op) {
    Staging staging(pool_);
    const Place host_send = staging.outgoing(send, send_bytes);
    const Place host_recv = staging.incoming(recv, recv_bytes);
    RequestPtr inner = op(host_send, host_recv);
    return std::make_unique<StagedRequest>(std::move(inner), std::move(staging));
  }
  template <typename Op>
  void blocking(Place send, int64_t send_bytes, Place recv, int64_t recv_bytes, Op&& op) {
    Staging staging(pool_);
    const Place host_send = staging.outgoing(send, send_bytes);
    const Place host_recv = staging.incoming(recv, recv_bytes);
    op(host_send, host_recv);
    staging.deliver();
  }

  int64_t own(std::span<const int64_t> counts) const {
    A2D_REQUIRE(static_cast<int>(counts.size()) == size(),
                "a collective needs one count per rank (", size(), "), got ", counts.size());
    return counts[static_cast<size_t>(rank())];
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<StagingPool> pool_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner,
                                                       Backend& backend) {
  return std::make_unique<StagedCommunicator>(std::move(inner), backend);
}

}  // namespace a2d
