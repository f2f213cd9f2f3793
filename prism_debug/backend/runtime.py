"""State the prism process groups of one real rank share."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable

import torch

from prism_debug.backend.hooks import (
    FlightHook,
    PeerFaultsHook,
    RecorderHook,
    WatchdogHook,
    WatchHook,
)
from prism_debug.backend.peer_faults import PeerFaults
from prism_debug.backend.real_comms import RealComms, SideStore
from prism_debug.backend.tracker import IterationTracker
from prism_debug.backend.values import Values
from prism_debug.backend.watchdog import ErrorHandling, Watchdog
from prism_debug.backend.work import FutureCompleter, flat_tensors
from prism_debug.engine import EmulatedClock, Engine
from prism_debug.graph import FamilyRecorder


@dataclasses.dataclass(eq=False)
class Runtime:
    rank: int
    world_size: int
    clock: EmulatedClock
    engine: Engine
    values: Values
    tracker: IterationTracker
    families: FamilyRecorder
    digests: bool = True
    # Called at the next harness entry once ``stop_requested`` is set: the
    # agent stops the script there when --iterations are done.
    stop_check: Callable[[], None] = lambda: None
    stop_requested: bool = dataclasses.field(default=False, init=False)
    # set while profiling a slice: records the rank's program (agent/program.py)
    recorder: RecorderHook | None = None
    longest_wait: tuple | None = dataclasses.field(default=None, init=False)
    # the debugger, while it watches collectives (breakpoints, stepping,
    # events): ``enter`` may pause and returns the wall seconds it did
    watch: WatchHook | None = dataclasses.field(default=None, init=False)
    # overrides every group's timeout (a scenario's), in seconds
    collective_timeout_s: float | None = None
    # what NCCL's watchdog does at an op's deadline (backend/watchdog.py); by
    # default as the environment says
    watchdog: WatchdogHook = dataclasses.field(
        default_factory=lambda: Watchdog(ErrorHandling.from_env()))
    # what faulty peers hand the real rank (nan, inf, corrupt); None: the
    # rank's own PeerFaults, made in __post_init__ (it needs the rank)
    peer_faults: PeerFaultsHook = None  # type: ignore[assignment]
    # the flight recorder (backend/fr_recorder.py), when the env turns it on
    flight: FlightHook | None = None
    # called once with the iteration in which the rank first hands a collective
    # a NaN or inf of its own (None: nobody asks, nothing is checked)
    on_nonfinite: Callable[[int], None] | None = None
    # several real ranks (--ranks): where they meet, and who they are; the
    # communicators among them, made at init_process_group (backend/real_comms.py)
    side_store: SideStore | None = None
    real_ranks: tuple[int, ...] = ()
    real_comms: RealComms | None = dataclasses.field(default=None, init=False)
    _num_groups: int = dataclasses.field(default=0, init=False)
    # the batch_isend_irecv call issuing ops now (its number), 0 outside one
    p2p_batch: int = dataclasses.field(default=0, init=False)
    num_batches: int = dataclasses.field(default=0, init=False)
    completer: FutureCompleter = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.completer = FutureCompleter(self.clock, self._future_completed)
        self._last_activity = self.clock.now()
        if self.peer_faults is None:
            self.peer_faults = PeerFaults(self.rank, frozenset(self.real_ranks))

    def next_group_id(self) -> int:
        """Process groups are numbered as torch numbers them: 0 is the default."""
        self._num_groups += 1
        return self._num_groups - 1

    def mark_activity(self, now: float) -> None:
        """The script just entered the harness at ``now``."""
        self._last_activity = now
        if self.stop_requested:
            self.stop_check()

    def wait_until(self, done: float) -> float:
        """Block the caller until the emulated clock reads ``done``; the time waited."""
        clock = self.clock
        start = clock.now()
        if start >= done:  # the common case for cheap ops: nothing to wait for
            return 0.0
        waited = clock.wait_until(done)
        self.tracker.waited(start, waited)
        return waited

    def note_wait(self, waited: float, op) -> None:
        """Keep the iteration's longest wait, to name who it waited for."""
        if self.longest_wait is None or waited > self.longest_wait[0]:
            self.longest_wait = (waited, op)

    def _future_completed(self, done: float, main_thread_blocked: bool) -> None:
        # A future awaited inside C++ (DDP's reducer) blocks the main thread
        # without passing through Python.  If the main thread sleeps when the
        # op completes, it has been waiting since its last entry into the
        # harness (or since the op was issued, whichever is later).
        if main_thread_blocked:
            since = self._last_activity
            self.tracker.waited(since, max(0.0, done - since))
            self._last_activity = done  # counted up to here; don't count it twice

    def inputs(self, tensors) -> None:
        """The rank hands ``tensors`` to a collective: digest them, and look
        for the first NaN or inf of its own when asked to."""
        if self.on_nonfinite is not None and _nonfinite(tensors):
            report, self.on_nonfinite = self.on_nonfinite, None
            report(self.tracker.iteration)
        if self.digests:
            _fold(self.tracker.hasher.update, tensors)

    def digest(self, tensors) -> None:
        """Fold the values of ``tensors`` into this iteration's digest."""
        if self.digests:
            _fold(self.tracker.hasher.update, tensors)


def _fold(update, tensors) -> None:
    for tensor in tensors:
        if tensor.is_cpu and tensor.is_contiguous():
            nbytes = tensor.nbytes
            if nbytes:
                buffer_type = _BUFFER_TYPES.get(nbytes)
                if buffer_type is None:
                    buffer_type = _buffer_type(nbytes)
                update(buffer_type.from_address(tensor.data_ptr()))
        else:
            update(tensor_bytes(tensor))


def _nonfinite(tensors) -> bool:
    return any(t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all())
               for t in flat_tensors(tensors))


# nbytes -> the ctypes array type that views a buffer of that size (a plain
# dict on the hot path: an lru_cache call costs more than the lookup)
_BUFFER_TYPES: dict[int, type[ctypes.Array[ctypes.c_ubyte]]] = {}


def _buffer_type(nbytes: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    if len(_BUFFER_TYPES) >= 1024:  # a script of ever-new sizes: start afresh
        _BUFFER_TYPES.clear()
    buffer_type = _BUFFER_TYPES[nbytes] = ctypes.c_ubyte * nbytes
    return buffer_type


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's values as bytes: the slow path, for device and strided tensors.

    (Contiguous CPU tensors are hashed in place, through a ctypes view of their
    memory: 3-4x cheaper than the chain of torch calls below.)
    """
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8).numpy().data
