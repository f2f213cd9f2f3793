"""Several real ranks (``ReplayEngine(real_ranks=R)``): each real process
holds a replica driven by its own rank and fed the others' arrivals, in
whatever order they come.  Replicas fed the same arrivals must compute the
same timeline to the last bit (``float.hex``), the full per-rank path's
within 1e-12, and a late real rank must delay the virtual ranks downstream
by what the graph's gaps and costs say.

The arrivals come from :func:`job`: each real rank follows its class program
as its process would (compute, issue at its own clock plus an offset, block
at a wait until the completion is known), fed to one engine as it goes."""

import math
import random

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from prism_debug.cost import DEFAULT_PROFILE, CostModel
from prism_debug.cost.hardware import load_profile
from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph.execution import ClassProgram, ExecutionGraph, GraphError, Mesh, OpSpec
from prism_debug.variability import parse_variability
from prism_debug.variability.model import StochasticCompute
from tests.engine.test_replay import (
    COST,
    constant_cost,
    end,
    issue,
    pipeline_graph,
    pipeline_jobs,
    wait,
)

SEED = 7

# ---------------------------------------------------------------------------------------
# The job and the replicas


def job(graph, ranks, offsets, iterations, cost, compute=None, windows=()):
    """Every real rank's feeds, in the order a scheduler of the real processes
    made them: ("issue", rank, iteration, op, arrival) and ("end", rank,
    iteration).  A rank blocks at a wait whose completion is unknown; the
    scheduler runs another meanwhile, and stops when none can go on (a
    failed peer)."""
    engine = ReplayEngine(graph, cost, real_rank=ranks[0], real_ranks=ranks, compute=compute,
                          seed=SEED)
    add_windows(engine, windows)
    feeds = []
    place = {r: [1, 0, 0.0, False, 0] for r in ranks}  # iteration, pc, clock, gap taken, ops
    moving = True
    while moving:
        moving = False
        for rank in ranks:
            program = graph.programs[graph.class_of(rank)]
            while place[rank][0] <= iterations:
                iteration, pc, clock, gap_taken, count = place[rank]
                event = program.events(iteration)[pc]
                if not gap_taken:
                    clock += event.gap_s
                if event.action == "wait":
                    done = engine.completion(rank, iteration, event.op)
                    if done == math.inf:
                        place[rank] = [iteration, pc, clock, True, count]
                        break
                    clock = max(clock, done)
                elif event.action == "issue":
                    offset = offsets[rank][count % len(offsets[rank])]
                    feeds.append(("issue", rank, iteration, event.op, clock + offset))
                    feed(engine, ranks[0], graph, feeds[-1])
                    count += 1
                if event.action == "end":
                    feeds.append(("end", rank, iteration))
                    feed(engine, ranks[0], graph, feeds[-1])
                    place[rank] = [iteration + 1, 0, clock, False, count]
                else:
                    place[rank] = [iteration, pc + 1, clock, False, count]
                moving = True
    return feeds


def feed(engine, me, graph, item):
    if item[0] == "issue":
        _, rank, iteration, op, arrival = item
        if rank == me:
            program = graph.programs[graph.class_of(rank)]
            assert engine.real_issue(program.ops[op], arrival) == (iteration, op)
        else:
            engine.peer_issue(rank, iteration, op, arrival)
    elif item[1] == me:
        engine.real_iteration_end()
    else:
        engine.peer_iteration_end(item[1], item[2])


def interleave(feeds, me, rnd):
    """The feeds in a random order but for the local rank's own, which its
    process makes in program order (and each only once its waits before it
    completed: :func:`replica` holds it back until then)."""
    order = list(feeds)
    rnd.shuffle(order)
    own = iter([f for f in feeds if f[1] == me])
    return [next(own) if f[1] == me else f for f in order]


