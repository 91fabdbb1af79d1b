// The host backends' operations (host_backend.hpp): bounds checks, then the CPU code of
// kernel.hpp and layout.hpp on the resolved addresses.
#include "host_backend.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "attention2d/error.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::backends {
namespace {

// Bytes from a strided tensor's first element to the end of its last row.
int64_t extent_bytes(int64_t elem, int64_t batch, int64_t tokens, int64_t heads, int64_t width,
                     int64_t batch_stride, int64_t token_stride, int64_t head_stride) {
  if (batch <= 0 || tokens <= 0 || heads <= 0 || width <= 0) return 0;
  return elem * ((batch - 1) * batch_stride + (tokens - 1) * token_stride +
                 (heads - 1) * head_stride + width);
}

class StagingBuffer final : public Buffer {
 public:
  StagingBuffer(Backend& backend, int64_t bytes)
      : Buffer(backend, bytes, allocate(bytes)), memory_(static_cast<std::byte*>(host_data())) {}
  ~StagingBuffer() override { delete[] memory_; }

 private:
  static void* allocate(int64_t bytes) {
    return new std::byte[static_cast<size_t>(std::max<int64_t>(bytes, 1))];
  }
  std::byte* memory_;
};

}  // namespace

HostBackend::Access::Access(HostBackend& backend, std::initializer_list<const Buffer*> buffers)
    : backend_(backend) {
  backend_.before_operation();
  for (const Buffer* buffer : buffers) {
    if (!buffer) continue;
    A2D_REQUIRE(&buffer->backend() == &backend_, "a buffer of the ", buffer->backend().name(),
                " backend was passed to the ", backend_.name(), " backend");
    A2D_REQUIRE(count_ < 16, "an operation names more than 16 buffers");
    buffers_[count_++] = buffer;
  }
  for (int i = 0; i < count_; ++i)
    backend_.open({buffers_[i]});
}

HostBackend::Access::~Access() {
  for (int i = 0; i < count_; ++i)
    backend_.close({buffers_[i]});
}

std::byte* HostBackend::address(const Place& place, int64_t bytes, const char* what) const {
  A2D_REQUIRE(bytes >= 0 && place.offset >= 0, what, ": negative size or offset");
  if (!place.buffer) {
    A2D_REQUIRE(place.host || bytes == 0, what, ": no memory given");
    return place.host ? place.host + place.offset : nullptr;
  }
  A2D_REQUIRE(place.offset + bytes <= place.buffer->bytes(), what, ": bytes [", place.offset, ", ",
              place.offset + bytes, ") lie outside the buffer of ", place.buffer->bytes(),
              " bytes");
  return memory(*place.buffer) + place.offset;
}

std::byte* HostBackend::address(const TokenTensor& t, const TokenBlock& block,
                                const char* what) const {
  const int64_t bytes = extent_bytes(dtype_bytes(t.dtype), block.batch, block.tokens, block.heads,
                                     block.width, t.batch_stride, t.token_stride, t.head_stride);
  if (bytes == 0) return nullptr;
  A2D_REQUIRE(t.buffer, what, ": no buffer");
  A2D_REQUIRE(t.batch_stride >= 0 && t.token_stride >= 0 && t.head_stride >= 0, what,
              ": negative strides");
  A2D_REQUIRE(t.offset % dtype_bytes(t.dtype) == 0, what, ": offset ", t.offset,
              " is not a multiple of the ", dtype_name(t.dtype), " element size");
  return address(Place::in(*t.buffer, t.offset), bytes, what);
}

float* HostBackend::address(const RowTensor& t, int64_t batch, int64_t heads, int64_t tokens,
                            const char* what) const {
  const int64_t bytes = extent_bytes(sizeof(float), batch, heads, tokens, 1, t.batch_stride,
                                     t.head_stride, t.token_stride);
  if (bytes == 0) return nullptr;
  A2D_REQUIRE(t.buffer, what, ": no buffer");
  A2D_REQUIRE(t.offset % static_cast<int64_t>(sizeof(float)) == 0, what,
              ": offset not a multiple of 4");
  return reinterpret_cast<float*>(address(Place::in(*t.buffer, t.offset), bytes, what));
}

