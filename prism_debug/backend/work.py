"""Work objects and futures that complete on the emulated clock."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
from collections.abc import Callable
from typing import Protocol

import torch.distributed as dist
from torch.futures import Future

from prism_debug.backend.fr_nccl_names import nccl_call_of
from prism_debug.backend.tracker import Completion, OpRecord
from prism_debug.backend.watchdog import TimedOutOp

log = logging.getLogger(__name__)


# set on the harness's own threads that ask the engine for completions (the
# exchange's receivers, agent/real.py): they must never hold the rank's clock
off_clock = threading.local()


class RealSide(Protocol):
    """The real side of a point-to-point op between two real ranks
    (backend/real_ops.py): gloo's Work, or a batch's (``_RealBatch``)."""

    def wait(self) -> object: ...

    def is_completed(self) -> bool: ...


class PrismWork(dist._Work):
    """The handle of one emulated op: done when the emulated clock reaches
    ``done``.  ``wait()`` blocks the calling thread until then."""

    def __init__(self, runtime, done, result: list, *, group=None, seq: int = 0,
                 op: str = "", arrival: float = 0.0, inputs: list | None = None,
                 peer: int | None = None) -> None:
        super().__init__()
        self._runtime = runtime
        # what the watchdog needs to know: the group that issued it (None: no
        # watchdog), the op's number in that group, its name as NCCL tells
        # its variants apart (backend/fr_nccl_names.py), when the rank issued
        # it, and its inputs where they are not its result, for the sizes
        # NCCL prints (its peer: a send's or receive's)
        self.group = group
        self.seq = seq
        self.op = op
        self.arrival = arrival
        self._inputs = inputs
        self._peer = peer
        # a float, or a callable the graph engine answers once the peers' side
        # is known (asked again whenever the engine advances)
        self._deferred = done if callable(done) else None
        self._done = None if callable(done) else done
        self._result = result
        self._future: Future | None = None
        # the group rank a recv came from (not ``source_rank``: that is Work's method)
        self.source: int | None = None
        self.recorded: tuple[int, int] | None = None  # its issue in the program being profiled
        self.record: OpRecord | None = None  # while the iteration's ops are recorded
        # a point-to-point op between two real ranks (backend/real_ops.py): the
        # gloo Work carrying its data, and what to do once the data is there
        self.real_work: RealSide | None = None
        self.on_real_done: Callable[[], None] | None = None

    def _source_rank(self) -> int:
        # torch asks for it after a recv without ``src``.
        if self.source is None:
            raise RuntimeError("source rank is only known for receives")
        return self.source

    def source_rank(self) -> int:
        return self._source_rank()

    def wait(self, timeout=None) -> bool:
        runtime = self._runtime
        if self.real_work is not None:
            self._wait_real()
        done = self.done
        if done == math.inf:
            # not known yet: the engine learns it when a thread issues the ops
            # its peers' side waits for, or another real rank's arrival comes
            # in; or never (a failed peer), and then the deadline below is the
            # watchdog's
            done = self._await_known()
        if self.group is not None and done > self.deadline:
            # it will not finish in time (a peer that never arrives, or very
            # late): the rank sits here until NCCL's watchdog would fire
            runtime.wait_until(self.deadline)
            error = self.expire()
            if error is not None:
                raise error
        waited = runtime.wait_until(done)
        if waited:
            if self.record is not None:
                self.record.waited_s += waited
            if self._deferred is not None:
                runtime.note_wait(waited, self._deferred)
        if self.recorded is not None:
            runtime.recorder.wait(runtime.clock.now(), self.recorded)
            self.recorded = None  # a second wait on the same work waits for nothing
        return True

    def _await_known(self) -> float:
        runtime = self._runtime
        if runtime.real_comms is None:
            return runtime.completer.await_known(self, self.deadline)
        # Another real rank's arrival is on its way: the clock stops where the
        # wait began (for every thread), and once the answer is in it reads the
        # op's completion if the wait was long enough, else where it stopped —
        # the exchange's latency is the harness's, not the job's (agent/real.py).
        clock = runtime.clock
        token = clock.cap()
        done = math.inf
        try:
            done = runtime.completer.await_known(self, self.deadline)
        finally:
            clock.uncap(token, done)
        return done

    def _wait_real(self) -> None:
        """The real peer's side of the op: the harness's time, off the clock
        (the engine says when the op completes on it)."""
        real_work = self.real_work
        assert real_work is not None  # (its callers check)
        clock = self._runtime.clock
        hold, _ = clock.enter()
        try:
            real_work.wait()
            self.real_work = None
            if self.on_real_done is not None:
                self.on_real_done()
                self.on_real_done = None
        finally:
            clock.leave(hold)

    @property
    def done(self) -> float:
        """When the op completes on the emulated clock (inf while the engine
        cannot say; called on a thread that drives the engine)."""
        if self._done is None:
            deferred = self._deferred
            assert deferred is not None  # (one of the two is set from the start)
            # the replay engine's own work is the harness's, not the job's time
            # (asked by a thread of the harness's own, it holds nothing: that
            # thread's work takes no time from the rank's)
            clock = self._runtime.clock
            hold = None if getattr(off_clock, "thread", False) else clock.enter()[0]
            try:
                done = deferred()
            finally:
                clock.leave(hold)
            if done == math.inf:
                # not known yet (the peers' side is still to come) or never (a
                # failed peer): ask again next time rather than keep it
                return done
            self._done = done
            if self.record is not None:
                self.record.done_s = done
        return self._done

    @property
    def known(self) -> float | None:
        """The completion if already known, without asking the engine (any thread)."""
        return self._done

    @property
    def deadline(self) -> float:
        if self.group is None:
            return math.inf
        return self.arrival + self.group.timeout_s

    def timed_out(self) -> TimedOutOp:
        """The op as the watchdog reports it, at its deadline."""
        group = self.group
        call = nccl_call_of(self.op, self._result, self._inputs, group_size=group.size(),
                            group_rank=group.rank(), peer=self._peer)
        return TimedOutOp(
            global_rank=self._runtime.rank, group_rank=group.rank(), pg_id=group.pg_id,
            seq=self.seq, op=self.op, op_type=call.op_type, numel_in=call.numel_in,
            numel_out=call.numel_out,
            timeout_ms=round(group.timeout_s * 1000),
            # the watchdog fires at the deadline on the emulated clock; the
            # thread that reports it may wake a little after it
            ran_for_ms=round((self.deadline - self.arrival) * 1000),
            last_enqueued=group.num_issued, last_completed=self.seq - 1)

    def expire(self) -> Exception | None:
        """Its deadline passed: the watchdog's verdict (it may end the process)."""
        return self._runtime.watchdog.expired(self.timed_out())

    def is_completed(self) -> bool:
        if self.real_work is not None and not self.real_work.is_completed():
            return False
        done = self._done
        if done is None:
            done = self.done if threading.current_thread() is threading.main_thread() \
                else math.inf
        return self._runtime.clock.now() >= done

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        # DDP's reducer waits on this future from C++, where no Python hook
        # can make the rank wait; so the future itself completes only when the
        # emulated op does, set by the completer thread.
        if self._future is None:
            if self.recorded is not None:
                self._runtime.recorder.future_requested(self.recorded)
                self.recorded = None
            self._future = Future()
            self._runtime.completer.complete_at(self._future, self, self._result)
        return self._future


