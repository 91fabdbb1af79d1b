"""attention() under torch.compile: one torch.library custom op, attention2d::attention, with its
fake implementation (shapes only, for tracing) and its autograd (the backward is another op,
attention2d::attention_backward), so that a block calling attention() or flash-attn's entries
compiles into one graph (fullgraph=True).

What torch.compile traces is compiled_attention(): it turns every argument that is not a tensor
into a constant the op's schema takes (the ranks' group, mesh or communicator by a handle,
Layout and Ranges objects by their keys, the rest as numbers and strings); the op's body runs
attention() itself at run time, where every check, the argument exchange and the engine happen as
in an eager call. Differences from the eager call: the op saves only the caller's tensors, so
where the caller's layout is not the plan's the backward moves Q, K, V, O and LSE into the plan's
layout again (the eager autograd function saved them there: one all-to-all more); and an mpi4py
communicator cannot be traced (a graph break: pass a torch process group)."""

import weakref
from typing import List, Optional, Tuple

import numpy as np
import torch

from ._channel import Error, Keyed, is_grid_mesh
from ._planning import _algo_name

# The objects that name a compiled call's ranks: handle -> (comm, group, grid mesh), each held
# weakly where it can be (a process group must be able to go with destroy_process_group) and
# strongly otherwise (a DeviceMesh, whose guard is equality: an equal mesh reuses the handle).
_targets = []


def _hold(x):
    if x is None:
        return None
    if is_grid_mesh(x):
        return lambda: x
    try:
        return weakref.ref(x)
    except TypeError:
        return lambda: x


@torch.compiler.assume_constant_result
def _ranks_handle(comm, group, grid):
    """The handle of the call's ranks (-1: the default group): evaluated once while tracing, its
    result a constant of the graph; torch.compile's guards on the objects themselves (a process
    group's identity, a mesh's equality) recompile the call when another one comes."""
    mesh = grid if is_grid_mesh(grid) else None
    if comm is None and group is None and mesh is None:
        return -1
    wanted = (comm, group, mesh)
    for handle, held in enumerate(_targets):
        if all((h() if h is not None else None) is w for h, w in zip(held, wanted)):
            return handle
    _targets.append(tuple(_hold(x) for x in wanted))
    return len(_targets) - 1


def _ranks_of(handle):
    """(comm, group, grid mesh) of a handle."""
    if handle < 0:
        return None, None, None
    objects = tuple(h() if h is not None else None for h in _targets[handle])
    if any(h is not None and o is None for h, o in zip(_targets[handle], objects)):
        raise Error("the process group or communicator a compiled attention2d call was traced "
                    "with is gone (destroy_process_group?): compile the call again")
    return objects


def _keyed(key, prefix, what):
    if not key:
        return None
    return Keyed.find(key, what) if key.startswith(prefix + ":") else key


def _integers(values):
    """A list of ints from a list or tuple (None stays None): a tensor goes as a tensor."""
    return None if values is None else [int(x) for x in values]


def compiled_attention(q, k, v, *, causal, window, softmax_scale, algo, grid, comm, return_lse,
                       layout, threads, machine, calibration, cu_seqlens, sinks, softcap,
                       heads_parallel, group, window_size, dropout_p, return_attn_probs, mask,
                       positions, qkv_format, refusal, varlen):
    """attention()'s arguments as the op takes them (traced by torch.compile)."""
    ranks = _ranks_handle(comm, group, grid)
    if grid is None or is_grid_mesh(grid):
        grid_text = ""
    elif isinstance(grid, str):
        grid_text = grid
    else:
        grid_text = "%dx%d" % (int(grid[0]), int(grid[1]))
    layout_key = "" if layout is None else layout if isinstance(layout, str) else layout._key
    mask_key = "" if mask is None else mask if isinstance(mask, str) else mask._key
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(np.asarray(sinks, dtype=np.float32))
    if positions is not None and not isinstance(positions, torch.Tensor):
        positions = torch.as_tensor(positions, dtype=torch.int64)
    cu = cu_seqlens if isinstance(cu_seqlens, torch.Tensor) else None
    cu_list = None if cu is not None else _integers(cu_seqlens)
    cu_k, max_q, max_k = varlen if varlen is not None else (None, None, None)
    cu_k_tensor = cu_k if isinstance(cu_k, torch.Tensor) else None
    cu_k_list = None if cu_k_tensor is not None else _integers(cu_k)
    lse_wanted = bool(return_lse or return_attn_probs)
    out, lse = torch.ops.attention2d.attention(
        q, k, v, sinks, cu, cu_k_tensor, positions, ranks, bool(causal), int(window or 0),
        None if softmax_scale is None else float(softmax_scale), _algo_name(algo), grid_text,
        layout_key, lse_wanted, int(threads), machine or "", calibration or "", cu_list,
        cu_k_list, varlen is not None, -1 if max_q is None else int(max_q),
        -1 if max_k is None else int(max_k), float(softcap or 0.0), int(heads_parallel or 0),
        None if window_size is None else _integers(window_size), float(dropout_p or 0.0),
        mask_key, qkv_format or "", refusal)
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out


