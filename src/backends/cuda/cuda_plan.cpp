// The CUDA backend's host-side logic (cuda_plan.hpp): plain C++, built and tested everywhere.
#include "cuda_plan.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "attention2d/error.hpp"

namespace a2d::cuda_plan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The largest grid y and z extents CUDA allows.
constexpr int64_t kMaxGridYZ = 65535;

int64_t padded_row_bytes(int64_t width) {
  return (width + kRowPadElements) * 2;  // 16-bit elements
}

void check_dtypes(DType expected,
                  std::initializer_list<std::pair<const TokenTensor*, const char*>> tensors) {
  for (const auto& [tensor, what] : tensors) {
    A2D_REQUIRE(tensor->dtype == expected, "the CUDA kernels need every input in one dtype: ", what,
                " is ", dtype_name(tensor->dtype), ", Q is ", dtype_name(expected));
  }
}

void check_common(const AttentionShape& shape, const Mask& mask, float scale, float softcap,
                  DType dtype) {
  shape.validate();
  mask.validate();
  A2D_REQUIRE(std::isfinite(scale) && scale > 0, "scale must be finite and positive (got ", scale,
              ")");
  check_supported(dtype, shape.head_dim, mask, softcap);
}

}  // namespace

void check_supported(DType dtype, int64_t head_dim, const Mask& mask, float softcap) {
  A2D_REQUIRE(softcap == 0.0f,
              "logit softcapping is not implemented on the CUDA backend (yet): "
              "run with --device cpu, or without --softcap");
  mask.validate();
  A2D_REQUIRE(supported_dtype(dtype),
              "the CUDA kernels take bf16 or fp16 inputs (tensor cores), "
              "not ",
              dtype_name(dtype), ": use --dtype bf16 or fp16, or --device cpu");
  A2D_REQUIRE(supported_head_dim(head_dim),
              "the CUDA kernels are built for head dimensions "
              "64, 80, 96 and 128, not ",
              head_dim, "; use --device cpu");
}

int64_t mask_document_values(const Mask& mask) {
  return mask.doc_offsets ? static_cast<int64_t>(mask.doc_offsets->size()) : 0;
}

int64_t mask_range_values(const Mask& mask) {
  return mask.ranges ? static_cast<int64_t>(mask.ranges->index.size()) : 0;
}

const std::vector<DType>& kernel_dtypes() {
  static const std::vector<DType> dtypes{DType::bf16, DType::f16};
  return dtypes;
}

const std::vector<int64_t>& kernel_head_dims() {
  static const std::vector<int64_t> head_dims{64, 80, 96, 128};
  return head_dims;
}

bool supported_head_dim(int64_t head_dim) {
  const std::vector<int64_t>& dims = kernel_head_dims();
  return std::find(dims.begin(), dims.end(), head_dim) != dims.end();
}

