"""Who the ranks are and how the engine's messages travel between them.

A Channel is the set of ranks a call is collective over, and the transport the engine's messages
cross:

  torch   a torch.distributed ProcessGroup (or a 1-D DeviceMesh; a 2-D or 3-D DeviceMesh passed as
          grid= lays ATTENTION2D's rows x columns, or the hybrid's heads x rows x columns, on its
          dimensions). Two transports (set_transport):
          "group" (the default): the group itself, its point-to-point operations and collectives
          through attention2d._c10d, a torch extension built against the installed torch
          (attention2d/group_comm.hpp); "mesh": a full mesh of Gloo TCP connections of the
          engine's own (attention2d._core.Transport.gloo, where the build has Gloo), whose
          addresses cross the group once (all_gather_object). No mpirun and no mpi4py needed:
          torchrun, or any launcher that sets the env:// variables.
  mpi     an mpi4py communicator (MPI.COMM_WORLD by default under mpirun / srun).
  local   one process and no launcher (no network, no MPI).

Ranks are the caller's: a group's own ranks, and for a DeviceMesh the ranks of the one group
torch flattens it into (dist.get_rank(group): what a caller cuts its shards by). Where a grid mesh
puts the engine's ranks elsewhere (the grid position u * R * C + r + c * R of the process at
mesh[u, r, c]), Channel.slots maps them back: everything Python sees (allgather, rank, layouts)
is in the caller's order, and the engine gets the map (Engine(slots=...)).

Channels are made once per group or communicator and kept while the group lives: a channel holds
its group only weakly and is released (with its engines) when torch drops the group, as
destroy_process_group() does, so that a new init_process_group() finds nothing of the old one;
clear_cache() releases every channel at once. Every engine made on a channel duplicates its
transport (its own message space over the same group or connections)."""

import os
import pickle
import weakref

from . import _core
from ._core import Error

try:  # torch is optional: numpy arrays and mpi4py work without it
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - Debian's python3-torch is installed by scripts/setup.sh
    torch = None
    dist = None
try:  # (an isinstance test traces under torch.compile; hasattr on a mesh does not)
    from torch.distributed.device_mesh import DeviceMesh
except ImportError:  # pragma: no cover - torch without distributed
    DeviceMesh = None

# Variables an MPI launcher (Open MPI's mpirun, MPICH/Hydra, Slurm's PMI/PMIx) sets in every rank.
_MPI_LAUNCH_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK",
                         "MPI_LOCALNRANKS")

# The watchdog's default timeout in seconds (attention2d.watchdog changes it; None turns it off).
DEFAULT_WATCHDOG_TIMEOUT = 300.0


