"""What a PyTorch user brings: process groups (under scripts/launch/launch.py the default group is
torch.distributed's), the layouts their shards are in (contiguous, uneven, zigzag), flash-attn's
argument names and entries, a cache that cannot return a stale engine, and refusals where the
package cannot know what the caller meant. Every result is checked against an fp64 reference of
the whole sequence (fp32: 1e-5 relative Frobenius for O, LSE, dQ, dK, dV; 16-bit: the engine's
bounds, reference on the rounded inputs). Runs under mpiexec too (the MPI transport), where the
torch-only tests skip."""

import pytest
import torch
import torch.distributed as dist

import attention2d
from attention2d import _core
from conftest import (COMM, TORCH_LAUNCH, assert_all_ranks, full_inputs, masked_reference,
                      reference, relative_error)

P, RANK = COMM.Get_size(), COMM.Get_rank()
FP32 = 1e-5
torch_only = pytest.mark.skipif(not TORCH_LAUNCH, reason="needs the torch.distributed launch")


def global_error(pairs):
    """Relative Frobenius error over every rank's (got, expected) local parts."""
    diff = sum(float((g.double() - e.double()).pow(2).sum()) for g, e in pairs)
    norm = sum(float(e.double().pow(2).sum()) for _, e in pairs)
    diff, norm = COMM.allreduce(diff), COMM.allreduce(norm)
    return (diff / max(norm, 1e-300)) ** 0.5


def tokens_of(layout, seq, counts=None):
    """This rank's global tokens in a caller's layout."""
    return torch.from_numpy(attention2d._sharding._layout_tokens(layout, seq, P, counts)[RANK])


def uneven_counts(seq):
    """Contiguous slices of different lengths, rank 0 empty when there are several ranks."""
    if P == 1:
        return [seq]
    weights = [0] + list(range(1, P))
    counts = [seq * w // sum(weights) for w in weights]
    counts[-1] += seq - sum(counts)
    return counts


def check_forward_backward(seq, heads, kv_heads, d, layout, counts=None, dtype=torch.float32,
                           seed=11, **kwargs):
    """attention() on shards in `layout` against the fp64 reference: the five outputs' errors."""
    q, k, v, d_out = full_inputs(seed, 2, seq, heads, kv_heads, d, dtype)
    mine = tokens_of(layout, seq, counts)
    local = [x.index_select(1, mine).to(dtype).requires_grad_() for x in (q, k, v)]
    out, lse = attention2d.attention(*local, layout=layout, return_lse=True, **kwargs)
    out.backward(d_out.index_select(1, mine).to(dtype))
    expected = reference(q, k, v, d_out, kwargs.get("causal", False), kwargs.get("window", 0),
                         out_dtype=None if dtype == torch.float32 else dtype)
    got = [out, lse] + [x.grad for x in local]
    return [global_error([(g, e.index_select(2 if i == 1 else 1, mine))])
            for i, (g, e) in enumerate(zip(got, expected))]


# ---------------------------------------------------------------------------------------------
# Layouts the caller brings


ALGOS = ["attention2d", "attention2d-overlap", "ring", "allgather-kv", "ulysses", "auto"]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "uneven"])
def test_caller_layouts(algo, layout):
    """Every algorithm on contiguous, zigzag and uneven contiguous shards (a rank with none):
    exchanged into the plan's layout inside, results in the caller's, exact."""
    seq, heads, kv_heads, d = 29, 6, 2, 16
    if algo == "ulysses" and kv_heads % P:
        pytest.skip("ulysses needs P | kv_heads")
    counts = uneven_counts(seq) if layout == "uneven" else None
    errors = check_forward_backward(seq, heads, kv_heads, d,
                                     "contiguous" if layout == "uneven" else layout, counts,
                                     causal=True, algo=algo)
    assert_all_ranks(max(errors) <= FP32, "%s on %s shards: errors %s" % (algo, layout, errors))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_caller_layouts_16_bit(dtype):
    errors = check_forward_backward(37, 4, 2, 32, "zigzag", dtype=dtype, causal=True,
                                    algo="attention2d")
    bounds = _core.output_bounds(str(dtype).replace("torch.", ""))
    names = ("out", "lse", "dq", "dk", "dv")
    assert_all_ranks(all(e <= bounds[n] for e, n in zip(errors, names)),
                     "%s zigzag errors %s" % (dtype, errors))


