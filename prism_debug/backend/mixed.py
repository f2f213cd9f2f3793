"""Values of a group that mixes m >= 2 real members with n - m virtual peers.

Virtual peer at virtual position v (0-based among the group's virtual members,
in group order) is *assigned* real member ``M[v mod m]``; real member j's
*multiplicity* ``k_j`` is 1 plus the number of virtual peers assigned to it
(Σ k_j = n).  Under ``mirror`` a virtual peer contributes what its assigned
member contributes, so member j pre-weights its own contribution by ``k_j``
(×k for SUM, x**k for PRODUCT, the parity of k for BXOR, nothing for
MAX/MIN/BAND/BOR) and one real reduction among the m real members gives the
n-member result.  Under ``zeros`` and ``random`` the virtual contributions do
not depend on any member's data: every member folds them in after the real
reduction, the same way (``random``'s draws keyed by a group-scoped key that
every member computes alike), so every member ends with the same bits.

Each op is split where the real communication goes (``prepare`` → the real op
→ ``finish``) so a caller can issue the real op asynchronously (a gloo Work)
and finish when it completes; the ``*_mixed`` functions chain the three with a
synchronous callable and are what the tests drive.  The real op is issued
exactly once per all-reduce whatever the policy; gathers, all-to-all, a reduce
to a real root and a broadcast from a real or mirrored root issue theirs once
too; a reduce to a virtual root, and a broadcast from one under
``zeros``/``random``, issue none (every member takes the same branch).

The arithmetic follows backend/values.py (the m = 1 case, which keeps that
path): NCCL's ``fmaxf``/``fminf`` for MAX/MIN, AVG as the SUM over n (integers:
truncated), PREMUL_SUM(f) as the SUM of f-premultiplied contributions (NCCL
multiplies each input), ``random`` peers as one aggregate draw — N(0, h) for
sums, Φ⁻¹(U^(1/h)) for MAX (its negation for MIN) — and a mirror for the other
ops and for integer tensors, faulty peers (``(group rank, "nan" | "inf" |
"corrupt", scale)``, backend/peer_faults.py) spoiled from what they would
contribute: under ``mirror`` the assigned member folds its faulty peers'
spoiled copies of its own contribution before the real reduction; under
``zeros``/``random`` every member folds them after (a ``random`` faulty peer's
own draw keyed ``(*key, "peer", r)``).  Faults act on floating tensors and
SUM/AVG/PREMUL_SUM/PRODUCT/MIN/MAX only, as in values.py; real members are
never spoiled here.  Unlike values.py's m = 1 shortcut, ``zeros`` PRODUCT is
the arithmetic ``x·0`` (a NaN or inf a member holds gives NaN, as the real
reduction would), not a plain ``zero_()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist

from prism_debug.backend.values import Values
from prism_debug.backend.values import spoiled as spoil  # (here ``spoiled`` names lists)

_R = dist.ReduceOp.RedOpType
_O = dist.ReduceOp  # its kinds, as torch's stubs name them (the same objects as _R's members)
SUM, AVG, PREMUL_SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR = (
    _O.SUM, _O.AVG, _O.PREMUL_SUM, _O.PRODUCT, _O.MIN, _O.MAX, _O.BAND, _O.BOR, _O.BXOR)
_SUMS = frozenset({SUM, AVG, PREMUL_SUM})
#: the reductions whose ``random`` peers are draws (floating tensors; the others mirror)
_DRAWN = frozenset({SUM, AVG, PREMUL_SUM, MIN, MAX})
_FAULTABLE = _SUMS | {PRODUCT, MIN, MAX}

#: A faulty peer of a reduction: (its group rank, "nan" | "inf" | "corrupt", scale).
Faulty = tuple[int, str, float]
#: ``reduce_real(tensor, op)``: the in-place real all-reduce among the m real members.
ReduceReal = Callable[[torch.Tensor, _R], None]


def multiplicities(n: int, real_positions: Sequence[int]) -> tuple[int, ...]:
    """``k_j`` per real member j (in group order): 1 + the virtual peers
    assigned to it round-robin.  ``multiplicities(5, (0, 3)) == (3, 2)``."""
    return MixedGroup(n, tuple(real_positions), 0).multiplicities


@dataclass(frozen=True)
class MixedGroup:
    """A group of ``size`` members whose group ranks ``real_positions``
    (ascending) are real processes; this process is real member ``me``
    (an index into ``real_positions``)."""

    size: int
    real_positions: tuple[int, ...]
    me: int

    def __post_init__(self) -> None:
        positions = self.real_positions
        if not positions or list(positions) != sorted(set(positions)):
            raise ValueError(f"real positions {positions!r} must be distinct and ascending")
        if positions[0] < 0 or positions[-1] >= self.size:
            raise ValueError(f"real positions {positions!r} outside a group of {self.size}")
        if not 0 <= self.me < len(positions):
            raise ValueError(f"real member {self.me} of {len(positions)}")

    @property
    def num_real(self) -> int:
        return len(self.real_positions)

    @property
    def position(self) -> int:
        """This member's group rank."""
        return self.real_positions[self.me]

    @cached_property
    def assigned(self) -> tuple[int, ...]:
        """Per group rank, the real member (index into ``real_positions``) it
        is or mirrors: virtual peer number v mirrors member ``v mod m``."""
        real = {p: j for j, p in enumerate(self.real_positions)}
        out, v = [], 0
        for p in range(self.size):
            if p in real:
                out.append(real[p])
            else:
                out.append(v % self.num_real)
                v += 1
        return tuple(out)

    @cached_property
    def multiplicities(self) -> tuple[int, ...]:
        counts = [0] * self.num_real
        for j in self.assigned:
            counts[j] += 1
        return tuple(counts)

    def virtual_of(self, member: int) -> tuple[int, ...]:
        """The group ranks of the virtual peers assigned to real ``member``."""
        real = set(self.real_positions)
        return tuple(p for p, j in enumerate(self.assigned) if j == member and p not in real)


