"""DistributedDataParallel under sequence parallelism.

With the sequence sharded over P ranks, each rank's loss is its share of the sequence's loss
(its tokens' terms, normalised by the tokens of the whole sequence), so a replicated parameter's
gradient is the SUM of the ranks' gradients. DDP averages over its group instead: 1/P of that.
register_ddp_hook() makes DDP sum over the ranks of each sequence and average over the
data-parallel replicas only, which is exact:

    model = DDP(Block(), process_group=group)
    attention2d.register_ddp_hook(model, sequence_parallel=P)   # P: ranks per sequence

(Equivalently, a loss multiplied by P under plain DDP; the hook keeps the loss value honest.)"""

from ._channel import Error, dist


def _hook(state, bucket):
    group, replicas = state
    tensor = bucket.buffer()
    work = dist.all_reduce(tensor, group=group, async_op=True)

    def finish(future):
        summed = future.value()[0]
        return summed.div_(replicas) if replicas > 1 else summed

    return work.get_future().then(finish)


def register_ddp_hook(ddp_model, sequence_parallel=None):
    """Makes `ddp_model` (torch.nn.parallel.DistributedDataParallel) reduce gradients as
    sequence parallelism needs: summed over the `sequence_parallel` ranks that share one sequence
    (default: every rank of the DDP group, i.e. pure sequence parallelism) and averaged over the
    group's size / sequence_parallel data-parallel replicas."""
    if dist is None:
        raise Error("register_ddp_hook needs torch.distributed")
    group = getattr(ddp_model, "process_group", None)
    ranks = dist.get_world_size(group)
    p = ranks if sequence_parallel is None else int(sequence_parallel)
    if p < 1 or ranks % p:
        raise Error("sequence_parallel=%d must divide the DDP group's %d ranks" % (p, ranks))
    ddp_model.register_comm_hook((group, ranks // p), _hook)
    return ddp_model
