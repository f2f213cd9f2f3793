"""Install the prism backend into torch.distributed, without touching the script.

* ``init_process_group`` with any backend name builds the prism default group
  on an in-process store, while ``dist.get_backend()`` still answers what the
  script asked for ("nccl", "cpu:gloo,cuda:nccl", ...).
* Every later ``new_group`` reaches :meth:`PrismProcessGroup.new_group`
  through the default group (torch delegates to it), members or not.
* Object collectives use mirror semantics at the object level: a peer holds
  the objects the real rank holds.  Pickled payloads cannot be zeros or noise.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import pickle
import warnings
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from prism_debug.backend.process_group import PrismProcessGroup
from prism_debug.backend.runtime import Runtime
from prism_debug.errors import UnsupportedOperation
from prism_debug.graph import WORLD_FAMILY, GroupRef

log = logging.getLogger(__name__)

BACKEND = "prism"
NCCL_DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)
OTHER_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def install(runtime: Runtime, on_init: Callable[[str], None]) -> None:
    """Patch torch.distributed so that the script's groups are prism groups.

    ``on_init(requested_backend)`` runs once the default group exists.
    """
    state = _State(runtime)

    def create_default_group(opts, backend_options):
        ranks = list(range(opts.group_size))
        return PrismProcessGroup(runtime, ranks, GroupRef(WORLD_FAMILY, 0), opts.timeout,
                                 state.requested)

    dist.Backend.register_backend(BACKEND, create_default_group, extended_api=True,
                                  devices=["cpu", "cuda"])
    original_init = c10d.init_process_group

    @functools.wraps(original_init)
    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1,
                           rank=-1, store=None, group_name="", pg_options=None,
                           device_id=None, _ranks=None):
        requested = str(backend) if backend else "undefined"
        _check_identity("rank", rank, runtime.rank)
        _check_identity("world_size", world_size, runtime.world_size)
        _warn_ignored(init_method=None if init_method in (None, "env://") else init_method,
                      store=store, pg_options=pg_options)
        if timeout is None:
            # As torch: NCCL's own default only for a plain "nccl" group.
            timeout = NCCL_DEFAULT_TIMEOUT if requested == "nccl" else OTHER_DEFAULT_TIMEOUT
        state.requested = requested
        # The script's init_method, store and device binding all describe a real
        # rendezvous of world_size processes; the emulated rank needs none of
        # them.  A bound device id would make DeviceMesh split groups, which a
        # Python group cannot serve.
        original_init(BACKEND, store=dist.HashStore(), rank=runtime.rank,
                      world_size=runtime.world_size, timeout=timeout, group_name=group_name)
        default_pg = c10d._get_default_group()
        _, pg_store = c10d._world.pg_map[default_pg]
        c10d._world.pg_map[default_pg] = (dist.Backend(requested), pg_store)
        c10d._world.pg_backend_config[default_pg] = requested
        on_init(requested)

    _patch("init_process_group", init_process_group)
    _patch("split_group", _split_group)
    _patch("batch_isend_irecv", _marking_batches(runtime, c10d.batch_isend_irecv))
    for name in ("broadcast_object_list", "all_gather_object", "gather_object",
                 "scatter_object_list", "send_object_list", "recv_object_list"):
        _patch(name, getattr(_ObjectCollectives(state), name))
    _give_cpu_builds_an_nccl_version()
    # new_group on an "nccl" default group asks for NCCL's default timeout,
    # which warns on CPU builds; the group is a prism group whatever it says.
    warnings.filterwarnings("ignore", message="Attempted to get default timeout for nccl backend")


def _split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None,
                 group_desc=None, backend=None):
    """``split_group`` as one ``new_group`` per split, so every split is
    recorded in its family (a Python group has no communicator to split)."""
    if not split_ranks:
        raise ValueError("split_ranks cannot be None or empty")
    if pg_options is not None or backend is not None:
        warnings.warn("prism-debug: split_group's pg_options and backend are ignored: "
                      "every split is a prism group", stacklevel=2)
    parent = parent_pg or c10d._get_default_group()
    parent_ranks = dist.get_process_group_ranks(parent)
    mine = None
    for ranks in split_ranks:
        global_ranks = [parent_ranks[r] for r in ranks]
        group = dist.new_group(global_ranks, timeout=timeout, group_desc=group_desc)
        if dist.get_rank() in global_ranks:
            mine = group
    return mine


def _give_cpu_builds_an_nccl_version() -> None:
    # torch's c10d logging wrapper asks for NCCL's version whenever an op on a
    # group that says "nccl" raises; a CPU build has none, and the resulting
    # AttributeError would hide the script's real exception.
    if not hasattr(torch._C, "_nccl_version"):
        torch.cuda.nccl.version = lambda: (0, 0, 0)


class _State:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.requested = "undefined"
        # id(group) -> the pickled object list the real rank last sent on it
        self.sent_objects: dict[int, bytes] = {}


def _marking_batches(runtime: Runtime, original):
    """torch runs a batch on a Python group as separate isend/irecv (it
    coalesces only C++ groups), but an NCCL job runs it as one NCCL group:
    the runtime says which ops one call issued, and the profile records it."""

    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list):
        runtime.num_batches += 1
        runtime.p2p_batch = runtime.num_batches
        try:
            return original(p2p_op_list)
        finally:
            runtime.p2p_batch = 0

    return batch_isend_irecv


def _patch(name: str, function) -> None:
    setattr(c10d, name, function)
    setattr(dist, name, function)


def _warn_ignored(**options) -> None:
    for name, value in options.items():
        if value is not None:
            warnings.warn(f"prism-debug: init_process_group({name}={value!r}) is ignored: "
                          "the emulated rank needs no rendezvous", stacklevel=3)


def _check_identity(what: str, given: int, emulated: int) -> None:
    if given not in (-1, None) and given != emulated:
        warnings.warn(
            f"prism-debug: the script passed {what}={given} to init_process_group; "
            f"it runs as {what} {emulated} as the command line asked", stacklevel=3)


class _ObjectCollectives:
    """Object collectives with object-level mirror semantics.

    Torch sends a pickled payload through tensor collectives; the timing and
    the traffic are those real ops, run through the prism group, while the
    objects a peer would send are the real rank's own.
    """

    def __init__(self, state: _State) -> None:
        self._state = state
        self._originals = {name: getattr(c10d, name) for name in (
            "broadcast_object_list", "all_gather_object", "gather_object",
            "scatter_object_list", "send_object_list", "recv_object_list")}

    @contextlib.contextmanager
    def _mirrored(self):
        values = self._state.runtime.values
        policy, values.policy = values.policy, "mirror"
        try:
            yield
        finally:
            values.policy = policy

    def broadcast_object_list(self, object_list, src=None, group=None, device=None,
                              group_src=None):
        # Mirrored, the root holds what the real rank holds: run the root's side.
        with self._mirrored():
            return self._originals["broadcast_object_list"](
                object_list, src=dist.get_rank(), group=group, device=device)

    def all_gather_object(self, object_list, obj, group=None):
        with self._mirrored():
            return self._originals["all_gather_object"](object_list, obj, group=group)

    def gather_object(self, obj, object_gather_list=None, dst=None, group=None, group_dst=None):
        with self._mirrored():
            return self._originals["gather_object"](
                obj, object_gather_list, dst=dst, group=group, group_dst=group_dst)

    def scatter_object_list(self, scatter_object_output_list, scatter_object_input_list=None,
                            src=None, group=None, group_src=None):
        root = src if src is not None else dist.get_global_rank(
            group or c10d._get_default_group(), group_src or 0)
        if root != dist.get_rank():
            raise UnsupportedOperation(
                f"scatter_object_list from virtual rank {root}: the objects a root "
                "scatters are its own and cannot be mirrored; scatter from the real rank "
                "or broadcast_object_list instead")
        with self._mirrored():
            return self._originals["scatter_object_list"](
                scatter_object_output_list, scatter_object_input_list, src=src,
                group=group, group_src=group_src)

    def send_object_list(self, object_list, dst=None, group=None, device=None,
                         group_dst=None, use_batch=False):
        self._state.sent_objects[id(group)] = pickle.dumps(object_list)
        with self._mirrored():
            return self._originals["send_object_list"](
                object_list, dst=dst, group=group, device=device, group_dst=group_dst,
                use_batch=use_batch)

    def recv_object_list(self, object_list, src=None, group=None, device=None,
                         group_src=None, use_batch=False):
        peer = src if src is not None else dist.get_global_rank(group, group_src)
        # Mirrored, a peer sends what the real rank sends; the latest objects
        # the real rank sent on this group stand for them.
        sent = self._state.sent_objects.get(id(group))
        if sent is None:
            raise UnsupportedOperation(
                f"recv_object_list from virtual rank {peer}: what that rank sends is not "
                "known before the real rank sends objects itself.  For torch.distributed."
                "pipelining, give PipelineStage its input_args/output_args so stages need "
                "no metadata exchange")
        objects = pickle.loads(sent)
        payload = sum(len(pickle.dumps(o)) for o in objects)
        sizes = torch.empty(len(object_list), dtype=torch.long)
        dist.recv(sizes, src=src, group=group, group_src=group_src)
        dist.recv(torch.empty(payload, dtype=torch.uint8), src=src, group=group,
                  group_src=group_src)
        for i in range(len(object_list)):
            object_list[i] = objects[i] if i < len(objects) else None
        return peer
