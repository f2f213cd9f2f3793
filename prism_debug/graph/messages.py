"""What ranks tell each other outside the tensor data path, kept in the graph.

``torch.distributed.pipelining`` infers stage shapes by sending objects
between neighbouring stages (``send_object_list``) after a warm-up vote of
one-element integer tensors.  A virtual peer cannot make those up: what a
stage sends depends on its own model.  So profiling records every message a
slice sends — pickled object lists, and small integer tensors (control
values: votes, flags, sizes) — and a virtual peer of that class "sends"
exactly that at run time.

A message is keyed by the iteration, the receiver's rank minus the sender's
(so one class's messages serve every rank of the class) and its order among
the sender's messages of that kind to that receiver within the iteration; a
receive matches the send of the same order.  Iterations after the profiled
ones use the last profiled iteration's messages (the steady state).

Payloads stay bytes here: unpickling happens only in the real rank, at the
``recv_object_list`` that asks for it (see ``backend/install.py``).  Pure:
no torch.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

OBJECTS = "objects"  # a send_object_list: the pickled list
TENSOR = "tensor"  # a small integer tensor sent point to point: its raw bytes
KINDS = (OBJECTS, TENSOR)
# integer and boolean tensors up to this size are control values, recorded whole
MAX_CONTROL_BYTES = 256
# a slice's exit code when it needs a message no profiled slice has sent yet
NEEDS_MESSAGES_EXIT = 3


#: a message as a graph file holds it: iteration, peer_delta, kind, order,
#: base64 payload, dtype, shape
MessageRow = list[int | str | list[int]]


@dataclasses.dataclass(frozen=True)
class PeerMessage:
    iteration: int  # 1-based, as optimizer steps
    peer_delta: int  # the receiver's global rank minus the sender's
    kind: str  # OBJECTS or TENSOR
    order: int  # among the sender's messages of this kind to this receiver in the iteration
    payload: bytes
    dtype: str = ""  # TENSOR: its dtype ("int32")
    shape: tuple[int, ...] = ()  # TENSOR: its shape

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown message kind {self.kind!r}")

    @property
    def key(self) -> tuple[int, int, str, int]:
        return (self.iteration, self.peer_delta, self.kind, self.order)

    def to_list(self) -> MessageRow:
        return [self.iteration, self.peer_delta, self.kind, self.order,
                base64.b64encode(self.payload).decode("ascii"), self.dtype, list(self.shape)]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> PeerMessage:
        """The message :meth:`to_list` wrote (JSON: the caller checks its values)."""
        iteration, delta, kind, order, payload, dtype, shape = row
        return cls(int(iteration), int(delta), str(kind), int(order),
                   base64.b64decode(payload, validate=True), str(dtype), tuple(shape))


class MessageCounter:
    """Numbers one rank's messages: the order of each among those of its
    kind to (or from) the same peer in the same iteration."""

    def __init__(self) -> None:
        self._counts: dict[tuple[int, int, str], int] = {}

    def next(self, iteration: int, peer_delta: int, kind: str) -> int:
        key = (iteration, peer_delta, kind)
        order = self._counts.get(key, 0)
        self._counts[key] = order + 1
        return order


@dataclasses.dataclass(frozen=True)
class MissingMessage:
    """A receive no known message answers (the slice needs another class first)."""

    iteration: int
    peer: int  # the sender's global rank
    peer_class: int
    peer_delta: int
    kind: str
    order: int

    def to_dict(self) -> dict[str, int | str]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        what = "objects (send_object_list)" if self.kind == OBJECTS else "a control tensor"
        return (f"{what} #{self.order} that rank {self.peer} sends {self.peer_delta:+d} ranks "
                f"away in iteration {self.iteration}")


class MessageBook:
    """The messages virtual peers send, by class, and the matching of the
    real rank's receives to them.

    ``class_of`` maps a global rank to its class; ``iterations`` is how many
    iterations were profiled (later ones use the last).  ``known`` are the
    classes whose messages are all here: a receive from another class that
    finds nothing is *missing* (profiling runs that class first), from a
    known class it finds ``None`` (the caller falls back to mirroring).
    """

    def __init__(self, class_of: Callable[[int], int], iterations: int,
                 messages: Mapping[int, Iterable[PeerMessage]], known: Iterable[int]) -> None:
        self.class_of = class_of
        self.iterations = max(1, iterations)
        self.known = set(known)
        self._by_class: dict[int, dict[tuple[int, int, str, int], PeerMessage]] = {
            c: {m.key: m for m in ms} for c, ms in messages.items()}
        self._received = MessageCounter()

    def add(self, class_id: int, message: PeerMessage) -> None:
        """A message a rank of ``class_id`` sent (the slice's own, while profiling)."""
        self._by_class.setdefault(class_id, {})[message.key] = message

    def receive(self, iteration: int, rank: int, peer: int,
                kind: str) -> PeerMessage | MissingMessage | None:
        """What ``peer`` sends ``rank`` next of ``kind`` in ``iteration``."""
        delta = rank - peer
        order = self._received.next(iteration, delta, kind)
        peer_class = self.class_of(peer)
        looked_up = min(iteration, self.iterations)
        found = self._by_class.get(peer_class, {}).get((looked_up, delta, kind, order))
        if found is not None:
            return found
        if peer_class in self.known:
            return None
        return MissingMessage(iteration, peer, peer_class, delta, kind, order)


def messages_to_json(messages: Mapping[int, Iterable[PeerMessage]]
                     ) -> dict[str, list[MessageRow]]:
    return {str(c): [m.to_list() for m in ms] for c, ms in messages.items()}


def messages_from_json(data: Mapping[str, Iterable[Sequence[Any]]]
                       ) -> dict[int, tuple[PeerMessage, ...]]:
    return {int(c): tuple(PeerMessage.from_list(row) for row in rows)
            for c, rows in data.items()}
