"""Values of groups mixing m >= 2 real members with virtual peers, against
their definitions (backend/mixed.py).

The m real members run in one process, one thread each, meeting in a small
in-process collective (``Members``): the real all-reduce there is the real op
over the members' prepared tensors in member order, as gloo's is for a fixed
member list.  Expected values never reuse mixed.py's arithmetic: the n-term
brute force materialises every virtual peer's contribution (its assigned
member's data under ``mirror``, zeros, a faulty peer's spoiled copy) and
reduces all n in group order; ``random`` peers are their documented keyed
draws (``Values.generator``: the healthy ones' aggregate with ``key``, a
faulty one's own with ``(*key, "peer", r)``).  Data built from small
integers and powers of two keep every sum and product exact, so the brute
force must match bit for bit whatever its order.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from prism_debug.backend.mixed import (
    MixedGroup,
    allgather_mixed,
    allreduce_mixed,
    alltoall_mixed,
    broadcast_mixed,
    multiplicities,
    reduce_mixed,
    reduce_scatter_mixed,
)
from prism_debug.backend.values import POLICIES, Values

R = dist.ReduceOp
KEY = (2, "dp", 1, 5, 0)  # (iteration, family, index, the group's op number, tensor)
SEED = 11
PREMUL = 0.25
FLOAT_OPS = ["SUM", "AVG", "PREMUL_SUM", "PRODUCT", "MIN", "MAX"]
INT_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
DRAWN = {"SUM", "AVG", "PREMUL_SUM", "MIN", "MAX"}
DTYPES = [torch.float32, torch.float64, torch.int64]


def torch_op(name):
    return R.PREMUL_SUM(PREMUL) if name == "PREMUL_SUM" else getattr(R, name)


def binary(name, floating):
    """NCCL's binary op for ``name`` (fmaxf/fminf: a NaN loses to a number)."""
    if name in ("SUM", "AVG", "PREMUL_SUM"):
        return torch.add
    if name == "PRODUCT":
        return torch.mul
    if name in ("MIN", "MAX"):
        if floating:
            return torch.fmax if name == "MAX" else torch.fmin
        return torch.maximum if name == "MAX" else torch.minimum
    return {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name]


