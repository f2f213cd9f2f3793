"""What a reduction hands the real rank when some peers are faulty (nan, inf,
corrupt), for every ReduceOp and values policy, against hand-computed groups.

The expected values come from a plain loop over explicit per-rank
contributions with NCCL's binary ops (``fminf``/``fmaxf`` for MIN/MAX: a NaN
loses to a number), in Python floats: nothing of the implementation's
arithmetic is reused.  Under ``random`` the peers' values are the documented
seeded draws (``Values.generator``): each faulty peer's own draw keyed
``(*key, "peer", r)``, the healthy ones as their aggregate drawn with ``key``
(the sum of h normals is ``sqrt(h)·z``; their maximum ``ndtri(u^(1/h))``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from functools import reduce
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import prism_debug
from prism_debug.backend.values import POLICIES, Values

R = dist.ReduceOp
ROOT = Path(prism_debug.__file__).resolve().parents[1]  # the tree under test
KEY = (3, 7, 0)
FLOAT_OPS = ["SUM", "AVG", "PREMUL_SUM", "PRODUCT", "MIN", "MAX"]
BITWISE_OPS = ["BAND", "BOR", "BXOR"]
PREMUL = 0.25
FAULTS = {"nan": ("nan", 1.0), "inf": ("inf", 1.0), "corrupt": ("corrupt", -3.0)}


def torch_op(name):
    return R.PREMUL_SUM(PREMUL) if name == "PREMUL_SUM" else getattr(R, name)


def fmax(a, b):
    return b if math.isnan(a) else a if math.isnan(b) else max(a, b)


def fmin(a, b):
    return b if math.isnan(a) else a if math.isnan(b) else min(a, b)


BINARY = {"SUM": lambda a, b: a + b, "AVG": lambda a, b: a + b, "PREMUL_SUM": lambda a, b: a + b,
          "PRODUCT": lambda a, b: a * b, "MIN": fmin, "MAX": fmax,
          "BAND": lambda a, b: a & b, "BOR": lambda a, b: a | b, "BXOR": lambda a, b: a ^ b}


def spoil(value, action, scale):
    return {"nan": math.nan, "inf": math.inf}.get(action, value * scale)


def contributions(x, op, n, me, faulty, policy, seed):
    """Each rank's contribution, element by element (lists of Python numbers):
    the real rank's ``x``; a healthy peer's and a faulty peer's as the policy
    and the fault say."""
    numbers = [float(v) for v in x] if isinstance(x[0], float) else list(x)
    floating = isinstance(numbers[0], float)
    values = Values(policy, seed)
    drawn = policy == "random" and floating and op in ("SUM", "AVG", "PREMUL_SUM", "MIN", "MAX")
    healthy = [r for r in range(n) if r != me and r not in faulty]
    ranks = [numbers]
    if drawn:
        if healthy:  # the healthy peers' aggregate, from its documented closed form
            h = len(healthy)
            if op in ("MIN", "MAX"):
                u = torch.rand(len(x), generator=values.generator(KEY), dtype=torch.float64)
                top = torch.special.ndtri(u ** (1.0 / h)).tolist()
                ranks.append(top if op == "MAX" else [-v for v in top])
            else:
                z = torch.randn(len(x), generator=values.generator(KEY), dtype=torch.float64)
                ranks.append([v * math.sqrt(h) for v in z.tolist()])
    else:
        for _ in healthy:  # random peers of other ops mirror
            ranks.append([0 * v for v in numbers] if policy == "zeros" else numbers)
    for r, (action, scale) in sorted(faulty.items()):
        if drawn:
            base = torch.randn(len(x), generator=values.generator((*KEY, "peer", r)),
                               dtype=torch.float64).tolist()
        elif policy == "zeros":
            base = [0 * v for v in numbers]
        else:
            base = numbers
        # integers hold no NaN: a faulty peer's integer contribution is its healthy one
        ranks.append([spoil(v, action, scale) for v in base] if floating else base)
    return ranks


def expected(x, op, n, me, faulty, policy, seed=0):
    ranks = contributions(x, op, n, me, faulty, policy, seed)
    out = [reduce(BINARY[op], column) for column in zip(*ranks, strict=True)]
    if op == "AVG":
        out = [v / n for v in out]
    elif op == "PREMUL_SUM":
        out = [v * PREMUL for v in out]
    return out


def reduced(x, op, n, faulty, policy, seed=0):
    dtype = torch.float64 if isinstance(x[0], float) else torch.int64
    tensor = torch.tensor(x, dtype=dtype)
    spoiled = tuple((r, *faulty[r]) for r in sorted(faulty))
    Values(policy, seed).reduce_peers(tensor, torch_op(op), n, KEY, spoiled)
    return tensor.tolist()


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, float) and math.isnan(w):
            assert math.isnan(g), (got, want)
        elif isinstance(w, float) and math.isinf(w):
            assert g == w, (got, want)
        else:
            assert g == pytest.approx(w, rel=1e-12, abs=1e-12), (got, want)


# n = 4, the real rank is group rank 1; peer 2 alone, or peers 0 and 3, faulty
X_FLOAT = [1.5, -2.0, 0.0, 3.0]
X_INT = [6, 5, 0, -3]
GROUPS = {"one": {2}, "two": {0, 3}}


@pytest.mark.parametrize("which", sorted(GROUPS))
@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("op", FLOAT_OPS + BITWISE_OPS)
def test_every_op_policy_and_fault_is_the_reduction_of_the_contributions(op, policy, fault,
                                                                         which):
    x = X_INT if op in BITWISE_OPS else X_FLOAT
    faulty = {r: FAULTS[fault] for r in GROUPS[which]}
    same(reduced(x, op, 4, faulty, policy), expected(x, op, 4, 1, faulty, policy))


def test_hand_computed_cases_read_as_the_issue_asks():
    # corrupt x3 under MAX: mirror peers hold x, the faulty one 3x; max is 3x where x > 0
    assert reduced([1.0, -2.0], "MAX", 4, {2: ("corrupt", 3.0)}, "mirror") == [3.0, -2.0]
    # ... and under zeros a corrupted zero is zero: max(x, 0)
    assert reduced([1.0, -2.0], "MAX", 4, {2: ("corrupt", 3.0)}, "zeros") == [1.0, 0.0]
    # a sum under zeros: only the real rank's x counts, the faulty zero too
    assert reduced([1.0, -2.0], "SUM", 4, {2: ("corrupt", 3.0)}, "zeros") == [1.0, -2.0]
    # a NaN peer loses NCCL's fmaxf/fminf; it poisons a sum and a product
    assert reduced([1.0, -2.0], "MIN", 4, {2: ("nan", 1.0)}, "mirror") == [1.0, -2.0]
    assert all(math.isnan(v) for v in reduced([1.0, -2.0], "PRODUCT", 4, {2: ("nan", 1.0)},
                                              "mirror"))
    # inf: +inf wins a MAX, loses a MIN, and a product of a negative is -inf
    assert reduced([1.0, -2.0], "MAX", 4, {2: ("inf", 1.0)}, "zeros") == [math.inf] * 2
    assert reduced([1.0, -2.0], "MIN", 4, {2: ("inf", 1.0)}, "zeros") == [0.0, -2.0]
    assert reduced([1.0, -2.0], "PRODUCT", 4, {2: ("inf", 1.0)}, "mirror") == \
        [math.inf, -math.inf]  # (-2)^3 · inf
    # AVG of mirrors, one x3: (1 + 1 + 3 + 1) / 4
    assert reduced([1.0], "AVG", 4, {2: ("corrupt", 3.0)}, "mirror") == [1.5]


def test_without_faults_the_policy_alone_decides():
    for policy in POLICIES:
        for op in FLOAT_OPS:
            plain, none = torch.tensor(X_FLOAT), torch.tensor(X_FLOAT)
            Values(policy, 0).reduce_peers(plain, torch_op(op), 4, KEY)
            Values(policy, 0).reduce_peers(none, torch_op(op), 4, KEY, ())
            assert torch.equal(plain, none)
            if policy != "random":
                same(plain.double().tolist(), expected(X_FLOAT, op, 4, 1, {}, policy))


def test_zeros_max_follows_fmaxf_for_the_real_ranks_own_nan():
    tensor = torch.tensor([math.nan, -1.0])
    Values("zeros", 0).reduce_peers(tensor, R.MAX, 4, KEY)
    assert tensor.tolist() == [0.0, 0.0]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(2, 9), policy=st.sampled_from(POLICIES),
       op=st.sampled_from(FLOAT_OPS), seed=st.integers(0, 2**31))
def test_any_group_shape_and_values(data, n, policy, op, seed):
    size = data.draw(st.integers(1, 12), label="numel")
    # (no subnormal-scale values: a PRODUCT whose partial product underflows to 0
    # before it meets a faulty inf is NaN in one order of the terms and inf in
    # another, and the order of a real reduction is not the test's to fix)
    normal = st.floats(-1e3, 1e3).filter(lambda v: v == 0 or abs(v) > 1e-6)
    x = data.draw(st.lists(normal, min_size=size, max_size=size), label="x")
    me = data.draw(st.integers(0, n - 1), label="me")
    peers = [r for r in range(n) if r != me]
    chosen = data.draw(st.lists(st.sampled_from(peers), min_size=1, unique=True), label="faulty")
    kinds = st.sampled_from([("nan", 1.0), ("inf", 1.0)]) | st.tuples(
        st.just("corrupt"), st.floats(-8, 8).filter(lambda s: s != 1 and abs(s) > 1e-6))
    faulty = {r: data.draw(kinds, label=f"fault of {r}") for r in chosen}
    tensor = torch.tensor(x, dtype=torch.float64)
    spoiled = tuple((r, *faulty[r]) for r in sorted(faulty))
    Values(policy, seed).reduce_peers(tensor, torch_op(op), n, KEY, spoiled)
    want = expected(x, op, n, me, faulty, policy, seed)
    for g, w in zip(tensor.tolist(), want, strict=True):
        if math.isnan(w):
            assert math.isnan(g)
        else:  # a sum of n terms folded k at a time: a few ulps of the largest term
            assert g == pytest.approx(w, rel=1e-9, abs=1e-9 * (1e3 * 8) ** (
                n if op == "PRODUCT" else 1))


# -- reduce: the root's buffer only -------------------------------------------------------

REDUCE_SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    from prism_debug.backend.install import install
    from prism_debug.backend.runtime import Runtime
    from prism_debug.backend.tracker import IterationTracker
    from prism_debug.backend.values import Values
    from prism_debug.cost import DEFAULT_PROFILE, CostModel, load_profile
    from prism_debug.engine import EmulatedClock
    from prism_debug.engine.lockstep import LockstepEngine
    from prism_debug.faults import parse_fault, resolve
    from prism_debug.graph import FamilyRecorder

    world, rank, fault = 8, 1, sys.argv[1]
    clock = EmulatedClock()
    rt = Runtime(rank=rank, world_size=world, clock=clock,
                 engine=LockstepEngine(CostModel(load_profile(DEFAULT_PROFILE)), 8),
                 values=Values("mirror", 0),
                 tracker=IterationTracker(clock.now(), lambda record: None, False),
                 families=FamilyRecorder(world))
    rt.peer_faults.set([resolve(parse_fault(fault), world, 8)])
    install(rt, lambda backend: None)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    out = {}
    for dst in (0, 5, 1):  # another rank is root (a faulty one, a healthy one), then this one
        x = torch.tensor([1.5, -2.0, 0.1, 3.0])
        before = x.numpy().tobytes().hex()
        dist.reduce(x, dst=dst, op=dist.ReduceOp.SUM)
        out[str(dst)] = [x.numpy().tobytes().hex() == before, x.tolist()]
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.parametrize("fault", ["nan 0,2-7", "corrupt 5 3", "inf 0"])
def test_reduce_changes_only_the_roots_buffer(tmp_path, fault):
    """A real rank of eight issues dist.reduce through the installed prism
    backend: as non-root its buffer stays bit-identical under any fault; as
    root it gets the reduction of the contributions."""
    script = tmp_path / "reduce.py"
    script.write_text(REDUCE_SCRIPT)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), fault], capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [text for text in proc.stdout.splitlines() if text.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    x = [1.5, -2.0, 0.1, 3.0]
    assert out["0"] == [True, pytest.approx(x)] and out["5"] == [True, pytest.approx(x)]
    unchanged, root = out["1"]
    action, targets, *scale = fault.split()
    faulty = {r: (action, float(scale[0]) if scale else 1.0)
              for r in range(8) if r != 1 and _in(r, targets)}
    want = expected([float(torch.tensor(v, dtype=torch.float32)) for v in x], "SUM", 8, 1,
                    faulty, "mirror")
    assert not unchanged
    for g, w in zip(root, want, strict=True):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, rel=1e-6)


def _in(rank, text):
    for part in text.split(","):
        low, _, high = part.partition("-")
        if int(low) <= rank <= int(high or low):
            return True
    return False
