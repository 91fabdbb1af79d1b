// attention2d._core: the compiled part of the Python package (pybind11).
//
// Thin on purpose: the problem and plan as plain values, the planner and the cost model, the
// shard layout, and an Engine that holds one DistributedAttention (built once per problem, plan
// and communicator) through a Session (attention2d/session.hpp) on the CPU backend. Its
// transports: the caller's torch process group (a table of the group's operations from
// attention2d._c10d: group_comm.hpp), a Gloo mesh of its own (where the build has Gloo), an MPI
// communicator (where the build has MPI; mpi4py's handle), or this process alone. Tensors cross
// as (address, dtype, shape, strides) tuples read from numpy arrays or torch tensors by the
// pure-Python layer (python/attention2d), which also checks them collectively before any call;
// the engine wraps their memory without copying.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#ifdef A2D_WITH_MPI
#include <mpi.h>
#endif

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/group_comm.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/tools/harness.hpp"
#ifdef A2D_WITH_MPI
#include "attention2d/mpi_comm.hpp"
#endif
#include "attention2d/planner.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/session.hpp"
#include "attention2d/version.hpp"
#include "attention2d/watchdog.hpp"

namespace py = pybind11;

namespace {

#ifdef A2D_WITH_MPI
// An MPI communicator from mpi4py's handle (MPI._handleof(comm): the MPI_Comm's value as an
// integer), so that building needs no mpi4py (the [mpi] extra brings it at run time).
template <class Handle>
Handle handle_from(uintptr_t value) {
  if constexpr (std::is_pointer_v<Handle>) {
    return reinterpret_cast<Handle>(value);  // Open MPI: a pointer
  } else {
    return static_cast<Handle>(value);  // MPICH: an integer
  }
}
MPI_Comm mpi_comm_of(uintptr_t handle) {
  return handle_from<MPI_Comm>(handle);
}
#endif

// A tensor from Python: (address, dtype name, shape, strides in elements).
struct HostTensor {
  uintptr_t address = 0;
  a2d::DType dtype = a2d::DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

HostTensor host_tensor(const py::tuple& t, size_t rank, const char* name) {
  A2D_REQUIRE(t.size() == 4, name, ": expected (address, dtype, shape, strides)");
  HostTensor h;
  h.address = t[0].cast<uintptr_t>();
  h.dtype = a2d::parse_dtype(t[1].cast<std::string>());
  h.shape = t[2].cast<std::vector<int64_t>>();
  h.strides = t[3].cast<std::vector<int64_t>>();
  A2D_REQUIRE(h.shape.size() == rank && h.strides.size() == rank, name, " must have ", rank,
              " dimensions");
  return h;
}

// Bytes from the tensor's first element to one past its last (strides non-negative: the Python
// layer copies anything else).
int64_t extent_bytes(const HostTensor& h) {
  int64_t last = 0;
  for (size_t i = 0; i < h.shape.size(); ++i) {
    if (h.shape[i] == 0) return 0;
    A2D_REQUIRE(h.strides[i] >= 0, "negative strides are not supported");
    last += (h.shape[i] - 1) * h.strides[i];
  }
  return (last + 1) * static_cast<int64_t>(a2d::dtype_bytes(h.dtype));
}

// The caller's memory as the engine backend's buffers for the length of one call (not copied):
// host memory on the CPU backend, a CUDA tensor's device memory on the cuda backend (the
// fenced-cuda backend stands in for it in tests: backend.hpp, wrap_device).
struct Wrapped {
  explicit Wrapped(a2d::Backend& target) : backend(target) {}
  a2d::Buffer& wrap(const HostTensor& h) {
    void* memory = reinterpret_cast<void*>(h.address);
    buffers.push_back(backend.host_accessible() ? backend.wrap_host(memory, extent_bytes(h))
                                                : backend.wrap_device(memory, extent_bytes(h)));
    return *buffers.back();
  }
  // [batch, tokens, heads, head_dim], the last dimension dense.
  a2d::TokenTensor token(const HostTensor& h) {
    A2D_REQUIRE(h.shape[3] <= 1 || h.strides[3] == 1,
                "the last dimension must be contiguous (stride 1)");
    a2d::TokenTensor t;
    t.buffer = &wrap(h);
    t.dtype = h.dtype;
    t.batch_stride = h.strides[0];
    t.token_stride = h.strides[1];
    t.head_stride = h.strides[2];
    return t;
  }
  // [batch, heads, tokens] fp32.
  a2d::RowTensor row(const HostTensor& h) {
    A2D_REQUIRE(h.dtype == a2d::DType::f32, "lse must be float32");
    a2d::RowTensor t;
    t.buffer = &wrap(h);
    t.batch_stride = h.strides[0];
    t.head_stride = h.strides[1];
    t.token_stride = h.strides[2];
    return t;
  }
  a2d::Backend& backend;
  std::vector<a2d::BufferPtr> buffers;
};

// Q, K, V, O and LSE of a call, wrapped: the fields every shards struct shares.
template <class Shards>
void wrap_common(Wrapped& w, Shards& s, const py::tuple& q, const py::tuple& k, const py::tuple& v,
                 const py::tuple& out, const py::tuple& lse, uintptr_t sinks) {
  s.q = w.token(host_tensor(q, 4, "q"));
  s.k = w.token(host_tensor(k, 4, "k"));
  s.v = w.token(host_tensor(v, 4, "v"));
  s.out = w.token(host_tensor(out, 4, "out"));
  s.lse = w.row(host_tensor(lse, 3, "lse"));
  s.sinks = reinterpret_cast<const float*>(sinks);
}

// The caller's layout from its name and (for contiguous) every rank's token count: the shards
// attention(layout=...) receives.
a2d::TokenLayout caller_layout(const std::string& kind, const std::vector<int64_t>& counts,
                               int64_t seq, int ranks) {
  if (kind == "contiguous" && !counts.empty()) return a2d::TokenLayout::contiguous_counts(counts);
  return a2d::TokenLayout(a2d::parse_layout(kind), seq, ranks);
}

// The cost model's view of the caller's shards ("" = in the plan's own layout: none). The Python
// layer's backward moves only dO in and dQ, dK, dV out (relayout.hpp: saved).
std::optional<a2d::UserShards> user_shards(const std::string& kind,
                                           const std::vector<int64_t>& counts, int64_t seq,
                                           int ranks) {
  if (kind.empty()) return std::nullopt;
  return a2d::UserShards{caller_layout(kind, counts, seq, ranks), a2d::RelayoutBackward::saved};
}

py::dict prediction_dict(const a2d::Prediction& p) {
  py::dict d;
  d["forward_s"] = p.forward_s;
  d["backward_s"] = p.backward_s;
  d["forward_compute_s"] = p.forward_compute_s;
  d["backward_compute_s"] = p.backward_compute_s;
  d["forward_flops"] = p.forward_flops;
  d["backward_flops"] = p.backward_flops;
  d["forward_bytes"] = p.forward.bytes;
  d["backward_bytes"] = p.backward.bytes;
  d["forward_messages"] = p.forward.messages;
  d["backward_messages"] = p.backward.messages;
  d["words_forward"] = p.words_forward;
  d["words_backward"] = p.words_backward;
  d["memory_bytes"] = p.memory_bytes;
  d["relayout_forward_bytes"] = p.relayout_forward.bytes;
  d["relayout_backward_bytes"] = p.relayout_backward.bytes;
  d["relayout_forward_s"] = p.relayout_forward_s;
  d["relayout_backward_s"] = p.relayout_backward_s;
  return d;
}

std::unique_ptr<a2d::Watchdog> g_watchdog;

// Marks this rank as outside the library when a call into it returns (the watchdog then waits for
// it without suspecting a hang: attention2d/watchdog.hpp).
struct CallScope {
  CallScope() = default;
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  ~CallScope() { a2d::Watchdog::note_idle(); }
};

// A KeyboardInterrupt in one rank of a job of several leaves the others waiting for it: under
// mpirun its exit blocks in MPI_Finalize (mpi4py's, at exit) while the others wait in a
// collective, alive and outside the library to their watchdog, which waits for such a rank up to
// its idle limit (30 minutes). So the watchdog takes SIGINT as it takes SIGTERM, where Python's
// default handler has it (a handler the program installed stays in charge): back to SIG_DFL here
// (from the main thread; elsewhere Python keeps it), and Watchdog::stop_on_signals takes it.
bool take_python_sigint() {
  const py::module_ signal = py::module_::import("signal");
  const py::module_ threading = py::module_::import("threading");
  if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return false;
  const py::object sigint = signal.attr("SIGINT");
  if (!signal.attr("getsignal")(sigint).is(signal.attr("default_int_handler"))) return false;
  signal.attr("signal")(sigint, signal.attr("SIG_DFL"));
  return true;
}

// The ranks of a group or communicator and the transport the engines use over them: an MPI
// communicator (a duplicate of an mpi4py one) or a full mesh of Gloo connections (bootstrapped
// through a torch process group by the Python layer). Every engine duplicates it.
class Transport {
 public:
  // comm: mpi4py's handle of the communicator (the caller keeps the communicator alive).
  static std::shared_ptr<Transport> mpi(uintptr_t comm) {
#ifdef A2D_WITH_MPI
    auto t = std::make_shared<Transport>();
    const MPI_Comm handle = mpi_comm_of(comm);
    t->base_ = a2d::make_mpi_communicator(handle);
    t->mpi_ = handle;
    t->kind_ = "mpi";
    return t;
#else
    (void)comm;
    A2D_FAIL(
        "this build of attention2d has no MPI (it was built where no MPI was found): pass a "
        "torch.distributed group instead, or rebuild with MPI (docs/python.md)");
#endif
  }