bool supported_dtype(DType dtype) {
  const std::vector<DType>& dtypes = kernel_dtypes();
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

bool rows_aligned(const TokenTensor& t) {
  const int64_t elem = dtype_bytes(t.dtype);
  return t.offset % 16 == 0 && (t.batch_stride * elem) % 16 == 0 &&
         (t.token_stride * elem) % 16 == 0 && (t.head_stride * elem) % 16 == 0;
}

void check_forward(const ForwardCall& call) {
  check_common(call.shape, call.mask, call.scale, call.softcap, call.q.dtype);
  check_dtypes(call.q.dtype, {{&call.k, "K"}, {&call.v, "V"}});
}

void check_backward(const BackwardCall& call) {
  check_common(call.shape, call.mask, call.scale, call.softcap, call.q.dtype);
  check_dtypes(call.q.dtype, {{&call.k, "K"}, {&call.v, "V"}, {&call.d_out, "dO"}});
  A2D_REQUIRE(call.delta.buffer || call.out.buffer || call.shape.q_tokens == 0,
              "backward: neither delta nor O given");
}

namespace {
void check_pairs(const TokenTensor& t, DType dtype, const char* what) {
  A2D_REQUIRE(t.dtype == dtype, what, " must be ", dtype_name(dtype), " (got ", dtype_name(t.dtype),
              ")");
  const int64_t pair = 2 * dtype_bytes(dtype);
  A2D_REQUIRE(t.offset % pair == 0 && t.batch_stride % 2 == 0 && t.token_stride % 2 == 0 &&
                  t.head_stride % 2 == 0,
              what,
              ": the CUDA kernels write pairs of elements; the offset must be a multiple "
              "of ",
              pair, " bytes and the strides even");
}
}  // namespace

void check_forward_output(const ForwardCall& call, const TokenTensor& out) {
  check_pairs(out, call.q.dtype, "forward O");
}

void check_partial_output(const PartialTensor& state) {
  check_pairs(state.acc, DType::f32, "partial accumulator");
}

void check_backward_outputs(const TokenTensor& dq, const TokenTensor& dk, const TokenTensor& dv) {
  A2D_REQUIRE(dq.dtype == DType::f32, "backward dQ must be fp32 (got ", dtype_name(dq.dtype), ")");
  check_pairs(dk, DType::f32, "backward dK");
  check_pairs(dv, DType::f32, "backward dV");
}

int64_t forward_shared_bytes(int64_t head_dim) {
  const int64_t row = padded_row_bytes(head_dim);
  return (kForwardTileQ + 2 * kForwardTileK) * row +
         (kForwardTileQ + kForwardTileK) * static_cast<int64_t>(sizeof(int64_t));
}

int64_t backward_shared_bytes(int64_t head_dim) {
  const int64_t row = padded_row_bytes(head_dim);
  return 2 * kBackwardTileQ * row                                    // Q, dO
         + 2 * kBackwardTileK * row                                  // K, V
         + kBackwardTileK * padded_row_bytes(kBackwardTileQ)         // dS^T
         + 2 * kBackwardTileQ * static_cast<int64_t>(sizeof(float))  // LSE, delta
         + (kBackwardTileQ + kBackwardTileK) * static_cast<int64_t>(sizeof(int64_t));
}

namespace {
AttentionPlan plan_common(const AttentionShape& shape, const Mask& mask, int64_t tile_q,
                          int64_t tile_k) {
  shape.validate();
  A2D_REQUIRE(supported_head_dim(shape.head_dim),
              "the CUDA kernels are built for head dimensions "
              "64, 80, 96 and 128, not ",
              shape.head_dim);
  A2D_REQUIRE(shape.batch <= kMaxGridYZ, "batch ", shape.batch, " exceeds ", kMaxGridYZ,
              " (the CUDA grid's z extent)");
  A2D_REQUIRE(shape.heads <= kMaxGridYZ, "heads ", shape.heads, " exceed ", kMaxGridYZ,
              " (the CUDA grid's y extent)");
  AttentionPlan plan;
  plan.head_dim = shape.head_dim;
  plan.mask = mask.view();
  plan.q_tiles = ceil_div(shape.q_tokens, tile_q);
  plan.kv_tiles = ceil_div(shape.kv_tokens, tile_k);
  plan.bounds_bytes = 2 * (plan.q_tiles + plan.kv_tiles) * static_cast<int64_t>(sizeof(int64_t));
  return plan;
}
}  // namespace

AttentionPlan plan_forward(const AttentionShape& shape, const Mask& mask) {
  AttentionPlan plan = plan_common(shape, mask, kForwardTileQ, kForwardTileK);
  plan.launch.grid_x = plan.q_tiles;
  plan.launch.grid_y = shape.heads;
  plan.launch.grid_z = shape.batch;
  plan.launch.threads = 32 * kForwardWarps;
  plan.launch.shared_bytes = forward_shared_bytes(shape.head_dim);
  A2D_REQUIRE(plan.launch.shared_bytes <= kMaxSharedBytes, "forward tile needs ",
              plan.launch.shared_bytes, " bytes of shared memory");
  return plan;
}

AttentionPlan plan_backward(const AttentionShape& shape, const Mask& mask) {
  AttentionPlan plan = plan_common(shape, mask, kBackwardTileQ, kBackwardTileK);
  plan.launch.grid_x = plan.kv_tiles;
  plan.launch.grid_y = shape.kv_heads;
  plan.launch.grid_z = shape.batch;
  plan.launch.threads = 32 * kBackwardWarps;
  plan.launch.shared_bytes = backward_shared_bytes(shape.head_dim);
  A2D_REQUIRE(plan.launch.shared_bytes <= kMaxSharedBytes, "backward tile needs ",
              plan.launch.shared_bytes, " bytes of shared memory");
  return plan;
}

std::string AttentionPlan::describe() const {
  std::ostringstream out;
  out << "grid " << launch.grid_x << "x" << launch.grid_y << "x" << launch.grid_z << ", "
      << launch.threads << " threads, " << launch.shared_bytes << " B shared, head_dim " << head_dim
      << ", " << q_tiles << " query tiles, " << kv_tiles << " key tiles";
  return out.str();
}

Launch plan_elementwise(int64_t count, int64_t max_blocks) {
  A2D_REQUIRE(count >= 0 && max_blocks >= 1, "bad element-wise launch");
  Launch launch;
  launch.threads = kElementwiseThreads;
  launch.grid_x = std::min(max_blocks, ceil_div(count, kElementwiseThreads));
  return launch;
}

Launch plan_rows(int64_t rows, int64_t max_blocks) {
  A2D_REQUIRE(rows >= 0 && max_blocks >= 1, "bad row launch");
  Launch launch;
  launch.threads = 256;  // 8 warps, one row each
  launch.grid_x = std::min(max_blocks, ceil_div(rows, 8));
  return launch;
}

int64_t extent_bytes(int64_t elem, int64_t batch, int64_t tokens, int64_t heads, int64_t width,
                     int64_t batch_stride, int64_t token_stride, int64_t head_stride) {
  if (batch <= 0 || tokens <= 0 || heads <= 0 || width <= 0) return 0;
  return elem * ((batch - 1) * batch_stride + (tokens - 1) * token_stride +
                 (heads - 1) * head_stride + width);
}

void check_place(const Place& place, int64_t bytes, const char* what) {
  A2D_REQUIRE(bytes >= 0 && place.offset >= 0, what, ": negative size or offset");
  if (bytes == 0) return;
  if (!place.buffer) {
    A2D_REQUIRE(place.host, what, ": no memory given");
    return;
  }
  A2D_REQUIRE(place.offset + bytes <= place.buffer->bytes(), what, ": bytes [", place.offset, ", ",
              place.offset + bytes, ") lie outside the buffer of ", place.buffer->bytes(),
              " bytes");
}

void check_tokens(const TokenTensor& t, const TokenBlock& block, const char* what) {
  const int64_t bytes = extent_bytes(dtype_bytes(t.dtype), block.batch, block.tokens, block.heads,
                                     block.width, t.batch_stride, t.token_stride, t.head_stride);
  if (bytes == 0) return;
  A2D_REQUIRE(t.buffer, what, ": no buffer");
  A2D_REQUIRE(t.batch_stride >= 0 && t.token_stride >= 0 && t.head_stride >= 0, what,
              ": negative strides");
  A2D_REQUIRE(t.offset % dtype_bytes(t.dtype) == 0, what, ": offset ", t.offset,
              " is not a multiple of the ", dtype_name(t.dtype), " element size");
  check_place(Place::in(*t.buffer, t.offset), bytes, what);
}

void check_rows(const RowTensor& t, int64_t batch, int64_t heads, int64_t tokens,
                const char* what) {
  const int64_t bytes = extent_bytes(sizeof(float), batch, heads, tokens, 1, t.batch_stride,
                                     t.head_stride, t.token_stride);
  if (bytes == 0) return;
  A2D_REQUIRE(t.buffer, what, ": no buffer");
  A2D_REQUIRE(t.batch_stride >= 0 && t.head_stride >= 0 && t.token_stride >= 0, what,
              ": negative strides");
  A2D_REQUIRE(t.offset % static_cast<int64_t>(sizeof(float)) == 0, what,
              ": offset not a multiple of 4");
  check_place(Place::in(*t.buffer, t.offset), bytes, what);
}

}  // namespace a2d::cuda_plan