# -- all-reduce (and reduce-scatter, through it) -----------------------------------------

def _kind_and_factor(op) -> tuple[_R, float]:
    kind = op if isinstance(op, _R) else op.op
    if kind != PREMUL_SUM:
        return kind, 1.0
    factor = op.factor
    return kind, float(factor.item() if isinstance(factor, torch.Tensor) else factor)


def _effective_policy(values: Values, kind: _R, tensor: torch.Tensor) -> str:
    """``random`` draws only floating sums and extremes; elsewhere it mirrors."""
    if values.policy == "random" and not (kind in _DRAWN and tensor.is_floating_point()):
        return "mirror"
    return values.policy


def _virtual_faults(group: MixedGroup, tensor: torch.Tensor, kind: _R,
                    faulty: Sequence[Faulty]) -> tuple[Faulty, ...]:
    if not faulty or not tensor.is_floating_point():
        return ()  # integers hold no NaN: left to the healthy reduction
    if kind not in _FAULTABLE:
        raise ValueError(f"unsupported reduce op {kind} for a floating tensor")
    real = set(group.real_positions)
    return tuple(f for f in sorted(faulty) if f[0] not in real)


def prepare_reduce(group: MixedGroup, tensor: torch.Tensor, op, values: Values,
                   faulty: Sequence[Faulty] = ()) -> _R:
    """In place, before the real reduction: this member's contribution,
    pre-weighted for the virtual peers it stands for.  Returns the op the real
    reduction runs (SUM for SUM/AVG/PREMUL_SUM, else the op itself)."""
    kind, factor = _kind_and_factor(op)
    real_op = SUM if kind in _SUMS else kind
    policy = _effective_policy(values, kind, tensor)
    if policy != "mirror":
        if kind == PREMUL_SUM:
            tensor.mul_(factor)
        return real_op
    spoiled = [f for f in _virtual_faults(group, tensor, kind, faulty)
               if group.assigned[f[0]] == group.me]
    healthy = group.multiplicities[group.me] - len(spoiled)  # itself included: >= 1
    base = tensor.clone() if spoiled else None
    if kind == PREMUL_SUM:
        if base is not None:
            base.mul_(factor)
        tensor.mul_(factor * healthy)  # one multiply, as values.py's mirror takes f·n
    elif kind in _SUMS:
        if healthy != 1:
            tensor.mul_(healthy)
    elif kind == PRODUCT:
        if healthy != 1:
            tensor.pow_(healthy)
    elif kind == BXOR:
        if healthy % 2 == 0:
            tensor.zero_()
    elif kind not in (MIN, MAX, BAND, BOR):
        raise ValueError(f"unsupported reduce op {kind}")
    if base is not None:
        _fold_spoiled(tensor, kind, base, spoiled, factor=1.0)
    return real_op


