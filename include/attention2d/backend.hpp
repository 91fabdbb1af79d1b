// attention2d: the backend interface, one implementation per kind of device.
//
// A backend owns data buffers and performs every operation the distributed algorithms apply to
// their contents: moving rows of tensors between shards and records (with conversion between
// element types), permuting gathered rows, the local attention kernels, merging and finalising
// partial results, delta, adding partial gradients. The algorithms (src/algorithms) hold Buffer
// handles and call only the backend and the communicator; they never read or write a buffer's
// memory themselves, so a new device is one new backend (docs/backends.md).
//
//   cpu     host memory; the CPU kernels (portable and AVX2 paths, kernel.hpp)
//   cuda    NVIDIA GPU memory and the CUDA kernels (built with -DA2D_WITH_CUDA=ON; one stream per
//           backend; docs/gpu.md). Its buffers are not host-accessible either.
//   fenced  a test backend: the CPU's operations on host memory that is kept inaccessible
//           (mprotect PROT_NONE) except inside the backend's own operations, so that any other
//           read or write crashes. Its buffers are not host-accessible, so communicators stage
//           them through host memory, as a GPU's buffers must be under an MPI that is not
//           CUDA-aware.
//   fenced-cuda  fenced, refusing every kernel call the CUDA backend would refuse (dtype, head
//           dimension, alignment): every algorithm checked against the CUDA kernels' rules on a
//           machine without a GPU.
//
// Tensors inside buffers are described by TokenTensor ([batch, tokens, heads, width], any DType,
// element strides) and RowTensor ([batch, heads, tokens], fp32), each a buffer, a byte offset and
// strides; positions and permutations are int64 arrays in buffers (Place). Operations are ordered:
// each sees the results of the ones before it (a device backend keeps one stream per rank and
// synchronises only where the host or a communicator needs the data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/buffer.hpp"
#include "attention2d/dtype.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/problem.hpp"

namespace a2d {

// A kernel call on tensors in buffers: kernel.hpp's ForwardArgs / BackwardArgs, with positions
// as int64 arrays in buffers (an empty Place: 0, 1, 2, ...).
struct ForwardCall {
  AttentionShape shape;
  Mask mask;
  float scale = 0.0f;
  float softcap = 0.0f;
  TokenTensor q, k, v;
  Place q_positions, kv_positions;
  int threads = 1;
  void (*progress)(void* context) = nullptr;  // as in ForwardArgs
  void* progress_context = nullptr;
};

struct BackwardCall {
  AttentionShape shape;
  Mask mask;
  float scale = 0.0f;
  float softcap = 0.0f;
  TokenTensor q, k, v, d_out;
  RowTensor lse;
  // delta when its buffer is set, else computed from out (as in BackwardArgs).
  RowTensor delta;
  TokenTensor out;
  Place q_positions, kv_positions;
  int threads = 1;
  void (*progress)(void* context) = nullptr;
  void* progress_context = nullptr;
  bool accumulate = false;  // add to dq, dk, dv instead of overwriting them
};

// What a backend can do, for the code that chooses around it (communicators, memory checks, the
// front ends' defaults and bounds): they ask these, never the backend's name. One record per kind
// of backend (its registry entry's), or per instance where that differs (the sim backend's device).
struct BackendCapabilities {
  // Buffers' memory is host-accessible (Buffer::host_data() set): communicators move it directly;
  // otherwise they stage it through host memory (make_staged_communicator).
  bool host_accessible = true;
  // Buffers are this host's memory (accessible or not), which the memory checks count; false
  // for a device's own memory (a GPU's).
  bool host_memory = true;
  // The kernels are the CPU's (kernel.hpp), on this process's threads: the kernel-path switch,
  // --threads, the FMA peak and the kernels' work counter (kernel_work) apply.
  bool cpu_kernels = true;
  // The kernels round P and dS to the inputs' 16-bit dtype, as tensor cores do: checks against
  // the fp64 reference use the tensor-core bounds (tools/check.hpp).
  bool tensor_core_rounding = false;
  // The --comm kind that moves this backend's buffers in their own memory ("nccl"); "" for none
  // (mpi and gloo carry every backend, staged where needed).
  std::string native_comm;
  // The dtypes its kernels compute in, its default first (--dtype's default on it).
  std::vector<DType> dtypes;  // by default fp32, bf16, fp16
  // The head dimensions its kernels take; empty: any.
  std::vector<int64_t> head_dims;
  // wrap_host / wrap_device work: the caller's host (device) memory as a buffer without a copy.
  bool wraps_host = false;
  bool wraps_device = false;