def waits_before(graph, me, feeds):
    """For each of the local rank's feeds, the (iteration, op) its process
    waited for since its previous feed."""
    program = graph.programs[graph.class_of(me)]
    out, waited = {}, []
    for iteration in sorted({f[2] for f in feeds if f[1] == me}):
        for event in program.events(iteration):
            if event.action == "wait":
                waited.append((iteration, event.op))
            elif event.action == "issue":
                out[("issue", iteration, event.op)], waited = waited, []
            else:
                out[("end", iteration)], waited = waited, []
    return out


def add_windows(engine, windows):
    for kind, rank, value, first in windows:
        if kind == "slow":
            engine.slow([rank], value, first_iteration=first)
        elif kind == "delay":
            engine.delay([rank], value, first_iteration=first)
        else:
            engine.fail([rank], at_iteration=first, at_op=int(value))


def replica(graph, ranks, me, feeds, cost, *, rnd=None, record=False, shortcuts=True,
            compute=None, windows=(), add_before=0, first_window=math.inf):
    """A replica fed ``feeds`` (shuffled by ``rnd``, when given), its windows
    added before feed ``add_before``; returns it and every real rank's
    completions, asked after every feed (an answer once known never changes)."""
    engine = ReplayEngine(graph, cost, real_rank=me, real_ranks=ranks, record=record,
                          compute=compute, seed=SEED)
    engine._loop.real_shortcuts = shortcuts
    order = feeds if rnd is None else interleave(feeds, me, rnd)
    waits = waits_before(graph, me, feeds)
    known, pending, held = {}, [], []  # held: the local rank's feeds whose waits go on

    def give(item):
        feed(engine, me, graph, item)
        if item[0] == "issue":
            pending.append(item[1:4])
        for key in list(pending):
            done = engine.completion(*key)
            if done < math.inf:
                known[key] = done
                pending.remove(key)
        for key in list(known)[-4:]:  # recent answers stay what they were
            again = engine.completion(*key)
            assert again == math.inf or again.hex() == known[key].hex()

    for i, item in enumerate(order):
        if i == add_before:
            # a window must come before any class reaches its first iteration
            assert max(s.iteration for s in engine._states) < first_window
            add_windows(engine, windows)
        if item[1] == me:
            held.append(item)
        else:
            give(item)
        while held and all(engine.real_completion(w) < math.inf
                           for w in waits[(held[0][0], *held[0][2:4])]):
            give(held.pop(0))
    assert not held
    known.update((key, math.inf) for key in pending)
    return engine, known


def timeline(engine):
    """Every rank's iteration starts, as hex."""
    return [[t.hex() for t in engine.iteration_starts(r)] for r in range(engine.mesh.world_size)]


def hexed(known):
    return {key: done.hex() for key, done in known.items()}


def records(engine):
    """The records by (class, iteration, op), arrays as hex (their order is
    when each replica completed them, which may differ)."""
    shape = engine._layout.local_shape

    def bits(times):
        return tuple(float(t).hex() for t in np.broadcast_to(times, shape).ravel())

    out = {}
    for r in engine.records:
        key = (r.class_id, r.iteration, r.op)
        assert key not in out
        out[key] = (bits(r.arrival), bits(r.done), r.cause)
    return out


