// The CUDA backend: device buffers (stream-ordered cudaMallocAsync on the backend's one stream),
// pinned staging buffers, and every data operation of backend.hpp as a kernel on that stream.
// Nothing here waits for the device except download() and upload() (the host needs the data, or
// may reuse its memory, when they return), synchronize() and add_sink_gradient() (whose result
// is a host array). The attention kernels are forward.cu and backward.cu; the checks and launch
// shapes come from cuda_plan.hpp (plain C++, unit-tested without a GPU).
//
// NOT YET RUN ON A GPU: compiled for sm_80 and sm_90 by scripts/test.sh, to be checked by
// scripts/gpu/gpu_check.sh (docs/gpu.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "attention2d/error.hpp"
#include "attention_kernels.hpp"
#include "backends/backends.hpp"
#include "cuda_backend.hpp"
#include "cuda_plan.hpp"

namespace a2d::backends {
namespace {

using cuda_kernels::DeviceFloats;
using cuda_kernels::DeviceRows;
using cuda_kernels::DeviceTokens;

void check_cuda(cudaError_t status, const char* what) {
  A2D_REQUIRE(status == cudaSuccess, "CUDA: ", what, ": ", cudaGetErrorString(status));
}
void check_launch(const char* what) {
  check_cuda(cudaGetLastError(), what);
}

dim3 grid_of(const cuda_plan::Launch& launch) {
  return dim3(static_cast<unsigned>(launch.grid_x), static_cast<unsigned>(launch.grid_y),
              static_cast<unsigned>(launch.grid_z));
}

// ---- element access of any dtype ----
__device__ __forceinline__ float load_element(const void* base, int dtype, int64_t index) {
  switch (dtype) {
    case static_cast<int>(DType::bf16):
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    case static_cast<int>(DType::f16):
      return __half2float(static_cast<const __half*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}
__device__ __forceinline__ void store_element(void* base, int dtype, int64_t index, float x) {
  switch (dtype) {
    case static_cast<int>(DType::bf16):
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(x);
      return;
    case static_cast<int>(DType::f16):
      static_cast<__half*>(base)[index] = __float2half_rn(x);
      return;
    default:
      static_cast<float*>(base)[index] = x;
  }
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

// ---- data kernels (grid-stride loops) ----
#define A2D_GRID_LOOP(i, count)                                                 \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (count); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void copy_tokens_kernel(Strided from, Strided to, int64_t batch, int64_t tokens,
                                   int64_t heads, int64_t width) {
  const int64_t count = batch * tokens * heads * width;
  A2D_GRID_LOOP(i, count) {
    const int64_t w = i % width;
    const int64_t h = (i / width) % heads;
    const int64_t t = (i / (width * heads)) % tokens;
    const int64_t b = i / (width * heads * tokens);
    const float x = load_element(from.data, from.dtype, from.at(b, t, h) + w);
    store_element(to.data, to.dtype, to.at(b, t, h) + w, x);
  }
}

__global__ void copy_same_kernel(const Strided from, Strided to, int64_t batch, int64_t tokens,
                                 int64_t heads, int64_t width, int element_bytes) {
  // Bit copies (no rounding of NaN payloads) in 16-bit or 32-bit units.
  const int64_t count = batch * tokens * heads * width;
  A2D_GRID_LOOP(i, count) {
    const int64_t w = i % width;
    const int64_t h = (i / width) % heads;
    const int64_t t = (i / (width * heads)) % tokens;
    const int64_t b = i / (width * heads * tokens);
    if (element_bytes == 2) {
      static_cast<uint16_t*>(to.data)[to.at(b, t, h) + w] =
          static_cast<const uint16_t*>(from.data)[from.at(b, t, h) + w];
    } else {
      static_cast<uint32_t*>(to.data)[to.at(b, t, h) + w] =
          static_cast<const uint32_t*>(from.data)[from.at(b, t, h) + w];
    }
  }
}

__global__ void copy_rows_kernel(StridedRows from, StridedRows to, int64_t batch, int64_t heads,
                                 int64_t tokens) {
  A2D_GRID_LOOP(i, batch * heads * tokens) {
    const int64_t t = i % tokens;
    const int64_t h = (i / tokens) % heads;
    const int64_t b = i / (tokens * heads);
    to.at(b, h, t) = from.at(b, h, t);
  }
}

template <typename Unit>
__global__ void gather_kernel(const Unit* rows, Unit* out, const int64_t* order, int64_t tokens,
                              int64_t units_per_token) {
  A2D_GRID_LOOP(i, tokens * units_per_token) {
    const int64_t token = i / units_per_token;
    const int64_t unit = i % units_per_token;
    out[i] = rows[order[token] * units_per_token + unit];
  }
}

__global__ void add_kernel(float* into, const float* from, int64_t count) {
  A2D_GRID_LOOP(i, count) {
    into[i] += from[i];
  }
}

__global__ void zero_floats_kernel(Strided t, int64_t batch, int64_t tokens, int64_t heads,
                                   int64_t width) {
  A2D_GRID_LOOP(i, batch * tokens * heads * width) {
    const int64_t w = i % width;
    const int64_t h = (i / width) % heads;
    const int64_t tok = (i / (width * heads)) % tokens;
    const int64_t b = i / (width * heads * tokens);
    static_cast<float*>(t.data)[t.at(b, tok, h) + w] = 0.0f;
  }
}

// Row kernels: one warp per (batch, token, head) row, 8 warps per block.
#define A2D_ROW_LOOP(row, rows)                                                           \
  for (int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; row < (rows); \
       row += int64_t(gridDim.x) * blockDim.x / 32)

__device__ __forceinline__ float max_keep_nan(float a, float b) {
  return (b > a || b != b) ? b : a;
}

// merge_partial_records: records [row max, row sum, acc(record - 2)], as merge.cpp.
__global__ void merge_records_kernel(float* into, const float* from, int64_t count,
                                     int64_t record) {
  const int lane = threadIdx.x % 32;
  A2D_ROW_LOOP(r, count) {
    float* a = into + r * record;
    const float* b = from + r * record;
    const float m_from = b[0];
    if (m_from == -INFINITY) continue;  // nothing to add (uniform across the warp)
    const float m_into = a[0];
    const float m = max_keep_nan(m_into, m_from);
    const float w_into = m_into == -INFINITY ? 0.0f : expf(m_into - m);
    const float w_from = expf(m_from - m);
    for (int64_t d = lane; d < record - 2; d += 32)
      a[2 + d] = w_into * a[2 + d] + w_from * b[2 + d];
    __syncwarp();
    if (lane == 0) {
      a[1] = w_into * a[1] + w_from * b[1];
      a[0] = m;
    }
  }
}

struct RowsDims {
  int64_t batch, tokens, heads, head_dim;
  __device__ void split(int64_t row, int64_t& b, int64_t& t, int64_t& h) const {
    h = row % heads;
    t = (row / heads) % tokens;
    b = row / (heads * tokens);
  }
};

__global__ void finalize_kernel(RowsDims dims, Strided acc, StridedRows row_max,
                                StridedRows row_sum, Strided out, StridedRows lse) {
  const int lane = threadIdx.x % 32;
  A2D_ROW_LOOP(row, dims.batch * dims.tokens * dims.heads) {
    int64_t b, t, h;
    dims.split(row, b, t, h);
    const float sum = row_sum.at(b, h, t);
    const float m = row_max.at(b, h, t);
    const bool empty = sum == 0.0f || m == -INFINITY;
    const float inverse = empty ? 0.0f : 1.0f / sum;
    for (int64_t d = lane; d < dims.head_dim; d += 32) {
      const float x =
          empty ? 0.0f : static_cast<const float*>(acc.data)[acc.at(b, t, h) + d] * inverse;
      store_element(out.data, out.dtype, out.at(b, t, h) + d, x);
    }
    if (lane == 0) lse.at(b, h, t) = empty ? -INFINITY : m + logf(sum);
  }
}

__global__ void delta_kernel(RowsDims dims, Strided out, Strided d_out, StridedRows delta) {
  const int lane = threadIdx.x % 32;
  A2D_ROW_LOOP(row, dims.batch * dims.tokens * dims.heads) {
    int64_t b, t, h;
    dims.split(row, b, t, h);
    double sum = 0.0;  // wide, as the CPU's compute_delta
    for (int64_t d = lane; d < dims.head_dim; d += 32) {
      sum += static_cast<double>(load_element(out.data, out.dtype, out.at(b, t, h) + d)) *
             load_element(d_out.data, d_out.dtype, d_out.at(b, t, h) + d);
    }
    for (int offset = 16; offset > 0; offset /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta.at(b, h, t) = static_cast<float>(sum);
  }
}

__global__ void sinks_kernel(RowsDims dims, const float* sinks, Strided out, StridedRows lse) {
  const int lane = threadIdx.x % 32;
  A2D_ROW_LOOP(row, dims.batch * dims.tokens * dims.heads) {
    int64_t b, t, h;
    dims.split(row, b, t, h);
    const double sink = sinks[h];
    const double old_lse = lse.at(b, h, t);
    const double high = fmax(old_lse, sink);
    const double new_lse =
        old_lse == -INFINITY ? sink : high + log(exp(old_lse - high) + exp(sink - high));
    const float factor = static_cast<float>(exp(old_lse - new_lse));
    for (int64_t d = lane; d < dims.head_dim; d += 32) {
      const int64_t at = out.at(b, t, h) + d;
      store_element(out.data, out.dtype, at, load_element(out.data, out.dtype, at) * factor);
    }
    __syncwarp();
    if (lane == 0) lse.at(b, h, t) = static_cast<float>(new_lse);
  }
}

__global__ void sink_gradient_kernel(RowsDims dims, const float* sinks, StridedRows lse,
                                     StridedRows delta, double* sums) {
  A2D_GRID_LOOP(i, dims.batch * dims.tokens * dims.heads) {
    const int64_t h = i % dims.heads;
    const int64_t t = (i / dims.heads) % dims.tokens;
    const int64_t b = i / (dims.heads * dims.tokens);
    const double value = exp(static_cast<double>(sinks[h]) - lse.at(b, h, t)) * delta.at(b, h, t);
    atomicAdd(sums + h, value);
  }
}

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

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking), "copy stream");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(copies_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(copies_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  const BackendCapabilities& capabilities() const override {
    static const BackendCapabilities capabilities = cuda_capabilities();
    return capabilities;
  }
  void check_supported(DType dtype, int64_t head_dim, const Mask& mask,
                       float softcap) const override {
    cuda_plan::check_supported(dtype, head_dim, mask, softcap);
  }

  BufferPtr allocate(int64_t bytes) override {
    A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
    return std::make_unique<DeviceBuffer>(*this, bytes, stream_);
  }
  BufferPtr allocate_staging(int64_t bytes) override {
    A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
    return std::make_unique<PinnedBuffer>(*this, bytes);
  }
  void synchronize() override { check_cuda(cudaStreamSynchronize(stream_), "synchronize"); }

  BufferPtr wrap_device(void* memory, int64_t bytes) override {
    A2D_REQUIRE(bytes >= 0, "cannot wrap ", bytes, " bytes");
    if (bytes > 0) {
      cudaPointerAttributes attributes{};
      check_cuda(cudaPointerGetAttributes(&attributes, memory), "cudaPointerGetAttributes");
      A2D_REQUIRE(
          attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
          "wrap_device: the address is not device memory (a CPU tensor?)");
      A2D_REQUIRE(attributes.device == device_, "wrap_device: the memory is on GPU ",
                  attributes.device, ", but this backend runs on GPU ", device_);
    }
    return std::make_unique<DeviceBuffer>(*this, bytes, memory);
  }
  // Cross-stream ordering by events: neither the host nor the device waits as a whole.
  void follow_stream(void* stream) override {
    CudaFence caller(static_cast<cudaStream_t>(stream));
    check_cuda(cudaStreamWaitEvent(stream_, caller.event(), 0), "follow the caller's stream");
  }
  void lead_stream(void* stream) override {
    CudaFence done(stream_);
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done.event(), 0),
               "the caller's stream waits for the backend");
  }

  // For the NCCL communicator (cuda_backend.hpp).
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  std::byte* address_of(const Place& place) const { return address(place); }

  void upload(const void* host, Place to, int64_t bytes) override {
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
  void upload_async(const void* host, Place to, int64_t bytes, const Fence* after) override {
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
  std::unique_ptr<Fence> fence() override { return std::make_unique<CudaFence>(stream_); }

  void download(Place from, void* host, int64_t bytes) override {
    cuda_plan::check_place(from, bytes, "download");
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(host, address(from), static_cast<size_t>(bytes), cudaMemcpyDefault,
                               stream_),
               "download");
    synchronize();
  }
  void fill_zero(Place at, int64_t bytes) override {
    cuda_plan::check_place(at, bytes, "fill_zero");
    if (bytes == 0) return;
    check_cuda(cudaMemsetAsync(address(at), 0, static_cast<size_t>(bytes), stream_), "fill_zero");
  }

  void copy_tokens(const TokenTensor& from, const TokenTensor& to,
                   const TokenBlock& block) override {
    cuda_plan::check_tokens(from, block, "copy_tokens source");
    cuda_plan::check_tokens(to, block, "copy_tokens destination");
    const int64_t count = block.batch * block.tokens * block.heads * block.width;
    if (count <= 0) return;
    const cuda_plan::Launch launch = cuda_plan::plan_elementwise(count);
    if (from.dtype == to.dtype) {
      copy_same_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
          strided(from), strided(to), block.batch, block.tokens, block.heads, block.width,
          static_cast<int>(dtype_bytes(from.dtype)));
    } else {
      copy_tokens_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
          strided(from), strided(to), block.batch, block.tokens, block.heads, block.width);
    }
    check_launch("copy_tokens");
  }
  void copy_rows(const RowTensor& from, const RowTensor& to, int64_t batch, int64_t heads,
                 int64_t tokens) override {
    cuda_plan::check_rows(from, batch, heads, tokens, "copy_rows source");
    cuda_plan::check_rows(to, batch, heads, tokens, "copy_rows destination");
    const int64_t count = batch * heads * tokens;
    if (count <= 0) return;
    const cuda_plan::Launch launch = cuda_plan::plan_elementwise(count);
    copy_rows_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(rows(from), rows(to), batch,
                                                                      heads, tokens);
    check_launch("copy_rows");
  }
  void permute_tokens(Place at, int64_t tokens, int64_t token_bytes, Place order) override {
    cuda_plan::check_place(at, tokens * token_bytes, "permute_tokens rows");
    cuda_plan::check_place(order, tokens * static_cast<int64_t>(sizeof(int64_t)),
                           "permute_tokens order");
    if (tokens == 0 || token_bytes == 0) return;
    A2D_REQUIRE(order.buffer, "permute_tokens: the order must be in a buffer of the backend");
    std::byte* data = address(at);
    const auto* from = reinterpret_cast<const int64_t*>(address(order));
    const int64_t bytes = tokens * token_bytes;
    Scratch gathered(bytes, stream_);
    const bool words = token_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(data) % 4 == 0;
    const int64_t units = words ? token_bytes / 4 : token_bytes;
    const cuda_plan::Launch launch = cuda_plan::plan_elementwise(tokens * units);
    if (words) {
      gather_kernel<uint32_t><<<grid_of(launch), launch.threads, 0, stream_>>>(
          reinterpret_cast<const uint32_t*>(data), gathered.as<uint32_t>(), from, tokens, units);
    } else {
      gather_kernel<unsigned char><<<grid_of(launch), launch.threads, 0, stream_>>>(
          reinterpret_cast<const unsigned char*>(data), gathered.as<unsigned char>(), from, tokens,
          units);
    }
    check_launch("permute_tokens");
    check_cuda(cudaMemcpyAsync(data, gathered.as<void>(), static_cast<size_t>(bytes),
                               cudaMemcpyDeviceToDevice, stream_),
               "permute_tokens copy");
  }

