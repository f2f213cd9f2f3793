"""What faulty virtual peers hand the real rank: NaN, inf, or corrupted data.

A ``nan``, ``inf`` or ``corrupt`` perturbation acts on the real rank's
collectives whose group holds one of its ranks, within its window (iteration
and collective, counted as the real rank counts them) and, when it names one,
on that family only.  What the real rank receives changes as the peer's
contribution would change it:

* reductions (all-reduce, the root's reduce, reduce-scatter): the backend's
  values policy reduces the real rank's contribution with the peers', a
  faulty peer's spoiled (NaN, +inf, or its policy contribution times the
  scale), on NCCL's arithmetic (``Values.reduce_peers`` with
  :meth:`PeerFaults.reduction`): a NaN spreads through SUM/AVG/PRODUCT but
  loses to numbers under MIN/MAX (``fmaxf``), a scaled zero (``zeros``) is
  zero; a ``reduce`` leaves a non-root rank's buffer as it was (NCCL writes
  ``recvbuff`` on the root only);
* gathers, all-to-all, broadcast from, receive from, scatter from a faulty
  peer: that peer's block is NaN, inf, or scaled.

Integer tensors are left alone (they hold no NaN; corrupt control values are
another failure).  Only direct contributions are modelled: a NaN that a
faulty peer passes to a third rank reaches the real rank only through the
real rank's own later collectives with that rank when it is selected too.
"""

from __future__ import annotations

import math

import torch

from prism_debug.backend.work import flat_tensors
from prism_debug.faults import VALUE_ACTIONS, Action, CorruptFault, Fault, Injection

_REDUCTIONS = frozenset({"all_reduce", "reduce", "reduce_scatter"})


class PeerFaults:
    def __init__(self, rank: int, real_ranks: frozenset[int] = frozenset()) -> None:
        self.rank = rank  # the real rank: never its own faulty peer
        self._real = real_ranks | {rank}  # nor any other real rank (--ranks)
        self.active: tuple[Injection, ...] = ()  # the value faults, for the hot path's test
        self._version = 0  # bumped by set(): each group keeps its members found for one

    def set(self, injections) -> None:
        """The faults in force (all kinds; the value ones are kept)."""
        self.active = tuple(i for i in injections if i.action in VALUE_ACTIONS)
        self._version += 1

    def _in_group(self, pg) -> list[tuple[Fault, list[int], _Spoil]]:
        """Each fault with members of ``pg``, their group ranks, and what it does
        to a contribution (kept on the group until the faults change)."""
        version, kept = getattr(pg, "_prism_faulty_members", (-1, []))
        if version == self._version:
            return kept
        index = {rank: i for i, rank in enumerate(pg.global_ranks)}
        found: list[tuple[Fault, list[int], _Spoil]] = []
        for injection in self.active:
            members = sorted(index[r] for r in injection.targets
                             if r in index and r not in self._real)
            if members:
                found.append((injection.fault, members, _Spoil.of(injection.fault)))
        pg._prism_faulty_members = (self._version, found)
        return found

    def _acting(self, pg, iteration: int, collective: int):
        for fault, members, spoil in self._in_group(pg):
            if fault.family is not None and fault.family != pg.ref.family:
                continue
            if fault.covers(iteration, collective):
                yield members, spoil

    def reduction(self, pg, iteration: int, collective: int) -> tuple[tuple[int, str, float], ...]:
        """The faulty peers of a reduction in ``pg`` now, for ``Values.reduce_peers``:
        (group rank, "nan" | "inf" | "corrupt", scale), each peer once (the first
        fault that hits it wins, as it would spoil the contribution first)."""
        if not self.active:
            return ()
        found: dict[int, tuple[int, str, float]] = {}
        for members, spoil in self._acting(pg, iteration, collective):
            for member in members:
                found.setdefault(member, (member, str(spoil.action), spoil.scale))
        return tuple(found[m] for m in sorted(found))

    def apply(self, pg, op: str, result: list, iteration: int, collective: int,
              source: int | None = None) -> bool:
        """Change ``result`` (the op's outputs) as the faulty peers would; whether
        anything changed.  ``source`` is the group rank data came from (broadcast
        root, receive peer, scatter root).  Reductions take their faulty peers
        in the reduction itself (:meth:`reduction`): here they are left alone."""
        if op in _REDUCTIONS:
            return False
        changed = False
        for members, spoil in self._acting(pg, iteration, collective):
            changed |= _corrupt(op, result, members, pg.size(), spoil, source)
        return changed


class _Spoil:
    """What one value fault does to a contribution: NaN, +inf, or a scale."""

    __slots__ = ("action", "scale")

    def __init__(self, action: Action, scale: float) -> None:
        self.action = action
        self.scale = scale

    @classmethod
    def of(cls, fault: Fault) -> _Spoil:
        return cls(fault.action, fault.scale if isinstance(fault, CorruptFault) else 1.0)


def _corrupt(op: str, result: list, members: list[int], n: int, p: _Spoil,
             source: int | None) -> bool:
    if source is not None:  # one sender: it is faulty or not
        return source in members and _each(result, lambda t: _block(t, p))
    if op in ("all_gather", "gather", "all_to_all"):
        changed = False
        for out in result:
            if isinstance(out, (list, tuple)):  # one output tensor per group rank
                for peer in members:
                    if peer < len(out):
                        changed |= _block(out[peer], p)
            elif op != "all_to_all" or out.shape[0] % n == 0:
                blocks = out.reshape(n, -1) if out.is_contiguous() else None
                if blocks is None:
                    continue
                for peer in members:
                    changed |= _block(blocks[peer], p)
        return changed
    return False


def _each(tensors, change) -> bool:
    changed = False
    for t in flat_tensors(tensors):
        changed |= change(t)
    return changed


def _block(t: torch.Tensor, p: _Spoil) -> bool:
    return _spoil(t, p, p.scale)


def _spoil(t: torch.Tensor, p: _Spoil, scale: float) -> bool:
    """NaN, +inf, or ``t`` times ``scale`` (corrupt); float tensors only."""
    if not t.is_floating_point():
        return False
    if p.action == Action.NAN:
        t.fill_(math.nan)
    elif p.action == Action.INF:
        t.fill_(math.inf)
    else:
        t.mul_(scale)
    return True
