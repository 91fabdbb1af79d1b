"""attention2d: exact distributed self-attention (ATTENTION2D, arXiv 2503.15758) from Python.

Every rank of a torch.distributed process group (or of an mpi4py communicator under mpirun)
holds a shard of the sequence, in flash-attn's shape convention [batch, local tokens, heads,
head_dim], and says how the shards cut the sequence:

    import torch.distributed as dist, attention2d
    dist.init_process_group("gloo")                       # torchrun, or any env:// launcher
    q_local = attention2d.shard(q, "contiguous")          # this rank's slice of the sequence
    out_local = attention2d.attention(q_local, k_local, v_local, causal=True,
                                      layout="contiguous")    # or "zigzag", or a Layout

attention() is differentiable for torch tensors (forward and backward run the distributed
engine), and takes numpy arrays for the forward. flash_attn_func / flash_attn_varlen_func /
ring_flash_attn_func / zigzag_ring_flash_attn_func take flash-attn's and ring-flash-attn's
arguments. layout() gives the plan's own layout (no exchange); plan() and model() the planner's
choice and the cost model's predictions; unshard() puts a tensor back together; Decoder prefills
a prompt into a distributed KV cache and decodes (docs/inference.md); register_ddp_hook makes
DDP exact under sequence parallelism; attention2d.transformers.register() serves Hugging Face
models built with attn_implementation="attention2d". docs/python.md has the whole story.
"""

try:
    from ._core import Error, version as __version__
except ImportError as _error:  # a system library missing: named, with its package (_loading.py)
    from ._loading import explain as _explain
    _explained = _explain(_error)
    if _explained is None:
        raise
    raise _explained from None
from ._api import attention
from ._channel import (DEFAULT_TRANSPORT, DEFAULT_WATCHDOG_TIMEOUT, TRANSPORTS, set_transport,
                       watchdog)
from ._ddp import register_ddp_hook
from ._decode import Decoder
from ._engine_cache import ENGINE_CACHE_SIZE, cache_info, clear_cache
from ._flash import (flash_attn_func, flash_attn_varlen_func, ring_flash_attn_func,
                     zigzag_ring_flash_attn_func)
from ._mask import Ranges, ranges
from ._planning import USER_LAYOUTS, model, plan
from ._sharding import Layout, layout, shard, unshard

__all__ = [
    "DEFAULT_TRANSPORT",
    "DEFAULT_WATCHDOG_TIMEOUT",
    "Decoder",
    "ENGINE_CACHE_SIZE",
    "Error",
    "Layout",
    "Ranges",
    "TRANSPORTS",
    "USER_LAYOUTS",
    "attention",
    "cache_info",
    "clear_cache",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "layout",
    "model",
    "plan",
    "ranges",
    "register_ddp_hook",
    "ring_flash_attn_func",
    "set_transport",
    "shard",
    "unshard",
    "watchdog",
    "zigzag_ring_flash_attn_func",
    "__version__",
]
