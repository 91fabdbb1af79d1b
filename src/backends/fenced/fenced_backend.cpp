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

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include "attention2d/error.hpp"
#include "backends/backends.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "backends/cuda/cuda_plan.hpp"
#include "backends/host/host_backend.hpp"

namespace a2d::backends {
namespace {

int64_t page_bytes() {
  static const int64_t bytes = sysconf(_SC_PAGESIZE);
  return bytes;
}

void protect(std::byte* memory, int64_t bytes, int access) {
  if (bytes > 0 && mprotect(memory, static_cast<size_t>(bytes), access) != 0) {
    A2D_FAIL("mprotect of fenced memory failed: ", std::strerror(errno));
  }
}

// The memory of one backend's buffers: page-aligned blocks carved out of large reserved regions,
// all of it PROT_NONE except while an operation runs, when all of it is open. One mprotect per
// region as an operation starts and one as it ends, whatever the number of buffers it touches:
// on the VMs we test on an mprotect costs 10-100 us (a TLB flush per page, or a full flush past
// 33 pages), and one per buffer per operation made the fenced MPI tests 2x slower than the CPU
// backend's. Opening every buffer, not only the operation's own, changes nothing for what the
// backend proves: between operations (where algorithms and communicators run) nothing is open.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (const Region& region : regions_)
      munmap(region.base, static_cast<size_t>(region.reserved));
  }

  // `bytes` (a multiple of the page size) of all-ones bytes, open or fenced as the arena is.
  std::byte* allocate(int64_t bytes) {
    std::byte* block = nullptr;
    for (Region& region : regions_) {
      if ((block = region.take(bytes)) != nullptr) break;
    }
    if (block == nullptr) {
      const int64_t reserve = std::max<int64_t>(kRegionBytes, bytes);
      void* base = mmap(nullptr, static_cast<size_t>(reserve), PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) {
        A2D_FAIL("cannot reserve ", reserve, " bytes for fenced buffers: ", std::strerror(errno));
      }
      regions_.push_back({static_cast<std::byte*>(base), reserve, 0, {}});
      block = regions_.back().take(bytes);
    }
    protect(block, bytes, PROT_READ | PROT_WRITE);  // also above the mark an open covered
    // All-ones bytes (NaN in every float type), as uninitialised memory of the sanitizer build.
    std::memset(block, 0xff, static_cast<size_t>(bytes));
    if (open_depth_ == 0) protect(block, bytes, PROT_NONE);
    return block;
  }

  void release(std::byte* block, int64_t bytes) {
    for (Region& region : regions_) {
      if (block >= region.base && block < region.base + region.reserved) {
        region.give_back(block - region.base, bytes);
        return;
      }
    }
  }

  // Nested: only the outermost open and close change the protection.
  void open() {
    if (open_depth_++ == 0) {
      for (const Region& region : regions_)
        protect(region.base, region.high_water, PROT_READ | PROT_WRITE);
    }
  }
  void close() {
    if (--open_depth_ == 0) {
      for (const Region& region : regions_)
        protect(region.base, region.high_water, PROT_NONE);
    }
  }

 private:
  static constexpr int64_t kRegionBytes = int64_t{1} << 30;  // address space, not memory

  struct Region {
    std::byte* base;
    int64_t reserved;
    int64_t high_water = 0;           // every block lies below it; the protection covers it
    std::map<int64_t, int64_t> free;  // offset -> bytes of the free blocks below high_water

    // First fit among the free blocks, else from above the high-water mark; null if full.
    std::byte* take(int64_t bytes) {
      for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->second < bytes) continue;
        const int64_t offset = it->first, left = it->second - bytes;
        free.erase(it);
        if (left > 0) free.emplace(offset + bytes, left);
        return base + offset;
      }
      if (reserved - high_water < bytes) return nullptr;
      high_water += bytes;
      return base + high_water - bytes;
    }
    // Back to the free blocks, merged with its free neighbours.
    void give_back(int64_t offset, int64_t bytes) {
      auto next = free.lower_bound(offset);
      if (next != free.end() && next->first == offset + bytes) {
        bytes += next->second;
        next = free.erase(next);
      }
      if (next != free.begin()) {
        auto previous = std::prev(next);
        if (previous->first + previous->second == offset) {
          previous->second += bytes;
          return;
        }
      }
      free.emplace(offset, bytes);
    }
  };

  std::vector<Region> regions_;
  int open_depth_ = 0;
};

