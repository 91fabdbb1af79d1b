// attention2d._core's transports, internal to python/src (module.cpp includes it): tensors as
// (address, dtype, shape, strides) tuples wrapped without copies, predictions as dicts, the call
// scope and Ctrl-C, and the ranks the engines run over (Transport: MPI, a Gloo mesh, or torch's
// process group through c10d).
#pragma once

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

namespace a2d::pymodule {

namespace py = pybind11;

#ifdef A2D_WITH_MPI
// An MPI communicator from mpi4py's handle (MPI._handleof(comm): the MPI_Comm's value as an
// integer), so that building needs no mpi4py (the [mpi] extra brings it at run time).
template <class Handle>
inline Handle handle_from(uintptr_t value) {
  if constexpr (std::is_pointer_v<Handle>) {
    return reinterpret_cast<Handle>(value);  // Open MPI: a pointer
  } else {
    return static_cast<Handle>(value);  // MPICH: an integer
  }
}
inline MPI_Comm mpi_comm_of(uintptr_t handle) {
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

inline HostTensor host_tensor(const py::tuple& t, size_t rank, const char* name) {
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
inline int64_t extent_bytes(const HostTensor& h) {
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
inline void wrap_common(Wrapped& w, Shards& s, const py::tuple& q, const py::tuple& k,
                        const py::tuple& v, const py::tuple& out, const py::tuple& lse,
                        uintptr_t sinks) {
  s.q = w.token(host_tensor(q, 4, "q"));
  s.k = w.token(host_tensor(k, 4, "k"));
  s.v = w.token(host_tensor(v, 4, "v"));
  s.out = w.token(host_tensor(out, 4, "out"));
  s.lse = w.row(host_tensor(lse, 3, "lse"));
  s.sinks = reinterpret_cast<const float*>(sinks);
}

// The caller's layout from its name and (for contiguous) every rank's token count: the shards
// attention(layout=...) receives. `slots` (empty: the identity): engine rank e holds the caller's
// shard slots[e], which the caller numbers in its own order (torch's ranks of a DeviceMesh laid
// out as a grid: python/attention2d/_channel.py) and `counts` lists in that order.
inline a2d::TokenLayout caller_layout(const std::string& kind, const std::vector<int64_t>& counts,
                                      int64_t seq, int ranks,
                                      const std::vector<int64_t>& slots = {}) {
  a2d::TokenLayout layout = kind == "contiguous" && !counts.empty()
                                ? a2d::TokenLayout::contiguous_counts(counts)
                                : a2d::TokenLayout(a2d::parse_layout(kind), seq, ranks);
  return slots.empty() ? layout : layout.permuted(slots);
}

// The cost model's view of the caller's shards ("" = in the plan's own layout: none). The Python
// layer's backward moves only dO in and dQ, dK, dV out (relayout.hpp: saved).
inline std::optional<a2d::UserShards> user_shards(const std::string& kind,
                                                  const std::vector<int64_t>& counts, int64_t seq,
                                                  int ranks,
                                                  const std::vector<int64_t>& slots = {}) {
  if (kind.empty()) return std::nullopt;
  return a2d::UserShards{caller_layout(kind, counts, seq, ranks, slots),
                         a2d::RelayoutBackward::saved};
}

inline py::dict prediction_dict(const a2d::Prediction& p) {
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
inline bool take_python_sigint() {
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

}  // namespace a2d::pymodule