  // The caller's process group, from the capsule attention2d._c10d.group_ops() made (taken over
  // here: the capsule is renamed so that it no longer releases the table). Collective: this rank
  // takes engine rank `position` (a DeviceMesh's order; the group's rank otherwise).
  static std::shared_ptr<Transport> group(py::object capsule, int position) {
    PyObject* object = capsule.ptr();
    constexpr const char* kName = "attention2d.group_ops";
    A2D_REQUIRE(PyCapsule_IsValid(object, kName),
                "Transport.group takes the capsule of attention2d._c10d.group_ops(group)");
    const auto* ops = static_cast<const A2dGroupOps*>(PyCapsule_GetPointer(object, kName));
    const A2dGroupOps table = *ops;
    PyCapsule_SetName(object, "attention2d.group_ops.taken");
    delete ops;
    auto t = std::make_shared<Transport>();
    std::unique_ptr<a2d::Communicator> whole = a2d::make_group_communicator(table);
    {
      py::gil_scoped_release release;
      t->base_ = whole->split(0, position);
    }
    t->kind_ = std::string("group:") + table.backend;
    return t;
  }

  // exchange(bytes) -> [bytes of every rank]: an all-gather over the bootstrap channel.
  static std::shared_ptr<Transport> gloo(int rank, int size, py::function exchange) {
    auto t = std::make_shared<Transport>();
    const a2d::AllGatherBytes all_gather = [&exchange](const std::string& mine) {
      py::list parts = exchange(py::bytes(mine));
      std::vector<std::string> result;
      for (const py::handle part : parts)
        result.push_back(part.cast<std::string>());
      return result;
    };
    t->base_ = a2d::make_gloo_communicator(rank, size, all_gather);
    t->kind_ = "gloo";
    return t;
  }