def coalesced_work(runtime, group, works: list[PrismWork]) -> PrismWork:
    """The Work of a batch of ops (``_start_coalescing`` ... ``_end_coalescing``,
    ``batch_isend_irecv``): done when its last op is, watched like any op —
    its deadline is its first op's, the earliest of the batch's, as NCCL
    times a coalesced batch from its launch."""
    if not works:
        return PrismWork(runtime, runtime.clock.now(), [])
    first = works[0]
    known = [t for t in (work.known for work in works) if t is not None]
    # a float when every op's completion is known, else asked at the first wait
    done: Completion = max(known) if len(known) == len(works) \
        else (lambda: max(work.done for work in works))
    # (NCCL's endCoalescing makes its Work with no tensors: NumelIn=0, NumelOut=0)
    batch = PrismWork(runtime, done, [], group=group, seq=works[-1].seq, op="coalesced",
                      arrival=first.arrival)
    real = [work for work in works if work.real_work is not None]
    if real:
        batch.real_work = _RealBatch(real)
    return batch


class _RealBatch:
    """The real sides of a batch's point-to-point ops, waited as one."""

    def __init__(self, works: list[PrismWork]) -> None:
        self._works = works

    def wait(self) -> None:
        for work in self._works:
            if work.real_work is not None:
                work._wait_real()

    def is_completed(self) -> bool:
        return all(w.real_work is None or w.real_work.is_completed() for w in self._works)


class _Pending:
    """A future (or a ``wait()``) the completer looks after."""

    __slots__ = ("future", "value", "work", "done", "deadline", "fired", "completed")

    def __init__(self, future, value, work, done: float, deadline: float) -> None:
        self.future = future
        self.value = value
        self.work = work  # asked again while ``done`` is inf
        self.done = done
        self.deadline = deadline
        self.fired = False  # the watchdog has had its say
        self.completed = False


