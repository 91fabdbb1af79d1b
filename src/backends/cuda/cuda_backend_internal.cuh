// Private to the CUDA backend's sources (cuda_backend.cu: buffers, copies, streams, fences and the
// factory; data_ops.cu: the data kernels and every operation that launches one, the attention
// kernels' launches included): the CUDA error checks, the kernels' strided views, the device
// buffer, per-operation scratch, and the CudaBackend class. Included only by .cu files.
//
// NOT YET RUN ON A GPU (docs/gpu.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/error.hpp"
#include "backends/backends.hpp"
#include "backends/cuda/attention_kernels.hpp"
#include "backends/cuda/cuda_plan.hpp"

namespace a2d::backends::cuda_detail {

using cuda_kernels::DeviceFloats;
using cuda_kernels::DeviceRows;
using cuda_kernels::DeviceTokens;

inline void check_cuda(cudaError_t status, const char* what) {
  A2D_REQUIRE(status == cudaSuccess, "CUDA: ", what, ": ", cudaGetErrorString(status));
}
inline void check_launch(const char* what) {
  check_cuda(cudaGetLastError(), what);
}

inline dim3 grid_of(const cuda_plan::Launch& launch) {
  return dim3(static_cast<unsigned>(launch.grid_x), static_cast<unsigned>(launch.grid_y),
              static_cast<unsigned>(launch.grid_z));
}

struct Strided {  // [batch, tokens, heads, width] of one dtype, strides in elements
  void* data;
  int dtype;
  int64_t batch_stride, token_stride, head_stride;
  __device__ int64_t at(int64_t b, int64_t t, int64_t h) const {
    return b * batch_stride + t * token_stride + h * head_stride;
  }
};
struct StridedRows {  // [batch, heads, tokens] fp32
  float* data;
  int64_t batch_stride, head_stride, token_stride;
  __device__ float& at(int64_t b, int64_t h, int64_t t) const {
    return data[b * batch_stride + h * head_stride + t * token_stride];
  }
};
struct RowsDims {
  int64_t batch, tokens, heads, head_dim;
  __device__ void split(int64_t row, int64_t& b, int64_t& t, int64_t& h) const {
    h = row % heads;
    t = (row / heads) % tokens;
    b = row / (heads * tokens);
  }
};

// ---- buffers ----
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(Backend& backend, int64_t bytes, cudaStream_t stream)
      : Buffer(backend, bytes, nullptr), stream_(stream) {
    if (bytes > 0) {
      check_cuda(cudaMallocAsync(&memory_, static_cast<size_t>(bytes), stream), "cudaMallocAsync");
      // All-ones bytes (NaN in every float type), as on the fenced backend: a kernel that reads
      // an element nobody wrote poisons the results the checks compare.
      check_cuda(cudaMemsetAsync(memory_, 0xff, static_cast<size_t>(bytes), stream), "poison");
    }
  }
  // The caller's device memory (wrap_device): neither poisoned nor freed here.
  DeviceBuffer(Backend& backend, int64_t bytes, void* foreign)
      : Buffer(backend, bytes, nullptr), memory_(foreign), stream_(nullptr), owned_(false) {}
  ~DeviceBuffer() override {
    // Stream-ordered: the memory returns to the pool after the operations issued before.
    if (memory_ && owned_) cudaFreeAsync(memory_, stream_);
  }
  std::byte* memory() const { return static_cast<std::byte*>(memory_); }

 private:
  void* memory_ = nullptr;
  cudaStream_t stream_;
  bool owned_ = true;
};