def finish_reduce(group: MixedGroup, tensor: torch.Tensor, op, values: Values, key: tuple,
                  faulty: Sequence[Faulty] = ()) -> None:
    """In place, after the real reduction: fold in the contributions no real
    member made (``zeros``, ``random``, their faulty peers), then AVG's /n."""
    kind, factor = _kind_and_factor(op)
    n = group.size
    policy = _effective_policy(values, kind, tensor)
    if policy != "mirror":
        spoiled = _virtual_faults(group, tensor, kind, faulty)
        healthy = n - group.num_real - len(spoiled)
        if policy == "zeros":
            if healthy > 0:
                _fold_zeros(tensor, kind)
            if spoiled:
                _fold_spoiled(tensor, kind, torch.zeros_like(tensor), spoiled, factor)
        else:
            if healthy > 0:
                _fold(tensor, _aggregate_draw(values, tensor, kind, healthy, key, factor), kind)
            for rank, action, scale in spoiled:
                draw = torch.randn(tensor.shape, generator=values.generator((*key, "peer", rank)),
                                   dtype=tensor.dtype)
                if kind == PREMUL_SUM:
                    draw.mul_(factor)
                _fold(tensor, spoil(draw, action, scale), kind)
    if kind == AVG:
        if tensor.is_floating_point() or tensor.is_complex():
            tensor.div_(n)
        else:
            tensor.div_(n, rounding_mode="trunc")


def allreduce_mixed(group: MixedGroup, tensor: torch.Tensor, op, values: Values, key: tuple,
                    reduce_real: ReduceReal, faulty: Sequence[Faulty] = ()) -> None:
    """In place: ``tensor`` becomes the n-member reduction (every member ends
    with the same bits).  ``key``: group-scoped, the same on every member."""
    real_op = prepare_reduce(group, tensor, op, values, faulty)
    reduce_real(tensor, real_op)
    finish_reduce(group, tensor, op, values, key, faulty)


def reduce_mixed(group: MixedGroup, tensor: torch.Tensor, root: int, op, values: Values,
                 key: tuple, reduce_real_to: Callable[[torch.Tensor, _R, int], None],
                 faulty: Sequence[Faulty] = ()) -> None:
    """A reduce to group rank ``root``: only a real root's ``tensor`` changes
    (NCCL writes the root's buffer only).  A real root: every member prepares
    a copy of its contribution (a non-root's buffer stays as it was, whatever
    the real reduce does to its input), ``reduce_real_to(buffer, op, member)``
    reduces to the root's real member, which finishes.  A virtual root: no
    real member receives anything, no real op."""
    if root not in group.real_positions:
        return
    mine = root == group.position
    buffer = tensor if mine else tensor.detach().clone()
    real_op = prepare_reduce(group, buffer, op, values, faulty)
    reduce_real_to(buffer, real_op, group.assigned[root])
    if mine:
        finish_reduce(group, buffer, op, values, key, faulty)


def reduce_scatter_mixed(group: MixedGroup, output: torch.Tensor, input: torch.Tensor, op,
                         values: Values, key: tuple, reduce_real: ReduceReal,
                         faulty: Sequence[Faulty] = ()) -> None:
    """``output`` ← this member's chunk (its group rank's, of n equal chunks of
    ``input``) of the all-reduce of ``input``: a real all-reduce of the whole
    input (n/m× the data of a real reduce-scatter: correct, not fast)."""
    whole = input.detach().clone()
    allreduce_mixed(group, whole, op, values, key, reduce_real, faulty)
    output.copy_(whole.reshape(group.size, -1)[group.position].view_as(output))


def _aggregate_draw(values: Values, like: torch.Tensor, kind: _R, h: int, key: tuple,
                    factor: float) -> torch.Tensor:
    """The reduction of ``h`` healthy random peers' contributions, in one draw
    (values.py's closed forms, keyed the same way)."""
    generator = values.generator(key)
    if kind in _SUMS:
        draw = torch.randn(like.shape, generator=generator, dtype=like.dtype).mul_(math.sqrt(h))
        return draw.mul_(factor) if kind == PREMUL_SUM else draw
    uniform = torch.rand(like.shape, generator=generator, dtype=torch.float64)
    extreme = torch.special.ndtri(uniform.pow_(1.0 / h)).to(like.dtype)
    return extreme if kind == MAX else extreme.neg_()


def _fold_zeros(tensor: torch.Tensor, kind: _R) -> None:
    """``tensor`` reduced with zero contributions (NCCL's binary ops)."""
    if kind in _SUMS or kind in (BOR, BXOR):
        return
    if kind == PRODUCT:
        tensor.mul_(0)  # not zero_(): a NaN or inf a member holds stays NaN, as x·0 is
    elif kind == BAND:
        tensor.zero_()
    elif kind in (MIN, MAX):
        _fold(tensor, torch.zeros((), dtype=tensor.dtype), kind)
    else:
        raise ValueError(f"unsupported reduce op {kind}")