class Channel:
    """The ranks of one group or communicator and the transport the engine uses over them."""

    def __init__(self, kind, transport, label, handle, order=None, watchdog_transport=None,
                 slots=None):
        self.kind = kind            # "torch", "mpi" or "local"
        self.transport = transport  # attention2d._core.Transport
        self.label = label          # for messages: "the torch process group of 4 ranks"
        # The group / communicator / mesh: a torch group or mesh weakly (torch owns it, and it
        # must be able to go: see release_group), an mpi4py communicator strongly.
        self._handle = handle
        self.order = order          # grid= DeviceMesh: (heads_parallel, rows, cols) it fixes
        # slots[e]: the caller's rank of the engine's rank e (None: the same ranks).
        self.slots = None if slots is None or list(slots) == list(range(len(slots))) else (
            [int(x) for x in slots])
        self.engine_rank = transport.rank
        self.rank = self.slots[self.engine_rank] if self.slots else transport.rank
        self.size = transport.size
        # What the watchdog runs over (a Gloo mesh or MPI): the transport itself, or for the
        # "group" transport a Gloo mesh made when the watchdog starts (None: not yet).
        self.watchdog_transport = watchdog_transport
        self.watchdog_maker = None
        # The last exchange of the caller's positions, by mode (_positions.resolve).
        self.positions_memo = {}
        # Whether CUDA tensors' messages travel over NCCL: the group's device backend is NCCL
        # (the project's NCCL communicator, bootstrapped through `transport`: docs/gpu.md).
        self.nccl = False

    @property
    def handle(self):
        return self._handle() if isinstance(self._handle, weakref.ref) else self._handle

    def allgather(self, value, phase):
        """Every rank's `value` (any picklable object), in rank order, over the engine's transport;
        `phase` names the wait for the watchdog."""
        parts = self.transport.allgather(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL),
                                         phase)
        return [pickle.loads(part) for part in self.in_caller_order(parts)]

    def in_caller_order(self, by_engine_rank):
        """A list indexed by the engine's ranks, reindexed by the caller's."""
        if not self.slots:
            return list(by_engine_rank)
        out = [None] * len(by_engine_rank)
        for engine_rank, item in enumerate(by_engine_rank):
            out[self.slots[engine_rank]] = item
        return out

    def raise_collectively(self, local_error, extra=None, phase="argument check"):
        """Every rank passes its own error text ("" if none); all raise the same Error if any
        rank has one. One all-gather of (error, extra); returns the gathered extras when nobody
        failed."""
        gathered = self.allgather((local_error, extra), phase)
        failed = [rank for rank, (error, _) in enumerate(gathered) if error]
        if failed:
            first = failed[0]
            message = gathered[first][0]
            if len(failed) == len(gathered) and len(gathered) > 1:
                message += " (on every rank)"
            else:
                if len(gathered) > 1:
                    message = "rank %d: %s" % (first, message)
                if len(failed) > 1:
                    message += " (and %d more ranks failed)" % (len(failed) - 1)
            raise Error(message)
        return [value for _, value in gathered]


class Keyed:
    """Objects a compiled call names by a string (torch.compile traces the string, a constant,
    and the op finds the object by it at run time): Layout and Ranges."""

    _objects = weakref.WeakValueDictionary()
    _count = [0]

    def _keep(self, kind):
        Keyed._count[0] += 1
        self._key = "%s:%d" % (kind, Keyed._count[0])
        Keyed._objects[self._key] = self

    @staticmethod
    def find(key, what):
        found = Keyed._objects.get(key)
        if found is None:
            raise Error("%s %s is gone: the compiled call outlived the object it was traced "
                        "with" % (what, key))
        return found


_channels = {}
_watchdog = {"timeout": DEFAULT_WATCHDOG_TIMEOUT, "channel": None, "idle_timeout": None}

# How long the ranks waiting inside attention2d wait for a rank that is alive outside it (a
# checkpoint, an evaluation) when the group's own timeout cannot be read: torch's default.
DEFAULT_IDLE_TIMEOUT = 1800.0


def _group_timeout(chan):
    """The process group's own timeout in seconds (torch's collectives give up after it), or
    None where it cannot be read (mpi4py, an older torch)."""
    group = chan.handle
    if group is not None and _is_device_mesh(group):
        try:
            group = (group.get_group() if group.ndim == 1
                     else _mesh_group(group, tuple(group.mesh.shape)))
        except Exception:  # noqa: BLE001 - a mesh torch cannot flatten: the documented default
            return None
    if group is None or not _is_process_group(group):
        return None
    import torch

    candidates = []
    backend = getattr(group, "_get_backend", None)
    if backend is not None:
        try:
            candidates.append(backend(torch.device("cpu")))
        except Exception:  # noqa: BLE001 - torch versions differ; the fallback is documented
            pass
    candidates.append(group)
    for owner in candidates:
        options = getattr(owner, "options", None)
        timeout = getattr(options, "_timeout", None) if options is not None else None
        if timeout is not None and hasattr(timeout, "total_seconds"):
            return float(timeout.total_seconds())
    return None