def test_layout_must_be_said():
    """With more than one rank and no layout the package cannot know how the shards cut the
    sequence: it refuses, naming the choices, on every rank."""
    q = torch.randn(1, 5, 2, 8)
    try:
        attention2d.attention(q, q, q, causal=True)
        message = ""
    except attention2d.Error as e:
        message = str(e)
    if P == 1:
        assert_all_ranks(message == "", "one rank needs no layout: %s" % message)
    else:
        assert_all_ranks("layout='contiguous'" in message and "'zigzag'" in message,
                         "not refused with the choices: %r" % message)


def test_shard_unshard_with_layout_names():
    seq = 23
    full = torch.arange(seq * 3, dtype=torch.float32).view(1, seq, 3)
    for layout in ("contiguous", "zigzag", "cyclic"):
        local = attention2d.shard(full, layout)
        assert_all_ranks(torch.equal(local, full.index_select(1, tokens_of(layout, seq))),
                         "shard(%s)" % layout)
        assert_all_ranks(torch.equal(attention2d.unshard(local, layout), full),
                         "unshard(%s)" % layout)
    counts = uneven_counts(seq)
    mine = tokens_of("contiguous", seq, counts)
    back = attention2d.unshard(full.index_select(1, mine), "contiguous")
    assert_all_ranks(torch.equal(back, full), "unshard of uneven contiguous slices")


# ---------------------------------------------------------------------------------------------
# The engine cache


def masked_case(seq, layout, dtype=torch.float32, causal=True, window=0, cu_seqlens=None,
                sinks=None, softcap=0.0, scale=None, group=None, comm=None):
    """Forward O and LSE of one call against the fp64 masked reference (rounded inputs)."""
    heads, kv_heads, d = 4, 2, 16
    q, k, v, _ = full_inputs(5, 1, seq, heads, kv_heads, d, dtype)
    mine = tokens_of(layout, seq)
    local = [x.index_select(1, mine).to(dtype) for x in (q, k, v)]
    out, lse = attention2d.attention(
        *local, causal=causal, window=window, cu_seqlens=cu_seqlens, softcap=softcap,
        softmax_scale=scale, sinks=None if sinks is None else sinks.float(), layout=layout,
        return_lse=True, group=group, comm=comm)
    out_ref, lse_ref = masked_reference(q, k, v, causal, window, cu_seqlens,
                                        None if sinks is None else sinks.double(), softcap, scale)
    bound = FP32 if dtype == torch.float32 else _core.output_bounds("bfloat16")["out"]
    error = global_error([(out, out_ref.index_select(1, mine)),
                          (lse, lse_ref.index_select(2, mine))])
    return error, bound


def test_changing_cu_seqlens_is_never_stale():
    """Packed documents change boundaries every batch: the same number of documents with other
    boundaries must not reuse the first call's mask."""
    seq = 64
    for bounds in ([0, 10, 64], [0, 40, 64], [0, 10, 64], [0, 1, 2, 64], [0, 62, 63, 64]):
        for layout in ("contiguous", "cyclic"):
            error, bound = masked_case(seq, layout, cu_seqlens=bounds)
            assert_all_ranks(error <= bound, "cu_seqlens %s (%s): error %.3g"
                             % (bounds, layout, error))