def _call(q, k, v, sinks, cu, cu_k, positions, ranks, causal, window, scale, algo, grid, layout,
          threads, machine, calibration, cu_list, cu_k_list, varlen, max_q, max_k, softcap,
          heads_parallel, window_size, dropout_p, mask, qkv_format, refusal, engine_only=False):
    """attention() at run time with the op's arguments: (out, lse), or the engine."""
    from . import _api

    comm, group, mesh = _ranks_of(ranks)
    return _api.attention(
        q, k, v, causal=causal, window=window, softmax_scale=scale, algo=algo,
        grid=mesh if mesh is not None else (grid or None), comm=comm, return_lse=True,
        layout=_keyed(layout, "layout", "layout="), threads=threads, machine=machine or None,
        calibration=calibration or None, cu_seqlens=cu if cu is not None else cu_list,
        sinks=sinks, softcap=softcap, heads_parallel=heads_parallel or None, group=group,
        window_size=window_size, dropout_p=dropout_p, mask=_keyed(mask, "ranges", "mask="),
        positions=positions, qkv_format=qkv_format or None, _refusal=refusal,
        _varlen=((cu_k if cu_k is not None else cu_k_list, None if max_q < 0 else max_q,
                  None if max_k < 0 else max_k) if varlen else None),
        _engine_only=engine_only, _in_op=True)


@torch.library.custom_op("attention2d::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 sinks: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                 cu_seqlens_k: Optional[torch.Tensor], positions: Optional[torch.Tensor],
                 ranks: int, causal: bool, window: int, softmax_scale: Optional[float], algo: str,
                 grid: str, layout: str, lse_wanted: bool, threads: int, machine: str,
                 calibration: str, cu_list: Optional[List[int]],
                 cu_k_list: Optional[List[int]], varlen: bool, max_seqlen_q: int,
                 max_seqlen_k: int, softcap: float, heads_parallel: int,
                 window_size: Optional[List[int]], dropout_p: float, mask: str, qkv_format: str,
                 refusal: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """attention(): this rank's O (q's shape and order) and fp32 LSE ([batch, heads, tokens],
    or [heads, tokens] for 3-D q). Collective over the call's ranks."""
    return _call(q, k, v, sinks, cu_seqlens, cu_seqlens_k, positions, ranks, causal, window,
                 softmax_scale, algo, grid, layout, threads, machine, calibration, cu_list,
                 cu_k_list, varlen, max_seqlen_q, max_seqlen_k, softcap, heads_parallel,
                 window_size, dropout_p, mask, qkv_format, refusal)


def _fake_outputs(q, qkv_format):
    """O and LSE as the op returns them (shapes, strides, dtypes)."""
    if q.dim() == 3:  # [tokens, heads, head_dim]
        n, h = q.shape[0], q.shape[1]
        return q.new_empty(q.shape), q.new_empty((h, n), dtype=torch.float32)
    if qkv_format == "bhsd":  # O written in flash-attn's order, returned transposed
        b, h, n, d = q.shape
        return (q.new_empty((b, n, h, d)).transpose(1, 2),
                q.new_empty((b, h, n), dtype=torch.float32))
    b, n, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, n), dtype=torch.float32)


@attention_op.register_fake
def _(q, k, v, sinks, cu_seqlens, cu_seqlens_k, positions, ranks, causal, window, softmax_scale,
      algo, grid, layout, lse_wanted, threads, machine, calibration, cu_list, cu_k_list, varlen,
      max_seqlen_q, max_seqlen_k, softcap, heads_parallel, window_size, dropout_p, mask,
      qkv_format, refusal):
    return _fake_outputs(q, qkv_format)


# The op's arguments after the tensors it saves for the backward, in order.
_SCALARS = ("ranks", "causal", "window", "softmax_scale", "algo", "grid", "layout", "lse_wanted",
            "threads", "machine", "calibration", "cu_list", "cu_k_list", "varlen",
            "max_seqlen_q", "max_seqlen_k", "softcap", "heads_parallel", "window_size",
            "dropout_p", "mask", "qkv_format", "refusal")