# How the engine's messages cross a torch group: "group" (the group's own operations, through
# attention2d._c10d) or "mesh" (a Gloo mesh of the engine's own). docs/python.md, "Transport",
# has the measurement that chose the default. A2D_TRANSPORT overrides it.
TRANSPORTS = ("group", "mesh")
DEFAULT_TRANSPORT = "group"
_transport = {"kind": os.environ.get("A2D_TRANSPORT") or DEFAULT_TRANSPORT,
              "default_group_used": False}


def set_transport(kind):
    """How the engine's messages cross a torch process group from now on: "group" (the group's
    own point-to-point operations and collectives, through attention2d._c10d) or "mesh" (a full
    mesh of Gloo connections of the engine's own; needs a build with Gloo). Returns the previous
    kind. Channels already made keep theirs; every rank must choose the same."""
    if kind not in TRANSPORTS:
        raise Error("transport %r: choose one of %s" % (kind, ", ".join(repr(t) for t in TRANSPORTS)))
    previous = _transport["kind"]
    _transport["kind"] = kind
    return previous


def _is_process_group(x):
    return dist is not None and isinstance(x, dist.ProcessGroup)


def _is_device_mesh(x):
    return DeviceMesh is not None and isinstance(x, DeviceMesh)


def _is_mpi_comm(x):
    return type(x).__module__.startswith("mpi4py") and hasattr(x, "Get_size")


def _env_int(name):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return None


def _default_target():
    """The default group or communicator: torch.distributed's default group where it is
    initialised, else MPI.COMM_WORLD under an MPI launcher, else this process alone. A
    torchrun-style launch (WORLD_SIZE > 1) without an initialised process group is refused: the
    ranks would otherwise each compute alone."""
    if dist is not None and dist.is_available() and dist.is_initialized():
        _transport["default_group_used"] = True
        return dist.distributed_c10d._get_default_group()
    world_size = _env_int("WORLD_SIZE")
    mpi_launch = any(name in os.environ for name in _MPI_LAUNCH_VARIABLES)
    if _transport["default_group_used"] and not mpi_launch:
        raise Error("torch.distributed is not initialised any more: destroy_process_group() was "
                    "called after attention2d last ran on the default group. Call "
                    "init_process_group() again before attention2d (it then uses the new default "
                    "group), or pass group=")
    if world_size is not None and world_size > 1 and not mpi_launch:
        raise Error("WORLD_SIZE=%d in the environment (a torchrun-style launch), but "
                    "torch.distributed is not initialised, so attention2d would run this process "
                    "alone as a world of 1 rank: call torch.distributed.init_process_group() "
                    "first (attention2d then uses the default group), or pass group=" % world_size)
    if mpi_launch:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if world_size is not None and world_size > 1 and comm.Get_size() != world_size:
            raise Error("WORLD_SIZE=%d in the environment, but MPI.COMM_WORLD has %d rank%s: "
                        "pass group= (a torch.distributed process group) or comm= to say which "
                        "ranks attention2d runs over" % (world_size, comm.Get_size(),
                                                         "" if comm.Get_size() == 1 else "s"))
        return comm
    return None  # this process alone


def _mesh_text(mesh):
    names = getattr(mesh, "mesh_dim_names", None)
    shape = tuple(int(s) for s in mesh.mesh.shape)
    return "%s%s" % (shape, " with mesh_dim_names %s" % (tuple(names),) if names else "")


def _refuse_whole_mesh(mesh):
    """group= a DeviceMesh of several dimensions: the ranks of one sequence, or a data-parallel x
    sequence-parallel mesh whose batches must not mix? attention2d cannot know: refused, with
    both fixes (the same verdict on every rank: every rank holds the same mesh)."""
    names = getattr(mesh, "mesh_dim_names", None)
    dim = ("group=mesh[%r]" % names[-1] if names else
           "group=mesh['cp'] of a mesh made with mesh_dim_names=('dp', 'cp')")
    raise Error("group= is a %d-D DeviceMesh %s: attention2d runs over the ranks of one sequence, "
                "and a mesh of several dimensions may be data parallel x sequence parallel (whose "
                "batches must not mix) or ATTENTION2D's own grid. Pass its sequence-parallel "
                "dimension (%s), or, where every rank of the mesh holds a shard of the same "
                "sequence, lay ATTENTION2D's rows x columns (heads x rows x columns for the "
                "hybrid) on it with grid=mesh (and no group=)"
                % (mesh.ndim, _mesh_text(mesh), dim))