class Members:
    """m real members in one process: ``run(body)`` calls ``body(j)`` on one
    thread per member; their real collectives meet at a barrier."""

    def __init__(self, m: int) -> None:
        self.m = m
        self._barrier = threading.Barrier(m, timeout=20)
        self._slots: list = [None] * m

    def run(self, body) -> list:
        results: list = [None] * self.m
        errors: list = []

        def member(j: int) -> None:
            try:
                results[j] = body(j)
            except BaseException as exc:  # surfaced on the test's thread
                errors.append(exc)
                self._barrier.abort()

        threads = [threading.Thread(target=member, args=(j,)) for j in range(self.m)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results

    def exchange(self, j: int, item) -> list:
        self._slots[j] = item
        self._barrier.wait()
        everything = list(self._slots)
        self._barrier.wait()
        return everything

    def reduce_real(self, j: int):
        def reduce(tensor: torch.Tensor, op) -> None:
            assert op not in (R.AVG, R.PREMUL_SUM)  # gloo has neither
            prepared = self.exchange(j, tensor.clone())
            combine = binary(op.name, tensor.is_floating_point())
            acc = prepared[0].clone()
            for other in prepared[1:]:  # in member order
                acc = combine(acc, other)
            tensor.copy_(acc)
        return reduce

    def gather_real(self, j: int):
        def gather(outputs: list, input: torch.Tensor) -> None:
            for out, shard in zip(outputs, self.exchange(j, input.clone()), strict=True):
                out.copy_(shard)
        return gather

    def broadcast_real(self, j: int):
        def broadcast(tensor: torch.Tensor, source: int) -> None:
            tensor.copy_(self.exchange(j, tensor.clone())[source])
        return broadcast

    def alltoall_real(self, j: int):
        def alltoall(outputs: list, inputs: list) -> None:
            sent = self.exchange(j, [t.clone() for t in inputs])
            for i, out in enumerate(outputs):
                out.copy_(sent[i][j])
        return alltoall


def spoil(t: torch.Tensor, action: str, scale: float) -> torch.Tensor:
    if action == "nan":
        return torch.full_like(t, math.nan)
    if action == "inf":
        return torch.full_like(t, math.inf)
    return t * scale


def aggregate(values: Values, like: torch.Tensor, name: str, h: int) -> torch.Tensor:
    """The documented closed form of h healthy random peers' reduction."""
    generator = values.generator(KEY)
    if name in ("MIN", "MAX"):
        u = torch.rand(like.shape, generator=generator, dtype=torch.float64)
        top = torch.special.ndtri(u ** (1.0 / h)).to(like.dtype)
        return top if name == "MAX" else -top
    return torch.randn(like.shape, generator=generator, dtype=like.dtype) * math.sqrt(h)


def brute_force(xs, group: MixedGroup, name: str, policy: str, faulty=()) -> torch.Tensor:
    """The reduction over all n members' contributions, each materialised."""
    n, m = group.size, group.num_real
    floating = xs[0].is_floating_point()
    values = Values(policy, SEED)
    real = set(group.real_positions)
    spoiled = {p: (a, s) for p, a, s in faulty} if floating else {}

    def premul(t):
        return t * PREMUL if name == "PREMUL_SUM" else t

    if policy == "random" and floating and name in DRAWN:
        # the real members (member order), the healthy peers' aggregate, the faulty ones
        terms = [premul(x) for x in xs]
        h = n - m - len(spoiled)
        if h:
            terms.append(premul(aggregate(values, xs[0], name, h)))
        for p in sorted(spoiled):
            draw = torch.randn(xs[0].shape, generator=values.generator((*KEY, "peer", p)),
                               dtype=xs[0].dtype)
            terms.append(spoil(premul(draw), *spoiled[p]))
    else:
        terms = []
        for p in range(n):
            mirrored = premul(xs[group.assigned[p]])
            c = mirrored if p in real or policy != "zeros" else torch.zeros_like(mirrored)
            terms.append(spoil(c, *spoiled[p]) if p in spoiled else c)
    combine = binary(name, floating)
    acc = terms[0].clone()
    for t in terms[1:]:
        acc = combine(acc, t)
    if name == "AVG":
        acc = acc / n if floating else torch.div(acc, n, rounding_mode="trunc")
    return acc


def same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bits; any NaN equals any NaN, and -0.0 equals 0.0 (which of two
    zeros fminf/fmaxf return depends on the order, unspecified in NCCL too)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.is_floating_point():
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), (got, want)
        width = torch.int32 if got.dtype == torch.float32 else torch.int64
        got, want = (got[~nan] + 0.0).view(width), (want[~nan] + 0.0).view(width)
    assert torch.equal(got, want), (got, want)


def mixed_allreduce(xs, group_of, name, policy, faulty=(), key=KEY):
    """Every member's result of the mixed all-reduce of its ``xs[j]``."""
    members = Members(len(xs))
    values = Values(policy, SEED)

    def body(j):
        tensor = xs[j].clone()
        allreduce_mixed(group_of(j), tensor, torch_op(name), values, key,
                        members.reduce_real(j), faulty)
        return tensor
    return members.run(body)


@st.composite
def layouts(draw):
    """(n, real group ranks): n <= 9, m in {2, 3, n}."""
    n = draw(st.integers(2, 9))
    m = draw(st.sampled_from(sorted({k for k in (2, 3, n) if k <= n})))
    real = draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m, unique=True))
    return n, tuple(sorted(real))


EXACT = st.sampled_from([0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 0.25, 1.5, -1.5])


def exact_data(draw, dtype, m, length):
    if dtype == torch.int64:
        rows = [draw(st.lists(st.integers(-4, 4), min_size=length, max_size=length))
                for _ in range(m)]
    else:
        rows = [draw(st.lists(EXACT, min_size=length, max_size=length)) for _ in range(m)]
    return [torch.tensor(row, dtype=dtype) for row in rows]


# -- the layout ---------------------------------------------------------------------------

