// The communicator interface over NCCL, on the CUDA backend's device memory (--comm nccl).
//
// NOT YET RUN ON A GPU: compiled by scripts/test.sh with the CUDA backend, to be checked by
// scripts/gpu/gpu_check.sh (docs/gpu.md, "Communicators").
//
// Streams. Each communicator (the world and every split: the grid's rows and columns) has an
// NCCL communicator and a stream of its own, of the highest priority. Posting an operation
// records an event on the backend's stream (the data to send, and the buffer to receive into, are
// ready once the work issued before the post is done) that the NCCL stream waits for; completing
// it makes the backend's stream wait for an event recorded on the NCCL stream after the transfer.
// The host waits for neither: a kernel launched between the post and the wait runs while the
// transfer does, and the kernel after the wait starts when both are done.
//
// Point-to-point operations are held back and issued together, as one ncclGroupStart/End, when
// any operation of the communicator is waited for or a collective is posted. NCCL runs the
// operations of one stream in order and has no tags, so a receive issued alone ahead of the send
// that a ring step posts after it would block the stream (and the neighbour's send) for good;
// grouped, each ring step's send to rank + 1 and receive from rank - 1 run together. The
// algorithms post a step's transfers before computing and wait after it, so every group is
// issued before the kernel that overlaps it finishes.
//
// Collectives: all-gather of equal blocks is ncclAllGather, a reduce-scatter sum or max of equal
// blocks is ncclReduceScatter; a sum of unequal blocks is an exchange of grouped sends and
// receives into scratch memory followed by the backend's add kernel on its own stream. The
// attention merge is the backend's (Communicator::merge_scatter: an all-to-all, then
// Backend::merge_partials). Host memory (places outside the
// backend's device buffers: the programs' host arrays, the agreement checks) moves over the host
// communicator the NCCL communicator was made with (a duplicate of an MPI communicator, or a Gloo
// mesh), as do broadcast, all_reduce and barrier.
#include "nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "backends/cuda/cuda_backend.hpp"
#include "host_forwarding.hpp"

namespace a2d::nccl {
namespace {

void check_nccl(ncclResult_t result, const char* what) {
  A2D_REQUIRE(result == ncclSuccess, "NCCL ", what, ": ", ncclGetErrorString(result));
}
void check_cuda(cudaError_t status, const char* what) {
  A2D_REQUIRE(status == cudaSuccess, "CUDA: ", what, ": ", cudaGetErrorString(status));
}

// A CUDA event without timing, owned.
class Event {
 public:
  Event() { check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "event"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// One point-to-point transfer waiting to be issued.
struct Transfer {
  bool send = false;
  int peer = 0;
  std::byte* data = nullptr;
  int64_t bytes = 0;
};

class Operation;

// The NCCL side of one communicator: its NCCL communicator, its stream, the backend's stream,
// and the point-to-point transfers not yet issued. Shared by the communicator and its requests.
class Channel {
 public:
  Channel(ncclComm_t comm, const Backend& backend)
      : comm_(comm), compute_(static_cast<cudaStream_t>(backends::cuda_stream_of(backend))) {
    int least = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities");
    check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
               "NCCL stream");
  }
  ~Channel() {
    try {
      issue();
    } catch (...) {
      // Destructors must not throw; the transfers' own waits report errors.
    }
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  cudaStream_t compute() const { return compute_; }

  // The NCCL stream waits for the work issued on the backend's stream so far.
  void after_compute() {
    Event posted;
    check_cuda(cudaEventRecord(posted.get(), compute_), "record post");
    check_cuda(cudaStreamWaitEvent(stream_, posted.get(), 0), "wait for post");
  }
  // The backend's stream waits for the work issued on the NCCL stream so far.
  void compute_after_transfers(const Event& done) {
    check_cuda(cudaStreamWaitEvent(compute_, done.get(), 0), "wait for transfer");
  }

  // Transfers of `operation`, held until issue().
  void hold(std::vector<Transfer> transfers, Operation* operation) {
    after_compute();  // the data are ready now, whenever the transfers are issued
    for (Transfer& t : transfers)
      held_.push_back(t);
    waiting_.push_back(operation);
  }
  void forget(Operation* operation) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), operation), waiting_.end());
  }
  // Issues the held transfers as one group, then marks their operations done by an event on
  // the NCCL stream after them.
  void issue();

 private:
  ncclComm_t comm_;
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  std::vector<Transfer> held_;
  std::vector<Operation*> waiting_;
};