# Words of mesh dimension names (split at "_") that name a parallelism other than the sequence's
# (torch's and torchtitan's: dp, dp_replicate, dp_shard, tp, pp, ep, ...): replicas of other
# batches, or shards of the model, never rows or columns of one sequence's grid.
_OTHER_PARALLELISM = {"dp", "ddp", "fsdp", "hsdp", "replicate", "data", "batch", "tp", "tensor",
                      "pp", "pipeline", "ep", "expert"}


def _refuse_other_parallelism(mesh):
    """grid= a mesh one of whose dimensions is named for data, tensor, pipeline or expert
    parallelism: its ranks hold other batches or other parts of the model, not the rows and
    columns of one sequence (a dp x cp mesh laid out as a grid mixes the replicas' batches
    without a word). Refused on every rank (every rank holds the same mesh)."""
    names = getattr(mesh, "mesh_dim_names", None) or ()
    other = [name for name in names if set(str(name).lower().split("_")) & _OTHER_PARALLELISM]
    if other:
        raise Error("grid= is the DeviceMesh %s, whose dimension %s names another parallelism "
                    "than the sequence's: grid= lays ATTENTION2D's rows x columns on the ranks of "
                    "ONE sequence. Pass the sequence-parallel dimension as group= (e.g. "
                    "group=mesh['cp']), or make a mesh of the sequence's ranks alone"
                    % (_mesh_text(mesh), ", ".join(repr(n) for n in other)))


def is_grid_mesh(grid):
    """Whether grid= is a DeviceMesh (which then names the call's ranks)."""
    return _is_device_mesh(grid)


def planner_grid(grid):
    """grid= as the planner takes it: None where grid= is a DeviceMesh (the channel's order
    carries its shape), else as given."""
    return None if _is_device_mesh(grid) else grid


def channel(comm=None, group=None, grid=None):
    """The Channel of `group` (a torch ProcessGroup or 1-D DeviceMesh), `grid` (a 2-D or 3-D
    DeviceMesh: ATTENTION2D's grid, or the hybrid's, laid on it) or `comm` (an mpi4py
    communicator; a ProcessGroup is accepted there too), or the default one."""
    if group is not None and comm is not None:
        raise Error("pass group= (torch.distributed) or comm= (mpi4py), not both")
    if _is_device_mesh(grid):
        if comm is not None or (group is not None and group is not grid):
            raise Error("grid= is a DeviceMesh, whose ranks are the call's: pass it alone, "
                        "without group= or comm=")
        if grid.ndim not in (2, 3):
            raise Error("grid= DeviceMesh %s: a grid mesh has 2 dimensions (rows x columns of "
                        "ATTENTION2D) or 3 (heads groups x rows x columns of the hybrid); pass a "
                        "1-D mesh as group= (the planner then chooses the grid)"
                        % _mesh_text(grid))
        _refuse_other_parallelism(grid)
        group = grid
    elif _is_device_mesh(group) and group.ndim > 1:
        _refuse_whole_mesh(group)
    target = group if group is not None else comm
    if target is None:
        target = _default_target()
    kind = _transport["kind"]
    key = ("local",) if target is None else (id(target), kind)
    made = _channels.get(key)
    if made is not None and made.handle is target:
        return made
    if target is None:
        transport = _core.Transport.local()
        made = Channel("local", transport, "this process alone (1 rank)", None,
                       watchdog_transport=transport if _core.gloo_built() else None)
    elif _is_process_group(target):
        made = _torch_channel(target, kind)
    elif _is_device_mesh(target):
        made = _mesh_channel(target, kind)
    elif _is_mpi_comm(target):
        made = _mpi_channel(target)
    else:
        raise Error("%s= must be a torch.distributed ProcessGroup%s, got %s"
                    % ("group" if group is not None else "comm",
                       " or DeviceMesh" if group is not None else " or an mpi4py communicator",
                       type(target).__name__))
    _channels[key] = made
    return made