  // This process alone, without MPI (a Gloo "mesh" of one rank where the build has Gloo, so
  // that the watchdog and its signal handling run over it).
  static std::shared_ptr<Transport> local() {
    auto t = std::make_shared<Transport>();
    if (a2d::gloo_built()) {
      t->base_ = a2d::make_gloo_communicator(
          0, 1, [](const std::string& mine) { return std::vector<std::string>{mine}; });
    } else {
      t->base_ = a2d::make_self_communicator();
    }
    t->kind_ = "local";
    return t;
  }

  int rank() const {
    return base_->rank();
  }
  int size() const {
    return base_->size();
  }
  const std::string& kind() const {
    return kind_;
  }

  // Every rank's bytes, in rank order; `phase` names the wait for the watchdog.
  std::vector<py::bytes> allgather(const py::bytes& mine, const std::string& phase) {
    const std::string own = mine;
    std::vector<std::string> parts;
    {
      CallScope scope;
      py::gil_scoped_release release;
      base_->set_phase(phase);
      parts = a2d::all_gather_bytes(*base_, own);
    }
    std::vector<py::bytes> result;
    for (const std::string& part : parts)
      result.emplace_back(part);
    return result;
  }

  // A communicator of the same ranks with its own message space (an engine's world).
  std::unique_ptr<a2d::Communicator> duplicate() {
    return base_->split(0, base_->rank());
  }

  // Collective: (re)starts the process's watchdog over these ranks. From then on a SIGTERM (where
  // its disposition is still the default) ends the job: one line naming it, exit 143 on every
  // rank (docs/reliability.md, "Signals"). So does a SIGINT in a job of several ranks where
  // Python's own handler has it (exit 130); a single process keeps its KeyboardInterrupt.
  void start_watchdog(double timeout, double idle_limit) {
    g_watchdog.reset();
#ifdef A2D_WITH_MPI
    if (kind_ == "mpi") g_watchdog = std::make_unique<a2d::Watchdog>(mpi_, timeout, idle_limit);
#endif
    if (!g_watchdog) g_watchdog = std::make_unique<a2d::Watchdog>(*base_, timeout, idle_limit);
    a2d::Watchdog::stop_on_signals(base_->size() > 1 && take_python_sigint());
  }

 private:
  std::unique_ptr<a2d::Communicator> base_;
#ifdef A2D_WITH_MPI
  MPI_Comm mpi_ = MPI_COMM_NULL;  // the caller's communicator (mpi4py keeps it alive)
#endif
  std::string kind_;
};

// Pairs (from, to) of tensors given as (address, dtype, shape, strides) tuples.
using TensorPairs = std::vector<std::pair<py::tuple, py::tuple>>;

// Orders one call's operations on a device backend after the caller's stream's work so far, and
// the caller's stream's later work after them (backend.hpp, follow_stream / lead_stream): torch's
// current stream then sees the outputs without the host or the device waiting as a whole. Nothing
// on the host backends (synchronous).
class OnCallerStream {
 public:
  OnCallerStream(a2d::Backend& backend, uintptr_t stream)
      : backend_(backend), stream_(reinterpret_cast<void*>(stream)) {
    backend_.follow_stream(stream_);
  }
  ~OnCallerStream() {
    try {
      backend_.lead_stream(stream_);
    } catch (...) {  // a destructor must not throw; the call's own error is the one to report
    }
  }
  OnCallerStream(const OnCallerStream&) = delete;
  OnCallerStream& operator=(const OnCallerStream&) = delete;

