// attention2d: the communicator interface every distributed algorithm is written against.
//
// Data move between Places (backend.hpp): positions in a backend's buffers, or in plain host
// memory. Counts are in bytes, so records that mix element types (bf16 rows with fp32 row
// statistics) move as they are; reductions combine fp32 records of `record` floats. Each
// operation has a non-blocking form returning a Request and a blocking form that waits for it.
// MPI (mpi_comm.hpp) and Gloo (gloo_comm.hpp) implement the interface for host-accessible memory;
// make_staged_communicator wraps any communicator so that buffers the host cannot touch (a GPU's,
// the fenced test backend's) move through host staging memory; a CountingCommunicator wraps any
// implementation and records the bytes and messages this rank sends, per phase.
//
// Counting convention (docs/cost-model.md): each collective is charged what this rank sends in
// the bandwidth-optimal ring schedule for it, which is also what the cost model assumes; a block
// that is empty (a rank owning no token) is not sent and costs no message:
//   all_gather      every block except the one of rank+1 (ring: own block first, then forward
//                   what arrives from rank-1), one message per non-empty block
//   reduce_scatter  every block except the rank's own, one message per non-empty block
//   all_to_all      one message per other rank with a non-empty block; those blocks
//   send_recv       one message with the send buffer, unless sent to itself or empty
//   broadcast       the root is charged one message with the buffer
//   all_reduce      2(P-1) messages, 2(P-1) * ceil(count / P) elements (reduce-scatter +
//                   all-gather)
// Messages and bytes to oneself are local copies and count as zero.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "attention2d/backend.hpp"

namespace a2d {

// How reduce_scatter and all_reduce combine contributions: element-wise, fp32 (the attention
// merge of partial records is not a reduction of the communicator's: see merge_scatter).
enum class Reduction { sum, max };

// A posted non-blocking operation. wait() completes it; destroying a Request that was not
// waited for waits for it.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
};
using RequestPtr = std::unique_ptr<Request>;

// A request that is already complete (operations on one rank, empty transfers).
RequestPtr completed_request();

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Ranks with the same color form a new communicator, ordered by key (as MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Rank i contributes bytes[i] bytes; recv receives all contributions in rank order
  // (sum(bytes) bytes). `send` may be recv at this rank's own offset.
  virtual RequestPtr all_gather_async(Place send, Place recv, std::span<const int64_t> bytes) = 0;
  // send holds sum(counts) fp32 records, block i (counts[i] records of `record` floats) destined
  // for rank i; recv receives counts[rank()] records, reduced over every rank's block.
  virtual RequestPtr reduce_scatter_async(Place send, Place recv, std::span<const int64_t> counts,
                                          int64_t record, Reduction reduction) = 0;
  // Sends send_bytes to `dest` and receives recv_bytes from `source`. Both sides must agree on
  // the sizes; a zero size posts nothing. Concurrent exchanges between the same ranks are told
  // apart by `tag`.
  virtual RequestPtr send_recv_async(Place send, int64_t send_bytes, int dest, Place recv,
                                     int64_t recv_bytes, int source, int tag = 0) = 0;
  // Block i of send (send_bytes[i] bytes) goes to rank i; block j of recv comes from rank j.
  virtual RequestPtr all_to_all_async(Place send, std::span<const int64_t> send_bytes, Place recv,
                                      std::span<const int64_t> recv_bytes) = 0;

  // Copies `bytes` bytes from `root` to every rank (used to distribute inputs and references,
  // never inside an algorithm).
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void all_reduce(float* data, int64_t count, Reduction reduction) = 0;
  virtual void all_reduce(double* data, int64_t count, Reduction reduction) = 0;
  virtual void all_reduce(int64_t* data, int64_t count, Reduction reduction) = 0;
  virtual void barrier() = 0;
  // Lets outstanding non-blocking operations advance (MPI progresses only inside MPI calls);
  // called by long computations between tiles.
  virtual void progress() {}

  // Names the phase that following operations are charged to (see CountingCommunicator).
  virtual void set_phase(const std::string& /*phase*/) {}

  // Whether this communicator moves buffers the host cannot touch (a staged communicator, NCCL
  // on a GPU's memory) itself; the algorithms stage the others where their backend needs it.
  virtual bool moves_backend_buffers() const { return false; }

  // Blocking forms. An implementation may run them with other algorithms than the non-blocking
  // forms: over MPI, the blocking reduce-scatter is a ring of point-to-point steps and the
  // blocking all-gather is Open MPI's tuned MPI_Allgatherv; Open MPI's non-blocking
  // reduce-scatter was ~30x slower for large blocks (docs/benchmarks.md). Use these whenever
  // nothing is computed while the collective runs.
  virtual void all_gather(Place send, Place recv, std::span<const int64_t> bytes) {
    all_gather_async(send, recv, bytes)->wait();
  }
  virtual void reduce_scatter(Place send, Place recv, std::span<const int64_t> counts,
                              int64_t record, Reduction reduction) {
    reduce_scatter_async(send, recv, counts, record, reduction)->wait();
  }
  void send_recv(Place send, int64_t send_bytes, int dest, Place recv, int64_t recv_bytes,
                 int source, int tag = 0) {
    send_recv_async(send, send_bytes, dest, recv, recv_bytes, source, tag)->wait();
  }
  virtual void all_to_all(Place send, std::span<const int64_t> send_bytes, Place recv,
                          std::span<const int64_t> recv_bytes) {
    all_to_all_async(send, send_bytes, recv, recv_bytes)->wait();
  }

  // The attention merge of partial records along this communicator (ATTENTION2D's row merge, the
  // decoder's split-KV merge), blocking: send holds sum(counts) fp32 records of `record` floats
  // [row max, row sum, acc(record - 2)], block i for rank i; recv (not overlapping send) receives
  // counts[rank()] records, every rank's block merged. The communicator only moves the records,
  // in the ring schedule of the reduce-scatter (P - 1 send_recv steps, so charged as the ring
  // reduce-scatter is); `backend` merges them (Backend::merge_partials) where they live, so a
  // GPU's records are merged on the GPU whatever carries them. src/comm/merge_scatter.cpp.
  void merge_scatter(Place send, Place recv, std::span<const int64_t> counts, int64_t record,
                     Backend& backend);
};