def test_multiplicities_assign_virtual_peers_round_robin_in_group_order():
    assert multiplicities(5, (0, 3)) == (3, 2)  # virtual 1, 2, 4 -> members 0, 1, 0
    assert MixedGroup(5, (0, 3), 1).assigned == (0, 0, 1, 1, 0)
    assert multiplicities(9, (2, 4, 8)) == (3, 3, 3)
    assert multiplicities(4, (0, 1, 2, 3)) == (1, 1, 1, 1)
    assert MixedGroup(8, (1, 6), 0).virtual_of(1) == (2, 4, 7)


@given(layouts())
def test_multiplicities_add_up_to_the_group_and_differ_by_at_most_one(layout):
    n, real = layout
    k = multiplicities(n, real)
    assert sum(k) == n and max(k) - min(k) <= 1
    assert k == tuple(sorted(k, reverse=True))  # the remainder goes to the first members


@pytest.mark.parametrize("n,real,me", [(4, (), 0), (4, (2, 1), 0), (4, (1, 4), 0),
                                       (4, (1, 2), 2), (4, (1, 1), 0)])
def test_a_malformed_layout_is_refused(n, real, me):
    with pytest.raises(ValueError):
        MixedGroup(n, real, me)


# -- all-reduce -----------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), layouts(), st.sampled_from(DTYPES), st.sampled_from(POLICIES),
       st.integers(1, 4))
def test_allreduce_is_the_reduction_of_all_n_contributions(data, layout, dtype, policy, length):
    n, real = layout
    floating = dtype.is_floating_point
    name = data.draw(st.sampled_from(FLOAT_OPS if floating else INT_OPS))
    xs = exact_data(data.draw, dtype, len(real), length)
    results = mixed_allreduce(xs, lambda j: MixedGroup(n, real, j), name, policy)
    want = brute_force(xs, MixedGroup(n, real, 0), name, policy)
    for got in results:  # every member holds the same bits, the definition's
        same_bits(got, want)


FLOATS = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), layouts(), st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from(["SUM", "AVG", "PREMUL_SUM"]))
def test_mirror_sum_is_the_multiplicity_weighted_sum_in_member_order(data, layout, dtype, name):
    n, real = layout
    xs = [torch.tensor(data.draw(st.lists(FLOATS, min_size=3, max_size=3)), dtype=dtype)
          for _ in real]
    results = mixed_allreduce(xs, lambda j: MixedGroup(n, real, j), name, "mirror")
    k = multiplicities(n, real)
    scale = PREMUL if name == "PREMUL_SUM" else 1.0
    want = xs[0] * (scale * k[0])
    for x, kj in zip(xs[1:], k[1:], strict=True):
        want = want + x * (scale * kj)
    if name == "AVG":
        want = want / n
    for got in results:
        same_bits(got, want)
    # and within float rounding of every virtual peer materialised, in group order:
    # n additions, each off by at most eps of the magnitudes summed so far (plus
    # the subnormal range, where premultiplying by f rounds absolutely)
    brute = brute_force(xs, MixedGroup(n, real, 0), name, "mirror")
    magnitude = sum(x.abs() * (scale * kj) for x, kj in zip(xs, k, strict=True))
    finfo = torch.finfo(dtype)
    bound = (n + 1) * (finfo.eps * (magnitude / n if name == "AVG" else magnitude) + finfo.tiny)
    assert ((results[0] - brute).abs() <= bound).all(), (results[0], brute, bound)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(2, 9), st.sampled_from(DTYPES), st.sampled_from(POLICIES))
def test_a_group_of_real_members_only_is_the_plain_real_op(data, n, dtype, policy):
    floating = dtype.is_floating_point
    name = data.draw(st.sampled_from(FLOAT_OPS if floating else INT_OPS))
    xs = [torch.tensor(data.draw(st.lists(FLOATS if floating else st.integers(-50, 50),
                                          min_size=2, max_size=2)), dtype=dtype)
          for _ in range(n)]
    results = mixed_allreduce(xs, lambda j: MixedGroup(n, tuple(range(n)), j), name, policy)
    combine = binary(name, floating)
    want = xs[0] * PREMUL if name == "PREMUL_SUM" else xs[0].clone()
    for x in xs[1:]:  # no virtual term at all
        want = combine(want, x * PREMUL if name == "PREMUL_SUM" else x)
    if name == "AVG":
        want = want / n if floating else torch.div(want, n, rounding_mode="trunc")
    for got in results:
        same_bits(got, want)