// One posted operation: done once the event recorded after its transfers is reached; then
// `finish` (the merge or add kernels of an exchange) runs on the backend's stream.
class Operation final : public Request {
 public:
  using Finish = std::function<void()>;
  Operation(std::shared_ptr<Channel> channel, Finish finish = {})
      : channel_(std::move(channel)), finish_(std::move(finish)) {}
  ~Operation() override {
    try {
      wait();
    } catch (...) {
      // A destructor must not throw; the owner's wait() reports errors.
    }
    channel_->forget(this);
  }

  // The transfers are on the NCCL stream; the event after them is recorded now.
  void issued() {
    check_cuda(cudaEventRecord(done_.get(), channel_->stream()), "record transfer");
    issued_ = true;
  }

  void wait() override {
    if (waited_) return;
    if (!issued_) channel_->issue();
    waited_ = true;
    channel_->compute_after_transfers(done_);
    if (finish_) finish_();
    scratch_.clear();
  }
  // Scratch memory of the backend kept until the finish has been issued (stream-ordered frees).
  void keep(BufferPtr buffer) { scratch_.push_back(std::move(buffer)); }

 private:
  std::shared_ptr<Channel> channel_;
  Finish finish_;
  Event done_;
  bool issued_ = false;
  bool waited_ = false;
  std::vector<BufferPtr> scratch_;
};

void Channel::issue() {
  if (waiting_.empty() && held_.empty()) return;
  if (!held_.empty()) {
    check_nccl(ncclGroupStart(), "group start");
    for (const Transfer& t : held_) {
      const auto count = static_cast<size_t>(t.bytes);
      if (t.send) {
        check_nccl(ncclSend(t.data, count, ncclUint8, t.peer, comm_, stream_), "send");
      } else {
        check_nccl(ncclRecv(t.data, count, ncclUint8, t.peer, comm_, stream_), "recv");
      }
    }
    check_nccl(ncclGroupEnd(), "group end");
    held_.clear();
  }
  ncclResult_t async = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(comm_, &async), "async error query");
  check_nccl(async, "asynchronous error");
  std::vector<Operation*> operations;
  operations.swap(waiting_);
  for (Operation* operation : operations)
    operation->issued();
}

bool on_device(const Place& place) {
  return place.buffer && !place.buffer->host_data();
}

class NcclCommunicator final : public comm_detail::HostForwarding {
 public:
  // Takes `comm` and `host` (a host communicator of the same ranks in the same order).
  NcclCommunicator(ncclComm_t comm, std::unique_ptr<Communicator> host, Backend& backend)
      : host_(std::move(host)), backend_(backend) {
    channel_ = std::make_shared<Channel>(comm, backend);
  }
  ~NcclCommunicator() override {
    channel_.reset();
    host_.reset();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    channel_->issue();
    std::unique_ptr<Communicator> host_part = host_->split(color, key);
    ncclComm_t part = nullptr;
    check_nccl(ncclCommSplit(channel_->comm(), color, key, &part, nullptr), "comm split");
    return std::make_unique<NcclCommunicator>(part, std::move(host_part), backend_);
  }

  RequestPtr all_gather_async(Place send, Place recv, std::span<const int64_t> bytes) override {
    check_counts(bytes);
    if (!device(send, recv)) return host_->all_gather_async(send, recv, bytes);
    const int64_t own = bytes[static_cast<size_t>(rank())];
    const int64_t at = std::accumulate(bytes.begin(), bytes.begin() + rank(), int64_t{0});
    if (std::all_of(bytes.begin(), bytes.end(), [&](int64_t b) { return b == own; })) {
      if (own == 0) return completed_request();
      return collective([&] {
        check_nccl(ncclAllGather(address(send), address(recv), static_cast<size_t>(own), ncclUint8,
                                 channel_->comm(), channel_->stream()),
                   "all-gather");
      });
    }
    // Unequal blocks: the own block is copied into place, the others are exchanged.
    std::vector<Transfer> transfers;
    int64_t offset = 0;
    for (int peer = 0; peer < size(); ++peer) {
      const int64_t block = bytes[static_cast<size_t>(peer)];
      if (peer != rank() && block > 0) {
        if (own > 0) transfers.push_back({true, peer, address(send), own});
        transfers.push_back({false, peer, address(recv) + offset, block});
      }
      offset += block;
    }
    copy_on_compute(address(recv) + at, address(send), own);
    return exchange(std::move(transfers));
  }