InTokens HostBackend::input(const TokenTensor& t, const TokenBlock& block, const char* what) const {
  return {address(t, block, what), t.dtype, t.batch_stride, t.token_stride, t.head_stride};
}

OutTokens HostBackend::output(const TokenTensor& t, const TokenBlock& block,
                              const char* what) const {
  return {address(t, block, what), t.dtype, t.batch_stride, t.token_stride, t.head_stride};
}

TokenView<float> HostBackend::floats(const TokenTensor& t, const TokenBlock& block,
                                     const char* what) const {
  A2D_REQUIRE(t.dtype == DType::f32, what, " must be fp32 (got ", dtype_name(t.dtype), ")");
  return {reinterpret_cast<float*>(address(t, block, what)), t.batch_stride, t.token_stride,
          t.head_stride};
}

RowView<float> HostBackend::rows(const RowTensor& t, int64_t batch, int64_t heads, int64_t tokens,
                                 const char* what) const {
  return {address(t, batch, heads, tokens, what), t.batch_stride, t.head_stride, t.token_stride};
}

const int64_t* HostBackend::indices(const Place& place, int64_t count, const char* what) const {
  if (place.empty()) return nullptr;
  return reinterpret_cast<const int64_t*>(
      address(place, count * static_cast<int64_t>(sizeof(int64_t)), what));
}

BufferPtr HostBackend::allocate_staging(int64_t bytes) {
  A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
  return std::make_unique<StagingBuffer>(*this, bytes);
}

void HostBackend::upload(const void* host, Place to, int64_t bytes) {
  Access access(*this, {to.buffer});
  std::byte* at = address(to, bytes, "upload");
  if (bytes > 0) std::memcpy(at, host, static_cast<size_t>(bytes));
}

void HostBackend::download(Place from, void* host, int64_t bytes) {
  Access access(*this, {from.buffer});
  const std::byte* at = address(from, bytes, "download");
  if (bytes > 0) std::memcpy(host, at, static_cast<size_t>(bytes));
}

void HostBackend::fill_zero(Place at, int64_t bytes) {
  Access access(*this, {at.buffer});
  std::byte* p = address(at, bytes, "fill_zero");
  if (bytes > 0) std::memset(p, 0, static_cast<size_t>(bytes));
}

void HostBackend::copy_tokens(const TokenTensor& from, const TokenTensor& to,
                              const TokenBlock& block) {
  Access access(*this, {from.buffer, to.buffer});
  const InTokens src = input(from, block, "copy_tokens source");
  const OutTokens dst = output(to, block, "copy_tokens destination");
  if (!src.data || !dst.data) return;
  const int64_t width = block.width;
  const bool same = from.dtype == to.dtype;
  std::vector<float> row(
      same || from.dtype == DType::f32 || to.dtype == DType::f32 ? 0 : static_cast<size_t>(width));
  // Token-major, as the records are laid out.
  for (int64_t t = 0; t < block.tokens; ++t) {
    for (int64_t b = 0; b < block.batch; ++b) {
      for (int64_t h = 0; h < block.heads; ++h) {
        const std::byte* in = src.at(b, t, h);
        std::byte* out = dst.at(b, t, h);
        if (same) {
          std::memcpy(out, in, static_cast<size_t>(width * dtype_bytes(from.dtype)));
        } else if (from.dtype == DType::f32) {
          from_float(to.dtype, reinterpret_cast<const float*>(in), out, width);
        } else if (to.dtype == DType::f32) {
          to_float(from.dtype, in, reinterpret_cast<float*>(out), width);
        } else {
          to_float(from.dtype, in, row.data(), width);
          from_float(to.dtype, row.data(), out, width);
        }
      }
    }
  }
}

void HostBackend::copy_rows(const RowTensor& from, const RowTensor& to, int64_t batch,
                            int64_t heads, int64_t tokens) {
  Access access(*this, {from.buffer, to.buffer});
  const RowView<float> src = rows(from, batch, heads, tokens, "copy_rows source");
  const RowView<float> dst = rows(to, batch, heads, tokens, "copy_rows destination");
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        dst.at(b, h, t) = src.at(b, h, t);
}