  BackendCapabilities();  // a host backend's: host memory, the CPU's kernels, every dtype
  bool computes_in(DType dtype) const;
  bool takes_head_dim(int64_t head_dim) const;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // "cpu", "fenced", ...: for messages and reports. Code that chooses asks capabilities().
  virtual std::string name() const = 0;
  virtual const BackendCapabilities& capabilities() const = 0;
  // capabilities().host_accessible: communicators move buffers directly, else stage them.
  bool host_accessible() const { return capabilities().host_accessible; }
  // Throws a2d::Error when this backend's kernels cannot compute problems of this dtype, head
  // dimension, mask or softcap (make_attention asks on every rank before any data moves). The
  // host backends compute everything; the CUDA backend refuses what its kernels lack.
  virtual void check_supported(DType /*dtype*/, int64_t /*head_dim*/, const Mask& /*mask*/,
                               float /*softcap*/) const {}
  // Optional: the score entries (query rows x keys, per head) this backend's attention kernels have
  // computed since it was made, which grows while a kernel runs: a work counter for progress
  // reports. -1 where the backend does not count (the CUDA backend).
  virtual int64_t kernel_work() const { return -1; }

  // ---- memory ----
  // Uninitialised (NaN bytes in the sanitizer build, and always on the fenced and cuda backends,
  // so that reading an unwritten element poisons the results the tests compare).
  virtual BufferPtr allocate(int64_t bytes) = 0;
  // Host-accessible memory for staging transfers (pinned where the device has such a thing).
  virtual BufferPtr allocate_staging(int64_t bytes) = 0;
  // Optional (CPU only; others throw): a buffer over the caller's host memory, not copied and not
  // owned. The memory must outlive the buffer.
  virtual BufferPtr wrap_host(void* memory, int64_t bytes);
  // Optional (cuda; fenced-cuda as its stand-in; others throw): a buffer over the caller's
  // device memory (a torch CUDA tensor's, on this backend's device), not copied and not owned.
  // The memory must outlive the buffer; the caller orders its own work around the backend's
  // with follow_stream and lead_stream. The fenced backends stand in for it with a fenced copy
  // made here and written back to `memory` when the buffer goes (host memory, for tests only).
  virtual BufferPtr wrap_device(void* memory, int64_t bytes);
  // Cross-stream order without a host wait (a cudaStream_t, 0 the legacy default stream):
  // follow_stream makes the operations issued from now on wait for the work issued so far on
  // `stream`; lead_stream makes the work issued later on `stream` wait for every operation
  // issued so far here. The host backends' operations are synchronous: nothing to order.
  virtual void follow_stream(void* /*stream*/) {}
  virtual void lead_stream(void* /*stream*/) {}
  virtual void upload(const void* host, Place to, int64_t bytes) = 0;
  virtual void download(Place from, void* host, int64_t bytes) = 0;
  // Optional: upload() that may return before the copy is made, for the staged communicator's
  // receives. Operations issued later see the data; the copy may run beside the operations issued
  // between `after` (a fence of this backend taken earlier, or null: now) and this call, which
  // must not touch `to`; `host` must stay unchanged until a fence taken after this call has been
  // waited for. The cuda backend copies on a stream of its own (so beside a running kernel), the
  // fenced backend at its next operation; by default it is upload().
  virtual void upload_async(const void* host, Place to, int64_t bytes, const Fence* after);
  // The point the operations issued so far have reached (the host backends' are synchronous:
  // reached at once, unless deferred by upload_async).
  virtual std::unique_ptr<Fence> fence();
  virtual void fill_zero(Place at, int64_t bytes) = 0;
  // Waits until every operation issued so far has finished (a device backend's stream; the host
  // backends' operations are synchronous, so for them it does nothing). For timing.
  virtual void synchronize() {}