class FencedBuffer final : public Buffer {
 public:
  FencedBuffer(Backend& backend, int64_t bytes, std::byte* memory, int64_t mapped)
      : Buffer(backend, bytes, nullptr), memory_(memory), mapped_(mapped) {}
  ~FencedBuffer() override;

  std::byte* memory() const { return memory_; }
  int64_t mapped() const { return mapped_; }
  // wrap_device's stand-in: the caller's memory, written back when the buffer goes.
  void write_back_to(void* caller) { write_back_ = caller; }

 private:
  std::byte* memory_;
  int64_t mapped_;
  void* write_back_ = nullptr;
};

// Host memory the host may not touch (staged by communicators), the CPU's kernels; with the CUDA
// rules, the CUDA kernels' dtypes and head dimensions. wrap_device: a fenced copy (tests).
BackendCapabilities fenced_capabilities(bool cuda_rules) {
  BackendCapabilities c;
  c.host_accessible = false;
  c.wraps_device = true;
  if (cuda_rules) {
    c.dtypes = cuda_plan::kernel_dtypes();
    c.head_dims = cuda_plan::kernel_head_dims();
  }
  return c;
}

class FencedBackend final : public HostBackend {
 public:
  explicit FencedBackend(bool cuda_rules) : cuda_rules_(cuda_rules) {}
  ~FencedBackend() override { make_deferred(); }
  std::string name() const override { return cuda_rules_ ? "fenced-cuda" : "fenced"; }
  const BackendCapabilities& capabilities() const override {
    static const BackendCapabilities fenced = fenced_capabilities(false),
                                     fenced_cuda = fenced_capabilities(true);
    return cuda_rules_ ? fenced_cuda : fenced;
  }

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
    return std::make_unique<FencedBuffer>(*this, bytes, arena_.allocate(mapped), mapped);
  }

  // The stand-in for a device tensor's memory (backend.hpp): a fenced copy of the caller's, which
  // only the backend's operations may touch, written back when the buffer goes.
  BufferPtr wrap_device(void* memory, int64_t bytes) override {
    BufferPtr buffer = allocate(bytes);
    if (bytes > 0) {
      HostBackend::upload(memory, Place::in(*buffer), bytes);
      static_cast<FencedBuffer&>(*buffer).write_back_to(memory);
    }
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
  void open(std::initializer_list<const Buffer*> /*buffers*/) override { arena_.open(); }
  void close(std::initializer_list<const Buffer*> /*buffers*/) override { arena_.close(); }

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
  Arena arena_;  // unmapped with the backend, which its buffers do not outlive

 public:
  void release(std::byte* memory, int64_t mapped) { arena_.release(memory, mapped); }
};

// A buffer freed with uploads into it still deferred receives them first (a GPU's frees are
// ordered after the copies on its stream).
FencedBuffer::~FencedBuffer() {
  auto& backend = static_cast<FencedBackend&>(this->backend());
  backend.make_deferred();
  if (write_back_) {
    try {
      backend.download(Place::in(*this), write_back_, bytes());
    } catch (...) {  // a destructor must not throw; the test then finds the caller's copy stale
    }
  }
  backend.release(memory_, mapped_);
}

std::unique_ptr<Backend> make_fenced(int /*ordinal*/) {
  return std::make_unique<FencedBackend>(false);
}
std::unique_ptr<Backend> make_fenced_cuda(int /*ordinal*/) {
  return std::make_unique<FencedBackend>(true);
}

}  // namespace

std::byte* fenced_memory(const Buffer& buffer) {
  A2D_REQUIRE(dynamic_cast<const FencedBackend*>(&buffer.backend()), "not a fenced buffer");
  return static_cast<const FencedBuffer&>(buffer).memory();
}

BackendEntry fenced_backend_entry(bool cuda_rules) {
  BackendEntry e;
  e.name = cuda_rules ? "fenced-cuda" : "fenced";
  e.summary = cuda_rules ? "fenced, refusing the kernel calls the CUDA backend refuses"
                         : "the test backend whose memory only its own operations may touch";
  e.capabilities = fenced_capabilities(cuda_rules);
  e.make = cuda_rules ? make_fenced_cuda : make_fenced;
  return e;
}

}  // namespace a2d::backends
