// Internal: the operations of every backend whose memory the CPU computes on (cpu, fenced). They
// resolve buffers to addresses through memory() and run the CPU kernels of kernel.hpp. Every
// operation first checks that what it touches lies inside the buffers it names, and holds the
// buffers open (open()/close()) while it runs: the fenced backend makes its memory accessible
// there and nowhere else.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "attention2d/backend.hpp"

namespace a2d::backends {

class HostBackend : public Backend {
 public:
  BufferPtr allocate_staging(int64_t bytes) override;
  void upload(const void* host, Place to, int64_t bytes) override;
  void download(Place from, void* host, int64_t bytes) override;
  void fill_zero(Place at, int64_t bytes) override;

  void copy_tokens(const TokenTensor& from, const TokenTensor& to,
                   const TokenBlock& block) override;
  void copy_rows(const RowTensor& from, const RowTensor& to, int64_t batch, int64_t heads,
                 int64_t tokens) override;
  void permute_tokens(Place rows, int64_t tokens, int64_t token_bytes, Place order) override;
  void attention_forward(const ForwardCall& call, const TokenTensor& out,
                         const RowTensor& lse) override;
  void attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                 bool accumulate) override;
  void attention_backward(const BackwardCall& call, const TokenTensor& dq, const TokenTensor& dk,
                          const TokenTensor& dv) override;
  void merge_partials(Place into, Place from, int64_t count, int64_t record) override;
  void copy_bytes(Place from, Place to, int64_t bytes) override;
  void finalize(const RowsShape& rows, const PartialTensor& state, const TokenTensor& out,
                const RowTensor& lse) override;
  void delta(const RowsShape& rows, const TokenTensor& out, const TokenTensor& d_out,
             const RowTensor& delta) override;
  void add(Place into, Place from, int64_t count) override;
  void add_sinks(const RowsShape& rows, const float* sinks, int64_t first_head,
                 const TokenTensor& out, const RowTensor& lse) override;
  void add_sink_gradient(const RowsShape& rows, const float* sinks, int64_t first_head,
                         const RowTensor& lse, const RowTensor& delta, double* dsink) override;
  int64_t kernel_work() const override { return kernel_work_.load(std::memory_order_relaxed); }

 protected:
  // Where a buffer of this backend lives (whether or not the host may touch it right now).
  virtual std::byte* memory(const Buffer& buffer) const = 0;
  // Makes the buffers accessible for the duration of one operation (nested calls allowed; null
  // entries ignored), and inaccessible again.
  virtual void open(std::initializer_list<const Buffer*> /*buffers*/) {}
  // Called as every operation starts, before open() (the fenced backend makes its deferred
  // uploads here).
  virtual void before_operation() {}
  virtual void close(std::initializer_list<const Buffer*> /*buffers*/) {}

  // Holds buffers open for a scope.
  class Access {
   public:
    Access(HostBackend& backend, std::initializer_list<const Buffer*> buffers);
    ~Access();
    Access(const Access&) = delete;
    Access& operator=(const Access&) = delete;

   private:
    HostBackend& backend_;
    const Buffer* buffers_[16] = {};
    int count_ = 0;
  };

 private:
  std::byte* address(const Place& place, int64_t bytes, const char* what) const;
  std::byte* address(const TokenTensor& t, const TokenBlock& block, const char* what) const;
  float* address(const RowTensor& t, int64_t batch, int64_t heads, int64_t tokens,
                 const char* what) const;
  InTokens input(const TokenTensor& t, const TokenBlock& block, const char* what) const;
  OutTokens output(const TokenTensor& t, const TokenBlock& block, const char* what) const;
  TokenView<float> floats(const TokenTensor& t, const TokenBlock& block, const char* what) const;
  RowView<float> rows(const RowTensor& t, int64_t batch, int64_t heads, int64_t tokens,
                      const char* what) const;
  // The kernels' work counter (kernel_work): they add to it as they compute.
  mutable std::atomic<int64_t> kernel_work_{0};
  const int64_t* indices(const Place& place, int64_t count, const char* what) const;
  ForwardArgs forward_args(const ForwardCall& call) const;
};

}  // namespace a2d::backends