  RequestPtr reduce_scatter_async(Place send, Place recv, std::span<const int64_t> counts,
                                  int64_t record, Reduction reduction) override {
    check_counts(counts);
    if (!device(send, recv)) {
      return host_->reduce_scatter_async(send, recv, counts, record, reduction);
    }
    const int64_t unit = record * static_cast<int64_t>(sizeof(float));
    const int64_t own = counts[static_cast<size_t>(rank())];
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == own; });
    if (equal) {
      if (own == 0) return completed_request();
      return collective([&] {
        check_nccl(
            ncclReduceScatter(address(send), address(recv), static_cast<size_t>(own * record),
                              ncclFloat32, reduction == Reduction::sum ? ncclSum : ncclMax,
                              channel_->comm(), channel_->stream()),
            "reduce-scatter");
      });
    }
    A2D_REQUIRE(reduction != Reduction::max,
                "the NCCL communicator reduces unequal blocks by sum only");
    // Exchange: block `peer` goes to `peer`; the blocks for this rank arrive in scratch, slot by
    // slot, and are added into the own block (copied to recv first) on the backend's stream when
    // the exchange completes.
    const int64_t own_bytes = own * unit;
    BufferPtr arrived = backend_.allocate(own_bytes * std::max(size() - 1, 0));
    std::vector<Transfer> transfers;
    std::vector<int64_t> slots;
    int64_t offset = 0;
    for (int peer = 0; peer < size(); ++peer) {
      const int64_t block = counts[static_cast<size_t>(peer)] * unit;
      if (peer != rank()) {
        if (block > 0) transfers.push_back({true, peer, address(send) + offset, block});
        if (own_bytes > 0) {
          const int64_t slot = static_cast<int64_t>(slots.size()) * own_bytes;
          transfers.push_back({false, peer, address(Place::in(*arrived, slot)), own_bytes});
          slots.push_back(slot);
        }
      }
      offset += block;
    }
    const int64_t at = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0}) * unit;
    copy_on_compute(address(recv), address(send) + at, own_bytes);
    // The finish may run after this communicator is gone (a request outlives it): it holds the
    // backend, not `this`.
    Buffer* scratch = arrived.get();
    Backend* backend = &backend_;
    auto operation = exchange(std::move(transfers), [backend, recv, scratch, slots, own, record] {
      for (int64_t slot : slots)
        backend->add(recv, Place::in(*scratch, slot), own * record);
    });
    operation->keep(std::move(arrived));
    return operation;
  }

  RequestPtr send_recv_async(Place send, int64_t send_bytes, int dest, Place recv,
                             int64_t recv_bytes, int source, int tag) override {
    A2D_REQUIRE(dest >= 0 && dest < size() && source >= 0 && source < size(), "send_recv: ranks ",
                dest, " and ", source, " of ", size());
    const bool host_send = send_bytes > 0 && !on_device(send);
    const bool host_recv = recv_bytes > 0 && !on_device(recv);
    if (host_send || host_recv) {
      A2D_REQUIRE((send_bytes == 0 || host_send) && (recv_bytes == 0 || host_recv),
                  "send_recv: one side in device memory and the other in host memory");
      return host_->send_recv_async(send, send_bytes, dest, recv, recv_bytes, source, tag);
    }
    std::vector<Transfer> transfers;
    if (dest == rank() && source == rank()) {
      A2D_REQUIRE(send_bytes == recv_bytes, "send_recv to itself of ", send_bytes, " bytes into ",
                  recv_bytes);
      copy_on_compute(address(recv), address(send), send_bytes);
      return completed_request();
    }
    if (send_bytes > 0) transfers.push_back({true, dest, address(send), send_bytes});
    if (recv_bytes > 0) transfers.push_back({false, source, address(recv), recv_bytes});
    if (transfers.empty()) return completed_request();
    return exchange(std::move(transfers));
  }

  RequestPtr all_to_all_async(Place send, std::span<const int64_t> send_bytes, Place recv,
                              std::span<const int64_t> recv_bytes) override {
    check_counts(send_bytes);
    check_counts(recv_bytes);
    if (!device(send, recv)) return host_->all_to_all_async(send, send_bytes, recv, recv_bytes);
    std::vector<Transfer> transfers;
    int64_t send_at = 0, recv_at = 0;
    for (int peer = 0; peer < size(); ++peer) {
      const int64_t out = send_bytes[static_cast<size_t>(peer)];
      const int64_t in = recv_bytes[static_cast<size_t>(peer)];
      if (peer == rank()) {
        A2D_REQUIRE(out == in, "all_to_all: the own block is ", out, " bytes sent and ", in,
                    " received");
        copy_on_compute(address(recv) + recv_at, address(send) + send_at, out);
      } else {
        if (out > 0) transfers.push_back({true, peer, address(send) + send_at, out});
        if (in > 0) transfers.push_back({false, peer, address(recv) + recv_at, in});
      }
      send_at += out;
      recv_at += in;
    }
    if (transfers.empty()) return completed_request();
    return exchange(std::move(transfers));
  }

  void barrier() override {
    channel_->issue();
    host_->barrier();
  }
  // NCCL progresses on the GPU; MPI's host operations progress inside their own calls.
  void progress() override {}

 private:
  Communicator& host_side() override { return *host_; }

  void check_counts(std::span<const int64_t> counts) const {
    A2D_REQUIRE(static_cast<int>(counts.size()) == size(),
                "a collective needs one count per rank (", size(), "), got ", counts.size());
  }
  // Whether an operation moves device memory (both places in the backend's device buffers) or
  // host memory (neither); mixing them is an error.
  bool device(const Place& send, const Place& recv) const {
    const bool out = on_device(send), in = on_device(recv);
    A2D_REQUIRE(out == in || send.empty() || recv.empty(), "an NCCL collective from ",
                out ? "device" : "host", " memory into ", in ? "device" : "host", " memory");
    return out || in;
  }
  // The device address of a place in the backend's buffers (null for an empty place, which only
  // zero-byte blocks use).
  std::byte* address(const Place& place) const {
    if (!place.buffer) {
      A2D_REQUIRE(!place.host, "an NCCL transfer between host and device memory");
      return nullptr;
    }
    A2D_REQUIRE(&place.buffer->backend() == &backend_, "a buffer of the ",
                place.buffer->backend().name(), " backend was passed to the NCCL communicator");
    return backends::cuda_address_of(place);
  }
  // A device-to-device copy on the backend's stream (ordered before the finish of the operation
  // posted next, which waits on that stream).
  void copy_on_compute(std::byte* to, const std::byte* from, int64_t bytes) {
    if (bytes == 0 || to == from) return;
    check_cuda(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                               channel_->compute()),
               "local block copy");
  }

  // A collective: the held point-to-point transfers are issued first (NCCL keeps the order of a
  // stream), then `call` on the NCCL stream after the backend's work so far.
  template <typename Call>
  std::unique_ptr<Operation> collective(Call&& call) {
    channel_->issue();
    channel_->after_compute();
    call();
    auto operation = std::make_unique<Operation>(channel_);
    operation->issued();
    return operation;
  }
  // Point-to-point transfers, held until the next wait or collective (see the top).
  std::unique_ptr<Operation> exchange(std::vector<Transfer> transfers,
                                      Operation::Finish finish = {}) {
    auto operation = std::make_unique<Operation>(channel_, std::move(finish));
    channel_->hold(std::move(transfers), operation.get());
    return operation;
  }

  std::unique_ptr<Communicator> host_;
  Backend& backend_;
  std::shared_ptr<Channel> channel_;
};

}  // namespace