  void attention_forward(const ForwardCall& call, const TokenTensor& out,
                         const RowTensor& lse) override {
    forward(call, &out, &lse, nullptr, false);
  }
  void attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                 bool accumulate) override {
    forward(call, nullptr, nullptr, &state, accumulate);
  }
  void attention_backward(const BackwardCall& call, const TokenTensor& dq, const TokenTensor& dk,
                          const TokenTensor& dv) override;

  void merge_partials(Place into, Place from, int64_t count, int64_t record) override {
    A2D_REQUIRE(record >= 2, "merge_partials: records of ", record, " floats");
    const int64_t bytes = count * record * static_cast<int64_t>(sizeof(float));
    cuda_plan::check_place(into, bytes, "merge_partials into");
    cuda_plan::check_place(from, bytes, "merge_partials from");
    if (count == 0) return;
    const cuda_plan::Launch launch = cuda_plan::plan_rows(count);
    merge_records_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
        reinterpret_cast<float*>(address(into)), reinterpret_cast<const float*>(address(from)),
        count, record);
    check_launch("merge_partials");
  }
  void copy_bytes(Place from, Place to, int64_t bytes) override {
    cuda_plan::check_place(from, bytes, "copy_bytes from");
    cuda_plan::check_place(to, bytes, "copy_bytes to");
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(address(to), address(from), static_cast<size_t>(bytes),
                               cudaMemcpyDefault, stream_),
               "copy_bytes");
  }
  void finalize(const RowsShape& r, const PartialTensor& state, const TokenTensor& out,
                const RowTensor& lse) override {
    const TokenBlock block{r.batch, r.tokens, r.heads, r.head_dim};
    A2D_REQUIRE(state.acc.dtype == DType::f32, "finalize: the accumulator must be fp32");
    cuda_plan::check_tokens(state.acc, block, "finalize accumulator");
    cuda_plan::check_rows(state.row_max, r.batch, r.heads, r.tokens, "finalize row max");
    cuda_plan::check_rows(state.row_sum, r.batch, r.heads, r.tokens, "finalize row sum");
    cuda_plan::check_tokens(out, block, "finalize O");
    cuda_plan::check_rows(lse, r.batch, r.heads, r.tokens, "finalize LSE");
    const int64_t count = r.batch * r.tokens * r.heads;
    if (count == 0) return;
    const cuda_plan::Launch launch = cuda_plan::plan_rows(count);
    finalize_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
        dims(r), strided(state.acc), rows(state.row_max), rows(state.row_sum), strided(out),
        rows(lse));
    check_launch("finalize");
  }
  void delta(const RowsShape& r, const TokenTensor& out, const TokenTensor& d_out,
             const RowTensor& delta_rows) override {
    const TokenBlock block{r.batch, r.tokens, r.heads, r.head_dim};
    cuda_plan::check_tokens(out, block, "delta O");
    cuda_plan::check_tokens(d_out, block, "delta dO");
    cuda_plan::check_rows(delta_rows, r.batch, r.heads, r.tokens, "delta");
    const int64_t count = r.batch * r.tokens * r.heads;
    if (count == 0) return;
    const cuda_plan::Launch launch = cuda_plan::plan_rows(count);
    delta_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(dims(r), strided(out),
                                                                  strided(d_out), rows(delta_rows));
    check_launch("delta");
  }
  void add(Place into, Place from, int64_t count) override {
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    cuda_plan::check_place(into, bytes, "add into");
    cuda_plan::check_place(from, bytes, "add from");
    if (count == 0) return;
    const cuda_plan::Launch launch = cuda_plan::plan_elementwise(count);
    add_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
        reinterpret_cast<float*>(address(into)), reinterpret_cast<const float*>(address(from)),
        count);
    check_launch("add");
  }
  void add_sinks(const RowsShape& r, const float* sinks, int64_t first_head, const TokenTensor& out,
                 const RowTensor& lse) override {
    const TokenBlock block{r.batch, r.tokens, r.heads, r.head_dim};
    cuda_plan::check_tokens(out, block, "sinks O");
    cuda_plan::check_rows(lse, r.batch, r.heads, r.tokens, "sinks LSE");
    const int64_t count = r.batch * r.tokens * r.heads;
    if (count == 0) return;
    Scratch device_sinks(r.heads * static_cast<int64_t>(sizeof(float)), stream_);
    // From pageable memory: copied out of `sinks` before cudaMemcpyAsync returns.
    check_cuda(cudaMemcpyAsync(device_sinks.as<float>(), sinks + first_head,
                               static_cast<size_t>(r.heads) * sizeof(float), cudaMemcpyHostToDevice,
                               stream_),
               "sinks upload");
    const cuda_plan::Launch launch = cuda_plan::plan_rows(count);
    sinks_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(dims(r), device_sinks.as<float>(),
                                                                  strided(out), rows(lse));
    check_launch("add_sinks");
  }
  void add_sink_gradient(const RowsShape& r, const float* sinks, int64_t first_head,
                         const RowTensor& lse, const RowTensor& delta_rows,
                         double* dsink) override {
    cuda_plan::check_rows(lse, r.batch, r.heads, r.tokens, "sink LSE");
    cuda_plan::check_rows(delta_rows, r.batch, r.heads, r.tokens, "sink delta");
    const int64_t count = r.batch * r.tokens * r.heads;
    if (count == 0) return;
    const int64_t sink_bytes = r.heads * static_cast<int64_t>(sizeof(float));
    const int64_t sum_bytes = r.heads * static_cast<int64_t>(sizeof(double));
    Scratch device_sinks(sink_bytes, stream_);
    Scratch sums(sum_bytes, stream_);
    check_cuda(cudaMemcpyAsync(device_sinks.as<float>(), sinks + first_head,
                               static_cast<size_t>(sink_bytes), cudaMemcpyHostToDevice, stream_),
               "sinks upload");
    check_cuda(cudaMemsetAsync(sums.as<void>(), 0, static_cast<size_t>(sum_bytes), stream_),
               "sink sums");
    const cuda_plan::Launch launch = cuda_plan::plan_elementwise(count);
    sink_gradient_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
        dims(r), device_sinks.as<float>(), rows(lse), rows(delta_rows), sums.as<double>());
    check_launch("add_sink_gradient");
    std::vector<double> host(static_cast<size_t>(r.heads));
    check_cuda(cudaMemcpyAsync(host.data(), sums.as<void>(), static_cast<size_t>(sum_bytes),
                               cudaMemcpyDeviceToHost, stream_),
               "sink sums download");
    synchronize();  // the result is a host array
    for (int64_t h = 0; h < r.heads; ++h)
      dsink[h] -= host[static_cast<size_t>(h)];
  }

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