def _fold_spoiled(tensor: torch.Tensor, kind: _R, base: torch.Tensor,
                  spoiled: Sequence[Faulty], factor: float) -> None:
    """Fold each faulty peer's spoiled copy of ``base`` (×``factor`` for PREMUL_SUM)."""
    for _, action, scale in spoiled:
        copy = base.clone()
        if kind == PREMUL_SUM and factor != 1.0:
            copy.mul_(factor)
        _fold(tensor, spoil(copy, action, scale), kind)


def _fold(acc: torch.Tensor, contribution: torch.Tensor, kind: _R) -> None:
    """In place: ``acc`` reduced with one contribution (``fmaxf``/``fminf``)."""
    if kind in _SUMS:
        acc.add_(contribution)
    elif kind == PRODUCT:
        acc.mul_(contribution)
    elif acc.is_floating_point():
        (torch.fmax if kind == MAX else torch.fmin)(acc, contribution, out=acc)
    else:
        (torch.maximum if kind == MAX else torch.minimum)(acc, contribution, out=acc)


# -- data movement: all-gather, broadcast, all-to-all ------------------------------------

def fill_virtual_slots(group: MixedGroup, slots: Sequence[torch.Tensor], values: Values,
                       key: tuple) -> None:
    """After the real op filled the real members' slots (group rank order):
    each virtual peer's slot ← its assigned member's (``mirror``; a seeded fill
    where the shapes differ), zeros, or seeded with ``(*key, p)``."""
    real = set(group.real_positions)
    for p, slot in enumerate(slots):
        if p in real:
            continue
        source = slots[group.real_positions[group.assigned[p]]]
        if values.policy == "zeros" and slot.shape == source.shape:
            slot.zero_()
        elif values.policy == "mirror" and slot.shape == source.shape:
            slot.copy_(source)
        else:
            values.fill_seeded(slot, (*key, p))


def allgather_mixed(group: MixedGroup, outputs: Sequence[torch.Tensor], input: torch.Tensor,
                    values: Values, key: tuple,
                    gather_real: Callable[[list[torch.Tensor], torch.Tensor], None]) -> None:
    """``outputs`` (n tensors shaped like ``input``, by group rank) ← every
    member's shard: ``gather_real(real_outputs, input)`` (the real all-gather
    among the m members, into their slots), then :func:`fill_virtual_slots`."""
    gather_real([outputs[p] for p in group.real_positions], input)
    fill_virtual_slots(group, outputs, values, key)


def broadcast_source(group: MixedGroup, root: int, policy: str) -> int | None:
    """The real member a broadcast from group rank ``root`` really comes from:
    the root itself, or the member a virtual root mirrors; None when a
    virtual root's data is not a member's (``zeros``, ``random``)."""
    j = group.assigned[root]
    if root in group.real_positions or policy == "mirror":
        return j
    return None


def broadcast_mixed(group: MixedGroup, tensor: torch.Tensor, root: int, values: Values,
                    key: tuple, broadcast_real: Callable[[torch.Tensor, int], None]) -> None:
    """``tensor`` ← the root's: ``broadcast_real(tensor, member)`` from the real
    member :func:`broadcast_source` names, or zeros, or seeded with ``key``."""
    source = broadcast_source(group, root, values.policy)
    if source is not None:
        broadcast_real(tensor, source)
    elif values.policy == "zeros":
        tensor.zero_()
    else:
        values.fill_seeded(tensor, key)


def alltoall_mixed(group: MixedGroup, outputs: Sequence[torch.Tensor],
                   inputs: Sequence[torch.Tensor], values: Values, key: tuple,
                   alltoall_real: Callable[[list[torch.Tensor], list[torch.Tensor]], None]) -> None:
    """``outputs[p]`` ← group rank p's chunk for this member (``inputs[p]`` is
    this member's chunk for p): ``alltoall_real(real_outputs, real_inputs)``
    exchanges the chunks among real members (index i = real member i); a
    virtual peer's chunk is what its assigned member sent (``mirror``), zeros,
    or seeded with ``(*key, p)`` — seeded too where its shape differs."""
    real = group.real_positions
    alltoall_real([outputs[p] for p in real], [inputs[p] for p in real])
    fill_virtual_slots(group, outputs, values, key)
