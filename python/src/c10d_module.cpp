// attention2d._c10d: the caller's torch process group as the engine's transport.
//
// A torch C++ extension, built against the installed torch (its headers, its pybind11, its
// libraries; python/CMakeLists.txt): group_ops(group) fills the plain C table of
// attention2d/group_comm.hpp with the group's own operations (c10d's send, recv, alltoall_base,
// _allgather_base, allreduce, broadcast, barrier) and returns it in a capsule that
// attention2d._core turns into a Communicator. The table is all this module shares with _core,
// so that torch's C++ ABI stays on this side.
//
// Memory crosses as tensors over the caller's memory (at::from_blob: no copy) on the group's
// device: CPU memory for a Gloo group; an NCCL group needs the device's memory (the CUDA backend,
// not wired to Python yet), so CPU memory with an NCCL group is refused by NCCL itself.
#include <ATen/ATen.h>
#include <Python.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attention2d/group_ops.h"

namespace py = pybind11;

namespace {

constexpr const char* kCapsuleName = "attention2d.group_ops";

struct Work;

// Works waited for are kept, the last kRetired of a group, before they are freed (Handle::retire).
constexpr size_t kRetired = 8;

struct Handle {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  c10::Device device = c10::Device(c10::kCPU);
  std::mutex retired_mutex;
  std::deque<std::unique_ptr<Work>> retired;  // freed before the group (declared after it)