class FutureCompleter:
    """One daemon thread that sets futures' results at their emulated
    completion times, and calls the watchdog at their deadlines.

    The replay engine is not thread-safe, and this thread never calls it.
    A completion the engine cannot give yet (inf: the peers' side depends on
    ops still to come) is asked again by :meth:`engine_advanced`, which the
    thread that drives the engine calls right after each advance — inside
    the harness's hold of the clock, so this thread, reading the clock,
    never sees a deadline pass that the advance was about to answer.  The
    answers are handed over under this object's lock.
    """

    def __init__(self, clock, on_blocked_wait) -> None:
        self._clock = clock
        self._on_blocked_wait = on_blocked_wait
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._main_tid = threading.main_thread().native_id
        # completions not known yet, asked again as the engine advances; read
        # without the lock on the hot path (a list's truth is atomic)
        self.unknown: list[_Pending] = []

    def complete_at(self, future: Future, done, value) -> None:
        """Complete ``future`` with ``value`` when ``done`` completes: a float
        (no deadline), or a Work (its completion, found out as the engine
        learns it, and its deadline: past it, the watchdog is called — it
        may take the process down).  A future that never completes is left
        pending: failing it would crash torch (DDP's reducer)."""
        work, deadline = None, math.inf
        if isinstance(done, PrismWork):
            work, deadline = done, done.deadline
            done = work.done
        if done <= self._clock.now():
            future.set_result(value)
            return
        entry = _Pending(future, value, work, done, deadline)
        with self._cond:
            if done == math.inf and work is not None:
                self.unknown.append(entry)
            self._schedule(entry)

    def engine_advanced(self) -> None:
        """The engine has advanced (an op issued, an iteration ended): ask
        again the completions it could not give.  Called on the thread that
        drives the engine, never concurrently with another of its calls."""
        with self._cond:
            unknown = list(self.unknown)
        for entry in unknown:
            done = entry.work.done  # the engine call, outside the lock
            if done < math.inf:
                with self._cond:
                    self.unknown.remove(entry)
                    entry.done = done
                    self._schedule(entry)
                    self._cond.notify_all()  # a wait() on it, too

    def await_known(self, work: PrismWork, deadline: float) -> float:
        """Block until the engine learns when ``work`` completes (another
        thread advancing it), or the emulated clock reaches ``deadline``;
        the completion, or inf if still unknown."""
        entry = _Pending(None, None, work, math.inf, math.inf)
        with self._cond:
            self.unknown.append(entry)
            try:
                while entry.done == math.inf and not self._closing:
                    remaining = deadline - self._clock.now()
                    if remaining <= 0:
                        break
                    self._cond.wait(min(remaining, 3600.0))
            finally:
                if entry in self.unknown:
                    self.unknown.remove(entry)
        return entry.done

    def _schedule(self, entry: _Pending) -> None:
        # (called with the lock) the next moment this entry needs the thread
        if entry.future is None:
            return  # a wait() watching for the answer: nothing to complete
        wake = entry.done if entry.fired else min(entry.done, entry.deadline)
        if wake == math.inf:
            return  # never: the op hangs, as NCCL's would, with no watchdog to fire
        heapq.heappush(self._heap, (wake, next(self._seq), entry))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="prism-futures", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread and wait for it, before the interpreter finalises.

        A daemon thread still running at finalisation is torn down wherever it
        is; inside torch's C++ (``set_result`` runs DDP's callbacks) that is a
        ``std::terminate`` and the rank dies of SIGABRT after a clean exit.
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                wake = self._heap[0][0]
                remaining = wake - self._clock.now()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                _, _, entry = heapq.heappop(self._heap)
                if entry.completed:
                    continue
                done = entry.done
                timed_out = not entry.fired and done > entry.deadline
                if timed_out:
                    entry.fired = True
                    self._schedule(entry)  # at its completion, if ever known
                elif done > wake:
                    continue  # a stale wake-up: a later one is queued
                else:
                    entry.completed = True
            if timed_out:
                try:
                    entry.work.expire()
                except Exception:
                    log.exception("prism-debug: the watchdog failed")
                continue
            try:
                self._on_blocked_wait(done, self._main_thread_waits_on_a_future())
                entry.future.set_result(entry.value)
            except Exception:  # this thread completes every future: it must live on
                log.exception("prism-debug: completing a collective's future failed")

    def _main_thread_waits_on_a_future(self) -> bool:
        """Whether the script's main thread is blocked on a futex — waiting on
        a future in C++, as DDP's reducer does — rather than computing,
        sleeping or reading files.  Linux only (``/proc``); elsewhere such
        waits go uncounted in ``comm_wait_s``."""
        try:
            with open(f"/proc/self/task/{self._main_tid}/wchan", "rb") as wchan:
                return wchan.read().startswith(b"futex")
        except OSError:
            return False



def flat_tensors(result) -> list:
    """The tensors in a result list (lists of lists for gathers)."""
    flat = []
    for item in result:
        if isinstance(item, (list, tuple)):
            flat.extend(flat_tensors(item))
        elif hasattr(item, "numel"):
            flat.append(item)
    return flat


def nbytes(tensors) -> int:
    """The bytes of an op's tensors."""
    if len(tensors) == 1:  # the common case, without a generator
        return tensors[0].nbytes
    return sum(t.nbytes for t in tensors)


def split_chunks(tensor, sizes, n: int) -> list:
    """``all_to_all_single``'s chunks of ``tensor``: by ``sizes``, else n equal ones."""
    if sizes:
        return list(tensor.split(list(sizes)))
    if tensor.shape[0] % n:
        raise ValueError(f"all_to_all_single: dim 0 of size {tensor.shape[0]} is not divisible "
                         f"by the group size {n}; pass split sizes")
    return list(tensor.chunk(n))