def check_replicas(graph, ranks, feeds, cost, data, compute=None, windows=(), first_window=None):
    """Every replica, fed in orders Hypothesis picks, against each other (by
    float.hex) and against the full per-rank path (within 1e-12)."""
    def add_point(order_feeds):
        if first_window is None:
            return 0  # windows from the start: before the first feed
        # before the first feed of an iteration past the first: no class can be
        # past iteration 4 then (real classes 2, virtual ones two ahead)
        last = next((i for i, f in enumerate(order_feeds) if f[2] > 1), len(order_feeds))
        return data.draw(st.integers(0, last), label="windows added before feed")

    first = math.inf if first_window is None else first_window
    oracle, oracle_known = replica(graph, ranks, ranks[0], feeds, cost, shortcuts=False,
                                   compute=compute, windows=windows, first_window=first)
    base_known = base_timeline = base_records = values = None
    for me in ranks:
        for record in (False, True):
            rnd = random.Random(data.draw(st.integers(0, 2 ** 32), label=f"order {me}"))
            order = interleave(feeds, me, random.Random(rnd.random()))
            engine, known = replica(graph, ranks, me, order, cost, record=record,
                                    compute=compute, windows=windows,
                                    add_before=add_point(order), first_window=first)
            if record:
                if base_records is None:
                    base_records = records(engine)
                mine = records(engine)
                assert mine == base_records, [(k, mine.get(k), base_records.get(k)) for k in
                                              sorted(set(mine) | set(base_records))
                                              if mine.get(k) != base_records.get(k)][:3]
                continue
            if base_known is None:
                base_known, base_timeline, values = hexed(known), timeline(engine), known
                # the full per-rank path, fed in the job's order
                assert set(oracle_known) == set(known)
                for key, done in known.items():
                    assert done == pytest.approx(oracle_known[key], rel=1e-12, abs=1e-12), (
                        key, done, oracle_known[key])
                for rank in range(graph.world_size):
                    assert engine.iteration_starts(rank) == pytest.approx(
                        oracle.iteration_starts(rank), rel=1e-12, abs=1e-12), (
                        rank, engine.iteration_starts(rank), oracle.iteration_starts(rank))
            assert hexed(known) == base_known
            assert timeline(engine) == base_timeline
    return values


# ---------------------------------------------------------------------------------------
# (a) replicas agree: the bundled example's graph and pipeline graphs


class Example(tuple):
    def __repr__(self) -> str:  # (Hypothesis prints it with every failure)
        return "<the bundled example at 64 ranks, the default hardware's costs>"


@pytest.fixture(scope="module")
def example(example_graph):
    return Example((ExecutionGraph.load(example_graph),
                    CostModel(load_profile(DEFAULT_PROFILE)).op_time_s))


def real_ranks(graph, draw):
    """2-4 real ranks in 1-3 classes."""
    by_class = {}
    for rank in range(graph.world_size):
        by_class.setdefault(graph.class_of(rank), []).append(rank)
    classes = draw(st.lists(st.sampled_from(sorted(by_class)), min_size=1,
                            max_size=min(3, len(by_class)), unique=True), label="classes")
    ranks = [draw(st.sampled_from(by_class[c]), label=f"rank of class {c}") for c in classes]
    pool = [r for c in classes for r in by_class[c] if r not in ranks]
    more = draw(st.lists(st.sampled_from(pool), max_size=4 - len(ranks), unique=True)
                if pool else st.just([]), label="more ranks")
    ranks = sorted(ranks + more)
    if len(ranks) < 2:
        assume(len(pool) > 0)
        ranks = sorted(ranks + [pool[0]])
    return ranks


# late, early, on time: offsets against the rank's own clock (seconds)
offsets_ms = st.lists(st.sampled_from([0.0, 0.0, 5.0, -1.0, 20.0]) | st.floats(-2, 30),
                      min_size=1, max_size=5)


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_replicas_of_the_example_agree_to_the_bit(example, data):
    graph, cost = example
    ranks = real_ranks(graph, data.draw)
    offsets = {r: [ms * 1e-3 for ms in data.draw(offsets_ms, label=f"offsets {r}")]
               for r in ranks}
    feeds = job(graph, ranks, offsets, 2, cost)
    known = check_replicas(graph, ranks, feeds, cost, data)
    assert all(done < math.inf for done in known.values())  # nothing failed: all complete


@settings(max_examples=150, deadline=None)
@given(pipeline_jobs(), st.data())
def test_replicas_of_a_pipeline_agree_to_the_bit(job_, data):
    graph, before, _ = job_
    ranks = real_ranks(graph, data.draw)
    offsets = {r: data.draw(st.lists(st.sampled_from([0.0, 0.05, -0.02, 0.3]) | st.floats(-1, 1),
                                     min_size=1, max_size=4), label=f"offsets {r}")
               for r in ranks}
    windows = [(kind, rank, value, 1) for kind, rank, value in before
               if kind != "link" and rank not in ranks]
    feeds = job(graph, ranks, offsets, 3, constant_cost, windows=windows)
    check_replicas(graph, ranks, feeds, constant_cost, data, windows=windows)