def _mpi_channel(comm):
    from mpi4py import MPI

    transport = _core.Transport.mpi(MPI._handleof(comm))
    return Channel("mpi", transport, "the MPI communicator of %d rank%s"
                   % (transport.size, "" if transport.size == 1 else "s"), comm,
                   watchdog_transport=transport)


def _gloo_world(group, my_index, size):
    """A Gloo mesh over the ranks of `group`, this rank at position `my_index` of `size`: the
    addresses cross the group once (all_gather_object), ordered by position."""
    def exchange(mine):
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, (my_index, mine), group=group)
        by_index = dict(gathered)
        return [by_index[i] for i in range(size)]

    return _core.Transport.gloo(my_index, size, exchange)


def _c10d_module():
    """attention2d._c10d, checked against the running torch (a torch extension runs only with
    the torch release it was built against)."""
    try:
        from . import _c10d
    except ImportError as e:
        raise Error("attention2d's transport over torch process groups (attention2d._c10d) is "
                    "missing or does not load (%s): it is built against the torch installed when "
                    "attention2d was built; rebuild attention2d (pip install --force-reinstall "
                    "--no-cache-dir .), or use attention2d.set_transport('mesh') where the build "
                    "has Gloo" % e) from None
    running = torch.__version__.split("+")[0]
    if _c10d.torch_version != running:
        raise Error("attention2d._c10d was built against torch %s, but this is torch %s: rebuild "
                    "attention2d for this torch (pip install --force-reinstall --no-cache-dir .)"
                    % (_c10d.torch_version, running))
    if _c10d.abi != _core.group_ops_abi:
        raise Error("attention2d._c10d and attention2d._core come from different builds: "
                    "reinstall attention2d")
    return _c10d


def _is_nccl_group(backend):
    """Whether a group's backend text ("nccl", "cpu:gloo,cuda:nccl", "gloo") carries CUDA
    tensors over NCCL."""
    return backend == "nccl" or "cuda:nccl" in backend


def _host_transport_kind(backend):
    """How the engine's host messages cross a group of `backend`: "group" (its own gloo part),
    "mesh" (a Gloo mesh bootstrapped through it: an NCCL-only group moves no host memory), or an
    error text."""
    if backend == "gloo" or "cpu:gloo" in backend:
        return "group"
    if backend == "nccl":
        if not _core.gloo_built():
            return ("group= is an NCCL process group, whose host messages (the engine's argument "
                    "checks, NCCL's bootstrap) need a Gloo mesh of attention2d's own, and this "
                    "build has no Gloo (libgloo-dev when attention2d is built); pass a group made "
                    "with backend='cpu:gloo,cuda:nccl'")
        return "mesh"
    return ("group= is a %s process group: attention2d runs over gloo groups, NCCL groups "
            "(CUDA tensors) and groups of both ('cpu:gloo,cuda:nccl')" % backend)


def _group_transport(group, position, size):
    """The transport over the group, this rank at engine rank `position`, and whether CUDA
    tensors' messages travel over NCCL: the group's own operations (its gloo part), or for an
    NCCL-only group a Gloo mesh of attention2d's bootstrapped through it."""
    backend = str(dist.get_backend(group))
    kind = _host_transport_kind(backend)
    if kind not in ("group", "mesh"):
        raise Error(kind)
    if kind == "mesh":
        return _gloo_world(group, position, size), True
    ops = _c10d_module().group_ops(group, "cpu")
    return _core.Transport.group(ops, position), _is_nccl_group(backend)


def _watch_group(group, key):
    """Releases the channel `key` (and its engines) when torch drops `group`: after
    destroy_process_group() nothing of attention2d keeps the group or its store alive."""
    try:
        weakref.finalize(group, release_channel, key)
    except TypeError:  # pragma: no cover - pybind11 objects take weak references
        pass