def test_every_field_of_the_key():
    """Each field that changes a result, changed once from the same base call: the result is
    the reference's for the new value (a stale engine would give the old one)."""
    seq = 48
    base = dict(causal=True, cu_seqlens=[0, 20, 48])
    changes = [dict(), dict(window=7), dict(softcap=2.0), dict(scale=0.3),
               dict(sinks=torch.linspace(-1, 1, 4)), dict(dtype=torch.bfloat16),
               dict(causal=False), dict(layout="zigzag"), dict(cu_seqlens=None)]
    if TORCH_LAUNCH:
        changes.append(dict(group=dist.new_group(list(range(P)))))
    for change in changes:
        arguments = dict(base, layout="contiguous")
        arguments.update(change)
        if not arguments.get("causal"):
            arguments.pop("window", None)
        error, bound = masked_case(seq, **arguments)
        assert_all_ranks(error <= bound, "changed %s: error %.3g" % (sorted(change), error))


def test_engine_cache_is_bounded():
    limit = attention2d.cache_info()["limit"]
    made = attention2d.cache_info()["made"]
    for seq in range(20, 20 + limit + 4):
        q = torch.randn(1, len(tokens_of("contiguous", seq)), 2, 8)
        attention2d.attention(q, q, q, causal=True, layout="contiguous")
    info = attention2d.cache_info()
    assert_all_ranks(info["engines"] <= limit, "cache holds %d > %d" % (info["engines"], limit))
    assert_all_ranks(info["made"] - made == limit + 4, "engines made %s" % info)


# ---------------------------------------------------------------------------------------------
# flash-attn's names and entries


def test_flash_attn_argument_names():
    seq, heads, d = 31, 4, 16
    q, k, v, _ = full_inputs(2, 1, seq, heads, heads, d)
    mine = tokens_of("contiguous", seq)
    local = [x.index_select(1, mine).float() for x in (q, k, v)]

    def run(**kwargs):
        return attention2d.attention(*local, layout="contiguous", **kwargs)

    equal = lambda a, b: torch.equal(a, b)
    assert_all_ranks(equal(run(causal=True, window_size=(6, 0)), run(causal=True, window=7)),
                     "window_size=(6, 0) is not window=7")
    assert_all_ranks(equal(run(window_size=(6, 0)), run(causal=True, window=7)),
                     "window_size=(6, 0) without causal is not the causal window 7")
    assert_all_ranks(equal(run(causal=True, window_size=(-1, -1)), run(causal=True)),
                     "window_size=(-1, -1) is not 'no window'")
    assert_all_ranks(equal(run(deterministic=True, softmax_scale=0.2),
                           run(deterministic=True, softmax_scale=0.2)),
                     "two identical calls differ (deterministic)")
    out, lse, probs = run(causal=True, return_attn_probs=True)
    out_ref, lse_ref = masked_reference(q, k, v, True, 0, None, None, 0.0)
    error = global_error([(out, out_ref.index_select(1, mine)),
                          (lse, lse_ref.index_select(2, mine))])
    assert_all_ranks(probs is None and error <= FP32, "return_attn_probs: error %.3g" % error)
    # A right side is flash-attn's two-sided window now (test_masks.py checks its results).
    for kwargs, expected in ((dict(window_size=(3, 2)), None),
                             (dict(causal=False, window_size=(-1, 0)), None),
                             (dict(dropout_p=0.1), "dropout_p must be 0.0")):
        try:
            run(**kwargs)
            message = None
        except attention2d.Error as e:
            message = str(e)
        ok = message is None if expected is None else (message and expected in message)
        assert_all_ranks(ok, "%s: %r" % (kwargs, message))


