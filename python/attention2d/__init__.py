"""attention2d: exact distributed self-attention (ATTENTION2D, arXiv 2503.15758) from Python.

Every rank of an MPI communicator (mpi4py; MPI.COMM_WORLD by default) holds a shard of the
sequence, in flash-attn's shape convention [batch, local tokens, heads, head_dim]:

    import attention2d
    lay = attention2d.layout(seq=n, heads=h, head_dim=d, causal=True)   # who holds which tokens
    q_local = attention2d.shard(q, lay)                                  # this rank's rows of q
    out_local = attention2d.attention(q_local, k_local, v_local, causal=True, layout=lay)

attention() is differentiable for torch tensors (forward and backward run the distributed
engine), and takes numpy arrays for the forward. plan() and model() give the planner's choice and
the cost model's predictions; unshard() puts a tensor back together from its shards. Decoder
prefills a prompt into a distributed KV cache and decodes steps of new tokens (docs/inference.md).
"""

from ._core import Error, version as __version__
from ._api import Layout, attention, layout, model, plan, shard, unshard, watchdog
from ._decode import Decoder

__all__ = [
    "Decoder",
    "Error",
    "Layout",
    "attention",
    "layout",
    "model",
    "plan",
    "shard",
    "unshard",
    "watchdog",
    "__version__",
]