  // Takes a work that was waited for, and frees the oldest of those kept. A gloo send or receive
  // work owns Gloo's buffer, whose destructor yields in a loop until Gloo's I/O thread lets go of
  // it; the I/O thread signals the completion from inside its read or write, still holding the
  // buffer, so a work freed right after its wait made the waiting thread, which the signal had
  // just woken (and which had often preempted the I/O thread on its core), spin against it: a
  // small call took milliseconds (docs/backends.md, "Small calls over Gloo"). kRetired waits
  // later the I/O thread is long done with it.
  void retire(Work* work);
};

struct Work {
  c10::intrusive_ptr<c10d::Work> work;
  // Tensors the work uses: views of the caller's memory (not owned), alive with the work.
  std::vector<at::Tensor> tensors;
  Handle* handle = nullptr;  // its group's
};

void Handle::retire(Work* work) {
  std::unique_ptr<Work> oldest;
  std::lock_guard<std::mutex> lock(retired_mutex);
  retired.emplace_back(work);
  if (retired.size() > kRetired) {
    oldest = std::move(retired.front());
    retired.pop_front();
  }
}

void write_error(char* error, int64_t bytes, const char* text) {
  if (error == nullptr || bytes <= 0) return;
  std::snprintf(error, static_cast<size_t>(bytes), "%s", text);
}

// The first line of torch's message (the rest is its C++ stack).
std::string brief(const std::exception& e) {
  std::string text = e.what();
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

at::Tensor bytes_at(const Handle& h, const void* data, int64_t bytes) {
  return at::from_blob(const_cast<void*>(data), {bytes},
                       at::TensorOptions().dtype(at::kByte).device(h.device));
}

// Releases the GIL where the calling thread holds it, for the length of a table entry: the
// group's worker threads take the GIL (freeing a finished work's tensors that Python made, such
// as all_gather_object's) while holding the group's queue lock, which enqueueing takes too.
class WithoutGil {
 public:
  WithoutGil() : state_(PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~WithoutGil() {
    if (state_) PyEval_RestoreThread(state_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* state_;
};

// Runs `post` (which returns a work and may throw) as a table entry of `group`.
template <typename Post>
void* guarded(void* group, char* error, int64_t error_bytes, Post post) {
  WithoutGil unlocked;
  try {
    auto* w = new Work();
    w->handle = static_cast<Handle*>(group);
    try {
      post(*w);
    } catch (...) {
      delete w;
      throw;
    }
    return w;
  } catch (const std::exception& e) {
    write_error(error, error_bytes, brief(e).c_str());
  } catch (...) {
    write_error(error, error_bytes, "unknown error");
  }
  return nullptr;
}

Handle& handle_of(void* group) {
  return *static_cast<Handle*>(group);
}

extern "C" {

void* op_send(void* group, const void* data, int64_t bytes, int32_t peer, int32_t tag, char* error,
              int64_t error_bytes) {
  return guarded(group, error, error_bytes, [&](Work& w) {
    Handle& h = handle_of(group);
    w.tensors = {bytes_at(h, data, bytes)};
    w.work = h.group->send(w.tensors, peer, tag);
  });
}

void* op_recv(void* group, void* data, int64_t bytes, int32_t peer, int32_t tag, char* error,
              int64_t error_bytes) {
  return guarded(group, error, error_bytes, [&](Work& w) {
    Handle& h = handle_of(group);
    w.tensors = {bytes_at(h, data, bytes)};
    w.work = h.group->recv(w.tensors, peer, tag);
  });
}

void* op_all_to_all(void* group, const void* send, const int64_t* send_bytes, void* recv,
                    const int64_t* recv_bytes, char* error, int64_t error_bytes) {
  return guarded(group, error, error_bytes, [&](Work& w) {
    Handle& h = handle_of(group);
    const auto size = static_cast<size_t>(h.group->getSize());
    std::vector<int64_t> in(send_bytes, send_bytes + size), out(recv_bytes, recv_bytes + size);
    int64_t in_total = 0, out_total = 0;
    for (size_t i = 0; i < size; ++i) {
      in_total += in[i];
      out_total += out[i];
    }
    // A rank with nothing to send or receive still takes part (its pointer may be null).
    static char nothing = 0;
    w.tensors = {bytes_at(h, in_total ? send : &nothing, in_total),
                 bytes_at(h, out_total ? recv : &nothing, out_total)};
    w.work = h.group->alltoall_base(w.tensors[1], w.tensors[0], out, in);
  });
}

void* op_all_gather(void* group, const void* send, void* recv, int64_t bytes, char* error,
                    int64_t error_bytes) {
  return guarded(group, error, error_bytes, [&](Work& w) {
    Handle& h = handle_of(group);
    w.tensors = {bytes_at(h, send, bytes), bytes_at(h, recv, bytes * h.group->getSize())};
    w.work = h.group->_allgather_base(w.tensors[1], w.tensors[0]);
  });
}

void* op_all_reduce(void* group, void* data, int64_t count, int32_t element, int32_t maximum,
                    char* error, int64_t error_bytes) {
  return guarded(group, error, error_bytes, [&](Work& w) {
    Handle& h = handle_of(group);
    const auto type = element == 0 ? at::kFloat : element == 1 ? at::kDouble : at::kLong;
    w.tensors = {at::from_blob(data, {count}, at::TensorOptions().dtype(type).device(h.device))};
    c10d::AllreduceOptions options;
    options.reduceOp = maximum ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    w.work = h.group->allreduce(w.tensors, options);
  });
}

void* op_broadcast(void* group, void* data, int64_t bytes, int32_t root, char* error,
                   int64_t error_bytes) {
  return guarded(group, error, error_bytes, [&](Work& w) {
    Handle& h = handle_of(group);
    w.tensors = {bytes_at(h, data, bytes)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    w.work = h.group->broadcast(w.tensors, options);
  });
}

void* op_barrier(void* group, char* error, int64_t error_bytes) {
  return guarded(group, error, error_bytes, [&](Work& w) {
    Handle& h = handle_of(group);
    c10d::BarrierOptions options;
    if (h.device.is_cuda()) options.device = h.device;
    w.work = h.group->barrier(options);
  });
}

int32_t op_wait(void* work, char* error, int64_t error_bytes) {
  WithoutGil unlocked;
  auto* w = static_cast<Work*>(work);
  int32_t result = 0;
  try {
    if (w->work) w->work->wait();
  } catch (const std::exception& e) {
    write_error(error, error_bytes, brief(e).c_str());
    result = -1;
  } catch (...) {
    write_error(error, error_bytes, "unknown error");
    result = -1;
  }
  w->handle->retire(w);
  return result;
}

void op_release(void* group) {
  WithoutGil unlocked;
  delete static_cast<Handle*>(group);
}

}  // extern "C"

void free_capsule(PyObject* capsule) {
  // A table _core took (it renames the capsule) is _core's to release.
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* ops = static_cast<A2dGroupOps*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (ops) {
    op_release(ops->group);
    delete ops;
  }
}

// The table of `group` (a torch.distributed ProcessGroup), in a capsule. device: "cpu" for a Gloo
// group's host memory, "cuda:N" for an NCCL group's device memory.
py::object group_ops(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                     const std::string& device) {
  auto* ops = new A2dGroupOps{};
  ops->abi = A2D_GROUP_OPS_ABI;
  ops->group = new Handle{group, c10::Device(device)};
  ops->rank = group->getRank();
  ops->size = group->getSize();
  // The backend that carries this device's tensors ("gloo" for the CPU part of torch 2's
  // "cpu:gloo,cuda:nccl" group), not the group's compound name: group_comm.cpp decides by it.
  std::snprintf(ops->backend, sizeof ops->backend, "%s",
                group->getBackend(c10::Device(device).type())->getBackendName().c_str());
  ops->send = op_send;
  ops->recv = op_recv;
  ops->all_to_all = op_all_to_all;
  ops->all_gather = op_all_gather;
  ops->all_reduce = op_all_reduce;
  ops->broadcast = op_broadcast;
  ops->barrier = op_barrier;
  ops->wait = op_wait;
  ops->release = op_release;
  PyObject* capsule = PyCapsule_New(ops, kCapsuleName, free_capsule);
  if (capsule == nullptr) {
    op_release(ops->group);
    delete ops;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

}  // namespace

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "attention2d's transport over the caller's torch process group (see group_comm.hpp)";
  m.attr("torch_version") = TORCH_VERSION;
  m.attr("abi") = A2D_GROUP_OPS_ABI;
  m.def("group_ops", &group_ops, py::arg("group"), py::arg("device") = "cpu",
        "the plain C table of the group's operations, in a capsule for attention2d._core");
}