# ---------------------------------------------------------------------------------------
# (c) order-free randomness and windows added at different moments


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_replicas_agree_under_stochastic_compute(example, data):
    graph, cost = example
    compute = StochasticCompute(graph, parse_variability(["cv=0.05"]))
    ranks = real_ranks(graph, data.draw)
    offsets = {r: [data.draw(st.floats(0, 0.01), label=f"offset {r}")] for r in ranks}
    feeds = job(graph, ranks, offsets, 2, cost, compute=compute)
    check_replicas(graph, ranks, feeds, cost, data, compute=compute)


@settings(max_examples=150, deadline=None)
@given(pipeline_jobs(), st.data())
def test_replicas_agree_with_windows_added_at_different_moments(job_, data):
    graph, _, _ = job_
    ranks = real_ranks(graph, data.draw)
    virtual = [r for r in range(graph.world_size) if r not in ranks]
    assume(virtual)
    first = 5  # no class is past iteration 4 where replicas add them (check_replicas)
    window = st.one_of(st.tuples(st.just("slow"), st.sampled_from(virtual), st.floats(1, 4)),
                       st.tuples(st.just("delay"), st.sampled_from(virtual), st.floats(0, 1)),
                       st.tuples(st.just("fail"), st.sampled_from(virtual), st.integers(0, 3)))
    windows = [(*w, first + data.draw(st.integers(0, 1), label="later"))
               for w in data.draw(st.lists(window, min_size=1, max_size=3), label="windows")]
    compute = StochasticCompute(graph, parse_variability(["cv=0.05"])) \
        if data.draw(st.booleans(), label="stochastic") else None
    offsets = {r: [data.draw(st.floats(0, 0.2), label=f"offset {r}")] for r in ranks}
    feeds = job(graph, ranks, offsets, 7, constant_cost, compute=compute, windows=windows)
    known = check_replicas(graph, ranks, feeds, constant_cost, data, compute=compute,
                           windows=windows, first_window=first)
    if not any(w[0] == "fail" for w in windows):
        assert all(done < math.inf for done in known.values())


# ---------------------------------------------------------------------------------------
# (b) a late real rank, worked out by hand; what stays unknown until it is fed


def pipeline_feeds(late_s):
    """pipeline_graph() (stage 0 = ranks 0, 1; stage 1 = ranks 2, 3; every op
    COST) with real ranks 0 and 2: rank 0 reaches its TP all-reduce
    ``late_s`` after its 1 s of compute, sends when it completes; rank 2
    receives at 0 and reaches its TP all-reduce 1 s after its receive."""
    tp0 = 1.0 + late_s + COST  # TP {0, 1}: rank 0 is its last member
    received = tp0 + COST  # the send leaves when the TP all-reduce is done
    return [("issue", 0, 1, 0, 1.0 + late_s), ("issue", 0, 1, 1, tp0), ("end", 0, 1),
            ("issue", 2, 1, 0, 0.0), ("issue", 2, 1, 1, received + 1.0), ("end", 2, 1)]


@pytest.mark.parametrize("me", [0, 2])
def test_a_late_real_rank_delays_a_virtual_rank_of_another_stage_by_the_chain(me):
    graph = pipeline_graph()
    times = []
    for late in (0.0, 0.005):
        engine = ReplayEngine(graph, constant_cost, real_rank=me, real_ranks=[0, 2])
        for item in pipeline_feeds(late):
            feed(engine, me, graph, item)
        times.append(engine.iteration_times(3))
    # rank 3 (virtual, stage 1): its receive from rank 1 waits for rank 1's
    # send, after TP {0, 1}, which real rank 0 held up; then 1 s; then TP {2, 3}
    on_time = ((1.0 + COST) + COST) + 1.0 + COST
    late = ((1.005 + COST) + COST) + 1.0 + COST
    assert times == [[pytest.approx(on_time, abs=1e-12)], [pytest.approx(late, abs=1e-12)]]
    assert times[1][0] - times[0][0] == pytest.approx(0.005, abs=1e-12)


