"""Inputs and verdicts for scripts/cluster/soak.sh's command-line jobs.

    soak_check.py gen DIR SEED BATCH SEQ HEADS KV_HEADS HEAD_DIM
        writes q.npy, k.npy, v.npy, do.npy (float32, [batch, seq, heads, head_dim]) into DIR
    soak_check.py check IN_DIR OUT_DIR CAUSAL WINDOW SUCCEEDED
        prints one verdict line and exits with its code:
          0 ok       the job succeeded and O, LSE, dQ, dK, dV are within 1e-5 (relative
                     Frobenius, fp32's bound) of an fp64 reference; or it failed and left nothing
          1 wrong    the job succeeded with an output outside that bound
          2 lost     the job succeeded with an output missing or partial; or it failed and left
                     a partial file, or anything but nothing or the complete set
"""

import os
import sys

import numpy as np

NAMES = ["o", "lse", "dq", "dk", "dv"]
BOUND = 1e-5


def gen(directory, seed, batch, seq, heads, kv_heads, head_dim):
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads), ("do", heads)):
        np.save(os.path.join(directory, name + ".npy"),
                rng.standard_normal((batch, seq, h, head_dim)).astype(np.float32))


def reference(q, k, v, do, causal, window):
    """fp64 O [b, n, h, d], LSE [b, h, n], dQ, dK, dV."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    heads, kv_heads, head_dim = q.shape[2], k.shape[2], q.shape[3]
    groups = heads // kv_heads
    kk, vv = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scale = head_dim ** -0.5
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    n = q.shape[1]
    if causal:
        pos = np.arange(n)
        visible = pos[None, :] <= pos[:, None]
        if window:
            visible &= pos[None, :] > pos[:, None] - window
        s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    lse = (np.log(total) + m)[..., 0]
    p /= total
    o = np.einsum("bhqk,bkhd->bqhd", p, vv)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vv)
    delta = np.einsum("bqhd,bqhd->bhq", do, o)[..., None]
    ds = p * (dp - delta)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dkk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dvv = np.einsum("bhqk,bqhd->bkhd", p, do)
    b = q.shape[0]
    dk = dkk.reshape(b, n, kv_heads, groups, head_dim).sum(axis=3)
    dv = dvv.reshape(b, n, kv_heads, groups, head_dim).sum(axis=3)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def load_complete(path):
    """The array, or None when the file is partial or not an .npy file."""
    try:
        return np.load(path, allow_pickle=False)
    except Exception:  # noqa: BLE001 - any reading failure is a partial file
        return None


def check(in_dir, out_dir, causal, window, succeeded):
    present = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    expected = sorted(name + ".npy" for name in NAMES)
    if not succeeded:
        if not present:
            return 0, "ok: failed, left nothing"
        if present != expected:
            return 2, f"lost: failed and left {present}"
    elif present != expected:
        return 2, f"lost: succeeded but left {present}"
    arrays = {}
    for name in NAMES:
        arrays[name] = load_complete(os.path.join(out_dir, name + ".npy"))
        if arrays[name] is None:
            return 2, f"lost: {name}.npy is partial"
    inputs = [np.load(os.path.join(in_dir, name + ".npy")) for name in ("q", "k", "v", "do")]
    ref = reference(*inputs, causal, window)
    errors = {}
    for name in NAMES:
        got, want = arrays[name].astype(np.float64), ref[name]
        if got.shape != want.shape:
            return 2, f"lost: {name}.npy has shape {got.shape}, not {want.shape}"
        finite = np.isfinite(want)
        diff = np.where(finite, got - want, 0.0)
        errors[name] = np.linalg.norm(diff) / max(np.linalg.norm(np.where(finite, want, 0)), 1e-30)
        if not np.array_equal(np.isfinite(got), finite):
            errors[name] = np.inf
    text = " ".join(f"{name} {e:.2e}" for name, e in errors.items())
    if max(errors.values()) > BOUND:
        return 1, f"wrong: {text} (bound {BOUND:g})"
    return 0, f"ok: {'succeeded' if succeeded else 'failed, left the complete set'}: {text}"


def main():
    if sys.argv[1] == "gen":
        gen(sys.argv[2], *(int(x) for x in sys.argv[3:9]))
        return 0
    code, line = check(sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5]),
                       sys.argv[6] == "1")
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
