"""destroy_process_group() then init_process_group() on the same port after attention2d used the
group (issue 47: it hung 45-100 s in torch's init, the package's channel keeping the old group and
its store alive): attention2d releases what it made on the group when torch drops it, re-init
takes as long as plain torch's, attention2d runs on the new group, and a call between destroy and
init names the destroy. Under scripts/launch/launch.py (env://, the same MASTER_PORT each time)."""

import time

import pytest
import torch
import torch.distributed as dist

import attention2d
from conftest import COMM, TORCH_LAUNCH, assert_all_ranks, full_inputs, masked_reference

pytestmark = pytest.mark.skipif(not TORCH_LAUNCH, reason="needs the torch.distributed launch")
FP32 = 1e-5


def run_once(seed):
    seq = 3 * dist.get_world_size() + 1
    q, k, v, _ = full_inputs(seed, 1, seq, 2, 2, 8)
    local = [attention2d.shard(x.float(), "contiguous") for x in (q, k, v)]
    out = attention2d.attention(*local, causal=True, layout="contiguous")
    ref, _ = masked_reference(q, k, v, True, 0, None, None, 0.0)
    return float((attention2d.unshard(out, "contiguous").double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("release", ["by itself", "clear_cache"])
def test_reinit_after_destroy(release):
    error = run_once(1)
    assert_all_ranks(error <= FP32, "first group: error %.3g" % error)
    if release == "clear_cache":
        attention2d.clear_cache()
    dist.barrier()
    dist.destroy_process_group()
    assert attention2d.cache_info()["engines"] == 0, attention2d.cache_info()
    with pytest.raises(attention2d.Error, match="destroy_process_group"):
        attention2d.attention(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4),
                              torch.ones(1, 2, 1, 4), layout="contiguous")
    start = time.monotonic()
    dist.init_process_group("gloo")
    seconds = time.monotonic() - start
    assert_all_ranks(seconds < 10, "init_process_group took %.1f s after destroy" % seconds)
    error = run_once(2)
    assert_all_ranks(error <= FP32, "after re-init: error %.3g" % error)
