// What every backend shares: dense tensor descriptors, capabilities, index uploads.
#include "attention2d/backend.hpp"

#include <algorithm>

#include "attention2d/error.hpp"

namespace a2d {

TokenTensor dense_token_tensor(Buffer& buffer, DType dtype, int64_t tokens, int64_t heads,
                               int64_t width, int64_t offset) {
  return {&buffer, offset, dtype, tokens * heads * width, heads * width, width};
}

RowTensor dense_row_tensor(Buffer& buffer, int64_t heads, int64_t tokens, int64_t offset) {
  return {&buffer, offset, heads * tokens, tokens, 1};
}

BackendCapabilities::BackendCapabilities() {
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16})
    dtypes.push_back(dtype);
}

bool BackendCapabilities::computes_in(DType dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

bool BackendCapabilities::takes_head_dim(int64_t head_dim) const {
  return head_dims.empty() ||
         std::find(head_dims.begin(), head_dims.end(), head_dim) != head_dims.end();
}

namespace {
class ReachedFence final : public Fence {
 public:
  void wait() override {}
};
}  // namespace

void Backend::upload_async(const void* host, Place to, int64_t bytes, const Fence* /*after*/) {
  upload(host, to, bytes);
}

std::unique_ptr<Fence> Backend::fence() {
  return std::make_unique<ReachedFence>();
}

BufferPtr Backend::wrap_host(void* /*memory*/, int64_t /*bytes*/) {
  A2D_FAIL("the ", name(), " backend cannot use host memory as its buffers; upload it instead");
}

BufferPtr Backend::wrap_device(void* /*memory*/, int64_t /*bytes*/) {
  A2D_FAIL("the ", name(), " backend has no device memory to wrap (device tensors need the cuda ",
           "backend)");
}

BufferPtr upload_indices(Backend& backend, const std::vector<int64_t>& values) {
  const int64_t bytes = static_cast<int64_t>(values.size() * sizeof(int64_t));
  BufferPtr buffer = backend.allocate(bytes);
  backend.upload(values.data(), Place::in(*buffer), bytes);
  return buffer;
}

}  // namespace a2d
