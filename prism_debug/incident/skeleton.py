"""An execution graph from flight-recorder dumps alone, for a job whose code is not at hand.

The dumps say, per rank, which ops it issued on which group, in what order,
with what sizes and dtypes, and when each was created (and, for NCCL with
timing on, when it ran).  They say nothing of iterations, of the compute in
between, nor (gloo) of point-to-point ops, so the skeleton is what can be
read plus what has to be guessed, and every guess is one line of
:attr:`Skeleton.notes`:

* groups: pg_config's members where the dump lists them, else the ranks
  whose entries name the group; the groups of one description are a family
  (graph/families.py), filled out to the whole world by the family's stride,
  and the families give the mesh (graph/build.py's ``infer_mesh``);
* iterations: each rank's op sequence is searched for the shortest period it
  repeats with; from collective 1 (when the ring buffer still holds it) that
  period is iteration 1, and what precedes the repeating stretch is warm-up;
* programs: ranks that repeat the same ops form a class, one per coordinate
  of a mesh axis where the classes line up with one;
* gaps: the time between one op's end (where timing was on, else its
  creation) and the next op's creation, the median over iterations and over
  the class's ranks, scaled so that an iteration's add up to the median
  iteration.

Every op is replayed as a synchronous call (issue, then wait), which is what
a flight-recorder entry of a blocking ``all_reduce`` looks like; a rank's
point-to-point ops created within BATCH_GAP_S of each other are taken as
one ``batch_isend_irecv`` (the dumps do not mark batches).
Pure: no torch.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter

from prism_debug.cost.ops import known_op
from prism_debug.errors import IncidentError
from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph, Mesh, OpSpec
from prism_debug.incident.dumps import Dump, DumpSet, Entry
from prism_debug.incident.mesh import dump_layout, group_order, span_text

# torch's dtype names (c10::toString) -> the graph's names and their sizes
DTYPES = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1),
    "Short": ("int16", 2), "Int": ("int32", 4), "Long": ("int64", 8), "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1),
    "UInt16": ("uint16", 2), "UInt32": ("uint32", 4), "UInt64": ("uint64", 8),
}
# A batch_isend_irecv issues its ops back to back; compute comes between batches
BATCH_GAP_S = 1e-3
# what the dumps cannot say: the machine's node size
ASSUMED_GPUS_PER_NODE = 8


@dataclasses.dataclass(frozen=True)
class GroupPace:
    """How many of one group's collectives (and, apart, its point-to-point
    ops: they have their own sequence numbers) each iteration holds: enough
    to turn a sequence number into an iteration."""

    group: str
    family: str
    ranks: tuple[int, ...]
    warmup: tuple[int, ...]  # its collectives in each warm-up iteration
    steady: int  # its collectives in every later iteration
    p2p_warmup: tuple[int, ...] = ()
    p2p_steady: int = 0

    def iteration_of(self, seq: int, *, p2p: bool = False) -> tuple[int, int] | None:
        """(iteration, position among the group's collectives in it, from 1)
        of the group's collective ``seq`` (its point-to-point op with
        ``p2p``), counted from 1; None where the group has none per steady
        iteration to count by."""
        warmup, steady = (self.p2p_warmup, self.p2p_steady) if p2p else \
            (self.warmup, self.steady)
        before = 0
        for iteration, count in enumerate(warmup, start=1):
            if seq <= before + count:
                return iteration, seq - before
            before += count
        if steady == 0 or seq < 1:
            return None
        rest = seq - before - 1
        return len(warmup) + rest // steady + 1, rest % steady + 1


@dataclasses.dataclass(frozen=True)
class Skeleton:
    graph: ExecutionGraph
    notes: tuple[str, ...]  # one line per guess or omission
    groups: dict[str, GroupPace]  # by the dumps' group name ("0", "3", ...)
    # the iteration each rank's record stops in (its last held op's), by rank
    last_iteration: dict[int, int]

    def locate(self, group: str, seq: int, *, p2p: bool = False) -> tuple[int, int] | None:
        """The iteration of collective ``seq`` of ``group`` (its
        point-to-point op ``seq`` with ``p2p``) and its position among that
        group's ops of the kind there; None for a group the skeleton cannot
        count (none of them per iteration, or not in the dumps)."""
        pace = self.groups.get(group)
        return None if pace is None else pace.iteration_of(seq, p2p=p2p)


@dataclasses.dataclass(frozen=True)
class _Op:
    """One entry as the graph sees it."""

    signature: tuple  # (kind, family, nbytes, dtype, peer steps): what a class repeats
    entry: Entry

    @property
    def is_p2p(self) -> bool:
        return self.entry.is_p2p

    @property
    def counter(self) -> tuple[str, bool]:
        """What numbers it: its group's collectives, or its group's p2p ops."""
        return self.entry.group, self.entry.is_p2p

    @property
    def seq(self) -> int:
        return self.entry.p2p_seq if self.entry.is_p2p else self.entry.collective_seq


@dataclasses.dataclass(frozen=True)
class _Timeline:
    """One rank's record cut into iterations: index ranges into its ops."""

    rank: int
    ops: tuple[_Op, ...]
    warmup: tuple[range, ...]
    steady: tuple[range, ...]
    first: int  # the number of its first iteration (warm-up or steady)
    period: int  # ops per steady iteration

    @property
    def pattern(self) -> tuple:
        cut = self.steady[0] if self.steady else range(len(self.ops))
        return tuple(self.ops[i].signature for i in cut)


