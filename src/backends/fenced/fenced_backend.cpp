// The fenced test backend: the CPU backend's operations on memory that is inaccessible (mprotect
// PROT_NONE) except while one of those operations runs. Its buffers report no host address, so
// communicators stage them through host memory as they must a GPU's; any access from outside the
// backend (an algorithm reading a buffer, a communicator handing one to MPI) is a segmentation
// fault. The MPI test matrix runs every algorithm on it (tests/mpi), which proves that the
// algorithms touch data only through the backend and the communicator.
//
// Uploads through upload_async (the staged communicator's receives) are deferred to the start of
// the backend's next operation, or the wait of a fence, reading the host memory only then: as a
// GPU copies from pinned memory after upload_async has returned. A communicator that reused a
// staging buffer before waiting for its fence would deliver the wrong bytes, and the MPI test
// matrix on this backend would see them.
//
// "fenced-cuda" is the same backend refusing every kernel call the CUDA backend would refuse
// (cuda_plan.hpp's checks: dtype, head dimension, masks, 16-byte aligned rows, pairs of output
// elements), so that every algorithm's calls are checked against the CUDA kernels' rules on a
// machine without a GPU (tests/CMakeLists.txt, cli.mpi.fenced_cuda_*).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "attention2d/error.hpp"
#include "backends/backends.hpp"
#include "backends/cuda/cuda_plan.hpp"
#include "backends/host/host_backend.hpp"

namespace a2d::backends {
namespace {

int64_t page_bytes() {
  static const int64_t bytes = sysconf(_SC_PAGESIZE);
  return bytes;
}

class FencedBuffer final : public Buffer {
 public:
  FencedBuffer(Backend& backend, int64_t bytes, std::byte* memory, int64_t mapped)
      : Buffer(backend, bytes, nullptr), memory_(memory), mapped_(mapped) {}
  ~FencedBuffer() override;

  std::byte* memory() const { return memory_; }
  int64_t mapped() const { return mapped_; }
  int opened = 0;  // nesting depth of the operations that hold it open

 private:
  std::byte* memory_;
  int64_t mapped_;
};

void protect(const FencedBuffer& buffer, int access) {
  if (mprotect(buffer.memory(), static_cast<size_t>(buffer.mapped()), access) != 0) {
    A2D_FAIL("mprotect of a fenced buffer failed: ", std::strerror(errno));
  }
}

class FencedBackend final : public HostBackend {
 public:
  explicit FencedBackend(bool cuda_rules) : cuda_rules_(cuda_rules) {}
  ~FencedBackend() override { make_deferred(); }
  std::string name() const override { return cuda_rules_ ? "fenced-cuda" : "fenced"; }
  bool host_accessible() const override { return false; }

  void check_supported(DType dtype, int64_t head_dim, const Mask& mask,
                       float softcap) const override {
    if (cuda_rules_) cuda_plan::check_supported(dtype, head_dim, mask, softcap);
  }
  void attention_forward(const ForwardCall& call, const TokenTensor& out,
                         const RowTensor& lse) override {
    if (cuda_rules_) {
      cuda_plan::check_forward(call);
      cuda_plan::check_forward_output(call, out);
    }
    HostBackend::attention_forward(call, out, lse);
  }
  void attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                 bool accumulate) override {
    if (cuda_rules_) {
      cuda_plan::check_forward(call);
      cuda_plan::check_partial_output(state);
    }
    HostBackend::attention_forward_partial(call, state, accumulate);
  }
  void attention_backward(const BackwardCall& call, const TokenTensor& dq, const TokenTensor& dk,
                          const TokenTensor& dv) override {
    if (cuda_rules_) {
      cuda_plan::check_backward(call);
      cuda_plan::check_backward_outputs(dq, dk, dv);
    }
    HostBackend::attention_backward(call, dq, dk, dv);
  }

  BufferPtr allocate(int64_t bytes) override {
    A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
    const int64_t page = page_bytes();
    const int64_t mapped = std::max<int64_t>(page, (bytes + page - 1) / page * page);
    void* memory = mmap(nullptr, static_cast<size_t>(mapped), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      A2D_FAIL("cannot map ", mapped, " bytes for a fenced buffer: ", std::strerror(errno));
    }
    auto buffer =
        std::make_unique<FencedBuffer>(*this, bytes, static_cast<std::byte*>(memory), mapped);
    // All-ones bytes (NaN in every float type), as uninitialised memory of the sanitizer build.
    std::memset(memory, 0xff, static_cast<size_t>(mapped));
    protect(*buffer, PROT_NONE);
    return buffer;
  }

  void upload_async(const void* host, Place to, int64_t bytes, const Fence* /*after*/) override {
    deferred_.push_back({host, to, bytes});
  }
  std::unique_ptr<Fence> fence() override { return std::make_unique<DeferredFence>(*this); }

  // The deferred uploads, in the order they were asked for.
  void make_deferred() {
    std::vector<Deferred> due;
    due.swap(deferred_);
    for (const Deferred& d : due)
      HostBackend::upload(d.host, d.to, d.bytes);
  }

 protected:
  std::byte* memory(const Buffer& buffer) const override {
    return static_cast<const FencedBuffer&>(buffer).memory();
  }
  void before_operation() override { make_deferred(); }
  void open(std::initializer_list<const Buffer*> buffers) override {
    for (const Buffer* b : buffers) {
      auto* buffer = const_cast<FencedBuffer*>(static_cast<const FencedBuffer*>(b));
      if (buffer->opened++ == 0) protect(*buffer, PROT_READ | PROT_WRITE);
    }
  }
  void close(std::initializer_list<const Buffer*> buffers) override {
    for (const Buffer* b : buffers) {
      auto* buffer = const_cast<FencedBuffer*>(static_cast<const FencedBuffer*>(b));
      if (--buffer->opened == 0) protect(*buffer, PROT_NONE);
    }
  }

 private:
  struct Deferred {
    const void* host;
    Place to;
    int64_t bytes;
  };
  // Reached once the uploads deferred so far are made.
  class DeferredFence final : public Fence {
   public:
    explicit DeferredFence(FencedBackend& backend) : backend_(backend) {}
    void wait() override { backend_.make_deferred(); }

   private:
    FencedBackend& backend_;
  };

  bool cuda_rules_;
  std::vector<Deferred> deferred_;
};

// A buffer freed with uploads into it still deferred receives them first (a GPU's frees are
// ordered after the copies on its stream).
FencedBuffer::~FencedBuffer() {
  static_cast<FencedBackend&>(backend()).make_deferred();
  munmap(memory_, static_cast<size_t>(mapped_));
}

}  // namespace

std::byte* fenced_memory(const Buffer& buffer) {
  A2D_REQUIRE(buffer.backend().name().rfind("fenced", 0) == 0, "not a fenced buffer");
  return static_cast<const FencedBuffer&>(buffer).memory();
}

std::unique_ptr<Backend> make_fenced_backend(bool cuda_rules) {
  return std::make_unique<FencedBackend>(cuda_rules);
}

}  // namespace a2d::backends