FAULTS = [("nan", 1.0), ("inf", 1.0), ("corrupt", -3.0)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), layouts(), st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from(POLICIES), st.sampled_from(FLOAT_OPS))
def test_faulty_virtual_peers_contribute_their_spoiled_share(data, layout, dtype, policy, name):
    n, real = layout
    virtual = [p for p in range(n) if p not in real]
    assume(virtual)
    chosen = data.draw(st.lists(st.sampled_from(virtual), min_size=1, unique=True))
    faulty = tuple((p, *data.draw(st.sampled_from(FAULTS))) for p in sorted(chosen))
    xs = exact_data(data.draw, dtype, len(real), 3)
    results = mixed_allreduce(xs, lambda j: MixedGroup(n, real, j), name, policy, faulty)
    want = brute_force(xs, MixedGroup(n, real, 0), name, policy, faulty)
    for got in results:
        same_bits(got, want)


def test_a_fault_naming_a_real_member_leaves_it_alone():
    xs = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])]
    spoiled = mixed_allreduce(xs, lambda j: MixedGroup(4, (0, 2), j), "SUM", "mirror",
                              faulty=((0, "nan", 1.0), (2, "inf", 1.0)))
    assert spoiled[0].tolist() == [8.0, 2.0]  # 2·x0 + 2·x1: nothing spoiled


def test_random_peers_are_keyed_by_the_group_scoped_key_only():
    xs = [torch.zeros(4000, dtype=torch.float64), torch.zeros(4000, dtype=torch.float64)]
    layout = lambda j: MixedGroup(9, (3, 5), j)  # noqa: E731
    first = mixed_allreduce(xs, layout, "SUM", "random")
    again = mixed_allreduce(xs, layout, "SUM", "random")
    other = mixed_allreduce(xs, layout, "SUM", "random", key=(*KEY[:-1], 1))
    same_bits(first[0], again[1])
    assert not torch.equal(first[0], other[0])
    # 7 virtual peers of N(0, 1) each: their sum is N(0, 7)
    assert first[0].std().item() == pytest.approx(math.sqrt(7), rel=0.05)


def test_integer_random_peers_mirror():
    xs = [torch.tensor([1, 2]), torch.tensor([10, 20])]
    got = mixed_allreduce(xs, lambda j: MixedGroup(5, (1, 3), j), "SUM", "random")
    assert got[0].tolist() == [3 * 1 + 2 * 10, 3 * 2 + 2 * 20]


# -- reduce-scatter, all-gather, broadcast, all-to-all -------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), layouts(), st.sampled_from(POLICIES), st.sampled_from(["SUM", "MAX", "AVG"]))
def test_reduce_scatter_is_the_own_chunk_of_the_n_member_reduction(data, layout, policy, name):
    n, real = layout
    xs = exact_data(data.draw, torch.float64, len(real), 2 * n)
    members = Members(len(real))
    values = Values(policy, SEED)

    def body(j):
        out = torch.empty(2, dtype=torch.float64)
        reduce_scatter_mixed(MixedGroup(n, real, j), out, xs[j], torch_op(name), values, KEY,
                             members.reduce_real(j))
        return out
    results = members.run(body)
    whole = brute_force(xs, MixedGroup(n, real, 0), name, policy).reshape(n, 2)
    for j, got in enumerate(results):
        same_bits(got, whole[real[j]])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts(), st.sampled_from(POLICIES), st.sampled_from(DTYPES))
def test_allgather_fills_real_slots_for_real_and_virtual_ones_by_policy(layout, policy, dtype):
    n, real = layout
    members = Members(len(real))
    values = Values(policy, SEED)
    shards = [torch.arange(3, dtype=dtype) + 10 * (j + 1) for j in range(len(real))]

    def body(j):
        outputs = list(torch.empty(n, 3, dtype=dtype).unbind(0))
        allgather_mixed(MixedGroup(n, real, j), outputs, shards[j], values, KEY,
                        members.gather_real(j))
        return torch.stack(outputs)
    results = members.run(body)
    group = MixedGroup(n, real, 0)
    for p in range(n):
        if p in real:
            want = shards[real.index(p)]
        elif policy == "mirror":
            want = shards[group.assigned[p]]
        elif policy == "zeros":
            want = torch.zeros(3, dtype=dtype)
        elif dtype.is_floating_point:
            want = torch.randn(3, generator=values.generator((*KEY, p)), dtype=dtype)
        else:
            want = torch.ones(3, dtype=dtype)  # seeded integers are ones (values.py)
        for got in results:
            same_bits(got[p], want)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("root", range(6))
