// attention2d: the communicator interface every distributed algorithm is written against.
//
// Data move between Places (backend.hpp): positions in a backend's buffers, or in plain host
// memory. Counts are in bytes, so records that mix element types (bf16 rows with fp32 row
// statistics) move as they are; reductions combine fp32 records of `record` floats. Each
// operation has a non-blocking form returning a Request and a blocking form that waits for it.
// MPI (mpi_comm.hpp) and Gloo (gloo_comm.hpp) implement the interface for host-accessible memory;
// make_staged_communicator wraps any communicator so that buffers the host cannot touch (a GPU's,
// the fenced test backend's) move through host staging memory; a CountingCommunicator wraps any
// implementation and records the bytes and messages this rank sends, per phase (both in
// comm_wrappers.hpp; the choice of a kind of communicator, CommKind, in comm_kind.hpp).
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
#include <memory>
#include <span>
#include <string>

#include "attention2d/buffer.hpp"
#include "attention2d/traffic.hpp"

namespace a2d {

class Backend;  // backend.hpp: merge_scatter merges with one

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

}  // namespace a2d
