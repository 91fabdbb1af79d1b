"""Tensors crossing into the engine: the inputs' checks (devices, dtypes, shapes; before any data
moves), views the engine reads or writes in place, allocation and torch's current stream."""

import numpy as np

from ._channel import torch
from ._planning import _dtype_name


def _is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def _describe_dtype(x):
    return str(x.dtype).replace("torch.", "")


def _engine_ready(x):
    """x itself where the engine can read it in place (the last dimension dense, strides >= 0),
    else a contiguous copy."""
    if _is_torch(x):
        if (x.dim() >= 1 and (x.stride(-1) == 1 or x.shape[-1] <= 1)
                and all(s >= 0 for s in x.stride())):
            return x
        return x.contiguous()
    x = np.asarray(x)
    item = x.itemsize
    if (x.ndim >= 1 and (x.strides[-1] == item or x.shape[-1] <= 1)
            and all(s >= 0 and s % item == 0 for s in x.strides)):
        return x
    return np.ascontiguousarray(x)


def _view(x):
    """(address, dtype, shape, strides in elements) of a tensor the engine reads or writes."""
    if _is_torch(x):
        return (x.data_ptr(), _dtype_name(x.dtype), list(x.shape), list(x.stride()))
    return (x.ctypes.data, _dtype_name(x.dtype), list(x.shape),
            [s // x.itemsize for s in x.strides])


_TORCH_DTYPES = ("float32", "bfloat16", "float16")
_CUDA_DTYPES = ("bfloat16", "float16")  # the CUDA kernels are tensor-core kernels
_NUMPY_DTYPES = ("float32", "float16")  # numpy has no bfloat16


def _current_cuda_device():
    return torch.cuda.current_device()


def _device_text(x):
    """The device a tensor's call runs on: "cpu" (numpy, CPU torch tensors) or "cuda:N"."""
    if _is_torch(x) and x.device.type == "cuda":
        return "cuda:%d" % (x.device.index if x.device.index is not None
                            else _current_cuda_device())
    return "cpu"


def _check_devices(tensors, cuda):
    """Where named torch tensors live, as an error text ("" if the call can run them): one device
    for all, CPU or (with `cuda`) the rank's current CUDA device, in a layout the kernels read
    (the last dimension dense). Checked before any data moves."""
    devices = [(name, x.device) for name, x in tensors if _is_torch(x)]
    if not devices:
        return ""
    kinds = {str(d) for _, d in devices}
    if len(kinds) > 1:
        return "%s must be on one device, got %s" % (
            ", ".join(n for n, _ in devices), ", ".join("%s on %s" % (n, d) for n, d in devices))
    name, device = devices[0]
    if device.type == "cpu":
        return ""
    if device.type != "cuda":
        return ("%s is on device %s: attention2d runs CPU and CUDA tensors" % (name, device))
    if not cuda:
        return ("%s is on device %s: this entry runs CPU tensors only (attention2d.Decoder's CUDA "
                "path is not built yet)" % (name, device))
    current = _current_cuda_device()
    if device.index is not None and device.index != current:
        return ("%s is on %s, but this rank's current CUDA device is cuda:%d: attention2d runs "
                "each rank on its current device (torch.cuda.set_device(local_rank) before the "
                "call, or move the tensors there)" % (name, device, current))
    for tensor_name, x in tensors:
        if x.dim() >= 1 and x.shape[-1] > 1 and x.stride(-1) != 1:
            return ("%s (CUDA) has stride %d in its last dimension: the CUDA kernels read rows of "
                    "head_dim contiguous elements; pass %s.contiguous() (no copy is made "
                    "silently on the GPU)" % (tensor_name, x.stride(-1), tensor_name))
    return ""


def _check_inputs(q, k, v, dims=(4,), cuda=False):
    """This rank's problem with its inputs, as an error text ("" if they are fine). cuda: whether
    the entry runs torch CUDA tensors (attention(); attention2d.Decoder does not yet)."""
    tensors = (("q", q), ("k", k), ("v", v))
    kinds = {_is_torch(x) for _, x in tensors}
    if len(kinds) != 1:
        return "q, k and v must all be torch tensors or all numpy arrays"
    placement = _check_devices(tensors, cuda) if _is_torch(q) else ""
    if placement:
        return placement
    for name, x in tensors:
        if _is_torch(x):
            allowed = _CUDA_DTYPES if x.device.type == "cuda" else _TORCH_DTYPES
        else:
            if not isinstance(x, np.ndarray):
                return "%s must be a torch tensor or a numpy array, got %s" % (name, type(x))
            allowed = _NUMPY_DTYPES
        if _describe_dtype(x) not in allowed:
            return "%s has dtype %s; supported%s: %s" % (
                name, _describe_dtype(x), " on CUDA (tensor-core kernels)"
                if allowed is _CUDA_DTYPES else "", ", ".join(allowed))
        if len(x.shape) not in dims:
            return ("%s must have 4 dimensions [batch, local tokens, heads, head_dim]%s, got "
                    "shape %s" % (name, " or 3 [local tokens, heads, head_dim]"
                                  if 3 in dims else "", list(x.shape)))
    if len({len(x.shape) for _, x in tensors}) != 1:
        return "q, k and v must have the same number of dimensions, got %s, %s and %s" % (
            list(q.shape), list(k.shape), list(v.shape))
    if not (_describe_dtype(q) == _describe_dtype(k) == _describe_dtype(v)):
        return "q, k and v must have one dtype, got %s, %s and %s" % (
            _describe_dtype(q), _describe_dtype(k), _describe_dtype(v))
    if len(q.shape) == 3:
        return _check_inputs(q[None], k[None], v[None], cuda=cuda)
    b, n, h, d = q.shape
    if tuple(k.shape) != tuple(v.shape):
        return "k and v must have the same shape, got %s and %s" % (list(k.shape), list(v.shape))
    if k.shape[0] != b or k.shape[1] != n or k.shape[3] != d:
        return ("k and v must be [batch, local tokens, kv_heads, head_dim] with q's batch (%d), "
                "local tokens (%d) and head_dim (%d); got %s" % (b, n, d, list(k.shape)))
    hk = k.shape[2]
    if hk < 1 or h % hk:
        return "q's heads (%d) must be a multiple of k's and v's heads (%d)" % (h, hk)
    return ""


def _torch_empty(shape, dtype, device=None):
    """A tensor from torch's allocator (on a CUDA device: its caching allocator, on the current
    stream, which the engine's work is ordered against: _stream_of)."""
    return torch.empty(tuple(shape), dtype=getattr(torch, dtype) if isinstance(dtype, str)
                       else dtype, device=device)


def _torch_empty_on(device):
    return lambda shape, dtype: _torch_empty(shape, dtype, device)


def _stream_of(x):
    """torch's current stream on a CUDA tensor's device as a cudaStream_t (0 for CPU tensors):
    the engine's work waits for what was queued on it and it waits for the engine's (events; no
    host or device-wide synchronisation)."""
    if _is_torch(x) and x.device.type == "cuda":
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    return 0


def _numpy_empty(shape, dtype):
    return np.empty(tuple(shape), dtype=dtype)
