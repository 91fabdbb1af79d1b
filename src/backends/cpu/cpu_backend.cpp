// The CPU backend: buffers are host memory, operations are the CPU kernels (host_backend.cpp).
#include <cstdlib>
#include <cstring>
#include <new>

#include "attention2d/error.hpp"
#include "backends/backends.hpp"
#include "backends/host/host_backend.hpp"

namespace a2d::backends {
namespace {

// 64-byte aligned host memory (a cache line, two ymm registers), owned or wrapped.
class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(Backend& backend, int64_t bytes, void* memory, bool owned)
      : Buffer(backend, bytes, memory), owned_(owned) {}
  ~CpuBuffer() override {
    if (owned_) std::free(host_data());
  }

 private:
  bool owned_;
};

// Host memory the caller may read, every dtype and head dimension, the CPU's kernels.
BackendCapabilities cpu_capabilities() {
  BackendCapabilities c;
  c.wraps_host = true;
  return c;
}

class CpuBackend final : public HostBackend {
 public:
  std::string name() const override { return "cpu"; }
  const BackendCapabilities& capabilities() const override {
    static const BackendCapabilities capabilities = cpu_capabilities();
    return capabilities;
  }

  BufferPtr allocate(int64_t bytes) override {
    A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
    const size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    void* memory = std::aligned_alloc(64, size == 0 ? 64 : size);
    if (!memory) throw std::bad_alloc();
#ifdef A2D_POISON_UNINITIALIZED
    // All-ones bytes are NaN as fp32, bf16 and fp16 alike.
    std::memset(memory, 0xff, size == 0 ? 64 : size);
#endif
    return std::make_unique<CpuBuffer>(*this, bytes, memory, true);
  }

  BufferPtr wrap_host(void* memory, int64_t bytes) override {
    A2D_REQUIRE(bytes >= 0 && (memory || bytes == 0), "wrap_host needs memory for ", bytes,
                " bytes");
    return std::make_unique<CpuBuffer>(*this, bytes, memory, false);
  }

 protected:
  std::byte* memory(const Buffer& buffer) const override {
    return static_cast<std::byte*>(buffer.host_data());
  }
};

std::unique_ptr<Backend> make_cpu_backend(int /*ordinal*/) {
  return std::make_unique<CpuBackend>();
}

}  // namespace

BackendEntry cpu_backend_entry() {
  BackendEntry e;
  e.name = "cpu";
  e.default_rank = 1;
  e.capabilities = cpu_capabilities();
  e.make = make_cpu_backend;
  return e;
}

}  // namespace a2d::backends