DeviceTokens CudaBackend::aligned_input(const TokenTensor& t, const TokenBlock& block,
                                        std::vector<std::unique_ptr<Scratch>>& keep) {
  if (cuda_plan::rows_aligned(t)) return tokens(t);
  const int64_t count = block.batch * block.tokens * block.heads * block.width;
  const int64_t elem = dtype_bytes(t.dtype);
  keep.push_back(std::make_unique<Scratch>(count * elem, stream_));
  const DeviceTokens dense{keep.back()->as<void>(), block.tokens * block.heads * block.width,
                           block.heads * block.width, block.width};
  if (count > 0) {
    const Strided to{keep.back()->as<void>(), static_cast<int>(t.dtype), dense.batch_stride,
                     dense.token_stride, dense.head_stride};
    const cuda_plan::Launch launch = cuda_plan::plan_elementwise(count);
    copy_same_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
        strided(t), to, block.batch, block.tokens, block.heads, block.width,
        static_cast<int>(elem));
    check_launch("aligned copy");
  }
  return dense;
}

void CudaBackend::fill_inputs(cuda_kernels::AttentionParams& p, const AttentionShape& s,
                              const Mask& mask, float scale, const TokenTensor& q,
                              const TokenTensor& k, const TokenTensor& v, const Place& q_positions,
                              const Place& kv_positions, const cuda_plan::AttentionPlan& plan,
                              int64_t tile_q, int64_t tile_k, int64_t* bounds,
                              std::vector<std::unique_ptr<Scratch>>& keep, const char* what) {
  const TokenBlock q_rows{s.batch, s.q_tokens, s.heads, s.head_dim};
  const TokenBlock kv_rows{s.batch, s.kv_tokens, s.kv_heads, s.head_dim};
  cuda_plan::check_tokens(q, q_rows, what);
  cuda_plan::check_tokens(k, kv_rows, what);
  cuda_plan::check_tokens(v, kv_rows, what);
  p.batch = s.batch;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.q_tokens = s.q_tokens;
  p.kv_tokens = s.kv_tokens;
  p.q = aligned_input(q, q_rows, keep);
  p.k = aligned_input(k, kv_rows, keep);
  p.v = aligned_input(v, kv_rows, keep);
  p.q_positions = positions(q_positions, s.q_tokens, "query positions");
  p.kv_positions = positions(kv_positions, s.kv_tokens, "key positions");
  p.mask = plan.mask;
  // The view's arrays (document boundaries, the range index) on the GPU, copied for this call
  // and freed stream-ordered after it.
  const auto upload = [&](const int64_t* host, int64_t values) -> const int64_t* {
    if (!host || values == 0) return host;
    const int64_t bytes = values * static_cast<int64_t>(sizeof(int64_t));
    keep.push_back(std::make_unique<Scratch>(bytes, stream_));
    check_cuda(cudaMemcpyAsync(keep.back()->as<void>(), host, static_cast<size_t>(bytes),
                               cudaMemcpyHostToDevice, stream_),
               "mask upload");
    return keep.back()->as<const int64_t>();
  };
  p.mask.doc_offsets = upload(p.mask.doc_offsets, cuda_plan::mask_document_values(mask));
  p.mask.ranges = upload(p.mask.ranges, cuda_plan::mask_range_values(mask));
  p.scale = scale;
  p.q_bounds = bounds;
  p.kv_bounds = bounds + 2 * plan.q_tiles;
  cuda_kernels::tile_bounds(p.q_positions, s.q_tokens, tile_q, bounds, stream_);
  cuda_kernels::tile_bounds(p.kv_positions, s.kv_tokens, tile_k, bounds + 2 * plan.q_tiles,
                            stream_);
}

