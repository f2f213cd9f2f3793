"""What faulty peers hand the real rank, on hand-computable groups."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from prism_debug.backend.peer_faults import PeerFaults
from prism_debug.faults import parse_fault, resolve

REAL = 4


def group(ranks=(4, 5, 6, 7), family="tp"):
    return SimpleNamespace(global_ranks=list(ranks), ref=SimpleNamespace(family=family),
                           size=lambda: len(ranks))


def faults(*texts):
    f = PeerFaults(REAL)
    f.set(resolve(parse_fault(t), 16, 8) for t in texts)
    return f


def test_a_corrupt_peer_scales_its_share_of_a_sum():
    # four ranks all-reduce ones (mirror: each contributes 1): 4; peer 5's
    # contribution x3 makes it 1 + 3 + 1 + 1 = 6
    out = torch.full((3,), 4.0)
    assert faults("corrupt 5 3").apply(group(), "all_reduce", [out], 1, 1)
    assert out.tolist() == [6.0, 6.0, 6.0]
    # two faulty peers of four: 1 + 3 + 3 + 1 = 8
    out = torch.full((3,), 4.0)
    faults("corrupt 5,6 3").apply(group(), "all_reduce", [out], 1, 1)
    assert out.tolist() == [8.0, 8.0, 8.0]


def test_nan_and_inf_spread_through_a_reduction():
    out = torch.ones(4)
    faults("nan 7").apply(group(), "reduce_scatter", [out], 1, 1)
    assert all(math.isnan(v) for v in out.tolist())
    out = torch.ones(4)
    faults("inf 7").apply(group(), "all_reduce", [out], 1, 1)
    assert out.tolist() == [math.inf] * 4


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
    out = torch.ones(2)
    assert not f.apply(group(family="tp"), "all_reduce", [out], 3, 2)  # another family
    assert not f.apply(group(family="dp"), "all_reduce", [out], 3, 1)  # before op 2
    assert not f.apply(group(family="dp"), "all_reduce", [out], 4, 1)  # window over
    assert not f.apply(group((0, 4), "dp"), "all_reduce", [out], 3, 2)  # 5 not a member
    assert not f.apply(group(family="dp"), "all_reduce", [torch.ones(2, dtype=torch.int64)],
                       3, 2)
    assert out.tolist() == [1.0, 1.0]
    assert f.apply(group(family="dp"), "all_reduce", [out], 3, 2)
    assert faults("nan 4").active and not faults("nan 4").apply(group(), "all_reduce", [out], 1, 1)
