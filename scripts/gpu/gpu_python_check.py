#!/usr/bin/env python3
"""The Python section of scripts/gpu_run.sh (docs/gpu.md, "CUDA tensors from PyTorch"): torch CUDA
tensors through attention2d on one GPU, against torch's SDPA in fp32 math.

  gpu_python_check.py sdpa     P = 1: forward and backward of CUDA tensors (bf16, fp16; odd N,
                               GQA, D 64/80/128, causal and not) against SDPA's math backend on
                               fp32 copies; outputs on the inputs' device; a call on a side stream
                               equal bit for bit (the engine ordered after and before torch's
                               current stream, with no synchronisation in between); the refusals
                               (fp32, a last dimension that is not dense)
  gpu_python_check.py llama    P = 1: one training step of a tiny transformers Llama (bf16) with
                               attention2d as its attention (AttentionInterface), loss and
                               gradients against attn_implementation="sdpa"
  gpu_python_check.py ranks    under scripts/launch/launch.py --nproc 2 on one GPU: zigzag shards,
                               forward + backward against the fp64 reference, over NCCL where the
                               installed NCCL runs two ranks on one GPU (2.30 and later, with
                               NCCL_MULTI_RANK_GPU_ENABLE=1: a "cpu:gloo,cuda:nccl" group),
                               else (after checking that NCCL is refused on every rank) staged
                               through host memory over a gloo group
  gpu_python_check.py --list   what would run (no GPU needed: the dry run)

A2D_CHECK_DEVICE=cpu runs sdpa and llama on CPU tensors instead (the script's own logic checked
without a GPU; the side stream and the CUDA refusals are then skipped): not a GPU result.

Each prints one line per check, "ok ..." or "FAIL ...", and exits 1 when any failed."""

import os
import sys

CASES = [  # (dtype, batch, seq, heads, kv_heads, head_dim, causal)
    ("bfloat16", 1, 333, 12, 4, 80, True),
    ("bfloat16", 2, 1000, 8, 8, 64, False),
    ("float16", 1, 777, 8, 2, 128, True),
    ("float16", 1, 257, 4, 1, 64, False),
]
failures = []
DEVICE = os.environ.get("A2D_CHECK_DEVICE", "cuda")


def report(ok, text):
    print(("ok   " if ok else "FAIL ") + text, flush=True)
    if not ok:
        failures.append(text)


def unit(dtype_name):
    return 2.0 ** -8 if dtype_name == "bfloat16" else 2.0 ** -11