def _torch_channel(group, kind, position=None, size=None, label=None, order=None, handle=None,
                   slots=None):
    """A channel over `group` (every rank of it), this rank at engine rank `position` (default:
    its rank in the group) of `size` (default: the group's); slots: Channel's."""
    rank = dist.get_rank(group)
    if rank < 0:
        raise Error("this process (global rank %d) is not a member of the process group passed "
                    "as group=" % dist.get_rank())
    size = dist.get_world_size(group) if size is None else size
    position = rank if position is None else position
    label = label or "the torch process group of %d rank%s" % (size, "" if size == 1 else "s")
    nccl = _is_nccl_group(str(dist.get_backend(group)))
    host_kind = _host_transport_kind(str(dist.get_backend(group)))
    if kind == "mesh" or size == 1 or host_kind == "mesh":
        if not _core.gloo_built():
            raise Error("set_transport('mesh') needs a build with Gloo (libgloo-dev when "
                        "attention2d was built); the default transport, 'group', needs none"
                        if kind == "mesh" or size == 1 else _host_transport_kind("nccl"))
        transport = _gloo_world(group, position, size)
        made = Channel("torch", transport, label, None, order, watchdog_transport=transport,
                       slots=slots)
    else:
        transport, nccl = _group_transport(group, position, size)
        made = Channel("torch", transport, label, None, order, slots=slots)
        if _core.gloo_built():
            group_ref = weakref.ref(group)
            made.watchdog_maker = lambda: _gloo_world(group_ref(), position, size)
    made.nccl = nccl
    target = group if handle is None else handle
    made._handle = weakref.ref(target)
    _watch_group(group, (id(target), kind))
    return made


def _mesh_group(mesh, shape):
    """One process group over every rank of an N-D DeviceMesh: the default group where the mesh
    spans the whole world, else the mesh flattened (DeviceMesh._flatten: torch >= 2.6, and only
    for a mesh with mesh_dim_names)."""
    if mesh.mesh.numel() == dist.get_world_size() and mesh.device_type == "cpu":
        return dist.distributed_c10d._get_default_group()
    flatten = getattr(mesh, "_flatten", None)
    if flatten is None:
        raise Error("grid=DeviceMesh of %d dimensions needs DeviceMesh._flatten() (torch >= "
                    "2.6) for one group over its ranks; pass group=mesh._flatten().get_group() "
                    "with algo= and grid=(rows, columns) instead" % len(shape))
    if not getattr(mesh, "mesh_dim_names", None):
        raise Error("grid=DeviceMesh %s spans %d of the %d ranks and has no mesh_dim_names, so "
                    "torch cannot flatten it into one group: make it with mesh_dim_names=(...) "
                    "(init_device_mesh(..., mesh_dim_names=...))"
                    % (shape, mesh.mesh.numel(), dist.get_world_size()))
    return flatten().get_group()


def _mesh_channel(mesh, kind):
    """A DeviceMesh of 1 dimension (group=: its ranks; the planner chooses), 2 (grid=: rows x
    columns of the ATTENTION2D grid) or 3 (grid=: heads groups x rows x columns of the hybrid).
    The process at mesh[u, r, c] takes the grid's position u * R * C + r + c * R as its engine
    rank; its rank for the caller stays its rank in the group over the whole mesh (torch's
    flattened order), and Channel.slots maps one to the other."""
    shape = tuple(int(s) for s in mesh.mesh.shape)
    if len(shape) == 1:
        return _torch_channel(mesh.get_group(), kind, handle=mesh)
    group = _mesh_group(mesh, shape)
    heads, rows, cols = (1,) + shape if len(shape) == 2 else shape
    caller_rank = {g: i for i, g in enumerate(dist.get_process_group_ranks(group))}
    me = dist.get_rank()
    size = heads * rows * cols
    slots = [0] * size
    position = None
    for u in range(heads):
        for r in range(rows):
            for c in range(cols):
                index = (r, c) if len(shape) == 2 else (u, r, c)
                global_rank = int(mesh.mesh[index])
                engine_rank = u * rows * cols + r + c * rows
                slots[engine_rank] = caller_rank[global_rank]
                if global_rank == me:
                    position = engine_rank
    if position is None:
        raise Error("this process (global rank %d) is not in the DeviceMesh passed as grid="
                    % me)
    return _torch_channel(group, kind, position, size,
                          "the DeviceMesh %s (%d ranks)" % (shape, size), (heads, rows, cols),
                          handle=mesh, slots=slots)