 private:
  a2d::Backend& backend_;
  void* stream_;
};

// The engine's backend on `device` ("cpu", "cuda:N", or "fenced-cuda" standing in for a GPU in
// tests) and its world: a duplicate of the transport, or with `nccl` the project's NCCL
// communicator on the backend's GPU, bootstrapped through the transport (which keeps carrying the
// host operations: group_comm.hpp, make_nccl_communicator).
std::unique_ptr<a2d::Communicator> engine_world(Transport& transport, a2d::Backend& backend,
                                                bool nccl) {
  if (!nccl) return transport.duplicate();
  py::gil_scoped_release release;
  return a2d::make_nccl_communicator(transport.duplicate(), backend);
}

// One distributed attention of a fixed problem and plan over a transport, on the backend of the
// caller's tensors' device (cpu, or cuda:N for torch CUDA tensors).
// With the caller's layout (`shards`: contiguous with counts, zigzag, cyclic) different from the
// plan's, exchange_in() moves tensors from the caller's layout into the plan's and
// exchange_out() back, each in one all-to-all (relayout.hpp); forward() and backward() take
// plan-layout shards.
// The engine's Session (attention2d/session.hpp): its world a duplicate of the transport (or the
// NCCL communicator over it), its backend on `device`; the watchdog is the transport's.
std::unique_ptr<a2d::Session> engine_session(Transport& transport, const std::string& device,
                                             bool nccl) {
  std::unique_ptr<a2d::Backend> backend = a2d::make_backend(device);
  std::unique_ptr<a2d::Communicator> world = engine_world(transport, *backend, nccl);
  return std::make_unique<a2d::Session>(std::move(world), std::move(backend));
}

class Engine {
 public:
  Engine(const a2d::Problem& problem, const a2d::Plan& plan, Transport& transport,
         const std::string& device = "cpu", bool nccl = false) {
    CallScope scope;
    session_ = engine_session(transport, device, nccl);
    a2d::set_error_rank(session_->world().rank());
    // Collective, before any buffer exists: refused on every rank when a host cannot hold what a
    // forward call allocates (attention2d/memory_check.hpp); the backward's at its first call.
    // A device backend's buffers are not the host's (every rank agrees: the device kind is
    // checked collectively before an engine is made).
    if (session_->backend().host_accessible())
      a2d::check_memory(session_->world(), a2d::attention_memory_check(problem, plan, false));
    attention_ = session_->attention(problem, plan);
  }

  Engine(const a2d::Problem& problem, const a2d::Plan& plan, Transport& transport,
         const std::string& kind, const std::vector<int64_t>& counts,
         const std::string& device = "cpu", bool nccl = false)
      : Engine(problem, plan, transport, device, nccl) {
    CallScope scope;
    const a2d::TokenLayout shards = caller_layout(kind, counts, problem.seq, size());
    const a2d::TokenLayout& planned = attention_->layout();
    to_plan_ = session_->relayout(shards, planned);
    if (to_plan_) to_user_ = session_->relayout(planned, shards);
  }

  const a2d::Problem& problem() const { return attention_->problem(); }
  const a2d::Plan& plan() const { return attention_->plan(); }
  int rank() const { return session_->world().rank(); }
  int size() const { return session_->world().size(); }
  std::vector<int64_t> tokens(int part) const { return attention_->layout().tokens_of(part); }
  bool exchanges() const { return to_plan_ != nullptr; }
  int64_t plan_tokens() const { return attention_->layout().count(rank()); }

  // Token tensors [batch, tokens, heads, width] and fp32 rows [batch, heads, tokens], each pair
  // (caller's layout, plan's layout) for exchange_in and (plan's, caller's) for exchange_out.
  // backward: whether the exchange belongs to the backward (the phase it is charged to).
  // stream: the caller's stream (torch's current cudaStream_t; 0 on the CPU) the call is ordered
  // after and before (OnCallerStream).
  void exchange_in(const TensorPairs& tokens, const TensorPairs& rows, bool backward,
                   uintptr_t stream) {
    exchange(*to_plan_, tokens, rows, backward ? a2d::kRelayoutBackwardIn : a2d::kRelayoutForwardIn,
             stream);
  }
  void exchange_out(const TensorPairs& tokens, const TensorPairs& rows, bool backward,
                    uintptr_t stream) {
    exchange(*to_user_, tokens, rows,
             backward ? a2d::kRelayoutBackwardOut : a2d::kRelayoutForwardOut, stream);
  }
  std::string device() const { return session_->backend().name(); }

  // sinks: the address of the sinks' fp32 logits [heads] (0 without sinks); dsink: where the
  // backward writes their gradient [heads] (the sum over every rank's rows).
  void forward(const py::tuple& q, const py::tuple& k, const py::tuple& v, const py::tuple& out,
               const py::tuple& lse, uintptr_t sinks, uintptr_t stream) {
    Wrapped w(session_->backend());
    a2d::ForwardShards s;
    wrap_common(w, s, q, k, v, out, lse, sinks);
    CallScope scope;
    py::gil_scoped_release release;
    OnCallerStream ordered(session_->backend(), stream);
    attention_->forward(s);
  }

  void backward(const py::tuple& q, const py::tuple& k, const py::tuple& v, const py::tuple& out,
                const py::tuple& d_out, const py::tuple& lse, const py::tuple& dq,
                const py::tuple& dk, const py::tuple& dv, uintptr_t sinks, uintptr_t dsink,
                uintptr_t stream) {
    Wrapped w(session_->backend());
    a2d::BackwardShards s;
    wrap_common(w, s, q, k, v, out, lse, sinks);
    s.d_out = w.token(host_tensor(d_out, 4, "d_out"));
    s.dq = w.token(host_tensor(dq, 4, "dq"));
    s.dk = w.token(host_tensor(dk, 4, "dk"));
    s.dv = w.token(host_tensor(dv, 4, "dv"));
    s.dsink = reinterpret_cast<float*>(dsink);
    CallScope scope;
    py::gil_scoped_release release;
    OnCallerStream ordered(session_->backend(), stream);
    if (!backward_checked_ && session_->backend().host_accessible()) {
      a2d::check_memory(session_->world(), a2d::attention_memory_check(problem(), plan(), true));
      backward_checked_ = true;
    }
    attention_->backward(s);
  }