// A stream-ordered scratch allocation for one operation.
class Scratch {
 public:
  Scratch(int64_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) {
      check_cuda(cudaMallocAsync(&memory_, static_cast<size_t>(bytes), stream), "scratch");
    }
  }
  ~Scratch() {
    if (memory_) cudaFreeAsync(memory_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(memory_);
  }

 private:
  void* memory_ = nullptr;
  cudaStream_t stream_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const BackendCapabilities& capabilities() const override {
    static const BackendCapabilities capabilities = cuda_capabilities();
    return capabilities;
  }
  void check_supported(DType dtype, int64_t head_dim, const Mask& mask,
                       float softcap) const override {
    cuda_plan::check_supported(dtype, head_dim, mask, softcap);
  }

  // Memory, copies, streams and fences (cuda_backend.cu).
  BufferPtr allocate(int64_t bytes) override;
  BufferPtr allocate_staging(int64_t bytes) override;
  void synchronize() override;
  BufferPtr wrap_device(void* memory, int64_t bytes) override;
  void follow_stream(void* stream) override;
  void lead_stream(void* stream) override;

  // For the NCCL communicator (cuda_backend.hpp).
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  std::byte* address_of(const Place& place) const { return address(place); }

  void upload(const void* host, Place to, int64_t bytes) override;
  void upload_async(const void* host, Place to, int64_t bytes, const Fence* after) override;
  std::unique_ptr<Fence> fence() override;
  void download(Place from, void* host, int64_t bytes) override;
  void fill_zero(Place at, int64_t bytes) override;
  void copy_bytes(Place from, Place to, int64_t bytes) override;

  // The data operations and the attention kernels' launches (data_ops.cu).
  void copy_tokens(const TokenTensor& from, const TokenTensor& to,
                   const TokenBlock& block) override;
  void copy_rows(const RowTensor& from, const RowTensor& to, int64_t batch, int64_t heads,
                 int64_t tokens) override;
  void permute_tokens(Place at, int64_t tokens, int64_t token_bytes, Place order) override;

  void attention_forward(const ForwardCall& call, const TokenTensor& out,
                         const RowTensor& lse) override;
  void attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                 bool accumulate) override;
  void attention_backward(const BackwardCall& call, const TokenTensor& dq, const TokenTensor& dk,
                          const TokenTensor& dv) override;

  void merge_partials(Place into, Place from, int64_t count, int64_t record) override;
  void finalize(const RowsShape& r, const PartialTensor& state, const TokenTensor& out,
                const RowTensor& lse) override;
  void delta(const RowsShape& r, const TokenTensor& out, const TokenTensor& d_out,
             const RowTensor& delta_rows) override;
  void add(Place into, Place from, int64_t count) override;
  void add_sinks(const RowsShape& r, const float* sinks, int64_t first_head, const TokenTensor& out,
                 const RowTensor& lse) override;
  void add_sink_gradient(const RowsShape& r, const float* sinks, int64_t first_head,
                         const RowTensor& lse, const RowTensor& delta_rows, double* dsink) override;

 private:
  std::byte* address(const Place& place) const {
    if (!place.buffer) return place.host + place.offset;
    A2D_REQUIRE(&place.buffer->backend() == this, "a buffer of the ",
                place.buffer->backend().name(), " backend was passed to the cuda backend");
    if (place.buffer->host_data()) {
      return static_cast<std::byte*>(place.buffer->host_data()) + place.offset;
    }
    return static_cast<const DeviceBuffer*>(place.buffer)->memory() + place.offset;
  }
  void* base(Buffer* buffer, int64_t offset) const {
    return buffer ? address(Place::in(*buffer, offset)) : nullptr;
  }
  Strided strided(const TokenTensor& t) const {
    return {base(t.buffer, t.offset), static_cast<int>(t.dtype), t.batch_stride, t.token_stride,
            t.head_stride};
  }
  StridedRows rows(const RowTensor& t) const {
    return {static_cast<float*>(base(t.buffer, t.offset)), t.batch_stride, t.head_stride,
            t.token_stride};
  }
  static RowsDims dims(const RowsShape& r) { return {r.batch, r.tokens, r.heads, r.head_dim}; }
  DeviceTokens tokens(const TokenTensor& t) const {
    return {base(t.buffer, t.offset), t.batch_stride, t.token_stride, t.head_stride};
  }
  DeviceFloats floats(const TokenTensor& t) const {
    return {static_cast<float*>(base(t.buffer, t.offset)), t.batch_stride, t.token_stride,
            t.head_stride};
  }
  DeviceRows device_rows(const RowTensor& t) const {
    return {static_cast<float*>(base(t.buffer, t.offset)), t.batch_stride, t.head_stride,
            t.token_stride};
  }
  const int64_t* positions(const Place& place, int64_t count, const char* what) const {
    if (place.empty()) return nullptr;
    A2D_REQUIRE(place.buffer, what, ": positions must be in a buffer of the backend");
    cuda_plan::check_place(place, count * static_cast<int64_t>(sizeof(int64_t)), what);
    return reinterpret_cast<const int64_t*>(address(place));
  }
  // The kernel's view of input `t`: `t` itself when its rows are 16-byte aligned, else a dense
  // copy of its `block` in new scratch (kept in `keep` until the kernel is queued, then freed
  // stream-ordered after it).
  DeviceTokens aligned_input(const TokenTensor& t, const TokenBlock& block,
                             std::vector<std::unique_ptr<Scratch>>& keep);
  // The common inputs of both kernels, and the tile bounds into `bounds` (plan.bounds_bytes).
  void fill_inputs(cuda_kernels::AttentionParams& p, const AttentionShape& s, const Mask& mask,
                   float scale, const TokenTensor& q, const TokenTensor& k, const TokenTensor& v,
                   const Place& q_positions, const Place& kv_positions,
                   const cuda_plan::AttentionPlan& plan, int64_t tile_q, int64_t tile_k,
                   int64_t* bounds, std::vector<std::unique_ptr<Scratch>>& keep, const char* what);
  void forward(const ForwardCall& call, const TokenTensor* out, const RowTensor* lse,
               const PartialTensor* state, bool accumulate);

  int device_;
  cudaStream_t copies_ = nullptr;  // upload_async's copies
  cudaStream_t stream_ = nullptr;
};

}  // namespace a2d::backends::cuda_detail