def _watchdog_transport(chan):
    """The transport the watchdog runs over on `chan` (made now where it is a Gloo mesh of its
    own), or None where the build has none for it."""
    if chan.watchdog_transport is None and chan.watchdog_maker is not None:
        chan.watchdog_transport = chan.watchdog_maker()
    return chan.watchdog_transport


def start_watchdog_once(chan):
    """Collective over `chan`: starts the watchdog (over the first channel used) unless it was
    turned off or already runs. A build without Gloo has no watchdog over torch groups (and
    over one process): there the group's own timeout bounds a wait."""
    timeout = _watchdog["timeout"]
    if not timeout or _watchdog["channel"] is not None:
        return
    transport = _watchdog_transport(chan)
    if transport is None:
        return
    idle = _watchdog["idle_timeout"]
    if idle is None:
        idle = _group_timeout(chan) or DEFAULT_IDLE_TIMEOUT
    transport.start_watchdog(float(timeout), float(idle))
    _watchdog["channel"] = chan


def watchdog(timeout, comm=None, group=None, idle_timeout=None):
    """Collective: the watchdog aborts the whole job (exit code 124, naming each rank's phase and
    the ranks behind) when a rank inside an attention2d call has waited `timeout` seconds with no
    rank making progress, or at once when a rank it waits for has died. It is on by default
    (DEFAULT_WATCHDOG_TIMEOUT = 300 s, started at the first call); None or 0 turns it off.

    A rank that is alive outside attention2d (saving a checkpoint, evaluating) is not a hang: the
    ranks waiting for it inside a call keep waiting while it answers, up to `idle_timeout`
    seconds after it left the library (None: the process group's own timeout, torch's 30 minutes
    by default, or DEFAULT_IDLE_TIMEOUT where it cannot be read). A rank that is dead, frozen or
    unreachable ends the job within `timeout`."""
    if idle_timeout is not None and not float(idle_timeout) > 0:
        raise Error("idle_timeout must be a positive number of seconds (or None: the process "
                    "group's own timeout), got %r" % (idle_timeout,))
    _core.stop_watchdog()
    _watchdog["channel"] = None
    _watchdog["timeout"] = float(timeout) if timeout else None
    _watchdog["idle_timeout"] = float(idle_timeout) if idle_timeout is not None else None
    if timeout:
        chan = channel(comm, group)
        if _watchdog_transport(chan) is None:
            raise Error("this build of attention2d has no watchdog over %s (the watchdog's link "
                        "is a Gloo mesh: libgloo-dev when attention2d is built); a torch group's "
                        "own timeout (init_process_group(timeout=...)) bounds a wait" % chan.label)
        start_watchdog_once(chan)


# Called with the key of a channel that is released (to drop the engines made on it).
_on_release = []


def release_channel(key):
    """Drops the channel `key` (torch dropped its group, or clear_cache()), the engines made on
    it and, if it runs over it, the watchdog."""
    chan = _channels.pop(key, None)
    if chan is None:
        return
    for forget in _on_release:
        forget(chan)
    if _watchdog["channel"] is chan:
        _core.stop_watchdog()
        _watchdog["channel"] = None


def release():
    """Drops every channel, its engines and the watchdog."""
    for key in list(_channels):
        release_channel(key)
    _core.stop_watchdog()
    _watchdog["channel"] = None