def build_skeleton(dumps: DumpSet, *, world_size: int | None = None) -> Skeleton:
    """The execution graph the dumps imply (see the module docstring); every
    guess it had to make is one of the skeleton's notes."""
    notes: list[str] = []
    layout = dump_layout(dumps, world_size, notes)
    world_size, mesh, family_axes = layout.world_size, layout.mesh, layout.family_axes
    members, group_family = layout.members, layout.group_family
    ops = {rank: _ops(dump, group_family, members, mesh, family_axes, notes)
           for rank, dump in sorted(dumps.dumps.items())}
    _note_p2p(dumps, notes)
    empty = sorted(rank for rank, rank_ops in ops.items() if not rank_ops)
    if len(empty) == len(ops):
        raise IncidentError(f"{dumps.directory}: no dump holds an op the graph knows: there is "
                            "no program to build")
    if empty:  # a rank that died before its first op, or whose ring was cleared
        notes.append(f"ranks {span_text(empty)}: their dumps hold no op: their programs are "
                     "their class's")
    periods: dict[tuple, tuple[int, int, int] | None] = {}
    timelines = {rank: _timeline(rank, rank_ops, periods, notes)
                 for rank, rank_ops in ops.items() if rank_ops}
    by_period: dict[int, list[int]] = {}
    for rank, timeline in timelines.items():
        if timeline.steady and len(timeline.steady) > 1:
            by_period.setdefault(timeline.period, []).append(rank)
    for period, ranks in sorted(by_period.items()):
        notes.append(f"iteration boundaries inferred from a period of {period} "
                     f"op{'s' if period > 1 else ''} (ranks {span_text(ranks)})")
    class_axis, class_ranks = _classes(timelines, mesh, notes)
    programs = tuple(_program(c, [timelines[r] for r in ranks])
                     for c, ranks in enumerate(class_ranks))
    missing = sorted(set(range(world_size)) - set(dumps.dumps))
    if missing:
        notes.append(f"ranks {span_text(missing)} left no dump: their programs are their "
                     "class's" if len(missing) > 1 else
                     f"rank {missing[0]} left no dump: its program is its class's")
    notes.append(_timing_note(dumps))
    graph = ExecutionGraph(mesh=mesh, families=family_axes, class_axis=class_axis,
                           programs=programs,
                           gpus_per_node=min(ASSUMED_GPUS_PER_NODE, world_size))
    if world_size > ASSUMED_GPUS_PER_NODE:
        notes.append(f"the dumps do not say the node size: {ASSUMED_GPUS_PER_NODE} GPUs per "
                     "node assumed")
    paces = _paces(timelines, members, group_family)
    last = {rank: t.first + len(t.warmup) + len(t.steady) - 1 + -(-len(_tail(t)) // t.period)
            for rank, t in timelines.items()}
    return Skeleton(graph, tuple(notes), paces, last)


# -- ops -----------------------------------------------------------------------------


def _ops(dump: Dump, group_family: dict[str, str], members: dict[str, tuple[int, ...]], mesh: Mesh,
         family_axes: dict[str, tuple[str, ...]], notes: list[str]) -> tuple[_Op, ...]:
    ops = []
    for entry in dump.entries:
        kind = known_op(entry.op)
        family = group_family[entry.group]
        if kind is None:
            _note_once(notes, f"{entry.op} entries are left out: the graph knows no such op")
            continue
        dtype, itemsize = DTYPES.get((entry.input_dtypes or entry.output_dtypes or ("Float",))[0],
                                     ("float32", 4))
        numel = max(_numel(entry.input_sizes), _numel(entry.output_sizes))
        steps: int | None = 0
        if entry.is_p2p:
            steps = _steps(dump.rank, entry, entry.p2p_ends, sorted(members[entry.group]),
                           family, mesh, family_axes, notes)
            if steps is None:
                continue
        ops.append(_Op((kind, family, numel * itemsize, dtype, steps), entry))
    return tuple(ops)


def _numel(sizes: tuple[tuple[int, ...], ...]) -> int:
    return sum(math.prod(shape) for shape in sizes)


def _steps(rank: int, entry: Entry, ends: tuple[int, int] | None, group: list[int],
           family: str, mesh: Mesh, family_axes, notes: list[str]) -> int | None:
    """How many steps along the family's axis the peer of a send or recv is."""
    axes = family_axes.get(family, ())
    if ends is None or len(axes) != 1 or max(ends) >= len(group):
        _note_once(notes, f"point-to-point ops on {family} are left out: "
                   + ("its groups vary no single mesh axis" if len(axes) != 1
                      else "their entries do not name both ends"))
        return None
    peer = group[ends[1]] if group[ends[0]] == rank else group[ends[0]]
    stride = mesh.strides[mesh.axis(axes[0])]
    return (peer - rank) // stride


def _note_p2p(dumps: DumpSet, notes: list[str]) -> None:
    if any(e.is_p2p for d in dumps.dumps.values() for e in d.entries):
        notes.append(f"point-to-point ops created within {BATCH_GAP_S * 1e3:g} ms of each other "
                     "(median) are taken as one batch_isend_irecv; each collective as a "
                     "synchronous call")
    backends = {e.backend for d in dumps.dumps.values() for e in d.entries}
    if "gloo" in backends:
        notes.append("gloo records no point-to-point ops: pipeline sends and receives, if the "
                     "job had any, are absent")


# -- iterations ----------------------------------------------------------------------


def _period(signatures: tuple) -> tuple[int, int, int] | None:
    """(period, start, length): the shortest period whose repeating stretch
    (signature[i] == signature[i + period] for i in start..start+length-1)
    covers the most of the record, at least two periods; None without one."""
    n = len(signatures)
    best = None
    for p in range(1, n // 2 + 1):
        run = start = 0
        best_run = (0, 0)
        for i in range(n - p):
            if signatures[i] == signatures[i + p]:
                run, start = run + 1, (start if run else i)
                if run > best_run[1]:
                    best_run = (start, run)
            else:
                run = 0
        if best_run[1] >= p and (best is None or best_run[1] + p > best[2] + best[0]):
            best = (p, best_run[0], best_run[1])
            if best_run[1] + p == n:  # the whole record repeats: a longer period only ties
                break
    return best


def _timeline(rank: int, ops: tuple[_Op, ...], periods: dict, notes: list[str]) -> _Timeline:
    """``rank``'s record cut into warm-up and steady iterations; ``periods``
    caches :func:`_period` by record (a class's ranks mostly share theirs)."""
    signatures = tuple(op.signature for op in ops)
    if signatures not in periods:
        periods[signatures] = _period(signatures)
    found = periods[signatures]
    if found is None:
        notes.append(f"rank {rank}: its {len(ops)} ops repeat with no period: its whole record "
                     "is one iteration")
        return _Timeline(rank, ops, (), (range(len(ops)),) if ops else (), 1, len(ops))
    period, start, length = found
    stop = start + length + period  # past the repeating stretch: where the incident stopped
    if _holds_the_start(ops):
        if start % period == 0:
            warmup = tuple(range(b, b + period) for b in range(0, start, period))
        else:
            warmup = (range(0, start),)
            notes.append(f"rank {rank}: its first {start} ops do not repeat: taken as one "
                         "warm-up iteration")
        boundary, first = start, 1
    else:
        warmup, boundary = (), _phase(ops, period, start, stop)
        first = _first_iteration(ops, period, boundary)
        _note_once(notes, "the ring buffer no longer holds collective 1: iterations are counted "
                          "as steady ones from it, their boundaries placed where every group's "
                          "count of collectives starts afresh")
    steady = tuple(range(b, b + period) for b in range(boundary, stop - period + 1, period))
    return _Timeline(rank, ops, warmup, steady, first, period)


def _holds_the_start(ops: tuple[_Op, ...]) -> bool:
    """True when every group's first held collective (and p2p op) is its 1st."""
    first: dict[tuple[str, bool], int] = {}
    for op in ops:
        first.setdefault(op.counter, op.seq)
    return bool(first) and all(seq == 1 for seq in first.values())


def _counts(ops: tuple[_Op, ...], cut: range) -> Counter:
    return Counter(ops[i].counter for i in cut)


def _phase(ops: tuple[_Op, ...], period: int, start: int, stop: int) -> int:
    """Where a steady iteration begins when collective 1 is gone: the offset
    at which every group's next collective is the first of an iteration
    (its sequence number is 1 past a multiple of its count per iteration),
    the longest gap before it breaking ties (the optimizer step ends one)."""
    counts = _counts(ops, range(start, start + period))
    candidates = []
    for b in range(start, min(start + period, stop - period + 1)):
        seen: set[tuple[str, bool]] = set()
        fits = True
        for op in ops[b:b + period]:
            if op.counter not in seen:
                seen.add(op.counter)
                fits &= (op.seq - 1) % counts[op.counter] == 0
        if fits:
            gap = ops[b].entry.created_ns - ops[b - 1].entry.created_ns if b else 0
            candidates.append((gap, -b))
    return -max(candidates)[1] if candidates else start


def _first_iteration(ops: tuple[_Op, ...], period: int, boundary: int) -> int:
    """The number of the iteration that begins at ``boundary``, counting
    every iteration as a steady one from collective 1."""
    counts = _counts(ops, range(boundary, boundary + period))
    for op in ops[boundary:boundary + period]:
        return (op.seq - 1) // counts[op.counter] + 1
    return 1


def _tail(timeline: _Timeline) -> range:
    """The ops after the last whole iteration: where the record stops."""
    end = timeline.steady[-1].stop if timeline.steady else \
        (timeline.warmup[-1].stop if timeline.warmup else 0)
    return range(end, len(timeline.ops))


# -- classes and programs --------------------------------------------------------------


def _classes(timelines: dict[int, _Timeline], mesh: Mesh, notes: list[str]
             ) -> tuple[str | None, list[list[int]]]:
    """The class axis and the dumped ranks of each class."""
    patterns = {rank: t.pattern for rank, t in timelines.items()}
    common = Counter(patterns.values()).most_common()
    if len(common) == 1:
        return None, [sorted(patterns)]
    for axis, name in enumerate(mesh.names):
        by_coordinate: dict[int, set] = {}
        for rank, pattern in patterns.items():
            by_coordinate.setdefault(mesh.coordinates(rank)[axis], set()).add(pattern)
        if all(len(p) == 1 for p in by_coordinate.values()) and \
                len({next(iter(p)) for p in by_coordinate.values()}) == len(by_coordinate):
            classes = [[r for r in sorted(patterns) if mesh.coordinates(r)[axis] == c]
                       for c in range(mesh.shape[axis])]
            empty = [c for c, ranks in enumerate(classes) if not ranks]
            if empty:
                notes.append(f"no rank at {name} = {span_text(empty)} left a dump: those "
                             "classes run the most common program")
                fallback = [r for r in sorted(patterns) if patterns[r] == common[0][0]]
                classes = [ranks or fallback for ranks in classes]
            notes.append(f"{len(common)} programs, one per {name} coordinate: {name} is the "
                         "class axis")
            return name, classes
    chosen = common[0][0]
    others = sorted(r for r, p in patterns.items() if p != chosen)
    notes.append(f"ranks {span_text(others)} repeat other ops than the rest, along no mesh "
                 f"axis: the skeleton gives every rank the most common program "
                 f"({len(chosen)} ops per iteration)")
    return None, [[r for r in sorted(patterns) if patterns[r] == chosen]]


def _program(class_id: int, timelines: list[_Timeline]) -> ClassProgram:
    """The class's program: its first rank's ops, with the medians of the
    gaps of every rank of the class that issued the same ops."""
    lead = timelines[0]
    ops: list[OpSpec] = []
    index: dict[tuple, int] = {}

    def events(cut: range, samples: list[list[float | None]]) -> tuple[Event, ...]:
        # (every sample holds the gaps of the same ops: ``same`` chose them)
        known = [[x for x in column if x is not None] for column in zip(*samples, strict=True)]
        gaps = [statistics.median(column) if column else 0.0 for column in known]
        # medians of the gaps do not add up to the median iteration: scale them so they do
        totals = [sum(x for x in row if x is not None) for row in samples if None not in row]
        if totals and sum(gaps) > 0:
            gaps = [g * statistics.median(totals) / sum(gaps) for g in gaps]
        out: list[Event] = []
        batch: list[int] = []  # one batch_isend_irecv's ops, issued and not yet awaited
        batches = 0
        for position, i in enumerate(cut):
            op = lead.ops[i]
            key = (op.signature, position)
            if key not in index:
                index[key] = len(ops)
                ops.append(OpSpec(*op.signature))
            if not op.is_p2p:
                out += [Event("issue", gaps[position], index[key]), Event("wait", 0.0, index[key])]
                continue
            if not batch:
                batches += 1
            batch.append(index[key])
            out.append(Event("issue", gaps[position], index[key], batches))
            following = position + 1 < len(cut) and lead.ops[i + 1].is_p2p \
                and gaps[position + 1] < BATCH_GAP_S
            if not following:
                out += [Event("wait", 0.0, k) for k in batch]
                batch = []
        return tuple(out) + (Event("end", gaps[-1]),)

    def same(t: _Timeline, cut: range, lead_cut: range) -> bool:
        return [t.ops[i].signature for i in cut] == [lead.ops[i].signature for i in lead_cut]

    warmup = []
    for w, lead_cut in enumerate(lead.warmup):
        warmup.append(events(lead_cut, [_gaps(t, w) for t in timelines
                                        if w < len(t.warmup) and same(t, t.warmup[w], lead_cut)]))
    if not lead.steady:
        return ClassProgram(class_id, tuple(ops), tuple(warmup), (Event("end", 0.0),))
    samples = [_gaps(t, len(t.warmup) + k) for t in timelines for k in range(len(t.steady))
               if same(t, t.steady[k], lead.steady[0])]
    steady = events(lead.steady[0], samples)
    return ClassProgram(class_id, tuple(ops), tuple(warmup), steady)


def _gaps(timeline: _Timeline, k: int) -> list[float | None]:
    """Seconds before each op of the timeline's iteration ``k`` (warm-up
    ones first) since the previous op's end, 0 for its first (the time
    across the boundary is the end's), and then the end's: until the next
    iteration's first op, or the op the record stops at (None where none)."""
    iterations = list(timeline.warmup) + list(timeline.steady)
    cut, ops = iterations[k], timeline.ops
    gaps = [0.0] + [_between(ops[i - 1].entry, ops[i].entry) for i in list(cut)[1:]]
    after = _between(ops[cut[-1]].entry, ops[cut.stop].entry) if cut.stop < len(ops) else None
    return gaps + [after]


def _between(before: Entry, after: Entry) -> float:
    """Seconds from ``before``'s end to ``after``'s creation.  Its end is
    known where timing was on (a start time, and a completion or a
    duration); a completion alone is the watchdog's discovery, up to its
    polling interval late, so then the end is taken as the creation."""
    end = before.created_ns
    if before.started_ns is not None and before.duration_ms is not None:
        end = before.started_ns + int(before.duration_ms * 1e6)
    elif before.started_ns is not None and before.completed_ns is not None:
        end = before.completed_ns
    return max(0.0, (after.created_ns - end) / 1e9)


def _paces(timelines: dict[int, _Timeline], members: dict[str, tuple[int, ...]],
           group_family: dict[str, str]) -> dict[str, GroupPace]:
    paces = {}
    for group in sorted(members, key=group_order):
        holders = [t for r, t in sorted(timelines.items()) if any(
            op.entry.group == group for op in t.ops)]
        if not holders:
            continue
        t = holders[0]
        steady = _counts(t.ops, t.steady[0]) if t.steady else Counter()
        # a wrapped ring (t.first > 1): the iterations before were steady ones
        warmup = [_counts(t.ops, w) for w in t.warmup] if t.first == 1 else []
        paces[group] = GroupPace(
            group, group_family[group], tuple(sorted(members[group])),
            tuple(c[group, False] for c in warmup), steady[group, False],
            tuple(c[group, True] for c in warmup), steady[group, True])
    return paces


# -- notes ---------------------------------------------------------------------------


def _timing_note(dumps: DumpSet) -> str:
    entries = [e for d in dumps.dumps.values() for e in d.entries]
    if any(e.started_ns is not None and (e.completed_ns or e.duration_ms) for e in entries):
        return ("gaps run from an op's end (its start plus duration, where timing was on) to "
                "the next op's creation: medians over iterations and ranks, scaled to add up "
                "to the median iteration")
    return ("gaps are differences of the ops' creation times (medians over iterations and "
            "ranks, scaled to add up to the median iteration; the dumps hold no start "
            "times): a synchronous call's includes its wait for the previous op, so the "
            "replay's own op times come on top")


def _note_once(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)