  // ---- data operations ----
  // to = from, converting between their dtypes (rounding to nearest even when narrowing).
  virtual void copy_tokens(const TokenTensor& from, const TokenTensor& to,
                           const TokenBlock& block) = 0;
  virtual void copy_rows(const RowTensor& from, const RowTensor& to, int64_t batch, int64_t heads,
                         int64_t tokens) = 0;
  // In place, `tokens` tokens of `token_bytes` bytes at `rows`: out[i] = in[order[i]], `order` an
  // int64 permutation of [0, tokens) in a buffer of this backend.
  virtual void permute_tokens(Place rows, int64_t tokens, int64_t token_bytes, Place order) = 0;
  // The kernels (kernel.hpp): O in its dtype and fp32 LSE; the fp32 partial state; fp32 gradients.
  virtual void attention_forward(const ForwardCall& call, const TokenTensor& out,
                                 const RowTensor& lse) = 0;
  virtual void attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                         bool accumulate) = 0;
  virtual void attention_backward(const BackwardCall& call, const TokenTensor& dq,
                                  const TokenTensor& dk, const TokenTensor& dv) = 0;
  // into <- merge(into, from) on `count` flat fp32 records [row max, row sum, acc(record - 2)]:
  // the attention merge of partial results, for every communicator (Communicator::merge_scatter)
  // and the overlapped algorithm's own merges.
  virtual void merge_partials(Place into, Place from, int64_t count, int64_t record) = 0;
  // to = from, `bytes` bytes (the two must not overlap).
  virtual void copy_bytes(Place from, Place to, int64_t bytes) = 0;
  // O (its dtype) and LSE of the partial state.
  virtual void finalize(const RowsShape& rows, const PartialTensor& state, const TokenTensor& out,
                        const RowTensor& lse) = 0;
  // delta = rowsum(dO * O), fp32.
  virtual void delta(const RowsShape& rows, const TokenTensor& out, const TokenTensor& d_out,
                     const RowTensor& delta) = 0;
  // into[i] += from[i], `count` fp32 values.
  virtual void add(Place into, Place from, int64_t count) = 0;
  // Attention sinks (kernel.hpp's add_sinks and add_sink_gradient): `sinks` and `dsink` are
  // host arrays of the global heads, the tensors' heads start at `first_head`.
  virtual void add_sinks(const RowsShape& rows, const float* sinks, int64_t first_head,
                         const TokenTensor& out, const RowTensor& lse) = 0;
  virtual void add_sink_gradient(const RowsShape& rows, const float* sinks, int64_t first_head,
                                 const RowTensor& lse, const RowTensor& delta, double* dsink) = 0;
};

// The backends this build knows: one entry each, in src/backends/registry.cpp (each made by its
// own folder's <name>_backend_entry()). Adding a backend: docs/backends.md.
struct BackendEntry {
  const char* name = "";          // the --device name
  const char* summary = "";       // what it is (the choices of an unknown --device, a2d info)
  const char* build_option = "";  // the CMake option that builds it; "" built always
  const char* title = "";         // in messages ("CUDA"); "": the name
  const char* toolkit = "";       // what building it needs ("a CUDA toolkit")
  const char* unit = "device";    // what "name:N" counts ("GPU")
  bool built = true;              // whether this build has it
  bool takes_ordinal = false;     // "name:N" picks device N
  // default_device(dtype): the available backend of the highest rank that computes in the dtype;
  // 0: never the default.
  int default_rank = 0;
  BackendCapabilities capabilities;
  // Makes one (ordinal -1: the node-local rank's device; throws without one); nullptr where it is
  // not made by name (sim: inside SimGrid only, sim.hpp).
  std::unique_ptr<Backend> (*make)(int ordinal) = nullptr;
  // Devices visible here (1 for the host's); nullptr: 1.
  int (*device_count)() = nullptr;

  int devices() const;  // 0 where not built or not made by name
};
const std::vector<BackendEntry>& backend_registry();
// The entry of a --device value ("cuda:1" is cuda's), nullptr for an unknown one.
const BackendEntry* find_backend(const std::string& device);

// A backend of the registry by its --device value: "cpu", "fenced", "fenced-cuda", "cuda" (the
// node-local rank's GPU) or "cuda:N" (GPU N); anything else throws a2d::Error naming the choices.
// A backend this build lacks, or whose device is absent, throws a2d::Error saying so.
std::unique_ptr<Backend> make_backend(const std::string& device);
std::vector<std::string> backend_names();  // those this build makes by name
// The devices' default for inputs of `dtype`: the available backend of the highest default_rank
// that computes in it ("cuda" for bf16/fp16 when the build has it and a GPU is visible), else
// "cpu".
std::string default_device(DType dtype);
// --dtype's default on `device` (its first dtype; fp32 for "" and unknown devices).
DType default_dtype(const std::string& device);

// An int64 array uploaded to a new buffer of `backend` (positions, permutations).
BufferPtr upload_indices(Backend& backend, const std::vector<int64_t>& values);

}  // namespace a2d