def test_flash_attn_entries():
    """flash_attn_func, the ring-flash-attn entries (their positional order) and the varlen
    entry on packed 3-D [tokens, heads, head_dim] shards with global cu_seqlens."""
    seq, heads, kv_heads, d = 33, 4, 2, 16
    q, k, v, _ = full_inputs(4, 1, seq, heads, kv_heads, d)
    ref_out, ref_lse = masked_reference(q, k, v, True, 0, None, None, 0.0)
    for entry, layout in ((attention2d.flash_attn_func, "contiguous"),
                          (attention2d.ring_flash_attn_func, "contiguous"),
                          (attention2d.zigzag_ring_flash_attn_func, "zigzag")):
        mine = tokens_of(layout, seq)
        local = [x.index_select(1, mine).float() for x in (q, k, v)]
        out, lse, _ = entry(*local, 0.0, None, True, (-1, -1), **(
            dict(return_attn_probs=True)))
        error = global_error([(out, ref_out.index_select(1, mine)),
                              (lse, ref_lse.index_select(2, mine))])
        assert_all_ranks(error <= FP32, "%s: error %.3g" % (entry.__name__, error))
    cu = [0, 7, 8, 30, 33]
    doc_out, doc_lse = masked_reference(q, k, v, True, 0, cu, None, 0.0)
    mine = tokens_of("contiguous", seq)
    packed = [x[0].index_select(0, mine).float().requires_grad_() for x in (q, k, v)]
    out, lse, _ = attention2d.flash_attn_varlen_func(
        *packed, torch.tensor(cu, dtype=torch.int32), torch.tensor(cu, dtype=torch.int32), 23, 23,
        causal=True, return_attn_probs=True)
    error = global_error([(out, doc_out[0].index_select(0, mine)),
                          (lse, doc_lse[0].index_select(1, mine))])
    assert_all_ranks(out.dim() == 3 and lse.dim() == 2 and error <= FP32,
                     "varlen: shapes %s %s, error %.3g" % (list(out.shape), list(lse.shape), error))
    out.sum().backward()
    assert_all_ranks(all(x.grad is not None and x.grad.shape == x.shape for x in packed),
                     "varlen gradients")
    for kwargs, expected in ((dict(alibi_slopes=torch.ones(heads)), "alibi"),
                             (dict(max_seqlen_q=5), "max_seqlen_q=5")):
        try:
            call = dict(max_seqlen_q=23, max_seqlen_k=23)
            call.update(kwargs)
            attention2d.flash_attn_varlen_func(*packed, cu, cu, **call)
            message = ""
        except attention2d.Error as e:
            message = str(e)
        assert_all_ranks(expected in message, "%s: %r" % (kwargs, message))


def test_create_graph_is_refused():
    q = torch.randn(1, len(tokens_of("contiguous", 12)), 2, 8, requires_grad=True)
    out = attention2d.attention(q, q, q, causal=True, layout="contiguous")
    try:
        torch.autograd.grad(out.sum(), q, create_graph=True)
        message = ""
    except attention2d.Error as e:
        message = str(e)
    assert_all_ranks("create_graph=True" in message, "not refused: %r" % message)


# ---------------------------------------------------------------------------------------------
# Process groups


@torch_only
def test_process_group_arguments():
    """comm=dist.group.WORLD is taken as the group; layout() and shard() take group=; a group of
    some ranks runs on those ranks only."""
    seq = 21
    q, k, v, _ = full_inputs(6, 1, seq, 2, 2, 8)
    ref_out, _ = masked_reference(q, k, v, True, 0, None, None, 0.0)
    mine = tokens_of("zigzag", seq)
    local = [x.index_select(1, mine).float() for x in (q, k, v)]
    out = attention2d.attention(*local, causal=True, layout="zigzag", comm=dist.group.WORLD)
    error = global_error([(out, ref_out.index_select(1, mine))])
    assert_all_ranks(error <= FP32, "comm=dist.group.WORLD: error %.3g" % error)
    everyone = dist.new_group(list(range(P)))
    lay = attention2d.layout(seq=seq, heads=2, head_dim=8, causal=True, comm=everyone)
    shards = [attention2d.shard(x.float(), lay) for x in (q, k, v)]
    out = attention2d.attention(*shards, causal=True, layout=lay, group=everyone)
    back = attention2d.unshard(out, lay, group=everyone)
    assert_all_ranks(float((back.double() - ref_out).norm() / ref_out.norm()) <= FP32,
                     "layout(comm=new_group)")
    if P > 1:
        some = list(range(P - 1))
        part = dist.new_group(some)  # every rank takes part in making it
        if RANK in some:
            sub = attention2d.layout(kind="contiguous", seq=seq, group=part)
            shards = [attention2d.shard(x.float(), sub) for x in (q, k, v)]
            out = attention2d.attention(*shards, causal=True, layout=sub, group=part)
            full = attention2d.unshard(out, sub, group=part)
            error = float((full.double() - ref_out).norm() / ref_out.norm())
        else:
            error = 0.0
        assert_all_ranks(error <= FP32, "a group of %d of %d ranks: error %.3g"
                         % (len(some), P, error))


