"""Install the prism backend into torch.distributed, without touching the script.

* ``init_process_group`` with any backend name builds the prism default group
  on an in-process store, while ``dist.get_backend()`` still answers what the
  script asked for ("nccl", "cpu:gloo,cuda:nccl", ...).
* Every later ``new_group`` reaches :meth:`PrismProcessGroup.new_group`
  through the default group (torch delegates to it), members or not.
* Object collectives use mirror semantics at the object level: a peer holds
  the objects the real rank holds.  Pickled payloads cannot be zeros or noise.
* Except for what a peer *sends* point to point, which depends on the peer's
  own model (pipelining's shape metadata and its warm-up vote): with
  :class:`Messages`, ``send_object_list`` and sends of small integer tensors are
  recorded while profiling, and ``recv_object_list`` / ``recv`` from a
  virtual peer get what that peer's class really sent (graph/messages.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import io
import logging
import pickle
import warnings
from collections.abc import Callable
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from prism_debug.backend.process_group import PrismProcessGroup
from prism_debug.backend.real_comms import RealComms
from prism_debug.backend.runtime import Runtime
from prism_debug.errors import UnsupportedOperation
from prism_debug.graph import WORLD_FAMILY, GroupRef
from prism_debug.graph.messages import (
    MAX_CONTROL_BYTES,
    OBJECTS,
    TENSOR,
    MessageBook,
    MessageCounter,
    MissingMessage,
    PeerMessage,
)

log = logging.getLogger(__name__)

BACKEND = "prism"
NCCL_DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)
OTHER_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


@dataclasses.dataclass(frozen=True)
class Messages:
    """What virtual peers send the real rank (``book``), and, while profiling,
    where the real rank's own messages go (``on_sent``) and what ends a slice
    that needs a message no profiled slice has sent yet (``on_missing``)."""

    book: MessageBook
    on_sent: Callable[[PeerMessage], None] | None = None
    # (the message, and the family of the group it was to come on)
    on_missing: Callable[[MissingMessage, str], NoReturn] | None = None


def install(runtime: Runtime, on_init: Callable[[str], None],
            messages: Messages | None = None) -> None:
    """Patch torch.distributed so that the script's groups are prism groups.

    ``on_init(requested_backend)`` runs once the default group exists;
    ``messages``: see :class:`Messages` (None: peers mirror the real rank).
    """
    state = _State(runtime, messages)

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
        if runtime.side_store is not None and runtime.real_comms is None:
            # before the default group, which is the first to get real members
            runtime.real_comms = RealComms(runtime.side_store, runtime.real_ranks,
                                           runtime.rank, timeout)
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
        if runtime.real_comms is not None:
            runtime.real_comms.meet()  # the real ranks start the job's time together
            runtime.clock.rebase()
        on_init(requested)

    _patch("init_process_group", init_process_group)
    _patch("split_group", _split_group)
    _patch("batch_isend_irecv", _marking_batches(runtime, c10d.batch_isend_irecv))
    objects = _ObjectCollectives(state)
    for name in ("broadcast_object_list", "all_gather_object", "gather_object",
                 "scatter_object_list", "send_object_list", "recv_object_list"):
        _patch(name, getattr(objects, name))
    if messages is not None:
        _patch("send", objects.send)
        _patch("recv", objects.recv)
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
    def __init__(self, runtime: Runtime, messages: Messages | None) -> None:
        self.runtime = runtime
        self.requested = "undefined"
        # id(group) -> the pickled object list the real rank last sent on it
        self.sent_objects: dict[int, bytes] = {}
        self.messages = messages
        self.sent = MessageCounter()
        # inside an object collective, whose own size tensors are no messages
        self.in_objects = False


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
        self._p2p = {"send": c10d.send, "recv": c10d.recv}

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
        state = self._state
        state.sent_objects[id(group)] = pickle.dumps(object_list)
        if state.messages is not None and state.messages.on_sent is not None:
            peer = dst if dst is not None else dist.get_global_rank(group, group_dst)
            self._record(peer, OBJECTS, state.sent_objects[id(group)])
        state.in_objects = True
        try:
            with self._mirrored():
                return self._originals["send_object_list"](
                    object_list, dst=dst, group=group, device=device, group_dst=group_dst,
                    use_batch=use_batch)
        finally:
            state.in_objects = False

    def recv_object_list(self, object_list, src=None, group=None, device=None,
                         group_src=None, use_batch=False):
        peer = src if src is not None else dist.get_global_rank(group, group_src)
        message = self._message(peer, OBJECTS, group)
        # What that peer's class really sent; without one, mirrored: a peer
        # sends what the real rank sends, and the latest objects the real rank
        # sent on this group stand for them.
        sent = message.payload if message is not None else self._state.sent_objects.get(
            id(group))
        if sent is None:
            raise UnsupportedOperation(
                f"recv_object_list from virtual rank {peer}: what that rank sends is not "
                "known before the real rank sends objects itself.  Run with a graph "
                "(prism-debug profile records what every pipeline stage sends), or, for "
                "torch.distributed.pipelining, give PipelineStage its input_args/output_args "
                "so stages need no metadata exchange")
        objects = pickle.loads(sent)
        # the bytes torch's own send_object_list puts on the wire for them
        payload = sum(len(_torch_pickle(o)) for o in objects)
        sizes = torch.empty(len(object_list), dtype=torch.long)
        self._p2p["recv"](sizes, src=src, group=group, group_src=group_src)
        self._p2p["recv"](torch.empty(payload, dtype=torch.uint8), src=src, group=group,
                          group_src=group_src)
        for i in range(len(object_list)):
            object_list[i] = objects[i] if i < len(objects) else None
        return peer

    # -- control tensors (installed with Messages only) ------------------------------

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        state = self._state
        if (state.messages.on_sent is not None and not state.in_objects
                and _is_control(tensor)):
            peer = dst if dst is not None else dist.get_global_rank(group, group_dst)
            self._record(peer, TENSOR, tensor.detach().cpu().contiguous().numpy().tobytes(),
                         str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        return self._p2p["send"](tensor, dst=dst, group=group, tag=tag, group_dst=group_dst)

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        if src is None and group_src is None or self._state.in_objects \
                or not _is_control(tensor):
            return self._p2p["recv"](tensor, src=src, group=group, tag=tag, group_src=group_src)
        peer = src if src is not None else dist.get_global_rank(group, group_src)
        message = self._message(peer, TENSOR, group)
        result = self._p2p["recv"](tensor, src=src, group=group, tag=tag, group_src=group_src)
        dtype = str(tensor.dtype).removeprefix("torch.")
        if message is not None and message.dtype == dtype \
                and message.shape == tuple(tensor.shape):
            received = torch.frombuffer(bytearray(message.payload), dtype=tensor.dtype)
            tensor.copy_(received.view(tensor.shape))
        return result

    # -- messages ---------------------------------------------------------------------

    def _record(self, peer: int, kind: str, payload: bytes, dtype: str = "",
                shape: tuple = ()) -> None:
        state = self._state
        messages = state.messages
        assert messages is not None and messages.on_sent is not None  # (its callers check)
        iteration = state.runtime.tracker.iteration
        delta = peer - state.runtime.rank
        order = state.sent.next(iteration, delta, kind)
        messages.on_sent(PeerMessage(iteration, delta, kind, order, payload, dtype, shape))

    def _message(self, peer: int, kind: str, group) -> PeerMessage | None:
        """What ``peer``'s class sends here next (None: not known, mirror)."""
        messages = self._state.messages
        if messages is None:
            return None
        runtime = self._state.runtime
        found = messages.book.receive(runtime.tracker.iteration, runtime.rank, peer, kind)
        if isinstance(found, MissingMessage):
            if messages.on_missing is None:
                return None
            ref = getattr(group or c10d._get_default_group(), "ref", None)
            messages.on_missing(found, ref.family if ref is not None else WORLD_FAMILY)
        return found


def _torch_pickle(obj) -> bytes:
    buffer = io.BytesIO()
    c10d._pickler(buffer).dump(obj)
    return buffer.getvalue()


def _is_control(tensor) -> bool:
    """Integer and boolean tensors this small carry control values (votes,
    flags, sizes) that steer the script, not data."""
    return (isinstance(tensor, torch.Tensor) and not tensor.is_floating_point()
            and not tensor.is_complex() and tensor.nbytes <= MAX_CONTROL_BYTES)
