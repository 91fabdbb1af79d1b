"""CUDA tensors from PyTorch (docs/gpu.md, "CUDA tensors from PyTorch"), without a GPU.

Two kinds of test: (1) the pointer, stream and refusal logic of attention2d._tensors on stand-in
tensors that say they are on a CUDA device (torch.device("cuda", N) needs no GPU; the current
device and stream come from monkeypatched torch.cuda functions); (2) the whole path a CUDA tensor
takes through the engine (the caller's memory wrapped as device buffers, no host access, torch
allocating every output, the CUDA kernels' rules) on the fenced-cuda backend, which stands in for
the GPU: CPU tensors run as if they were CUDA tensors (_engine_cache._CPU_STAND_IN), forward and backward
against the fp64 reference at the 16-bit bounds. What only a GPU shows (the kernels' numbers,
the events on real streams, NCCL) is scripts/gpu_run.sh's Python section."""

import pytest
import torch

import attention2d
from attention2d import _engine_cache, _tensors
from conftest import COMM, assert_all_ranks, full_inputs, global_max, reference


class StandIn:
    """What _tensors reads of a torch tensor (device, dtype, shape, strides, data_ptr), claiming a
    CUDA device: enough for the pointer, stream and refusal logic."""

    def __init__(self, device, dtype=torch.bfloat16, shape=(1, 8, 4, 64), stride=None,
                 address=0x7F0000001000):
        self.device = torch.device(device)
        self.dtype = dtype
        self.shape = torch.Size(shape)
        self._stride = stride
        self.address = address

    def dim(self):
        return len(self.shape)

    def stride(self, dim=None):
        strides = self._stride
        if strides is None:
            strides, step = [], 1
            for size in reversed(self.shape):
                strides.insert(0, step)
                step *= size
        return tuple(strides) if dim is None else strides[dim]

    def data_ptr(self):
        return self.address


@pytest.fixture
def gpu(monkeypatch):
    """Stand-ins count as torch tensors; this rank's current CUDA device is cuda:0 and torch's
    current stream there has handle 0xabc0."""
    real = _tensors._is_torch
    monkeypatch.setattr(_tensors, "_is_torch", lambda x: isinstance(x, StandIn) or real(x))
    monkeypatch.setattr(_tensors, "_current_cuda_device", lambda: 0)

    class Stream:
        cuda_stream = 0xABC0

    asked = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: asked.append(device) or Stream())
    return asked


def test_cuda_inputs_are_accepted_and_read_in_place(gpu):
    q = StandIn("cuda:0")
    k = StandIn("cuda:0", shape=(1, 8, 2, 64), address=0x7F0000100000)
    assert _tensors._check_inputs(q, k, k, cuda=True) == ""
    # The device pointer itself, no copy: the engine wraps the tensor's memory.
    assert _tensors._view(k) == (0x7F0000100000, "bf16", [1, 8, 2, 64], [1024, 128, 64, 1])
    assert _tensors._device_text(q) == "cuda:0"
    assert _tensors._device_text(StandIn("cuda")) == "cuda:0"  # no index: the current device
    assert _engine_cache._engine_device("cuda:0") == ("cuda:0", True)
    assert _engine_cache._engine_device("cpu") == ("cpu", False)


def test_the_call_runs_on_torchs_current_stream_of_the_tensors_device(gpu):
    assert _tensors._stream_of(StandIn("cuda:0")) == 0xABC0
    assert gpu == [torch.device("cuda:0")]
    assert _tensors._stream_of(torch.zeros(1)) == 0  # CPU tensors: no stream


@pytest.mark.parametrize("case, words", [
    ((StandIn("cuda:0"), StandIn("cpu"), StandIn("cuda:0")), "must be on one device"),
    ((StandIn("cuda:0"), StandIn("cuda:1"), StandIn("cuda:1")), "must be on one device"),
    ((StandIn("cuda:1"),) * 3, "current CUDA device is cuda:0"),
    ((StandIn("meta"),) * 3, "runs CPU and CUDA tensors"),
    ((StandIn("cuda:0", dtype=torch.float32),) * 3, "supported on CUDA (tensor-core kernels)"),
    ((StandIn("cuda:0", stride=(1024, 128, 1, 4)),) * 3, "contiguous elements"),
])
def test_refusals_before_any_data_moves(gpu, case, words):
    assert words in _tensors._check_inputs(*case, cuda=True)


