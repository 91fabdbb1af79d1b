#include <algorithm>

#include "attention2d/comm.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/timing.hpp"

namespace a2d {
namespace {
class CompletedRequest final : public Request {
 public:
  void wait() override {}
};
}  // namespace

RequestPtr completed_request() {
  return std::make_unique<CompletedRequest>();
}

void TrafficLog::add(const std::string& phase, int64_t bytes, int64_t messages) {
  Traffic& t = phases_[phase];
  t.bytes += bytes;
  t.messages += messages;
}

Traffic TrafficLog::total(const std::string& prefix) const {
  Traffic sum;
  for (const auto& [name, t] : phases_) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    sum.bytes += t.bytes;
    sum.messages += t.messages;
  }
  return sum;
}

namespace {
// Every block except `skipped`.
RingCharge charge_all_but(std::span<const int64_t> counts, size_t skipped) {
  RingCharge charge;
  if (counts.size() <= 1) return charge;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i == skipped || counts[i] == 0) continue;
    charge.elements += counts[i];
    ++charge.messages;
  }
  return charge;
}
}  // namespace

RingCharge ring_all_gather_charge(std::span<const int64_t> counts, int rank) {
  return charge_all_but(counts,
                        (static_cast<size_t>(rank) + 1) % std::max<size_t>(counts.size(), 1));
}

RingCharge ring_reduce_scatter_charge(std::span<const int64_t> counts, int rank) {
  return charge_all_but(counts, static_cast<size_t>(rank));
}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner,
                                           std::shared_ptr<TrafficLog> log,
                                           std::shared_ptr<std::string> phase)
    : inner_(std::move(inner)),
      log_(std::move(log)),
      phase_(phase ? std::move(phase) : std::make_shared<std::string>("other")) {
  A2D_REQUIRE(inner_ && log_, "CountingCommunicator needs a communicator and a log");
}

std::unique_ptr<Communicator> CountingCommunicator::split(int color, int key) {
  return std::make_unique<CountingCommunicator>(inner_->split(color, key), log_, phase_);
}

void TrafficLog::switch_phase(const std::string& from, double now) {
  if (switched_at_ >= 0) seconds_[from] += now - switched_at_;
  switched_at_ = now;
}

void CountingCommunicator::set_phase(const std::string& phase) {
  log_->switch_phase(*phase_, seconds_now());
  *phase_ = phase;
  inner_->set_phase(phase);
}

void CountingCommunicator::charge(int64_t bytes, int64_t messages) {
  log_->add(*phase_, bytes, messages);
}

RequestPtr CountingCommunicator::all_gather_async(Place send, Place recv,
                                                  std::span<const int64_t> bytes) {
  charge_all_gather(bytes);
  return inner_->all_gather_async(send, recv, bytes);
}

void CountingCommunicator::all_gather(Place send, Place recv, std::span<const int64_t> bytes) {
  charge_all_gather(bytes);
  inner_->all_gather(send, recv, bytes);
}

void CountingCommunicator::charge_all_gather(std::span<const int64_t> bytes) {
  const RingCharge ring = ring_all_gather_charge(bytes, rank());
  charge(ring.elements, ring.messages);
}

RequestPtr CountingCommunicator::reduce_scatter_async(Place send, Place recv,
                                                      std::span<const int64_t> counts,
                                                      int64_t record, Reduction reduction) {
  charge_reduce_scatter(counts, record);
  return inner_->reduce_scatter_async(send, recv, counts, record, reduction);
}

void CountingCommunicator::reduce_scatter(Place send, Place recv, std::span<const int64_t> counts,
                                          int64_t record, Reduction reduction) {
  charge_reduce_scatter(counts, record);
  inner_->reduce_scatter(send, recv, counts, record, reduction);
}

void CountingCommunicator::charge_reduce_scatter(std::span<const int64_t> counts, int64_t record) {
  const RingCharge ring = ring_reduce_scatter_charge(counts, rank());
  charge(static_cast<int64_t>(sizeof(float)) * record * ring.elements, ring.messages);
}

RequestPtr CountingCommunicator::send_recv_async(Place send, int64_t send_bytes, int dest,
                                                 Place recv, int64_t recv_bytes, int source,
                                                 int tag) {
  if (dest != rank() && send_bytes > 0) charge(send_bytes, 1);
  return inner_->send_recv_async(send, send_bytes, dest, recv, recv_bytes, source, tag);
}

RequestPtr CountingCommunicator::all_to_all_async(Place send, std::span<const int64_t> send_bytes,
                                                  Place recv, std::span<const int64_t> recv_bytes) {
  charge_all_to_all(send_bytes);
  return inner_->all_to_all_async(send, send_bytes, recv, recv_bytes);
}

void CountingCommunicator::all_to_all(Place send, std::span<const int64_t> send_bytes, Place recv,
                                      std::span<const int64_t> recv_bytes) {
  charge_all_to_all(send_bytes);
  inner_->all_to_all(send, send_bytes, recv, recv_bytes);
}

void CountingCommunicator::charge_all_to_all(std::span<const int64_t> send_bytes) {
  int64_t bytes = 0, messages = 0;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank() || send_bytes[static_cast<size_t>(peer)] == 0) continue;
    bytes += send_bytes[static_cast<size_t>(peer)];
    ++messages;
  }
  charge(bytes, messages);
}

void CountingCommunicator::broadcast(void* data, int64_t bytes, int root) {
  if (rank() == root && size() > 1 && bytes > 0) charge(bytes, 1);
  inner_->broadcast(data, bytes, root);
}

void CountingCommunicator::charge_all_reduce(int64_t count, int64_t element_bytes) {
  const int64_t p = size();
  if (p <= 1) return;
  charge(2 * (p - 1) * ((count + p - 1) / p) * element_bytes, 2 * (p - 1));
}

void CountingCommunicator::all_reduce(float* data, int64_t count, Reduction reduction) {
  charge_all_reduce(count, 4);
  inner_->all_reduce(data, count, reduction);
}

void CountingCommunicator::all_reduce(double* data, int64_t count, Reduction reduction) {
  charge_all_reduce(count, 8);
  inner_->all_reduce(data, count, reduction);
}

void CountingCommunicator::all_reduce(int64_t* data, int64_t count, Reduction reduction) {
  charge_all_reduce(count, 8);
  inner_->all_reduce(data, count, reduction);
}

}  // namespace a2d