def sdpa_reference(q, k, v, d_out, causal):
    """SDPA's math backend on fp32 copies ([B, N, H, D] in and out; GQA by repetition): out,
    lse-free gradients dq, dk, dv."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[2] // k.shape[2]
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    kk = k32.repeat_interleave(group, dim=2)
    vv = v32.repeat_interleave(group, dim=2)
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q32.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
            is_causal=causal).transpose(1, 2)
    out.backward(d_out.float())
    return out.detach(), q32.grad, k32.grad, v32.grad


def relative(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def check_sdpa():
    import torch

    import attention2d

    device = (torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda"
              else torch.device("cpu"))
    for dtype_name, b, n, h, hk, d, causal in CASES:
        dtype = getattr(torch, dtype_name)
        gen = torch.Generator(device="cpu").manual_seed(52)
        q, k, v = (torch.randn(b, n, heads, d, generator=gen).to(device, dtype).requires_grad_()
                   for heads in (h, hk, hk))
        d_out = torch.randn(b, n, h, d, generator=gen).to(device, dtype)
        name = "%s B=%d N=%d H=%d:%d D=%d causal=%s" % (dtype_name, b, n, h, hk, d, causal)
        try:
            out = attention2d.attention(q, k, v, causal=causal)
            out.backward(d_out)
        except Exception as error:  # reported, the next case still runs
            report(False, "%s: %s" % (name, str(error).splitlines()[0]))
            continue
        report(out.device == device and out.dtype == dtype,
               "%s: the output is torch's, on %s in %s" % (name, out.device, out.dtype))
        ref_out, ref_dq, ref_dk, ref_dv = sdpa_reference(q, k, v, d_out, causal)
        u = unit(dtype_name)
        checks = (("O", out, ref_out, 2 * u + 1e-5), ("dQ", q.grad, ref_dq, 4 * u),
                  ("dK", k.grad, ref_dk, 4 * u), ("dV", v.grad, ref_dv, 2 * u))
        for what, got, want, bound in checks:
            error = relative(got, want)
            report(error <= bound,
                   "%s: %s relative error %.3g (bound %.3g)" % (name, what, error, bound))
        if device.type != "cuda":
            continue
        # On a side stream: the engine follows that stream (the inputs are written on the
        # default stream, which the side stream waits for) and the result is read after
        # wait_stream, never after a device-wide synchronisation.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            again = attention2d.attention(q.detach(), k.detach(), v.detach(), causal=causal)
        torch.cuda.current_stream().wait_stream(side)
        report(torch.equal(again, out.detach()),
               "%s: the same bits from a call on a side stream" % name)
    if device.type != "cuda":
        return
    # Refusals before any data moves.
    x = torch.zeros(1, 8, 2, 64, device=device)
    for what, args in (("fp32", (x, x, x)),
                       ("a last dimension that is not dense",
                        (torch.zeros(1, 8, 64, 2, device=device, dtype=torch.bfloat16)
                         .transpose(2, 3),) * 3)):
        try:
            attention2d.attention(*args)
            report(False, "%s was not refused" % what)
        except attention2d.Error as error:
            report(True, "%s refused: %s" % (what, str(error).splitlines()[0][:120]))


def check_llama():
    import torch

    import attention2d

    try:
        import transformers
        from transformers import (AttentionInterface, AutoModelForCausalLM, LlamaConfig,
                                  LlamaForCausalLM)
    except ImportError as error:
        report(False, "transformers: %s" % error)
        return

    def a2d_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
        # transformers hands [B, H, N, D]; attention2d takes [B, N, H, D] (one rank: no layout).
        out = attention2d.attention(query.transpose(1, 2), key.transpose(1, 2),
                                    value.transpose(1, 2), causal=True, softmax_scale=scaling)
        return out, None

    AttentionInterface.register("attention2d", a2d_attention)
    config = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=1024)
    torch.manual_seed(52)
    base = LlamaForCausalLM(config).to(DEVICE, torch.bfloat16)
    tokens = torch.randint(0, 1000, (2, 384), device=DEVICE)
    results = {}
    for implementation in ("sdpa", "attention2d"):
        try:
            # The documented way to choose a registered attention (AttentionInterface).
            model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
            model = model.to(DEVICE, torch.bfloat16)
            model.load_state_dict(base.state_dict())
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
        except Exception as error:
            report(False, "tiny Llama (transformers %s) with %s: %s"
                   % (transformers.__version__, implementation, str(error).splitlines()[0]))
            return
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
        results[implementation] = (float(loss.detach()), grads)
    (loss_sdpa, g_sdpa), (loss_a2d, g_a2d) = results["sdpa"], results["attention2d"]
    report(abs(loss_a2d - loss_sdpa) <= 1e-2 * abs(loss_sdpa),
           "tiny Llama step: loss %.5f with attention2d, %.5f with sdpa" % (loss_a2d, loss_sdpa))
    error = relative(g_a2d, g_sdpa)
    report(error <= 5e-2, "tiny Llama step: gradients' relative difference %.3g (bound 5e-2)"
           % error)


def check_ranks():
    import torch
    import torch.distributed as dist

    import attention2d

    rank = int(os.environ["RANK"])
    if DEVICE == "cuda":
        torch.cuda.set_device(0)  # one GPU for both ranks
        nccl = torch.cuda.nccl.version()
    else:
        nccl = (0, 0, 0)
    shares = tuple(nccl[:2]) >= (2, 30)
    if shares:
        os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    dist.init_process_group("cpu:gloo,cuda:nccl" if DEVICE == "cuda" else "gloo")
    gen = torch.Generator().manual_seed(52)
    b, n, h, hk, d = 1, 999, 12, 4, 80
    full = [torch.randn(b, n, heads, d, generator=gen, dtype=torch.float64).bfloat16().double()
            for heads in (h, hk, hk, h)]
    q, k, v, d_out = full
    tag = "P=2 on one GPU (NCCL %s)" % ".".join(map(str, nccl))

    def run(group, how):
        layout = attention2d.layout(n, kind="zigzag", group=group)
        shards = [attention2d.shard(x, layout).to(DEVICE, torch.bfloat16).requires_grad_()
                  for x in (q, k, v)]
        out = attention2d.attention(*shards, causal=True, layout="zigzag", group=group)
        out.backward(attention2d.shard(d_out, layout).to(DEVICE, torch.bfloat16))
        got = [attention2d.unshard(t.detach(), layout, group=group).double()
               for t in (out, shards[0].grad, shards[1].grad, shards[2].grad)]
        want = reference(q, k, v, d_out)
        u = 2.0 ** -8
        for what, g, w, bound in zip(("O", "dQ", "dK", "dV"), got, want,
                                     (2 * u + 1e-5, 4 * u, 4 * u, 2 * u)):
            error = relative(g, w)
            if rank == 0:
                report(error <= bound, "%s %s: %s relative error %.3g (bound %.3g)"
                       % (tag, how, what, error, bound))

    if DEVICE != "cuda":
        run(dist.group.WORLD, "on CPU tensors over gloo (the script's logic only)")
    elif shares:
        run(dist.group.WORLD, "over NCCL (NCCL_MULTI_RANK_GPU_ENABLE=1)")
    else:
        try:
            run(dist.group.WORLD, "over NCCL")
            report(False, "%s: NCCL below 2.30 ran two ranks on one GPU: expected a refusal" % tag)
        except attention2d.Error as error:
            report("NCCL" in str(error), "%s: NCCL refused on rank %d: %s"
                   % (tag, rank, str(error).splitlines()[0][:160]))
        attention2d.clear_cache()
        run(dist.new_group(backend="gloo"), "staged through host memory (gloo group)")
    dist.barrier()
    dist.destroy_process_group()


def reference(q, k, v, d_out):
    """fp64 causal attention and its gradients (GQA summed over the group)."""
    import torch

    group = q.shape[2] // k.shape[2]
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", qq, kk.repeat_interleave(group, 2)) * q.shape[-1] ** -0.5
    n = q.shape[1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vv.repeat_interleave(group, 2))
    out.backward(d_out)
    return out.detach(), qq.grad, kk.grad, vv.grad


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "--list"
    if what == "--list":
        for case in CASES:
            print("sdpa case: %s B=%d N=%d H=%d:%d D=%d causal=%s" % case)
        print("sdpa: a call on a side stream; refusals of fp32 and a non-dense last dimension")
        print("llama: a tiny transformers Llama step, attention2d against sdpa")
        print("ranks: P=2 on one GPU, over NCCL (>= 2.30) or refused then staged")
        return 0
    {"sdpa": check_sdpa, "llama": check_llama, "ranks": check_ranks}[what]()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