void HostBackend::permute_tokens(Place rows_at, int64_t tokens, int64_t token_bytes, Place order) {
  Access access(*this, {rows_at.buffer, order.buffer});
  std::byte* data = address(rows_at, tokens * token_bytes, "permute_tokens rows");
  const int64_t* from = indices(order, tokens, "permute_tokens order");
  if (tokens == 0) return;
  A2D_REQUIRE(from, "permute_tokens: no order given");
  a2d::permute_tokens(data, token_bytes, from, tokens);
}

ForwardArgs HostBackend::forward_args(const ForwardCall& call) const {
  const AttentionShape& s = call.shape;
  ForwardArgs args;
  args.shape = s;
  args.mask = call.mask;
  args.scale = call.scale;
  args.softcap = call.softcap;
  args.q = input(call.q, {s.batch, s.q_tokens, s.heads, s.head_dim}, "forward Q");
  args.k = input(call.k, {s.batch, s.kv_tokens, s.kv_heads, s.head_dim}, "forward K");
  args.v = input(call.v, {s.batch, s.kv_tokens, s.kv_heads, s.head_dim}, "forward V");
  args.q_positions = indices(call.q_positions, s.q_tokens, "forward query positions");
  args.kv_positions = indices(call.kv_positions, s.kv_tokens, "forward key positions");
  args.threads = call.threads;
  args.progress = call.progress;
  args.progress_context = call.progress_context;
  args.work_done = &kernel_work_;
  return args;
}

void HostBackend::attention_forward(const ForwardCall& call, const TokenTensor& out,
                                    const RowTensor& lse) {
  Access access(*this, {call.q.buffer, call.k.buffer, call.v.buffer, call.q_positions.buffer,
                        call.kv_positions.buffer, out.buffer, lse.buffer});
  const AttentionShape& s = call.shape;
  a2d::attention_forward(forward_args(call),
                         output(out, {s.batch, s.q_tokens, s.heads, s.head_dim}, "forward O"),
                         rows(lse, s.batch, s.heads, s.q_tokens, "forward LSE"));
}

void HostBackend::attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                            bool accumulate) {
  Access access(*this, {call.q.buffer, call.k.buffer, call.v.buffer, call.q_positions.buffer,
                        call.kv_positions.buffer, state.acc.buffer, state.row_max.buffer,
                        state.row_sum.buffer});
  const AttentionShape& s = call.shape;
  const PartialView partial{
      floats(state.acc, {s.batch, s.q_tokens, s.heads, s.head_dim}, "partial accumulator"),
      rows(state.row_max, s.batch, s.heads, s.q_tokens, "partial row max"),
      rows(state.row_sum, s.batch, s.heads, s.q_tokens, "partial row sum")};
  a2d::attention_forward_partial(forward_args(call), partial, accumulate);
}

void HostBackend::attention_backward(const BackwardCall& call, const TokenTensor& dq,
                                     const TokenTensor& dk, const TokenTensor& dv) {
  Access access(
      *this, {call.q.buffer, call.k.buffer, call.v.buffer, call.d_out.buffer, call.lse.buffer,
              call.delta.buffer, call.out.buffer, call.q_positions.buffer, call.kv_positions.buffer,
              dq.buffer, dk.buffer, dv.buffer});
  const AttentionShape& s = call.shape;
  const TokenBlock q_rows{s.batch, s.q_tokens, s.heads, s.head_dim};
  const TokenBlock kv_rows{s.batch, s.kv_tokens, s.kv_heads, s.head_dim};
  BackwardArgs args;
  args.shape = s;
  args.mask = call.mask;
  args.scale = call.scale;
  args.softcap = call.softcap;
  args.q = input(call.q, q_rows, "backward Q");
  args.k = input(call.k, kv_rows, "backward K");
  args.v = input(call.v, kv_rows, "backward V");
  args.d_out = input(call.d_out, q_rows, "backward dO");
  args.lse = rows(call.lse, s.batch, s.heads, s.q_tokens, "backward LSE");
  if (call.delta.buffer) {
    args.delta = rows(call.delta, s.batch, s.heads, s.q_tokens, "backward delta");
  } else {
    args.out = input(call.out, q_rows, "backward O");
  }
  args.q_positions = indices(call.q_positions, s.q_tokens, "backward query positions");
  args.kv_positions = indices(call.kv_positions, s.kv_tokens, "backward key positions");
  args.threads = call.threads;
  args.progress = call.progress;
  args.progress_context = call.progress_context;
  args.work_done = &kernel_work_;
  args.accumulate = call.accumulate;
  a2d::attention_backward(args, floats(dq, q_rows, "backward dQ"),
                          floats(dk, kv_rows, "backward dK"), floats(dv, kv_rows, "backward dV"));
}

