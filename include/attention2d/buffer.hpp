// attention2d: buffers, places and the tensors in them, the handles the algorithms hold
// (backend.hpp: the Backend that owns the buffers and operates on their contents). Tensors inside
// buffers are described by TokenTensor ([batch, tokens, heads, width], any DType, element
// strides) and RowTensor ([batch, heads, tokens], fp32), each a buffer, a byte offset and
// strides; positions and permutations are int64 arrays in buffers (Place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "attention2d/dtype.hpp"

namespace a2d {

class Backend;  // backend.hpp

// Memory owned by a backend (or, for the CPU backend, host memory it was asked to wrap).
class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  int64_t bytes() const { return bytes_; }
  Backend& backend() const { return *backend_; }
  // The memory's host address, or nullptr where the host must not touch it (device memory, the
  // fenced backend's memory). Communicators move host-accessible buffers directly.
  void* host_data() const { return host_; }

 protected:
  Buffer(Backend& backend, int64_t bytes, void* host)
      : backend_(&backend), bytes_(bytes), host_(host) {}

 private:
  Backend* backend_;
  int64_t bytes_;
  void* host_;
};
using BufferPtr = std::unique_ptr<Buffer>;

// A byte position: in a backend's buffer, or in plain host memory (buffer == nullptr; the
// communicators' control paths and the programs' host arrays).
struct Place {
  Buffer* buffer = nullptr;
  std::byte* host = nullptr;
  int64_t offset = 0;  // bytes

  static Place in(Buffer& buffer, int64_t offset = 0) { return {&buffer, nullptr, offset}; }
  static Place at_host(const void* memory) {
    return {nullptr, static_cast<std::byte*>(const_cast<void*>(memory)), 0};
  }
  bool empty() const { return buffer == nullptr && host == nullptr; }
  Place operator+(int64_t bytes) const { return {buffer, host, offset + bytes}; }
};

// A [batch, tokens, heads, width] tensor in a buffer; strides in elements of dtype, `width`
// elements per row dense.
struct TokenTensor {
  Buffer* buffer = nullptr;
  int64_t offset = 0;  // bytes from the buffer's start to element (0, 0, 0, 0)
  DType dtype = DType::f32;
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;

  // The same tensor from head `first` on.
  TokenTensor from_head(int64_t first) const {
    TokenTensor t = *this;
    t.offset += first * head_stride * dtype_bytes(dtype);
    return t;
  }
};

// A [batch, heads, tokens] fp32 statistic in a buffer (LSE, row max, row sum, delta).
struct RowTensor {
  Buffer* buffer = nullptr;
  int64_t offset = 0;  // bytes
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;

  RowTensor from_head(int64_t first) const {
    RowTensor t = *this;
    t.offset += first * head_stride * static_cast<int64_t>(sizeof(float));
    return t;
  }
};

// The online-softmax state of partial results (kernel.hpp's PartialState), fp32, in buffers.
struct PartialTensor {
  TokenTensor acc;
  RowTensor row_max;
  RowTensor row_sum;
};

// Dense row-major [batch, tokens, heads, width] and [batch, heads, tokens] at `offset` bytes.
TokenTensor dense_token_tensor(Buffer& buffer, DType dtype, int64_t tokens, int64_t heads,
                               int64_t width, int64_t offset = 0);
RowTensor dense_row_tensor(Buffer& buffer, int64_t heads, int64_t tokens, int64_t offset = 0);

// Rows moved by copy_tokens: `width` elements of each (batch, token, head).
struct TokenBlock {
  int64_t batch = 1;
  int64_t tokens = 0;
  int64_t heads = 1;
  int64_t width = 0;
};

// A point in a backend's sequence of operations (Backend::fence).
class Fence {
 public:
  virtual ~Fence() = default;
  // Returns once the operations issued before the fence was taken are done.
  virtual void wait() = 0;
};

}  // namespace a2d