void CudaBackend::forward(const ForwardCall& call, const TokenTensor* out, const RowTensor* lse,
                          const PartialTensor* state, bool accumulate) {
  const AttentionShape& s = call.shape;
  cuda_plan::check_forward(call);
  const cuda_plan::AttentionPlan plan = cuda_plan::plan_forward(s, call.mask);
  const TokenBlock q_rows{s.batch, s.q_tokens, s.heads, s.head_dim};
  cuda_kernels::ForwardParams p;
  if (state) {
    cuda_plan::check_partial_output(*state);
    cuda_plan::check_tokens(state->acc, q_rows, "partial accumulator");
    cuda_plan::check_rows(state->row_max, s.batch, s.heads, s.q_tokens, "partial row max");
    cuda_plan::check_rows(state->row_sum, s.batch, s.heads, s.q_tokens, "partial row sum");
    p.partial = true;
    p.accumulate = accumulate;
    p.acc = floats(state->acc);
    p.row_max = device_rows(state->row_max);
    p.row_sum = device_rows(state->row_sum);
  } else {
    cuda_plan::check_forward_output(call, *out);
    cuda_plan::check_tokens(*out, q_rows, "forward O");
    cuda_plan::check_rows(*lse, s.batch, s.heads, s.q_tokens, "forward LSE");
    p.out = tokens(*out);
    p.lse = device_rows(*lse);
  }
  if (s.q_tokens == 0) return;
  Scratch bounds(plan.bounds_bytes, stream_);
  std::vector<std::unique_ptr<Scratch>> keep;
  fill_inputs(p, s, call.mask, call.scale, call.q, call.k, call.v, call.q_positions,
              call.kv_positions, plan, cuda_plan::kForwardTileQ, cuda_plan::kForwardTileK,
              bounds.as<int64_t>(), keep, "forward inputs");
  cuda_kernels::attention_forward(call.q.dtype, plan, p, stream_);
}