int version() {
  int code = 0;
  check_nccl(ncclGetVersion(&code), "version");
  return code;
}

std::string gpu_identity(const Backend& backend) {
  char bus[64] = {};
  check_cuda(cudaDeviceGetPCIBusId(bus, sizeof bus, backends::cuda_device_of(backend)),
             "PCI bus id");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "/" + bus;
}

std::unique_ptr<Communicator> make_communicator(std::unique_ptr<Communicator> host,
                                                Backend& backend) {
  A2D_REQUIRE(host, "the NCCL communicator needs a host communicator");
  ncclUniqueId id{};
  if (host->rank() == 0) check_nccl(ncclGetUniqueId(&id), "unique id");
  host->broadcast(&id, sizeof id, 0);
  check_cuda(cudaSetDevice(backends::cuda_device_of(backend)), "cudaSetDevice");
  ncclComm_t nccl_comm = nullptr;
  check_nccl(ncclCommInitRank(&nccl_comm, host->size(), id, host->rank()), "comm init");
  return std::make_unique<NcclCommunicator>(nccl_comm, std::move(host), backend);
}

#ifdef A2D_WITH_MPI
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Backend& backend) {
  return make_communicator(make_mpi_communicator(comm), backend);
}
#endif

}  // namespace a2d::nccl