 private:
  void exchange(a2d::LayoutExchange& exchange, const TensorPairs& tokens, const TensorPairs& rows,
                const std::string& phase, uintptr_t stream) {
    A2D_REQUIRE(to_plan_ != nullptr,
                "this engine's shards are in the plan's layout: nothing to "
                "exchange");
    Wrapped w(session_->backend());
    std::vector<a2d::LayoutExchange::TokenMove> token_moves;
    for (const auto& [from, to] : tokens) {
      const HostTensor f = host_tensor(from, 4, "from"), t = host_tensor(to, 4, "to");
      a2d::LayoutExchange::TokenMove move;
      move.from = w.token(f);
      move.to = w.token(t);
      move.batch = f.shape[0];
      move.heads = f.shape[2];
      move.width = f.shape[3];
      token_moves.push_back(move);
    }
    std::vector<a2d::LayoutExchange::RowMove> row_moves;
    for (const auto& [from, to] : rows) {
      const HostTensor f = host_tensor(from, 3, "from"), t = host_tensor(to, 3, "to");
      a2d::LayoutExchange::RowMove move;
      move.from = w.row(f);
      move.to = w.row(t);
      move.batch = f.shape[0];
      move.heads = f.shape[1];
      row_moves.push_back(move);
    }
    CallScope scope;
    py::gil_scoped_release release;
    OnCallerStream ordered(session_->backend(), stream);
    exchange.exchange(session_->world(), token_moves, row_moves, phase);
  }

  std::unique_ptr<a2d::Session> session_;
  std::unique_ptr<a2d::DistributedAttention> attention_;
  std::unique_ptr<a2d::LayoutExchange> to_plan_, to_user_;
  bool backward_checked_ = false;  // the backward's memory check, made at its first call
};

// A prefill and its decode steps (inference.hpp) over a transport, on the CPU backend: the KV
// cache lives in the decoder; prefill() and step() read the caller's tensors in place.
class DecoderEngine {
 public:
  DecoderEngine(const a2d::Problem& problem, const a2d::Plan& plan, Transport& transport,
                int64_t capacity) {
    CallScope scope;
    session_ = engine_session(transport, "cpu", false);
    a2d::set_error_rank(rank());
    a2d::check_memory(session_->world(), a2d::decoder_memory_check(problem, plan, capacity));
    decoder_ = session_->decoder(problem, plan, capacity);
  }

  int rank() const { return session_->world().rank(); }
  int size() const { return session_->world().size(); }
  std::vector<int64_t> prompt_tokens(int part) const {
    return decoder_->prompt_layout().tokens_of(part);
  }
  // The next step of `tokens` tokens: {"first_position", "owners", "counts", "positions" (this
  // rank's)}.
  py::dict next_step(int64_t tokens) const {
    const a2d::DecodeStep step = decoder_->next_step(tokens);
    py::dict d;
    d["first_position"] = step.first_position;
    d["owners"] = step.owners;
    d["counts"] = step.counts;
    d["positions"] = step.positions_of(rank());
    return d;
  }

  void prefill(const py::tuple& q, const py::tuple& k, const py::tuple& v, const py::tuple& out,
               const py::tuple& lse, uintptr_t sinks) {
    Wrapped w(session_->backend());
    a2d::ForwardShards s;
    wrap_common(w, s, q, k, v, out, lse, sinks);
    CallScope scope;
    py::gil_scoped_release release;
    decoder_->prefill(s);
  }

  void step(int64_t tokens, const py::tuple& q, const py::tuple& k, const py::tuple& v,
            const py::tuple& out, const py::tuple& lse, uintptr_t sinks) {
    Wrapped w(session_->backend());
    a2d::DecodeShards s;
    // A rank that owns none of the step's tokens passes tensors of no tokens (whose strides
    // numpy may give as 0): the decoder reads none of them then.
    const HostTensor hq = host_tensor(q, 4, "q");
    if (hq.shape[1] > 0) wrap_common(w, s, q, k, v, out, lse, sinks);
    s.sinks = reinterpret_cast<const float*>(sinks);
    CallScope scope;
    py::gil_scoped_release release;
    decoder_->step(tokens, s);
  }

  int64_t sequence() const { return decoder_->sequence(); }
  std::vector<int64_t> counts() const { return decoder_->cached_counts(); }
  std::vector<int64_t> positions() const { return decoder_->positions(); }
  int64_t capacity() const { return decoder_->capacity(); }
  int64_t reallocations() const { return decoder_->reallocations(); }

 private:
  std::unique_ptr<a2d::Session> session_;
  std::unique_ptr<a2d::DistributedDecoder> decoder_;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "attention2d's compiled core (see the attention2d package)";
  m.attr("version") = A2D_VERSION_STRING;

