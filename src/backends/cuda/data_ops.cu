// The CUDA backend's data operations (backend.hpp): the data kernels (grid-stride loops and one
// warp per row) and every operation that launches one — copies of tokens and rows, the
// permutation, the merge of partial records, finalize, delta, the sinks — and the launches of the
// attention kernels (forward.cu, backward.cu) with their inputs' checks and aligned copies. All
// run on the backend's stream; only add_sink_gradient waits (its result is a host array).
//
// NOT YET RUN ON A GPU: compiled for sm_80 and sm_90 by scripts/test.sh, to be checked by
// scripts/gpu/gpu_check.sh (docs/gpu.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <vector>

#include "attention2d/error.hpp"
#include "backends/cuda/attention_kernels.hpp"
#include "backends/cuda/cuda_backend_internal.cuh"
#include "backends/cuda/cuda_plan.hpp"

namespace a2d::backends::cuda_detail {
namespace {

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

}  // namespace

void CudaBackend::copy_tokens(const TokenTensor& from, const TokenTensor& to,
                              const TokenBlock& block) {
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
void CudaBackend::copy_rows(const RowTensor& from, const RowTensor& to, int64_t batch,
                            int64_t heads, int64_t tokens) {
  cuda_plan::check_rows(from, batch, heads, tokens, "copy_rows source");
  cuda_plan::check_rows(to, batch, heads, tokens, "copy_rows destination");
  const int64_t count = batch * heads * tokens;
  if (count <= 0) return;
  const cuda_plan::Launch launch = cuda_plan::plan_elementwise(count);
  copy_rows_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(rows(from), rows(to), batch,
                                                                    heads, tokens);
  check_launch("copy_rows");
}
void CudaBackend::permute_tokens(Place at, int64_t tokens, int64_t token_bytes, Place order) {
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

void CudaBackend::attention_forward(const ForwardCall& call, const TokenTensor& out,
                                    const RowTensor& lse) {
  forward(call, &out, &lse, nullptr, false);
}
void CudaBackend::attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                            bool accumulate) {
  forward(call, nullptr, nullptr, &state, accumulate);
}

void CudaBackend::merge_partials(Place into, Place from, int64_t count, int64_t record) {
  A2D_REQUIRE(record >= 2, "merge_partials: records of ", record, " floats");
  const int64_t bytes = count * record * static_cast<int64_t>(sizeof(float));
  cuda_plan::check_place(into, bytes, "merge_partials into");
  cuda_plan::check_place(from, bytes, "merge_partials from");
  if (count == 0) return;
  const cuda_plan::Launch launch = cuda_plan::plan_rows(count);
  merge_records_kernel<<<grid_of(launch), launch.threads, 0, stream_>>>(
      reinterpret_cast<float*>(address(into)), reinterpret_cast<const float*>(address(from)), count,
      record);
  check_launch("merge_partials");
}
void CudaBackend::finalize(const RowsShape& r, const PartialTensor& state, const TokenTensor& out,
                           const RowTensor& lse) {
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
void CudaBackend::delta(const RowsShape& r, const TokenTensor& out, const TokenTensor& d_out,
                        const RowTensor& delta_rows) {
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
void CudaBackend::add(Place into, Place from, int64_t count) {
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
void CudaBackend::add_sinks(const RowsShape& r, const float* sinks, int64_t first_head,
                            const TokenTensor& out, const RowTensor& lse) {
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
void CudaBackend::add_sink_gradient(const RowsShape& r, const float* sinks, int64_t first_head,
                                    const RowTensor& lse, const RowTensor& delta_rows,
                                    double* dsink) {
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

}  // namespace a2d::backends::cuda_detail
