// The CUDA backend: device buffers (stream-ordered cudaMallocAsync on the backend's one stream),
// pinned staging buffers, the copies between host and device and within the device, the copy
// stream and the fences between streams, the NCCL communicator's surface (cuda_backend.hpp) and
// the factory. Its data kernels and the attention kernels' launches are data_ops.cu; the class
// and what both share, cuda_backend_internal.cuh. Nothing here waits for the device except
// download() and upload() (the host needs the data, or may reuse its memory, when they return)
// and synchronize(). The attention kernels are forward.cu and backward.cu; the checks and launch
// shapes come from cuda_plan.hpp (plain C++, unit-tested without a GPU).
//
// NOT YET RUN ON A GPU: compiled for sm_80 and sm_90 by scripts/test.sh, to be checked by
// scripts/gpu/gpu_check.sh (docs/gpu.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "attention2d/error.hpp"
#include "backends/backends.hpp"
#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/cuda_backend_internal.cuh"
#include "backends/cuda/cuda_plan.hpp"

namespace a2d::backends {
namespace cuda_detail {
namespace {

class PinnedBuffer final : public Buffer {
 public:
  PinnedBuffer(Backend& backend, int64_t bytes) : Buffer(backend, bytes, allocate(bytes)) {}
  ~PinnedBuffer() override { cudaFreeHost(host_data()); }

 private:
  static void* allocate(int64_t bytes) {
    void* memory = nullptr;
    check_cuda(cudaMallocHost(&memory, static_cast<size_t>(std::max<int64_t>(bytes, 1))),
               "cudaMallocHost");
    return memory;
  }
};

// A point on a stream: an event recorded there.
class CudaFence final : public Fence {
 public:
  explicit CudaFence(cudaStream_t stream) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "fence event");
    check_cuda(cudaEventRecord(event_, stream), "fence record");
  }
  ~CudaFence() override { cudaEventDestroy(event_); }
  void wait() override { check_cuda(cudaEventSynchronize(event_), "fence wait"); }
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};
}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking), "copy stream");
}
CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(copies_);
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(copies_);
  cudaStreamDestroy(stream_);
}

BufferPtr CudaBackend::allocate(int64_t bytes) {
  A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
  return std::make_unique<DeviceBuffer>(*this, bytes, stream_);
}
BufferPtr CudaBackend::allocate_staging(int64_t bytes) {
  A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
  return std::make_unique<PinnedBuffer>(*this, bytes);
}
void CudaBackend::synchronize() {
  check_cuda(cudaStreamSynchronize(stream_), "synchronize");
}

BufferPtr CudaBackend::wrap_device(void* memory, int64_t bytes) {
  A2D_REQUIRE(bytes >= 0, "cannot wrap ", bytes, " bytes");
  if (bytes > 0) {
    cudaPointerAttributes attributes{};
    check_cuda(cudaPointerGetAttributes(&attributes, memory), "cudaPointerGetAttributes");
    A2D_REQUIRE(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
                "wrap_device: the address is not device memory (a CPU tensor?)");
    A2D_REQUIRE(attributes.device == device_, "wrap_device: the memory is on GPU ",
                attributes.device, ", but this backend runs on GPU ", device_);
  }
  return std::make_unique<DeviceBuffer>(*this, bytes, memory);
}
// Cross-stream ordering by events: neither the host nor the device waits as a whole.
void CudaBackend::follow_stream(void* stream) {
  CudaFence caller(static_cast<cudaStream_t>(stream));
  check_cuda(cudaStreamWaitEvent(stream_, caller.event(), 0), "follow the caller's stream");
}
void CudaBackend::lead_stream(void* stream) {
  CudaFence done(stream_);
  check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done.event(), 0),
             "the caller's stream waits for the backend");
}

void CudaBackend::upload(const void* host, Place to, int64_t bytes) {
  cuda_plan::check_place(to, bytes, "upload");
  if (bytes == 0) return;
  check_cuda(
      cudaMemcpyAsync(address(to), host, static_cast<size_t>(bytes), cudaMemcpyDefault, stream_),
      "upload");
  // The caller may reuse `host` (a staging buffer) as soon as this returns.
  synchronize();
}
// On the copy stream, after `after` (or everything issued so far): the copy runs beside the
// kernels issued since, and the backend's stream waits for it before its next operation.
void CudaBackend::upload_async(const void* host, Place to, int64_t bytes, const Fence* after) {
  cuda_plan::check_place(to, bytes, "upload");
  if (bytes == 0) return;
  const auto* point = dynamic_cast<const CudaFence*>(after);
  CudaFence now(stream_);
  check_cuda(cudaStreamWaitEvent(copies_, point ? point->event() : now.event(), 0),
             "copy stream wait");
  check_cuda(
      cudaMemcpyAsync(address(to), host, static_cast<size_t>(bytes), cudaMemcpyDefault, copies_),
      "upload_async");
  CudaFence copied(copies_);
  check_cuda(cudaStreamWaitEvent(stream_, copied.event(), 0), "stream waits for the copy");
}
// Recorded on the backend's stream, which has waited for every queued upload.
std::unique_ptr<Fence> CudaBackend::fence() {
  return std::make_unique<CudaFence>(stream_);
}

void CudaBackend::download(Place from, void* host, int64_t bytes) {
  cuda_plan::check_place(from, bytes, "download");
  if (bytes == 0) return;
  check_cuda(
      cudaMemcpyAsync(host, address(from), static_cast<size_t>(bytes), cudaMemcpyDefault, stream_),
      "download");
  synchronize();
}
void CudaBackend::fill_zero(Place at, int64_t bytes) {
  cuda_plan::check_place(at, bytes, "fill_zero");
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(address(at), 0, static_cast<size_t>(bytes), stream_), "fill_zero");
}
void CudaBackend::copy_bytes(Place from, Place to, int64_t bytes) {
  cuda_plan::check_place(from, bytes, "copy_bytes from");
  cuda_plan::check_place(to, bytes, "copy_bytes to");
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(address(to), address(from), static_cast<size_t>(bytes),
                             cudaMemcpyDefault, stream_),
             "copy_bytes");
}

}  // namespace cuda_detail

namespace {
const cuda_detail::CudaBackend& cuda_backend_of(const Backend& backend) {
  const auto* cuda = dynamic_cast<const cuda_detail::CudaBackend*>(&backend);
  A2D_REQUIRE(cuda, "the ", backend.name(), " backend is not the cuda backend");
  return *cuda;
}
}  // namespace

void* cuda_stream_of(const Backend& backend) {
  return cuda_backend_of(backend).stream();
}
int cuda_device_of(const Backend& backend) {
  return cuda_backend_of(backend).device();
}
std::byte* cuda_address_of(const Place& place) {
  A2D_REQUIRE(place.buffer, "a host place has no device address");
  return cuda_backend_of(place.buffer->backend()).address_of(place);
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  A2D_REQUIRE(status == cudaSuccess && count > 0, "--device cuda: no CUDA GPU is available here (",
              status == cudaSuccess ? "no devices" : cudaGetErrorString(status),
              "); use --device cpu");
  if (device >= 0) {
    A2D_REQUIRE(device < count, "cuda:", device, ": there are ", count,
                " GPUs here (cuda:0 to cuda:", count - 1, ")");
    return std::make_unique<cuda_detail::CudaBackend>(device);
  }
  // One GPU per rank: the node-local rank's (Open MPI and Slurm set it), else the first.
  device = 0;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name)) {
      device = std::atoi(value) % count;
      break;
    }
  }
  return std::make_unique<cuda_detail::CudaBackend>(device);
}

}  // namespace a2d::backends