  static py::exception<a2d::Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const a2d::CollectiveError& e) {
      PyErr_SetString(error.ptr(), e.brief().c_str());
    } catch (const a2d::Error& e) {
      PyErr_SetString(error.ptr(), e.message().c_str());
    }
  });

  py::class_<a2d::Problem>(m, "Problem")
      .def(py::init<>())
      .def_readwrite("batch", &a2d::Problem::batch)
      .def_readwrite("heads", &a2d::Problem::heads)
      .def_readwrite("kv_heads", &a2d::Problem::kv_heads)
      .def_readwrite("seq", &a2d::Problem::seq)
      .def_readwrite("head_dim", &a2d::Problem::head_dim)
      .def_readwrite("scale", &a2d::Problem::scale)
      .def_property(
          "causal",
          [](const a2d::Problem& p) {
            return p.mask.kind == a2d::MaskKind::causal ||
                   p.mask.kind == a2d::MaskKind::causal_window;
          },
          [](a2d::Problem& p, bool causal) {
            const auto documents = p.mask.doc_offsets;
            p.mask = causal ? (p.mask.window > 0 ? a2d::Mask::causal_window(p.mask.window)
                                                 : a2d::Mask::causal())
                            : a2d::Mask::none();
            p.mask.doc_offsets = documents;
          })
      .def_property(
          "window", [](const a2d::Problem& p) { return p.mask.window; },
          [](a2d::Problem& p, int64_t window) {
            A2D_REQUIRE(window >= 0, "window must be >= 0 (0: no window), got ", window);
            const bool causal =
                p.mask.kind == a2d::MaskKind::causal || p.mask.kind == a2d::MaskKind::causal_window;
            A2D_REQUIRE(window == 0 || causal,
                        "a window needs causal=True (the window is q - window < k <= q)");
            const auto documents = p.mask.doc_offsets;
            p.mask = window > 0 ? a2d::Mask::causal_window(window)
                                : (causal ? a2d::Mask::causal() : a2d::Mask::none());
            p.mask.doc_offsets = documents;
          })
      // Lengths of the packed documents ([] = one document, no document mask).
      .def_property(
          "documents",
          [](const a2d::Problem& p) {
            std::vector<int64_t> lengths;
            if (p.mask.doc_offsets) {
              const auto& offsets = *p.mask.doc_offsets;
              for (size_t d = 0; d + 1 < offsets.size(); ++d)
                lengths.push_back(offsets[d + 1] - offsets[d]);
            }
            return lengths;
          },
          [](a2d::Problem& p, const std::vector<int64_t>& lengths) {
            p.mask.doc_offsets.reset();
            if (!lengths.empty()) p.mask = p.mask.with_documents(lengths);
          })
      // The whole mask at once, through the library's one check of contradictions (make_mask),
      // in Python's words: window_size (left, right) or None, documents' lengths ([]: one),
      // ranges as (q0, q1, k0, k1, type) tuples or None.
      .def(
          "set_mask",
          [](a2d::Problem& p, bool causal, int64_t window,
             std::optional<std::pair<int64_t, int64_t>> window_size,
             const std::vector<int64_t>& documents,
             std::optional<std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int>>>
                 ranges) {
            a2d::MaskOptions o;
            o.causal = causal;
            o.window = window;
            o.window_size_given = window_size.has_value();
            if (window_size) {
              o.window_left = window_size->first;
              o.window_right = window_size->second;
            }
            o.causal_sets_right = true;  // flash-attn: causal makes the right side 0
            o.doc_lengths = documents;
            o.ranges_given = ranges.has_value();
            if (ranges) {
              for (const auto& [q0, q1, k0, k1, type] : *ranges)
                o.ranges.push_back({q0, q1, k0, k1, static_cast<a2d::RangeType>(type)});
            }
            o.causal_name = "causal=True";
            o.window_name = "window";
            o.window_size_name = "window_size";
            o.documents_name = "cu_seqlens";
            o.ranges_name = "mask";
            p.mask = a2d::make_mask(o);
          },
          py::arg("causal"), py::arg("window"), py::arg("window_size"), py::arg("documents"),
          py::arg("ranges"))
      .def_property_readonly("window_size",
                             [](const a2d::Problem& p) {
                               return py::make_tuple(p.mask.window_left(), p.mask.window_right());
                             })
      .def_property_readonly("mask", [](const a2d::Problem& p) { return p.mask.describe(); })
      // The document boundaries' and slices' hash (Mask::digest): with mask, a cache key.
      .def_property_readonly("mask_digest", [](const a2d::Problem& p) { return p.mask.digest(); })
      .def_readwrite("sinks", &a2d::Problem::sinks)
      .def_readwrite("softcap", &a2d::Problem::softcap)
      .def_property(
          "dtype", [](const a2d::Problem& p) { return std::string(a2d::dtype_name(p.dtype)); },
          [](a2d::Problem& p, const std::string& name) { p.dtype = a2d::parse_dtype(name); })
      .def("validate", &a2d::Problem::validate)
      .def("describe", &a2d::Problem::describe)
      .def("__repr__", &a2d::Problem::describe);

  py::class_<a2d::Plan>(m, "Plan")
      .def(py::init<>())
      .def_property(
          "algorithm", [](const a2d::Plan& p) { return a2d::algorithm_name(p.algorithm); },
          [](a2d::Plan& p, const std::string& name) { p.algorithm = a2d::parse_algorithm(name); })
      .def_property(
          "grid", [](const a2d::Plan& p) { return py::make_tuple(p.grid.rows, p.grid.cols); },
          [](a2d::Plan& p, std::pair<int, int> g) {
            p.grid = {g.first, g.second};
          })
      .def_property(
          "layout", [](const a2d::Plan& p) { return a2d::layout_name(p.layout); },
          [](a2d::Plan& p, const std::string& name) { p.layout = a2d::parse_layout(name); })
      .def_readwrite("stripe", &a2d::Plan::stripe)
      .def_readwrite("kv_transpose", &a2d::Plan::kv_transpose)
      .def_readwrite("heads_parallel", &a2d::Plan::heads_parallel)
      .def_readwrite("threads", &a2d::Plan::threads)
      .def("describe", &a2d::Plan::describe)
      .def("__repr__", &a2d::Plan::describe);

  m.def("default_plan", [](const std::string& algo, const a2d::Problem& problem, int ranks) {
    return a2d::default_plan(a2d::parse_algorithm(algo), problem, ranks);
  });
  m.def("check_plan", &a2d::check_plan);
  // Every algorithm's name, in the table's order (src/table/): the tests' lists read it.
  m.def("algorithm_names", &a2d::algorithm_names);
  // The mask specification parser the command line uses (--mask-ranges): slices as (q0, q1, k0,
  // k1, type) tuples from a generator (prefix-lm:P, block-causal:B, random:S[:SEED]) or a file.
  m.def("parse_mask_ranges", [](const std::string& text, int64_t seq) {
    std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int>> out;
    for (const a2d::MaskSlice& s : a2d::parse_mask_ranges(text, seq))
      out.emplace_back(s.q0, s.q1, s.k0, s.k1, static_cast<int>(s.type));
    return out;
  });
  m.def("parse_range_type",
        [](const std::string& name) { return static_cast<int>(a2d::parse_range_type(name)); });
  m.def("check_grid",
        [](const std::string& grid, int ranks) { a2d::check_grid(a2d::parse_grid(grid), ranks); });
  m.def("default_calibration_file", &a2d::default_calibration_file);
  // The planner of `a2d plan` / `a2d run`: (plan, prediction, machine description).
  // shards_kind / shard_counts: the caller's layout ("" = the plan's own), which the model charges
  // the exchanges to and from.
  m.def("choose_plan",
        [](const a2d::Problem& problem, int ranks, int ranks_per_node, const std::string& machine,
           const std::string& calibration, const std::string& machine_file, const std::string& algo,
           const std::string& grid, int heads_parallel, const std::string& shards_kind,
           const std::vector<int64_t>& shard_counts) {
          const a2d::MachineChoice choice{machine, calibration, machine_file};
          const auto shards = user_shards(shards_kind, shard_counts, problem.seq, ranks);
          const auto planned = a2d::choose_plan(problem, ranks, ranks_per_node, choice, algo, grid,
                                                heads_parallel, shards ? &*shards : nullptr);
          return py::make_tuple(planned.plan, prediction_dict(planned.prediction),
                                planned.machine_description);
        });
  // Every plan the model ranks, fastest first: [(plan, prediction)], and the skipped ones.
  m.def("search_plans",
        [](const a2d::Problem& problem, int ranks, int ranks_per_node, const std::string& machine,
           const std::string& calibration, const std::string& machine_file,
           const std::string& shards_kind, const std::vector<int64_t>& shard_counts) {
          const a2d::MachineChoice choice{machine, calibration, machine_file};
          const a2d::Machine chosen = choice.machine(ranks, problem.dtype);
          const auto shards = user_shards(shards_kind, shard_counts, problem.seq, ranks);
          const a2d::PlanSearch search = a2d::search_plans(
              problem, ranks, chosen, ranks_per_node, true, false, shards ? &*shards : nullptr);
          py::list ranked;
          for (const a2d::RankedPlan& r : search.ranked) {
            ranked.append(py::make_tuple(r.plan, prediction_dict(r.prediction)));
          }
          return py::make_tuple(ranked, search.skipped, chosen.name + ": " + chosen.description);
        });
  m.def("predict", [](const a2d::Problem& problem, const a2d::Plan& plan, int ranks_per_node,
                      const std::string& machine, const std::string& calibration,
                      const std::string& machine_file) {
    const a2d::MachineChoice choice{machine, calibration, machine_file};
    const a2d::Machine chosen = choice.machine(plan.ranks(), problem.dtype);
    return prediction_dict(a2d::predict(problem, plan, chosen, ranks_per_node));
  });
  m.def("layout_tokens", [](const a2d::Problem& problem, const a2d::Plan& plan, int ranks) {
    const a2d::TokenLayout layout(plan.layout, problem.seq, ranks, plan.stripe);
    std::vector<std::vector<int64_t>> parts;
    for (int part = 0; part < ranks; ++part)
      parts.push_back(layout.tokens_of(part));
    return parts;
  });
  // The bounds every distributed output meets against the fp64 reference on the rounded inputs
  // (relative Frobenius errors; harness.hpp): the tests use them.
  m.def("output_bounds", [](const std::string& dtype) {
    const a2d::OutputBounds b = a2d::output_bounds(a2d::parse_dtype(dtype));
    py::dict d;
    d["out"] = b.out;
    d["lse"] = b.lse;
    d["dq"] = b.dq;
    d["dk"] = b.dk;
    d["dv"] = b.dv;
    return d;
  });
  m.def("stop_watchdog", [] { g_watchdog.reset(); });

  // Decode (inference.hpp): the bytes rank `rank` sends in a step whose new tokens are owned
  // `counts` per rank, and the cost model's prediction of a step at a cache length.
  m.def("decode_step_traffic",
        [](const a2d::Problem& problem, const std::vector<int64_t>& counts, int rank) {
          const a2d::DecodeTraffic t = a2d::decode_step_traffic(problem, counts, rank);
          py::dict d;
          d["q_allgather_bytes"] = t.q_allgather.bytes;
          d["merge_bytes"] = t.merge.bytes;
          d["bytes"] = t.total().bytes;
          d["messages"] = t.total().messages;
          return d;
        });
  m.def("predict_decode_step",
        [](const a2d::Problem& problem, const a2d::Plan& plan, int ranks_per_node,
           const std::string& machine, const std::string& calibration,
           const std::string& machine_file, int64_t cached_tokens, int64_t tokens_per_step) {
          const a2d::MachineChoice choice{machine, calibration, machine_file};
          const a2d::Machine chosen = choice.machine(plan.grid.size(), problem.dtype);
          const a2d::DecodePrediction p = a2d::predict_decode_step(
              problem, plan, chosen, ranks_per_node, cached_tokens, tokens_per_step);
          py::dict d;
          d["step_s"] = p.step_s;
          d["kernel_s"] = p.kernel_s;
          d["comm_s"] = p.comm_s;
          d["bytes"] = p.traffic.bytes;
          d["messages"] = p.traffic.messages;
          d["cache_tokens"] = p.cache_tokens;
          d["cache_bytes"] = p.cache_bytes;
          return d;
        });
  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport")
      .def_static("mpi", &Transport::mpi,
                  "over an MPI communicator (a duplicate of it), from mpi4py's MPI._handleof(comm)")
      .def_static("group", &Transport::group,
                  "over the caller's process group: the capsule of attention2d._c10d.group_ops")
      .def_static("gloo", &Transport::gloo,
                  "collective: a full mesh of Gloo TCP connections among `size` ranks; "
                  "exchange(bytes) -> [every rank's bytes] carries the addresses once")
      .def_static("local", &Transport::local, "this process alone")
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size)
      .def_property_readonly("kind", &Transport::kind)
      .def("allgather", &Transport::allgather)
      .def("start_watchdog", &Transport::start_watchdog, py::arg("timeout"),
           py::arg("idle_limit") = a2d::Watchdog::kDefaultIdleLimit,
           "collective: a watchdog over these ranks that aborts the job when a rank inside the "
           "library waited `timeout` seconds with no rank progressing (a rank alive outside the "
           "library is waited for up to `idle_limit` seconds)");
  m.def("gloo_built", &a2d::gloo_built);
  m.def("mpi_built", [] {
#ifdef A2D_WITH_MPI
    return true;
#else
    return false;
#endif
  });
  m.attr("group_ops_abi") = A2D_GROUP_OPS_ABI;
  // Every rank's global token indices (increasing) in a layout the caller brings.
  m.def("user_layout_tokens", [](const std::string& kind, int64_t seq, int ranks) {
    const a2d::TokenLayout layout(a2d::parse_layout(kind), seq, ranks);
    std::vector<std::vector<int64_t>> parts;
    for (int part = 0; part < ranks; ++part)
      parts.push_back(layout.tokens_of(part));
    return parts;
  });

  py::class_<DecoderEngine>(m, "DecoderEngine")
      .def(py::init<const a2d::Problem&, const a2d::Plan&, Transport&, int64_t>())
      .def_property_readonly("rank", &DecoderEngine::rank)
      .def_property_readonly("size", &DecoderEngine::size)
      .def_property_readonly("sequence", &DecoderEngine::sequence)
      .def_property_readonly("capacity", &DecoderEngine::capacity)
      .def_property_readonly("reallocations", &DecoderEngine::reallocations)
      .def("counts", &DecoderEngine::counts)
      .def("positions", &DecoderEngine::positions)
      .def("prompt_tokens", &DecoderEngine::prompt_tokens)
      .def("next_step", &DecoderEngine::next_step)
      .def("prefill", &DecoderEngine::prefill)
      .def("step", &DecoderEngine::step);

  py::class_<Engine>(m, "Engine")
      .def(py::init<const a2d::Problem&, const a2d::Plan&, Transport&, const std::string&, bool>(),
           py::arg("problem"), py::arg("plan"), py::arg("transport"), py::arg("device") = "cpu",
           py::arg("nccl") = false)
      .def(py::init<const a2d::Problem&, const a2d::Plan&, Transport&, const std::string&,
                    const std::vector<int64_t>&, const std::string&, bool>(),
           py::arg("problem"), py::arg("plan"), py::arg("transport"), py::arg("kind"),
           py::arg("counts"), py::arg("device") = "cpu", py::arg("nccl") = false)
      .def_property_readonly("exchanges", &Engine::exchanges)
      .def_property_readonly("plan_tokens", &Engine::plan_tokens)
      .def_property_readonly("device", &Engine::device)
      .def("exchange_in", &Engine::exchange_in, py::arg("tokens"), py::arg("rows"),
           py::arg("backward"), py::arg("stream") = 0)
      .def("exchange_out", &Engine::exchange_out, py::arg("tokens"), py::arg("rows"),
           py::arg("backward"), py::arg("stream") = 0)
      .def_property_readonly("problem", &Engine::problem)
      .def_property_readonly("plan", &Engine::plan)
      .def_property_readonly("rank", &Engine::rank)
      .def_property_readonly("size", &Engine::size)
      .def("tokens", &Engine::tokens)
      .def("forward", &Engine::forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
           py::arg("lse"), py::arg("sinks"), py::arg("stream") = 0)
      .def("backward", &Engine::backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
           py::arg("d_out"), py::arg("lse"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
           py::arg("sinks"), py::arg("dsink"), py::arg("stream") = 0);
}
