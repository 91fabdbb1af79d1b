"""attention2d.Decoder against an fp64 torch reference of the whole sequence: after a prefill of
an odd prompt, steps of 1 and 3 tokens (GQA 12:4, head dim 80, causal and windowed, float32 and
bfloat16 torch tensors, float32 numpy arrays), the new tokens' O and LSE must meet
output_bounds; and bad arguments fail on every rank before any data moves."""

import numpy as np
import pytest
import torch

import attention2d
from attention2d import _core
from conftest import COMM, TORCH_LAUNCH, assert_all_ranks, full_inputs, reference


def run_decode(dtype, window, steps, use_numpy=False, prompt=23, grid=None):
    heads, kv_heads, head_dim = 12, 4, 80
    total = prompt + sum(steps)
    q, k, v, _ = full_inputs(11, 1, total, heads, kv_heads, head_dim, dtype)
    out_ref, lse_ref, *_ = reference(q, k, v, q, causal=True, window=window)
    name = str(dtype).replace("torch.", "")
    dec = attention2d.Decoder(prompt=prompt, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                              window=window, dtype=name, grid=grid)

    def local(x, positions):
        part = x.index_select(1, torch.from_numpy(positions)).to(dtype).contiguous()
        return part.numpy() if use_numpy else part

    def errors(out, lse, positions):
        index = torch.from_numpy(positions)
        out, lse = torch.as_tensor(out).double(), torch.as_tensor(lse).double()
        e_out, e_lse = out_ref.index_select(1, index), lse_ref.index_select(2, index)
        sums = [float((out - e_out).pow(2).sum()), float(e_out.pow(2).sum()),
                float((lse - e_lse).pow(2).sum()), float(e_lse.pow(2).sum())]
        sums = [COMM.allreduce(s) for s in sums]
        return (sums[0] / sums[1]) ** 0.5, (sums[2] / sums[3]) ** 0.5

    bounds = _core.output_bounds(name)
    mine = dec.layout.tokens()
    out, lse = dec.prefill(local(q, mine), local(k, mine), local(v, mine))
    e_out, e_lse = errors(out, lse, mine)
    assert_all_ranks(e_out <= bounds["out"] and e_lse <= bounds["lse"],
                     "prefill errors %.3g %.3g" % (e_out, e_lse))
    for t in steps:
        positions = dec.next_positions(t)
        out, lse = dec.step(local(q, positions), local(k, positions), local(v, positions),
                            tokens=t)
        e_out, e_lse = errors(out, lse, positions)
        assert_all_ranks(e_out <= bounds["out"] and e_lse <= bounds["lse"],
                         "step of %d at %d: errors %.3g %.3g" % (t, dec.sequence, e_out, e_lse))
    assert dec.sequence == total
    assert list(dec.cached_positions()) == sorted(dec.cached_positions())


@pytest.mark.skipif(not TORCH_LAUNCH or COMM.Get_size() != 4, reason="a 2 x 2 DeviceMesh")
def test_decode_on_a_grid_mesh():
    """A Decoder over grid=DeviceMesh (ATTENTION2D's 2 x 2 grid on its dimensions; the engine's
    ranks at grid positions, the caller's in torch's order): each rank's tokens and the step's
    owners are torch's ranks'."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("r", "c"))
    run_decode(torch.float32, 0, [1, 3, 1], grid=mesh)


@pytest.mark.parametrize("window", [0, 7])
def test_decode_float32_matches_the_reference(window):
    run_decode(torch.float32, window, [1, 1, 3, 1, 3])


def test_decode_bfloat16():
    run_decode(torch.bfloat16, 0, [1, 3, 1])


def test_decode_numpy():
    run_decode(torch.float32, 0, [3, 1], use_numpy=True)


def test_decode_step_bytes_are_the_formula():
    dec = attention2d.Decoder(prompt=10, heads=12, kv_heads=4, head_dim=80)
    step = dec.next_step(3)
    ranks = COMM.Get_size()
    traffic = _core.decode_step_traffic(dec.problem, step["counts"], COMM.Get_rank())
    counts = step["counts"]
    nxt, own = counts[(COMM.Get_rank() + 1) % ranks], counts[COMM.Get_rank()]
    expected = 0 if ranks == 1 else 12 * ((3 - nxt) * 80 * 4 + (3 - own) * 4 * 82)
    assert_all_ranks(traffic["bytes"] == expected, "bytes %d, formula %d"
                     % (traffic["bytes"], expected))


def test_bad_arguments_fail_on_every_rank():
    with pytest.raises(attention2d.Error, match="heads"):
        attention2d.Decoder(prompt=10, heads=12, kv_heads=5, head_dim=16)
    dec = attention2d.Decoder(prompt=10, heads=4, kv_heads=2, head_dim=16)
    with pytest.raises(attention2d.Error, match="call prefill"):
        dec.step(torch.zeros(1, 0, 4, 16), torch.zeros(1, 0, 2, 16), torch.zeros(1, 0, 2, 16))
    mine = len(dec.layout.tokens())
    with pytest.raises(attention2d.Error, match="owns"):
        dec.prefill(torch.zeros(1, mine + 1, 4, 16), torch.zeros(1, mine + 1, 2, 16),
                    torch.zeros(1, mine + 1, 2, 16))


def test_decoder_too_big_for_memory(monkeypatch):
    """A Decoder its hosts cannot hold is refused on every rank before it allocates, counting the
    KV cache it reserves (capacity=); A2D_FAULT_MEMORY_AVAILABLE (test-only) stands for what the
    host has. The cache alone decides: with room for the prefill but not for a capacity of 10^6
    tokens per rank (1 GiB), the capacity is refused and the prompt's own shard is not."""
    def made(capacity):
        try:
            attention2d.Decoder(prompt=23, heads=4, head_dim=32, capacity=capacity)
            return None
        except attention2d.Error as e:
            return str(e)

    monkeypatch.setenv("A2D_FAULT_MEMORY_AVAILABLE", str(64 << 20))
    messages = COMM.allgather(made(1 << 20))
    assert_all_ranks(all(m is not None for m in messages), "not refused everywhere: %s" % messages)
    assert_all_ranks(len(set(messages)) == 1, "messages differ: %s" % messages)
    assert_all_ranks("the KV cache (capacity, or the prompt's shard)" in messages[0],
                     "the cache is not named: %r" % messages[0])
    messages = COMM.allgather(made(0))
    assert_all_ranks(all(m is None for m in messages), "the prompt alone refused: %s" % messages)