def test_a_completion_stays_unknown_until_the_arrival_it_needs_is_fed():
    graph = pipeline_graph()
    tp_op, send_op = graph.programs[0].ops
    recv_op, _ = graph.programs[1].ops
    # rank 2 receives from real rank 0: unknown until rank 0's send is fed
    engine = ReplayEngine(graph, constant_cost, real_rank=2, real_ranks=[0, 2])
    handle = engine.real_issue(recv_op, 0.0)
    assert engine.real_completion(handle) == math.inf
    engine.peer_issue(0, 1, 1, 1.3)  # its send, before its TP all-reduce is known
    assert engine.real_completion(handle) == math.inf
    assert engine.completion(0, 1, 1) == math.inf
    engine.peer_issue(0, 1, 0, 1.2)  # TP {0, 1} done 1.3; both sends leave at 1.3
    assert engine.real_completion(handle) == pytest.approx(1.4)
    assert engine.completion(0, 1, 0) == pytest.approx(1.3)
    # two real ranks of one TP group: the op waits for both, in either order
    for first, second in ((0, 1), (1, 0)):
        engine = ReplayEngine(graph, constant_cost, real_rank=first, real_ranks=[0, 1])
        handle = engine.real_issue(tp_op, 1.0)
        assert engine.real_completion(handle) == math.inf
        engine.peer_issue(second, 1, 0, 1.25)
        assert engine.real_completion(handle) == pytest.approx(1.35)
        assert engine.completion(second, 1, 0) == pytest.approx(1.35)
        assert engine.last_arrival(handle) == (second, pytest.approx(1.25))


def test_a_peer_may_be_fed_ahead_of_the_local_rank_and_its_class():
    graph = pipeline_graph()
    tp_op, send_op = graph.programs[0].ops
    engine = ReplayEngine(graph, constant_cost, real_rank=0, real_ranks=[0, 1])
    for iteration in (2, 1):  # iteration 2 first: kept until its class gets there
        engine.peer_issue(1, iteration, 1, 10.0 * iteration + 0.5)
        engine.peer_issue(1, iteration, 0, 10.0 * iteration)
        engine.peer_iteration_end(1, iteration)
    engine.peer_issue(1, 1, 0, 10.0)  # a repeat is harmless
    with pytest.raises(GraphError, match="came twice"):
        engine.peer_issue(1, 2, 0, 11.0)
    h = engine.real_issue(tp_op, 1.0)
    assert engine.real_completion(h) == pytest.approx(10.1)
    engine.real_issue(send_op, 10.1)
    engine.real_iteration_end()
    h = engine.real_issue(tp_op, 20.0)
    assert engine.real_completion(h) == pytest.approx(20.1)


def test_what_peers_may_feed():
    graph = pipeline_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=0, real_ranks=[0, 2])
    with pytest.raises(GraphError, match="rank 1 is not a peer real rank"):
        engine.peer_issue(1, 1, 0, 1.0)
    with pytest.raises(GraphError, match="rank 0 is not a peer real rank"):
        engine.peer_issue(0, 1, 0, 1.0)
    with pytest.raises(GraphError, match="issues no such op"):
        engine.peer_issue(2, 1, 5, 1.0)
    with pytest.raises(GraphError, match="must name each rank once"):
        ReplayEngine(graph, constant_cost, real_rank=1, real_ranks=[0, 2])
    with pytest.raises(GraphError, match="no peers"):
        ReplayEngine(graph, constant_cost, real_rank=1).peer_iteration_end(0, 1)
    with pytest.raises(GraphError, match="does not follow the graph"):
        engine.real_iteration_end()  # rank 0 has ops to issue first


# ---------------------------------------------------------------------------------------
# (d) one real rank named in real_ranks is today's engine