// Bytes and messages this rank sent, by phase name.
struct Traffic {
  int64_t bytes = 0;
  int64_t messages = 0;
};

class TrafficLog {
 public:
  void add(const std::string& phase, int64_t bytes, int64_t messages);
  const std::map<std::string, Traffic>& phases() const { return phases_; }
  // Sum over the phases whose name starts with `prefix` ("" = everything).
  Traffic total(const std::string& prefix = "") const;
  void clear() {
    phases_.clear();
    seconds_.clear();
    switched_at_ = -1;
  }

  // Wall-clock time by phase: a phase's clock runs from the set_phase that names it to the next
  // set_phase (so time spent computing after naming "forward.kernel" is the kernel's).
  void switch_phase(const std::string& from, double now);
  const std::map<std::string, double>& seconds() const { return seconds_; }

 private:
  std::map<std::string, Traffic> phases_;
  std::map<std::string, double> seconds_;
  double switched_at_ = -1;
};

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

// Ring-schedule charges of the counting convention above (elements as given in counts); shared
// with the cost model.
struct RingCharge {
  int64_t elements = 0;
  int64_t messages = 0;
};
RingCharge ring_all_gather_charge(std::span<const int64_t> counts, int rank);
RingCharge ring_reduce_scatter_charge(std::span<const int64_t> counts, int rank);

// What carries the algorithms' messages (--comm):
//   mpi   MPI on host memory; a GPU's buffers (any backend whose buffers are not host-accessible)
//         are staged through pinned host buffers by the algorithms (make_staged_communicator).
//         Works with an MPI that is not CUDA-aware and with several ranks on one GPU.
//   nccl  NCCL on the CUDA backend's device memory (docs/gpu.md, "Communicators"): grouped
//         send/recv, all-gather and reduce-scatter on a stream of its own, ordered against the
//         backend's stream by events, so the host never waits for a transfer. Needs the build's
//         CUDA backend (-DA2D_WITH_CUDA=ON), --device cuda and, under NCCL before 2.30, one GPU
//         per rank.
//   gloo  Gloo's TCP transport on host memory (gloo_comm.hpp): one full mesh of connections,
//         bootstrapped over MPI here (over torch.distributed in Python); a GPU's and the fenced
//         backend's buffers are staged through host memory as for mpi. Needs a build with Gloo
//         (-DA2D_WITH_GLOO, on where libgloo-dev is installed).
enum class CommKind { mpi, nccl, gloo };
CommKind parse_comm_kind(const std::string& name);  // throws a2d::Error naming the choices
std::string comm_kind_name(CommKind kind);
// The backend's native communicator (BackendCapabilities::native_comm: nccl for cuda), else mpi.
CommKind default_comm_kind(const Backend& backend);

// `inner` with staging: data in buffers whose host_data() is null (a device's, the fenced
// backend's) is copied by `backend` into host staging memory before it is sent and out of it
// once it has arrived (at wait() for a posted operation); host-accessible places pass straight
// through. Sums and maxima run on the staged host copies; merge_scatter merges on `backend`.
// Splits are staged as well.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner,
                                                       Backend& backend);

}  // namespace a2d