def _mesh(shape, reverse, names=None):
    """A DeviceMesh over the 4 ranks: init_device_mesh("cpu", shape, mesh_dim_names=...) (torch
    flattens it into one group), or one without names whose rank order is reversed (mesh
    positions and global ranks differ; the default group carries it, as it spans the world)."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if reverse:
        return DeviceMesh("cpu", torch.arange(P - 1, -1, -1).view(*shape))
    return init_device_mesh("cpu", shape,
                            mesh_dim_names=names or ("u", "r", "c")[-len(shape):])


MESHES = [((2, 2), False), ((1, 4), True), ((4, 1), False), ((2, 2), True), ((2, 2, 1), False),
          ((2, 1, 2), True)]


@torch_only
@pytest.mark.parametrize("shape,reverse", MESHES)
def test_grid_mesh_fixes_the_grid(shape, reverse):
    """grid=DeviceMesh: 2-D (rows x columns) is ATTENTION2D's grid, 3-D (heads groups x rows x
    columns) the hybrid's; the plan's own layout (attention2d.layout(grid=mesh)), its
    Layout.tokens indexed by torch's ranks."""
    if P != 4:
        pytest.skip("meshes of 4 ranks")
    mesh = _mesh(shape, reverse)
    seq, heads = 19, 4
    lay = attention2d.layout(seq=seq, heads=heads, head_dim=8, causal=True, grid=mesh)
    expected = ("hybrid" if len(shape) == 3 else "attention2d", tuple(shape[-2:]),
                shape[0] if len(shape) == 3 else 1)
    got = (lay.plan.algorithm, tuple(lay.plan.grid), lay.plan.heads_parallel)
    assert_all_ranks(got == expected, "mesh %s: plan %s" % (shape, lay.plan.describe()))
    q, k, v, d_out = full_inputs(8, 1, seq, heads, heads, 8)
    shards = [attention2d.shard(x.float(), lay).requires_grad_() for x in (q, k, v)]
    out = attention2d.attention(*shards, causal=True, layout=lay, grid=mesh,
                                qkv_format="bshd")
    (out * attention2d.shard(d_out.float(), lay)).sum().backward()
    ref = reference(q, k, v, d_out, causal=True)
    got = [attention2d.unshard(x, lay, grid=mesh) for x in
           (out, shards[0].grad, shards[1].grad, shards[2].grad)]
    errors = [float((g.double() - r).norm() / r.norm()) for g, r in
              zip(got, (ref[0], ref[2], ref[3], ref[4]))]
    assert_all_ranks(max(errors) <= FP32, "DeviceMesh %s: O, dQ, dK, dV errors %s"
                     % (shape, errors))