def test_one_real_rank_in_real_ranks_is_todays_engine(example):
    graph, cost = example
    compute = StochasticCompute(graph, parse_variability(["cv=0.05"]))
    offsets = {5: [0.0, 0.003]}
    feeds = job(graph, [5], offsets, 2, cost, compute=compute)
    told = []
    for real_ranks in (None, [5]):
        engine = ReplayEngine(graph, cost, real_rank=5, real_ranks=real_ranks,
                              compute=compute, seed=SEED)
        handles = []
        for item in feeds:
            feed(engine, 5, graph, item)
            if item[0] == "issue":
                handles.append(item[2:4])
        told.append(([engine.real_completion(h).hex() for h in handles[-20:]],
                     timeline(engine)))
    assert told[0] == told[1]


def test_a_window_for_a_later_iteration_leaves_the_compute_done_so_far_alone():
    """Settling a class's pending compute when a replica adds a window would
    change its rounding ((0.1 + 0.2) + 0.3 is not 0.1 + (0.2 + 0.3)): a replica
    adding it mid-iteration must compute what one adding it first does."""
    tp_op = OpSpec("all_reduce", "tp", 64)
    graph = ExecutionGraph(
        mesh=Mesh((2, 2), ("dp", "tp")), families={"tp": ("tp",), "dp": ("dp",)},
        class_axis=None, gpus_per_node=4, programs=(ClassProgram(0, (tp_op,) * 3, (), (
            issue(0), wait(0), issue(1, 0.2), issue(2, 0.3), wait(1), wait(2), end())),))
    feeds = [("issue", r, 1, op, at) for op, at in ((0, 0.0), (1, 0.1 + 0.2), (2, 0.6))
             for r in (0, 1)] + [("end", 0, 1), ("end", 1, 1)]
    timelines = []
    for add_before in (0, 4):  # first, or with the class at op 2, 0.2 s computed since op 1
        engine, _ = replica(graph, [0, 1], 0, feeds, constant_cost,
                            windows=[("slow", 2, 2.0, 2)], add_before=add_before,
                            first_window=2)
        timelines.append(timeline(engine))
    assert timelines[0] == timelines[1]
    # the TP group {2, 3} arrives at op 2 at 0.1 + (0.2 + 0.3): done 0.1 later, then ends
    assert float.fromhex(timelines[0][2][1]) == 0.1 + (0.2 + 0.3) + COST


def test_a_class_that_never_blocks_stays_near_the_slowest_real_class():
    """Stage 0 isends to stage 1 and never waits; stages 1 and 2 are real.
    With stage 2's real rank still in iteration 1, stage 0 may not run more
    than one iteration past it, however far stage 1's real rank has gone."""
    tp_op = OpSpec("all_reduce", "tp", 64)
    programs = (ClassProgram(0, (OpSpec("send", "pp", 64, peer=1),), (), (issue(0, 1.0), end())),
                ClassProgram(1, (OpSpec("recv", "pp", 64, peer=-1),), (),
                             (issue(0), wait(0), end())),
                ClassProgram(2, (tp_op,), (), (issue(0, 1.0), wait(0), end())))
    graph = ExecutionGraph(mesh=Mesh((3, 2), ("pp", "tp")), families={"pp": ("pp",),
                                                                      "tp": ("tp",)},
                           class_axis="pp", programs=programs, gpus_per_node=8)
    for me in (2, 4):
        engine = ReplayEngine(graph, constant_cost, real_rank=me, real_ranks=[2, 4])
        for iteration in range(1, 7):
            feed(engine, me, graph, ("issue", 2, iteration, 0, float(iteration)))
            if me == 2 and engine.real_completion((iteration, 0)) == math.inf:
                break  # its process waits for the receive
            feed(engine, me, graph, ("end", 2, iteration))
        assert engine._states[2].iteration == 1
        assert engine._states[0].iteration == 3  # ended iteration 2, held at 3's start
        assert engine.completion(2, 3, 0) == math.inf
        assert engine.completion(2, 2, 0) == pytest.approx(2.0 + COST)
