"""What virtual peers contribute to a collective's result.

Outputs always get the right shape and dtype and deterministic contents.

* ``mirror`` (default): every peer contributes what the real rank contributes,
  the natural assumption for SPMD data parallelism.  SUM over n peers is n·x,
  AVG and MAX/MIN are x, an all-gather repeats the local shard, a
  reduce-scatter returns the local chunk reduced n times.
* ``zeros``: peers contribute zeros (SUM is x, AVG is x/n).
* ``random``: peers contribute seeded N(0, 1) values; a SUM over n-1 of them
  is drawn from its exact distribution, N(0, n-1), in one draw.

Reductions follow NCCL's arithmetic: MIN and MAX are ``fminf``/``fmaxf`` (a
NaN loses to a number, ``src/device/reduce_kernel.h``), AVG is the sum over n.

A faulty peer (``faulty``: NaN, inf or corrupt, from backend/peer_faults.py)
contributes what the policy says a healthy one would, spoiled: NaN, +inf, or
that contribution times the fault's scale (zero under ``zeros``, ``s·x`` under
``mirror``, ``s·z`` for its own seeded draw ``z`` under ``random``); the
result is the op over the real rank's, the healthy peers' and the faulty
peers' contributions, as the real reduction of them would give.  Under
``random`` each faulty peer's ``z`` is drawn with key ``(*key, "peer", r)`` (r
its group rank) and the healthy peers enter as their one-draw aggregate.
Integer tensors hold no NaN and are left to the healthy reduction.

Data no rank of the real rank's kind could know — a tensor received from
another pipeline stage, a scatter from another root — gets seeded values that
depend only on (seed, iteration, op index): same seed, same run.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from prism_debug.errors import ConfigError

_R = dist.ReduceOp.RedOpType
_O = dist.ReduceOp  # its kinds, as torch's stubs name them (the same objects as _R's members)
# pybind's enum comparisons cost ~0.75 µs each, several per op on the hot
# path: the reductions compare plain ints instead (``kind.value``).
_SUM, _AVG, _PREMUL_SUM, _PRODUCT, _MIN, _MAX, _BAND, _BOR, _BXOR = (
    k.value for k in (_O.SUM, _O.AVG, _O.PREMUL_SUM, _O.PRODUCT, _O.MIN, _O.MAX,
                      _O.BAND, _O.BOR, _O.BXOR))
POLICIES = ("mirror", "zeros", "random")
#: the reductions whose ``random`` peers are seeded draws (the others mirror)
_RANDOM_KINDS = frozenset({_SUM, _AVG, _PREMUL_SUM, _MIN, _MAX})
_SUMS = frozenset({_SUM, _AVG, _PREMUL_SUM})

#: A faulty peer of a reduction: (its group rank, "nan" | "inf" | "corrupt", scale).
Faulty = tuple[int, str, float]


class Values:
    def __init__(self, policy: str, seed: int) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"unknown value policy {policy!r}; "
                              f"expected one of {', '.join(POLICIES)}")
        self.policy = policy
        self.seed = seed

    # -- seeded data ----------------------------------------------------------

    def generator(self, key: tuple) -> torch.Generator:
        digest = hashlib.blake2b(repr((self.seed, *key)).encode(), digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))

    def fill_seeded(self, tensor: torch.Tensor, key: tuple) -> None:
        """Deterministic contents for data no peer model can know.

        Floating tensors get N(0, 1) values.  Integer and boolean tensors are
        far more often control values (flags, votes, sizes) than data, so they
        get ones: that keeps handshakes such as pipelining's warm-up vote on
        the path every rank agreed.
        """
        # (as a real backend writes a receive buffer: outside autograd, which
        # refuses in-place writes to the leaves pipelining receives into)
        with torch.no_grad():
            if tensor.is_floating_point() or tensor.is_complex():
                values = torch.randn(tensor.shape, generator=self.generator(key),
                                     dtype=tensor.dtype)
                tensor.copy_(values)
            else:
                tensor.fill_(1)

    # -- collectives ----------------------------------------------------------

    def reduce_peers(self, tensor: torch.Tensor, op, n: int, key: tuple,
                     faulty: Sequence[Faulty] = ()) -> None:
        """In place: ``tensor`` becomes the reduction of the real rank's
        ``tensor`` with the n-1 peers' contributions, ``faulty`` ones spoiled."""
        kind = (op if isinstance(op, _R) else op.op).value
        factor = op.factor if kind == _PREMUL_SUM else None
        if faulty and n > 1 and tensor.is_floating_point():
            self._reduce_faulty(tensor, kind, n, factor, key, faulty)
        elif self.policy == "mirror":
            _reduce_mirror(tensor, kind, n, factor)
        elif self.policy == "zeros":
            _reduce_zeros(tensor, kind, n, factor)
        else:
            self._reduce_random(tensor, kind, n, factor, key)

    def peer_copy(self, out: torch.Tensor, mine: torch.Tensor, key: tuple) -> None:
        """``out`` receives what a peer holds where the real rank holds ``mine``."""
        if self.policy == "mirror":
            out.copy_(mine)
        elif self.policy == "zeros":
            out.zero_()
        else:
            self.fill_seeded(out, key)

    def _reduce_random(self, tensor, kind, n, factor, key) -> None:
        if n <= 1 or not tensor.is_floating_point():
            _reduce_mirror(tensor, kind, n, factor)
            return
        generator = self.generator(key)
        if kind in (_SUM, _AVG, _PREMUL_SUM):
            noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
            tensor.add_(noise.mul_(math.sqrt(n - 1)))
            if kind == _AVG:
                tensor.div_(n)
            elif kind == _PREMUL_SUM:
                tensor.mul_(_premul_factor(factor))
        elif kind in (_MAX, _MIN):
            # The largest of n-1 standard normals is Φ⁻¹(U^(1/(n-1))): one draw.
            uniform = torch.rand(tensor.shape, generator=generator, dtype=torch.float64)
            extreme = torch.special.ndtri(uniform.pow_(1.0 / (n - 1))).to(tensor.dtype)
            if kind == _MAX:
                torch.fmax(tensor, extreme, out=tensor)
            else:
                torch.fmin(tensor, extreme.neg_(), out=tensor)
        else:
            _reduce_mirror(tensor, kind, n, factor)

    def _healthy_random(self, like: torch.Tensor, kind, h: int, key: tuple) -> torch.Tensor:
        """The reduction of ``h`` healthy random peers' contributions, in one draw."""
        generator = self.generator(key)
        if kind in _SUMS:
            return torch.randn(like.shape, generator=generator, dtype=like.dtype).mul_(
                math.sqrt(h))
        uniform = torch.rand(like.shape, generator=generator, dtype=torch.float64)
        extreme = torch.special.ndtri(uniform.pow_(1.0 / h)).to(like.dtype)
        return extreme if kind == _MAX else extreme.neg_()

    def _reduce_faulty(self, tensor: torch.Tensor, kind, n: int, factor, key: tuple,
                       faulty: Sequence[Faulty]) -> None:
        """The op over the real rank's ``tensor``, the healthy peers' and the
        faulty peers' spoiled contributions (the rare path: a fault is in force)."""
        if kind not in _SUMS and kind not in (_PRODUCT, _MIN, _MAX):
            raise ValueError(f"unsupported reduce op {_R(kind)} for a floating tensor")
        mine = tensor.clone()
        # random peers are draws only where the policy draws them; elsewhere mirrors
        policy = self.policy if self.policy != "random" or kind in _RANDOM_KINDS else "mirror"
        healthy = n - 1 - len(faulty)
        if healthy > 0:
            if policy == "random":
                _fold(tensor, self._healthy_random(tensor, kind, healthy, key), 1, kind)
            else:
                _fold(tensor, mine if policy == "mirror" else 0.0, healthy, kind)
        if policy == "random":
            for rank, action, scale in faulty:
                draw = torch.randn(tensor.shape, generator=self.generator((*key, "peer", rank)),
                                   dtype=tensor.dtype)
                _fold(tensor, spoiled(draw, action, scale), 1, kind)
        else:
            # identical contributions fold together: k copies at once
            counts: dict[tuple[str, float], int] = {}
            for _, action, scale in faulty:
                counts[(action, scale)] = counts.get((action, scale), 0) + 1
            for (action, scale), k in counts.items():
                base = mine.clone() if policy == "mirror" else torch.zeros_like(mine)
                _fold(tensor, spoiled(base, action, scale), k, kind)
        if kind == _AVG:
            tensor.div_(n)
        elif kind == _PREMUL_SUM:
            tensor.mul_(_premul_factor(factor))


