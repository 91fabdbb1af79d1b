// Internal: a communicator whose operations on host memory (broadcast, all_reduce, barrier,
// progress, set_phase) are those of another one: the staged and the NCCL communicators move
// backend buffers themselves and hand everything else to the MPI communicator they hold.
#pragma once

#include <string>

#include "attention2d/comm.hpp"

namespace a2d::comm_detail {

class HostForwarding : public Communicator {
 public:
  void broadcast(void* data, int64_t bytes, int root) override {
    host_side().broadcast(data, bytes, root);
  }
  void all_reduce(float* data, int64_t count, Reduction reduction) override {
    host_side().all_reduce(data, count, reduction);
  }
  void all_reduce(double* data, int64_t count, Reduction reduction) override {
    host_side().all_reduce(data, count, reduction);
  }
  void all_reduce(int64_t* data, int64_t count, Reduction reduction) override {
    host_side().all_reduce(data, count, reduction);
  }
  void barrier() override { host_side().barrier(); }
  void progress() override { host_side().progress(); }
  void set_phase(const std::string& phase) override { host_side().set_phase(phase); }
  bool moves_backend_buffers() const override { return true; }

 protected:
  // The communicator of the same ranks that the host operations go to.
  virtual Communicator& host_side() = 0;
};

}  // namespace a2d::comm_detail