def test_broadcast_from_a_real_or_virtual_root(policy, root):
    real = (1, 4)
    group = MixedGroup(6, real, 0)
    members = Members(2)
    values = Values(policy, SEED)
    held = [torch.tensor([1.0, 2.0]), torch.tensor([7.0, 8.0])]

    def body(j):
        tensor = held[j].clone()
        broadcast_mixed(MixedGroup(6, real, j), tensor, root, values, KEY,
                        members.broadcast_real(j))
        return tensor
    results = members.run(body)
    if root in real or policy == "mirror":
        want = held[group.assigned[root]]  # the root, or the member it mirrors
    elif policy == "zeros":
        want = torch.zeros(2)
    else:
        want = torch.randn(2, generator=values.generator(KEY))
    for got in results:
        same_bits(got, want)


@pytest.mark.parametrize("policy", POLICIES)
def test_alltoall_takes_a_virtual_peers_chunk_from_its_assigned_member(policy):
    n, real = 5, (0, 3)  # virtual 1, 2, 4 mirror members 0, 1, 0
    members = Members(2)
    values = Values(policy, SEED)
    # member j's chunk for group rank p: 100·(j + 1) + p
    chunks = [[torch.full((2,), 100.0 * (j + 1) + p) for p in range(n)] for j in range(2)]

    def body(j):
        outputs = [torch.empty(2) for _ in range(n)]
        alltoall_mixed(MixedGroup(n, real, j), outputs, chunks[j], values, KEY,
                       members.alltoall_real(j))
        return outputs
    results = members.run(body)
    for j, outputs in enumerate(results):
        me = real[j]
        for p, got in enumerate(outputs):
            if p in real:
                want = chunks[real.index(p)][me]
            elif policy == "mirror":
                want = chunks[(0, 0, 1, 1, 0)[p]][me]  # what the assigned member sent me
            elif policy == "zeros":
                want = torch.zeros(2)
            else:
                want = torch.randn(2, generator=values.generator((*KEY, p)))
            same_bits(got, want)


def test_alltoall_chunks_of_another_size_than_the_assigned_members_are_seeded():
    members = Members(2)
    values = Values("mirror", SEED)
    sizes = [1, 2, 1]  # group rank 1 (virtual, mirroring member 0) sends 2 where 0 sends 1

    def body(j):
        outputs = [torch.empty(s) for s in sizes]
        inputs = [torch.full((s,), float(j)) for s in sizes]
        alltoall_mixed(MixedGroup(3, (0, 2), j), outputs, inputs, values, KEY,
                       members.alltoall_real(j))
        return outputs
    for outputs in members.run(body):
        same_bits(outputs[1], torch.randn(2, generator=values.generator((*KEY, 1))))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("root", range(5))
def test_reduce_changes_a_real_roots_buffer_only(policy, root):
    n, real = 5, (1, 3)
    members = Members(2)
    values = Values(policy, SEED)
    xs = [torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 0.25, -1.0])]

    def reduce_to(j):
        def reduce(buffer, op, member):
            everything = members.exchange(j, buffer.clone())
            buffer.add_(torch.rand(3))  # a real reduce may use a non-root's input as scratch
            if j == member:
                buffer.copy_(everything[0] + everything[1])
        return reduce

    def body(j):
        tensor = xs[j].clone()
        reduce_mixed(MixedGroup(n, real, j), tensor, root, R.SUM, values, KEY, reduce_to(j))
        return tensor
    results = members.run(body)
    for j, got in enumerate(results):
        if real[j] == root:
            same_bits(got, brute_force(xs, MixedGroup(n, real, 0), "SUM", policy))
        else:
            same_bits(got, xs[j])  # as it was: a virtual root, or not the root
