// attention2d: communicators that wrap another one: the counting communicator (records the bytes
// and messages this rank sends, per phase, by comm.hpp's counting convention) and the staged one
// (moves buffers the host cannot touch through host staging memory).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "attention2d/comm.hpp"
#include "attention2d/traffic.hpp"

namespace a2d {

// Forwards every operation to `inner` and charges it to the current phase of a shared log
// (shared so the world, row and column communicators of a grid add into one log).
class CountingCommunicator : public Communicator {
 public:
  CountingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<TrafficLog> log,
                       std::shared_ptr<std::string> phase = nullptr);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<Communicator> split(int color, int key) override;
  RequestPtr all_gather_async(Place send, Place recv, std::span<const int64_t> bytes) override;
  RequestPtr reduce_scatter_async(Place send, Place recv, std::span<const int64_t> counts,
                                  int64_t record, Reduction reduction) override;
  RequestPtr send_recv_async(Place send, int64_t send_bytes, int dest, Place recv,
                             int64_t recv_bytes, int source, int tag = 0) override;
  RequestPtr all_to_all_async(Place send, std::span<const int64_t> send_bytes, Place recv,
                              std::span<const int64_t> recv_bytes) override;
  void all_gather(Place send, Place recv, std::span<const int64_t> bytes) override;
  void reduce_scatter(Place send, Place recv, std::span<const int64_t> counts, int64_t record,
                      Reduction reduction) override;
  void all_to_all(Place send, std::span<const int64_t> send_bytes, Place recv,
                  std::span<const int64_t> recv_bytes) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void all_reduce(float* data, int64_t count, Reduction reduction) override;
  void all_reduce(double* data, int64_t count, Reduction reduction) override;
  void all_reduce(int64_t* data, int64_t count, Reduction reduction) override;
  void barrier() override { inner_->barrier(); }
  void progress() override { inner_->progress(); }
  void set_phase(const std::string& phase) override;
  bool moves_backend_buffers() const override { return inner_->moves_backend_buffers(); }

  const TrafficLog& log() const { return *log_; }
  // The communicator this one counts for.
  Communicator& inner() { return *inner_; }
  // The current phase's name, shared with the splits (and with any other communicator made with
  // it, so that phases set on either time and charge both).
  const std::shared_ptr<std::string>& shared_phase() const { return phase_; }

 private:
  void charge(int64_t bytes, int64_t messages);
  void charge_all_gather(std::span<const int64_t> bytes);
  void charge_reduce_scatter(std::span<const int64_t> counts, int64_t record);
  void charge_all_to_all(std::span<const int64_t> send_bytes);
  void charge_all_reduce(int64_t count, int64_t element_bytes);

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<TrafficLog> log_;
  std::shared_ptr<std::string> phase_;
};

// `inner` with staging: data in buffers whose host_data() is null (a device's, the fenced
// backend's) is copied by `backend` into host staging memory before it is sent and out of it
// once it has arrived (at wait() for a posted operation); host-accessible places pass straight
// through. Sums and maxima run on the staged host copies; merge_scatter merges on `backend`.
// Splits are staged as well.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner,
                                                       Backend& backend);

}  // namespace a2d