void CudaBackend::attention_backward(const BackwardCall& call, const TokenTensor& dq,
                                     const TokenTensor& dk, const TokenTensor& dv) {
  const AttentionShape& s = call.shape;
  cuda_plan::check_backward(call);
  const cuda_plan::AttentionPlan plan = cuda_plan::plan_backward(s, call.mask);
  const TokenBlock q_rows{s.batch, s.q_tokens, s.heads, s.head_dim};
  const TokenBlock kv_rows{s.batch, s.kv_tokens, s.kv_heads, s.head_dim};
  cuda_plan::check_backward_outputs(dq, dk, dv);
  cuda_plan::check_tokens(dq, q_rows, "backward dQ");
  cuda_plan::check_tokens(dk, kv_rows, "backward dK");
  cuda_plan::check_tokens(dv, kv_rows, "backward dV");
  cuda_plan::check_tokens(call.d_out, q_rows, "backward dO");
  cuda_plan::check_rows(call.lse, s.batch, s.heads, s.q_tokens, "backward LSE");
  cuda_kernels::BackwardParams p;
  p.dq = floats(dq);
  p.dk = floats(dk);
  p.dv = floats(dv);
  p.accumulate = call.accumulate;
  if (!call.accumulate) {
    // dQ is summed with atomic adds: start from zero. (dK, dV are overwritten by their block;
    // with no query rows the kernel still runs and writes zeros.)
    const int64_t count = s.batch * s.q_tokens * s.heads * s.head_dim;
    if (count > 0) {
      const cuda_plan::Launch launch = cuda_plan::plan_elementwise(count);
      zero_floats_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
          strided(dq), s.batch, s.q_tokens, s.heads, s.head_dim);
      check_launch("zero dQ");
    }
  }
  if (s.kv_tokens == 0) return;
  std::vector<std::unique_ptr<Scratch>> keep;
  p.d_out = aligned_input(call.d_out, q_rows, keep);
  p.lse = static_cast<const float*>(base(call.lse.buffer, call.lse.offset));
  p.lse_rows = device_rows(call.lse);
  // delta given, or computed here from O (the forward's output, in the inputs' dtype).
  Scratch own_delta(call.delta.buffer ? 0 : s.batch * s.heads * s.q_tokens * 4, stream_);
  if (call.delta.buffer) {
    cuda_plan::check_rows(call.delta, s.batch, s.heads, s.q_tokens, "backward delta");
    p.delta = device_rows(call.delta);
  } else if (s.q_tokens > 0) {
    cuda_plan::check_tokens(call.out, q_rows, "backward O");
    const DeviceRows computed{own_delta.as<float>(), s.heads * s.q_tokens, s.q_tokens, 1};
    const cuda_plan::Launch launch = cuda_plan::plan_rows(s.batch * s.q_tokens * s.heads);
    delta_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
        RowsDims{s.batch, s.q_tokens, s.heads, s.head_dim}, strided(call.out), strided(call.d_out),
        StridedRows{computed.data, computed.batch_stride, computed.head_stride,
                    computed.token_stride});
    check_launch("delta");
    p.delta = computed;
  }
  Scratch bounds(plan.bounds_bytes, stream_);
  fill_inputs(p, s, call.mask, call.scale, call.q, call.k, call.v, call.q_positions,
              call.kv_positions, plan, cuda_plan::kBackwardTileQ, cuda_plan::kBackwardTileK,
              bounds.as<int64_t>(), keep, "backward inputs");
  cuda_kernels::attention_backward(call.q.dtype, plan, p, stream_);
}

}  // namespace

namespace {
const CudaBackend& cuda_backend_of(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
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
    return std::make_unique<CudaBackend>(device);
  }
  // One GPU per rank: the node-local rank's (Open MPI and Slurm set it), else the first.
  device = 0;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name)) {
      device = std::atoi(value) % count;
      break;
    }
  }
  return std::make_unique<CudaBackend>(device);
}

}  // namespace a2d::backends