def spoiled(contribution: torch.Tensor, action: str, scale: float) -> torch.Tensor:
    """What a faulty peer contributes instead of ``contribution`` (in place)."""
    if action == "nan":
        return contribution.fill_(math.nan)
    if action == "inf":
        return contribution.fill_(math.inf)
    if action == "corrupt":
        return contribution.mul_(scale)
    raise ValueError(f"unknown peer fault {action!r}")


def _fold(acc: torch.Tensor, contribution, k: int, kind) -> None:
    """In place: ``acc`` reduced with ``k`` equal contributions (NCCL's binary ops)."""
    if kind in _SUMS:
        acc.add_(contribution if k == 1 else contribution * k)
    elif kind == _PRODUCT:
        acc.mul_(contribution if k == 1 else contribution ** k)
    else:
        other = torch.as_tensor(contribution, dtype=acc.dtype)
        (torch.fmax if kind == _MAX else torch.fmin)(acc, other, out=acc)


def _premul_factor(factor) -> float:
    if isinstance(factor, torch.Tensor):
        return float(factor.item())
    return float(factor)


def _reduce_mirror(tensor: torch.Tensor, kind, n: int, factor) -> None:
    if n <= 1 and kind != _PREMUL_SUM:
        return
    if kind == _SUM:
        tensor.mul_(n)
    elif kind in (_AVG, _MAX, _MIN, _BAND, _BOR):
        return
    elif kind == _PREMUL_SUM:
        tensor.mul_(_premul_factor(factor) * n)
    elif kind == _PRODUCT:
        tensor.pow_(n)
    elif kind == _BXOR:
        if n % 2 == 0:
            tensor.zero_()
    else:
        raise ValueError(f"unsupported reduce op {_R(kind)}")


def _reduce_zeros(tensor: torch.Tensor, kind, n: int, factor) -> None:
    if n <= 1 and kind != _PREMUL_SUM:
        return
    if kind in (_SUM, _BOR, _BXOR):
        return
    if kind == _AVG:
        tensor.div_(n)
    elif kind == _PREMUL_SUM:
        tensor.mul_(_premul_factor(factor))
    elif kind in (_MAX, _MIN) and tensor.is_floating_point():
        # fmaxf/fminf: a NaN the real rank holds loses to the peers' zeros
        zero = torch.zeros((), dtype=tensor.dtype)
        (torch.fmax if kind == _MAX else torch.fmin)(tensor, zero, out=tensor)
    elif kind == _MAX:
        tensor.clamp_(min=0)
    elif kind == _MIN:
        tensor.clamp_(max=0)
    elif kind in (_PRODUCT, _BAND):
        tensor.zero_()
    else:
        raise ValueError(f"unsupported reduce op {_R(kind)}")