@torch_only
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "uneven"])
@pytest.mark.parametrize("shape,reverse", MESHES)
def test_grid_mesh_shards_in_torch_order(shape, reverse, layout):
    """The caller's shards over a grid mesh, cut by torch's rank (dist.get_rank(), the order of
    the group the mesh flattens into) as users cut them: exact against fp64 for O, LSE, dQ, dK,
    dV (issue 57: the package counted them r + c * R, error 0.33 with no message)."""
    if P != 4:
        pytest.skip("meshes of 4 ranks")
    mesh = _mesh(shape, reverse)
    seq, heads, kv_heads, d = 37, 6, 2, 16
    counts = uneven_counts(seq) if layout == "uneven" else None
    errors = check_forward_backward(seq, heads, kv_heads, d,
                                     "contiguous" if layout == "uneven" else layout, counts,
                                     causal=True, grid=mesh, qkv_format="bshd")
    assert_all_ranks(max(errors) <= FP32, "grid=DeviceMesh %s (%s) on %s shards: errors %s"
                     % (shape, "reversed" if reverse else "torch's order", layout, errors))
    # shard()/unshard() over the mesh agree with torch's order too.
    q = full_inputs(3, 1, seq, heads, kv_heads, d)[0].float()
    kind = "contiguous" if layout == "uneven" else layout
    mine = attention2d.shard(q, kind, grid=mesh)
    assert_all_ranks(torch.equal(mine, q.index_select(1, tokens_of(kind, seq))),
                     "shard(grid=mesh) in torch's order")
    assert_all_ranks(torch.equal(attention2d.unshard(mine, kind, grid=mesh), q),
                     "unshard(grid=mesh)")


@torch_only
def test_whole_mesh_as_group_is_refused():
    """A dp x cp mesh passed whole as group= would mix the data-parallel batches (issue 57:
    gradient error 0.55, no message): refused on every rank, naming mesh['cp'], and so is
    grid=mesh (a dimension named for data parallelism); with group=mesh['cp'] each replica's
    sequence is exact. A 1-D mesh is a group; grid= takes 2-D and 3-D meshes only, and alone."""
    if P != 4:
        pytest.skip("a 2 x 2 mesh")
    mesh = _mesh((2, 2), False, names=("dp", "cp"))
    seq, heads, d = 21, 4, 8
    replica = dist.get_rank() // 2
    q, k, v, d_out = full_inputs(40 + replica, 1, seq, heads, heads, d)
    cp = mesh["cp"]
    mine = attention2d.shard(torch.arange(seq), "contiguous", dim=0, group=cp)
    local = [x.index_select(1, mine).float().requires_grad_() for x in (q, k, v)]
    with pytest.raises(attention2d.Error, match=r"group=mesh\['cp'\]"):
        attention2d.attention(*local, causal=True, layout="contiguous", group=mesh)
    with pytest.raises(attention2d.Error, match=r"group=mesh\['cp'\]"):
        attention2d.shard(q, "contiguous", group=mesh)
    with pytest.raises(attention2d.Error, match="1-D mesh as group="):
        attention2d.attention(*local, causal=True, layout="contiguous", grid=cp)
    # grid= the dp x cp mesh: it names data parallelism, not a grid of one sequence.
    with pytest.raises(attention2d.Error, match="names another parallelism"):
        attention2d.attention(*local, causal=True, layout="contiguous", grid=mesh)
    with pytest.raises(attention2d.Error, match="pass it alone"):
        attention2d.attention(*local, causal=True, layout="contiguous", grid=mesh,
                              group=dist.group.WORLD)
    out, lse = attention2d.attention(*local, causal=True, layout="contiguous", group=cp,
                                     return_lse=True, qkv_format="bshd")
    out.backward(d_out.index_select(1, mine).float())
    expected = reference(q, k, v, d_out, causal=True)
    got = [out, lse] + [x.grad for x in local]
    errors = [relative_error(g, e.index_select(2 if i == 1 else 1, mine))
              for i, (g, e) in enumerate(zip(got, expected))]
    assert_all_ranks(max(errors) <= FP32, "group=mesh['cp'], replica %d: errors %s"
                     % (replica, errors))