def test_the_decoder_still_refuses_cuda_tensors(gpu):
    assert "CPU tensors only" in _tensors._check_inputs(*(StandIn("cuda:0"),) * 3)


def test_attention_refuses_on_every_rank(gpu):
    """A refusal is collective: raised on every rank, before the engine is made."""
    made = attention2d.cache_info()["made"]
    bad = StandIn("cuda:1") if COMM.Get_rank() == COMM.Get_size() - 1 else StandIn("cuda:0")
    with pytest.raises(attention2d.Error):
        attention2d.attention(bad, bad, bad, layout="contiguous")
    assert attention2d.cache_info()["made"] == made


@pytest.fixture
def fenced_cuda(monkeypatch):
    monkeypatch.setattr(_engine_cache, "_CPU_STAND_IN", "fenced-cuda")
    yield
    attention2d.clear_cache()


@pytest.mark.parametrize("dtype, causal, layout", [
    (torch.bfloat16, True, "zigzag"), (torch.float16, False, "contiguous")])
def test_forward_and_backward_on_the_device_path(fenced_cuda, dtype, causal, layout):
    """Odd N, GQA 12:4, D = 80 through the engine on fenced-cuda: every tensor the engine touches
    is the caller's memory wrapped as device buffers (the host may not read them), outputs come
    from torch, the CUDA kernels' rules apply. O, LSE, dQ, dK, dV against fp64 at the 16-bit
    bounds (docs/gpu.md, "Accuracy bounds", with the CPU kernels' rounding)."""
    q, k, v, d_out = full_inputs(52, 1, 333, 12, 4, 80, dtype)
    lay = layout if COMM.Get_size() > 1 else "contiguous"
    shards = [attention2d.shard(x.to(dtype), lay).requires_grad_() for x in (q, k, v)]
    out, lse = attention2d.attention(*shards, causal=causal, layout=lay, return_lse=True)
    assert out.dtype == dtype and out.device.type == "cpu"
    (out * attention2d.shard(d_out.to(dtype), lay)).sum().backward()
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = reference(q, k, v, d_out, causal, out_dtype=dtype)
    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    errors = {
        "out": (attention2d.unshard(out.detach(), lay), ref_out, 2 * u + 1e-5),
        "lse": (attention2d.unshard(lse.detach(), lay, dim=2), ref_lse, 1e-5),
        "dq": (attention2d.unshard(shards[0].grad, lay), ref_dq, 4 * u),
        "dk": (attention2d.unshard(shards[1].grad, lay), ref_dk, 4 * u),
        "dv": (attention2d.unshard(shards[2].grad, lay), ref_dv, 2 * u),
    }
    for name, (got, want, bound) in errors.items():
        error = global_max(float((got.double() - want).norm() / want.norm()))
        assert_all_ranks(error <= bound, "%s: relative error %.3g > %.3g" % (name, error, bound))
    # The engines of this call ran on the stand-in backend (the device path), not the CPU's.
    devices = {engine.device for engine in _engine_cache._engines._engines.values()}
    assert devices == {"fenced-cuda"}, devices


def test_fp32_is_refused_by_the_cuda_rules(fenced_cuda):
    """The engine on the device path refuses what the CUDA kernels cannot compute, on every rank,
    before any data moves (the backend's check_supported)."""
    x = torch.zeros(1, 5, 2, 64)
    with pytest.raises(attention2d.Error, match="fp32"):
        attention2d.attention(x, x, x, layout="contiguous")


@pytest.mark.parametrize("backend, host, nccl", [
    ("gloo", "group", False), ("cpu:gloo,cuda:nccl", "group", True), ("nccl", "mesh", True),
    ("mpi", None, False)])
def test_which_groups_carry_cuda_tensors_over_nccl(backend, host, nccl):
    """An NCCL group's CUDA messages go over NCCL (the project's communicator, bootstrapped
    through the group's gloo part or, for an NCCL-only group, a Gloo mesh of attention2d's own);
    a gloo group's are staged through host memory; other backends are refused. (No NCCL group can
    be made without a GPU: the choice is tested as the functions the channel asks.)"""
    from attention2d import _channel

    assert _channel._is_nccl_group(backend) == nccl
    kind = _channel._host_transport_kind(backend)
    if host is None:
        assert "attention2d runs over gloo groups, NCCL groups" in kind
    else:
        assert kind == host