@torch.library.custom_op("attention2d::attention_backward", mutates_args=())
def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                          lse: torch.Tensor, d_out: torch.Tensor, d_lse: Optional[torch.Tensor],
                          sinks: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                          cu_seqlens_k: Optional[torch.Tensor],
                          positions: Optional[torch.Tensor], ranks: int, causal: bool,
                          window: int, softmax_scale: Optional[float], algo: str, grid: str,
                          layout: str, lse_wanted: bool, threads: int, machine: str,
                          calibration: str, cu_list: Optional[List[int]],
                          cu_k_list: Optional[List[int]], varlen: bool, max_seqlen_q: int,
                          max_seqlen_k: int, softcap: float, heads_parallel: int,
                          window_size: Optional[List[int]], dropout_p: float, mask: str,
                          qkv_format: str, refusal: str
                          ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (in q's, k's, v's shapes and order) and dsinks (empty without sinks) of
    attention2d::attention, from the caller's tensors (collective): the same engine as the
    forward (the engine cache keeps it), the LSE's gradient added where any rank's LSE has one."""
    from ._autograd import _backward_in_user_layout
    from ._channel import channel

    engine = _call(q, k, v, sinks, cu_seqlens, cu_seqlens_k, positions, ranks, causal, window,
                   softmax_scale, algo, grid, layout, threads, machine, calibration, cu_list,
                   cu_k_list, varlen, max_seqlen_q, max_seqlen_k, softcap, heads_parallel,
                   window_size, dropout_p, mask, qkv_format, refusal, engine_only=True)
    comm, group, mesh = _ranks_of(ranks)
    chan = channel(comm, group, mesh)
    # A gradient of zeros adds nothing (torch.compile hands one for an LSE the loss does not use).
    lse_gradient = lse_wanted and any(chan.allgather(
        d_lse is not None and bool(d_lse.any()), "backward arguments"))
    if lse_gradient:
        chan.raise_collectively(
            "the gradient through the returned LSE is computed without sinks and softcap only: "
            "detach the LSE (lse.detach()) or drop %s" % ("sinks" if sinks is not None
                                                         else "softcap")
            if sinks is not None or softcap else "", phase="backward arguments")
    thd, sdpa = q.dim() == 3, qkv_format == "bhsd"
    if thd:
        q4, k4, v4, out4, do4, lse4 = q[None], k[None], v[None], out[None], d_out[None], lse[None]
        dl4 = None if d_lse is None else d_lse[None]
    elif sdpa:
        q4, k4, v4, out4, do4 = (x.transpose(1, 2) for x in (q, k, v, out, d_out))
        lse4, dl4 = lse, d_lse
    else:
        q4, k4, v4, out4, do4, lse4, dl4 = q, k, v, out, d_out, lse, d_lse
    if lse_gradient and dl4 is None:  # this rank's LSE is unused, another rank's is not
        dl4 = torch.zeros(lse4.shape, dtype=torch.float32, device=q.device)
    dq, dk, dv, dsinks = _backward_in_user_layout(engine, q4, k4, v4, out4, lse4, do4, sinks,
                                                  dl4 if lse_gradient else None)
    if thd:
        dq, dk, dv = dq[0], dk[0], dv[0]
    elif sdpa:
        dq, dk, dv = (x.transpose(1, 2).contiguous() for x in (dq, dk, dv))
    return dq, dk, dv, q.new_empty(0) if dsinks is None else dsinks


@attention_backward_op.register_fake
def _(q, k, v, out, lse, d_out, d_lse, sinks, cu_seqlens, cu_seqlens_k, positions, *scalars):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(0) if sinks is None else sinks.new_empty(sinks.shape))


def _setup_context(ctx, inputs, output):
    q, k, v, sinks, cu, cu_k, positions = inputs[:7]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, cu, cu_k, positions)
    ctx.scalars = inputs[7:]
    ctx.set_materialize_grads(False)  # an unused LSE's gradient is None, as in the eager call


def _backward(ctx, d_out, d_lse):
    if torch.is_grad_enabled():
        raise Error("attention2d's backward is not differentiable itself: create_graph=True "
                    "(double backward, gradient penalties through the attention) is not "
                    "supported")
    q, k, v, out, lse, sinks, cu, cu_k, positions = ctx.saved_tensors
    if d_out is None:
        d_out = torch.zeros_like(out)
    dq, dk, dv, dsinks = attention_backward_op(q, k, v, out, lse, d_out, d_lse, sinks, cu, cu_k,
                                               positions, *ctx.scalars)
    return (dq, dk, dv, None if sinks is None else dsinks) + (None,) * (3 + len(_SCALARS))


attention_op.register_autograd(_backward, setup_context=_setup_context)
