"""What faulty peers hand the real rank, on hand-computable groups."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.distributed as dist

from prism_debug.backend.peer_faults import PeerFaults
from prism_debug.backend.values import Values
from prism_debug.faults import parse_fault, resolve

REAL = 4


def group(ranks=(4, 5, 6, 7), family="tp"):
    return SimpleNamespace(global_ranks=list(ranks), ref=SimpleNamespace(family=family),
                           size=lambda: len(ranks))


def faults(*texts):
    f = PeerFaults(REAL)
    f.set(resolve(parse_fault(t), 16, 8) for t in texts)
    return f


def reduced(f, x, op=dist.ReduceOp.SUM, policy="mirror"):
    """What the real rank holding ``x`` gets from an all-reduce of group() with ``f``."""
    out = torch.tensor(x)
    Values(policy, 0).reduce_peers(out, op, 4, (1, 0, 0), f.reduction(group(), 1, 1))
    return out.tolist()


def test_a_corrupt_peer_scales_its_contribution_to_a_sum():
    # four ranks all-reduce ones (mirror: each contributes 1): 4; peer 5's
    # contribution x3 makes it 1 + 3 + 1 + 1 = 6
    assert faults("corrupt 5 3").reduction(group(), 1, 1) == ((1, "corrupt", 3.0),)
    assert reduced(faults("corrupt 5 3"), [1.0] * 3) == [6.0, 6.0, 6.0]
    # two faulty peers of four: 1 + 3 + 3 + 1 = 8
    assert reduced(faults("corrupt 5,6 3"), [1.0] * 3) == [8.0, 8.0, 8.0]
    # reductions are the values' business, not apply's
    out = torch.ones(3)
    assert not faults("corrupt 5 3").apply(group(), "all_reduce", [out], 1, 1)
    assert out.tolist() == [1.0] * 3


def test_nan_and_inf_spread_through_a_sum_but_nan_loses_a_max():
    assert all(math.isnan(v) for v in reduced(faults("nan 7"), [1.0] * 4))
    assert reduced(faults("inf 7"), [1.0] * 4) == [math.inf] * 4
    # NCCL's fmaxf: a NaN contribution loses to the numbers
    assert reduced(faults("nan 7"), [1.0, -2.0], dist.ReduceOp.MAX) == [1.0, -2.0]
    # a corrupt zero is zero: the sum is the real rank's alone
    assert reduced(faults("corrupt 7 5"), [1.0, -2.0], policy="zeros") == [1.0, -2.0]


def test_a_gather_gets_the_faulty_peers_block_only():
    outs = [[torch.ones(2) for _ in range(4)]]
    faults("nan 6").apply(group(), "all_gather", outs, 1, 1)
    assert [math.isnan(t[0].item()) for t in outs[0]] == [False, False, True, False]
    flat = torch.ones(8)  # all_gather_into_tensor: one block per group rank
    faults("corrupt 5 -1").apply(group(), "all_gather", [flat], 1, 1)
    assert flat.tolist() == [1, 1, -1, -1, 1, 1, 1, 1]


def test_a_receive_or_broadcast_is_faulty_only_from_a_faulty_source():
    t = torch.ones(2)
    assert not faults("nan 6").apply(group(), "recv", [t], 1, 1, source=1)
    assert faults("nan 6").apply(group(), "broadcast", [t], 1, 1, source=2)
    assert all(math.isnan(v) for v in t.tolist())


def test_window_family_members_and_integers_are_respected():
    f = faults("nan 5 family dp at 3 op 2 for 1")
    assert not f.reduction(group(family="tp"), 3, 2)  # another family
    assert not f.reduction(group(family="dp"), 3, 1)  # before op 2
    assert not f.reduction(group(family="dp"), 4, 1)  # window over
    assert not f.reduction(group((0, 4), "dp"), 3, 2)  # 5 not a member
    faulty = f.reduction(group(family="dp"), 3, 2)
    assert faulty == ((1, "nan", 1.0),)
    ints = torch.ones(2, dtype=torch.int64)  # integers hold no NaN: the healthy sum
    Values("mirror", 0).reduce_peers(ints, dist.ReduceOp.SUM, 4, (), faulty)
    assert ints.tolist() == [4, 4]
    out = torch.ones(8)  # one block of two per group rank
    assert not f.apply(group(family="tp"), "all_gather", [out], 3, 2)
    assert f.apply(group(family="dp"), "all_gather", [out], 3, 2)
    assert faults("nan 4").active and not faults("nan 4").reduction(group(), 1, 1)