void HostBackend::merge_partials(Place into, Place from, int64_t count, int64_t record) {
  Access access(*this, {into.buffer, from.buffer});
  const int64_t bytes = count * record * static_cast<int64_t>(sizeof(float));
  auto* a = reinterpret_cast<float*>(address(into, bytes, "merge_partials into"));
  const auto* b = reinterpret_cast<const float*>(address(from, bytes, "merge_partials from"));
  if (count > 0) merge_partial_records(a, b, count, record);
}

void HostBackend::copy_bytes(Place from, Place to, int64_t bytes) {
  Access access(*this, {from.buffer, to.buffer});
  const std::byte* source = address(from, bytes, "copy_bytes from");
  std::byte* target = address(to, bytes, "copy_bytes to");
  if (bytes > 0) std::memmove(target, source, static_cast<size_t>(bytes));
}

void HostBackend::finalize(const RowsShape& r, const PartialTensor& state, const TokenTensor& out,
                           const RowTensor& lse) {
  Access access(*this, {state.acc.buffer, state.row_max.buffer, state.row_sum.buffer, out.buffer,
                        lse.buffer});
  const TokenBlock block{r.batch, r.tokens, r.heads, r.head_dim};
  const ConstPartialView partial{
      floats(state.acc, block, "finalize accumulator"),
      rows(state.row_max, r.batch, r.heads, r.tokens, "finalize row max"),
      rows(state.row_sum, r.batch, r.heads, r.tokens, "finalize row sum")};
  finalize_partial(r, partial, output(out, block, "finalize O"),
                   rows(lse, r.batch, r.heads, r.tokens, "finalize LSE"));
}

void HostBackend::delta(const RowsShape& r, const TokenTensor& out, const TokenTensor& d_out,
                        const RowTensor& delta_rows) {
  Access access(*this, {out.buffer, d_out.buffer, delta_rows.buffer});
  const TokenBlock block{r.batch, r.tokens, r.heads, r.head_dim};
  compute_delta(r, input(out, block, "delta O"), input(d_out, block, "delta dO"),
                rows(delta_rows, r.batch, r.heads, r.tokens, "delta"));
}

void HostBackend::add(Place into, Place from, int64_t count) {
  Access access(*this, {into.buffer, from.buffer});
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  auto* a = reinterpret_cast<float*>(address(into, bytes, "add into"));
  const auto* b = reinterpret_cast<const float*>(address(from, bytes, "add from"));
  for (int64_t i = 0; i < count; ++i)
    a[i] += b[i];
}

void HostBackend::add_sinks(const RowsShape& r, const float* sinks, int64_t first_head,
                            const TokenTensor& out, const RowTensor& lse) {
  Access access(*this, {out.buffer, lse.buffer});
  const TokenBlock block{r.batch, r.tokens, r.heads, r.head_dim};
  a2d::add_sinks(r, sinks, first_head, output(out, block, "sinks O"),
                 rows(lse, r.batch, r.heads, r.tokens, "sinks LSE"));
}

void HostBackend::add_sink_gradient(const RowsShape& r, const float* sinks, int64_t first_head,
                                    const RowTensor& lse, const RowTensor& delta_rows,
                                    double* dsink) {
  Access access(*this, {lse.buffer, delta_rows.buffer});
  a2d::add_sink_gradient(r, sinks, first_head, rows(lse, r.batch, r.heads, r.tokens, "sink LSE"),
                         rows(delta_rows, r.batch, r.heads, r.tokens, "sink delta"), dsink);
}

}  // namespace a2d::backends
