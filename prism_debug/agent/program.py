"""Records the real rank's program while profiling a slice (pure: no torch).

Every op issued, every wait and every iteration end becomes an event with
the compute gap since the rank's previous event, on the emulated clock.
Collectives complete at once while profiling (the ``zero`` hardware), so the
gaps are the rank's own compute.  Futures awaited inside C++ (DDP's reducer)
leave no wait to see: they are taken as awaited at the next optimizer step,
which is where DDP's backward ends.  A wait for an op of an earlier
iteration is not recorded: programs describe one iteration, and the op's
completion was long settled when the wait came.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from prism_debug.graph.build import RecordedEnd, RecordedEvent, RecordedIssue, RecordedWait
from prism_debug.graph.messages import (
    MessageBook,
    PeerMessage,
    messages_from_json,
    messages_to_json,
)


class ProgramRecorder:
    def __init__(self, start: float) -> None:
        self._last = start
        self._events: list[RecordedEvent] = []
        self._issues = 0
        self._iteration = 0
        self._futures: list[tuple[int, int]] = []  # issues awaited out of sight
        self._batch = 0  # the runtime's number of the last batch seen
        self._batches = 0  # batches this iteration

    def _gap(self, now: float) -> float:
        gap, self._last = max(0.0, now - self._last), now
        return gap

    def issue(self, now: float, kind: str, family: str, nbytes: int, dtype: str,
              peer_delta: int = 0, batch: int = 0) -> tuple[int, int]:
        """Record an issue; returns the token :meth:`wait` takes.  ``batch``:
        the runtime's number of the batch_isend_irecv that issued it (0: none),
        renumbered from 1 in each iteration so that iterations compare."""
        if batch:
            if batch != self._batch:
                self._batch, self._batches = batch, self._batches + 1
            batch = self._batches
        self._events.append(RecordedIssue(self._gap(now), kind, family, nbytes, dtype, peer_delta,
                                          batch))
        self._issues += 1
        return self._iteration, self._issues - 1

    def wait(self, now: float, token: tuple[int, int]) -> None:
        iteration, issue = token
        if iteration == self._iteration:
            self._events.append(RecordedWait(self._gap(now), issue))

    def future_requested(self, token: tuple[int, int]) -> None:
        self._futures.append(token)

    def step(self, now: float) -> None:
        """An optimizer step begins: outstanding futures were awaited by now."""
        for issue in self._futures:
            self.wait(now, issue)
        self._futures.clear()

    def end(self, now: float) -> list[list]:
        """Close the iteration; its events as JSON-ready lists."""
        self.step(now)
        self._events.append(RecordedEnd(self._gap(now)))
        events = [[type(e).__name__, *dataclasses.astuple(e)] for e in self._events]
        self._events, self._issues, self._batches = [], 0, 0
        self._iteration += 1
        return events


def events_from_json(rows: list[list]) -> tuple[RecordedEvent, ...]:
    kinds = {cls.__name__: cls for cls in (RecordedIssue, RecordedWait, RecordedEnd)}
    return tuple(kinds[row[0]](*row[1:]) for row in rows)


# -- what a slice is told of the other classes' messages -------------------------------

MESSAGES_ENV = "PRISM_DEBUG_PEER_MESSAGES"  # names the JSON file profiling writes


def write_slice_messages(path: Path, *, class_stride: int, num_classes: int, iterations: int,
                         known: Iterable[int], messages: dict[int, Iterable[PeerMessage]]) -> None:
    """What the next slice may receive: the messages of the classes profiled
    so far (``known``: those whose runs completed, plus the slice's own)."""
    path.write_text(json.dumps({
        "class_stride": class_stride, "num_classes": num_classes, "iterations": iterations,
        "known": sorted(known), "messages": messages_to_json(messages)}))


def slice_book(path: str | None) -> MessageBook:
    """The book a profiled slice receives from.  Without a file (the first
    slice: the mesh is not known yet) every message it receives is missing: the
    slice stops at the first, and profiling runs it again once the layout is
    known."""
    if path is None:
        return MessageBook(lambda rank: -1, 0, {}, known=())
    data = json.loads(Path(path).read_text())
    stride, count = data["class_stride"], data["num_classes"]
    # (a dict of its own: the book takes a dict of any iterables, and dicts are invariant)
    messages: dict[int, Iterable[PeerMessage]] = dict(messages_from_json(data["messages"]))
    return MessageBook(lambda rank: (rank // stride) % count, data["iterations"], messages,
                       known=data["known"])
