"""Work objects and futures that complete on the emulated clock."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time

import torch.distributed as dist
from torch.futures import Future

from prism_debug.backend.tracker import OpRecord
from prism_debug.backend.watchdog import TimedOutOp

log = logging.getLogger(__name__)


class PrismWork(dist._Work):
    """The handle of one emulated op: done when the emulated clock reaches
    ``done``.  ``wait()`` blocks the calling thread until then."""

    def __init__(self, runtime, done, result: list, *, group=None, seq: int = 0,
                 op: str = "", arrival: float = 0.0) -> None:
        super().__init__()
        self._runtime = runtime
        # what the watchdog needs to know: the group that issued it (None for
        # a coalesced batch's own Work: the watchdog watches its ops), the op's
        # number in that group, its name, and when the rank issued it
        self.group = group
        self.seq = seq
        self.op = op
        self.arrival = arrival
        # a float, or a callable the graph engine answers once the peers' side
        # is known (resolved at the first wait)
        self._deferred = done if callable(done) else None
        self._done = None if callable(done) else done
        self._result = result
        self._future: Future | None = None
        self.source_rank: int | None = None  # group rank a recv came from
        self.recorded: tuple[int, int] | None = None  # its issue in the program being profiled
        self.record: OpRecord | None = None  # while the iteration's ops are recorded

    def _source_rank(self) -> int:
        # torch asks for it after a recv without ``src``.
        if self.source_rank is None:
            raise RuntimeError("source rank is only known for receives")
        return self.source_rank

    def wait(self, timeout=None) -> bool:
        runtime = self._runtime
        done = self.done
        if self.group is not None and done > self.deadline:
            # it will not finish in time (a peer that never arrives, or very
            # late): the rank sits here until NCCL's watchdog would fire
            runtime.wait_until(self.deadline)
            error = runtime.watchdog.expired(self.timed_out())
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

    @property
    def done(self) -> float:
        """When the op completes on the emulated clock."""
        if self._done is None:
            # the replay engine's own work is the harness's, not the job's time
            started = time.perf_counter()
            done = self._deferred()
            self._runtime.clock.exclude_since(started)
            if done == math.inf:
                # not known yet (the peers' side is still to come) or never (a
                # failed peer): ask again next time rather than keep it
                return done
            self._done = done
            if self.record is not None:
                self.record.done_s = done
        return self._done

    @property
    def deadline(self) -> float:
        return self.arrival + self.group.timeout_s

    def timed_out(self) -> TimedOutOp:
        """The op as the watchdog reports it, at its deadline."""
        group = self.group
        numel = sum(t.numel() for t in flat_tensors(self._result))
        return TimedOutOp(
            global_rank=self._runtime.rank, group_rank=group.rank(), pg_id=group.pg_id,
            seq=self.seq, op=self.op, numel_in=numel, numel_out=numel,
            timeout_ms=round(group.timeout_s * 1000),
            # the watchdog fires at the deadline on the emulated clock; the
            # thread that reports it may wake a little after it
            ran_for_ms=round((self.deadline - self.arrival) * 1000),
            last_enqueued=group.num_issued, last_completed=self.seq - 1)

    def is_completed(self) -> bool:
        return self._runtime.clock.now() >= self.done

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
            if self.group is None:
                self._runtime.completer.complete_at(self._future, self.done, self._result)
            else:
                runtime = self._runtime
                self._runtime.completer.complete_at(
                    self._future, self.done, self._result, self.deadline,
                    lambda: runtime.watchdog.expired(self.timed_out()))
        return self._future


class FutureCompleter:
    """One daemon thread that sets futures' results at their emulated
    completion times, in deadline order."""

    def __init__(self, clock, on_blocked_wait) -> None:
        self._clock = clock
        self._on_blocked_wait = on_blocked_wait
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._main_tid = threading.main_thread().native_id

    def complete_at(self, future: Future, done: float, value, deadline: float = math.inf,
                    on_timeout=None) -> None:
        """Complete ``future`` with ``value`` at ``done``; if that is past
        ``deadline``, call ``on_timeout`` then instead (the watchdog: it may
        take the process down).  A future that never completes is left
        pending: failing it would crash torch (DDP's reducer)."""
        if done <= self._clock.now():
            future.set_result(value)
            return
        wake = min(done, deadline)
        if wake == math.inf:
            return  # never: the op hangs, as NCCL's would, with no watchdog to fire
        with self._cond:
            heapq.heappush(self._heap, (wake, next(self._seq), future, value, done, on_timeout))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="prism-futures", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Stop the thread and wait for it, before the interpreter finalises.

        A daemon thread still running at finalisation is torn down wherever it
        is; inside torch's C++ (``set_result`` runs DDP's callbacks) that is a
        ``std::terminate`` and the rank dies of SIGABRT after a clean exit.
        """
        with self._cond:
            self._closing = True
            self._cond.notify()
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
                _, _, future, value, done, on_timeout = heapq.heappop(self._heap)
            if done > wake:  # its deadline, not its completion
                try:
                    on_timeout()
                except Exception:
                    log.exception("prism-debug: the watchdog failed")
                if done < math.inf:
                    with self._cond:
                        heapq.heappush(self._heap, (done, next(self._seq), future, value,
                                                    done, None))
                continue
            try:
                self._on_blocked_wait(done, self._main_thread_waits_on_a_future())
                future.set_result(value)
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
