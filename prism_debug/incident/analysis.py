"""What a set of flight-recorder dumps says happened.

Every group's collectives are numbered by the group (``collective_seq``), on
every member alike, so the dumps line up by group and number.  A group
*stopped* where its members part: some reached a collective that others
never recorded (they never arrived: hung, or died and left no dump), or
recorded it with another call (a size, dtype or op that does not match the
majority's).  The incident's stop is the earliest of those by the time the
waiting ranks issued it: a rank that hangs stops every group it is in, one
after another, and the first it failed is where it went wrong.

gloo's recorder never marks an entry started or completed and reports the
collective it timed out in as completed, so "last completed" here is the
last collective every member recorded, which holds for every backend.
Group membership comes from pg_config where the dumps state it (NCCL's list
every group); gloo's do not, and then a group's members are the ranks whose
entries name it, plus ranks that left no dump where a family's regular
stride says they belong.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

from prism_debug.incident.dumps import DEFAULT_GROUP, DumpSet, Entry

MISMATCH_KINDS = ("size", "dtype", "op")  # faults.DesyncKind's, as fr_trace's error types


@dataclasses.dataclass(frozen=True)
class Group:
    name: str
    desc: str
    members: tuple[int, ...]  # as far as the dumps tell
    inferred: tuple[int, ...]  # members placed by their family's stride (no dump of theirs)
    last_seq: dict[int, int]  # member with a dump -> the last collective it recorded here


@dataclasses.dataclass(frozen=True)
class Mismatch:
    rank: int
    kind: str  # size, dtype or op
    got: str  # the rank's call
    expected: str  # the majority's


@dataclasses.dataclass(frozen=True)
class Stop:
    """Where a group's members parted."""

    group: Group
    seq: int  # the collective that did not complete
    entry: Entry  # as the ranks that arrived recorded it (the majority's)
    arrived: tuple[int, ...]
    missing: tuple[int, ...]  # members with a dump that never recorded it
    no_dump: tuple[int, ...]  # members that left no dump at all
    mismatched: tuple[Mismatch, ...]
    issued_ns: int  # when the first rank to arrive issued it

    @property
    def culprits(self) -> tuple[int, ...]:
        """The ranks the others waited for: those that called it wrong, else
        those that never arrived (a rank that left no dump counts as one: a
        dead rank writes none; where others called it wrong, a rank with no
        dump is only unknown, as gloo aborts a rank that receives too much)."""
        if self.mismatched:
            return tuple(sorted({m.rank for m in self.mismatched}))
        return tuple(sorted({*self.missing, *self.no_dump}))

    @property
    def kind(self) -> str:
        """``mismatch``, ``hang`` (arrived nowhere, yet wrote a dump) or ``fail``
        (left no dump: it died, or could not write one)."""
        if self.mismatched:
            return "mismatch"
        return "hang" if self.missing else "fail"


@dataclasses.dataclass(frozen=True)
class Incident:
    world_size: int
    dumped: tuple[int, ...]
    no_dump: tuple[int, ...]  # ranks of the world that wrote none
    groups: tuple[Group, ...]
    stops: tuple[Stop, ...]  # earliest first
    last_completed: dict[str, tuple[int, Entry] | None]  # group -> (seq, entry)
    timeout_ms: int  # the process-group timeout the entries carry (0: unknown)

    @property
    def stop(self) -> Stop | None:
        """Where the job went wrong: the earliest stop."""
        return self.stops[0] if self.stops else None


def analyse(dumps: DumpSet, world_size: int | None = None) -> Incident:
    """The incident the dumps record; ``world_size`` where the dumps cannot
    tell it (gloo's name no group's ranks: the largest rank seen bounds it)."""
    by_group = _entries_by_group(dumps)
    groups = _groups(dumps, by_group, world_size)
    seen = {r for g in groups for r in g.members} | set(dumps.dumps)
    world = world_size or max(seen) + 1
    stops, last_completed = [], {}
    for group in groups:
        stop, last = _group_stop(group, by_group[group.name], dumps)
        last_completed[group.name] = last
        if stop is not None:
            stops.append(stop)
    stops.sort(key=lambda s: (s.issued_ns, s.group.name))
    timeouts = Counter(e.timeout_ms for d in dumps.dumps.values() for e in d.entries[-8:])
    return Incident(
        world_size=world, dumped=tuple(sorted(dumps.dumps)),
        no_dump=tuple(r for r in range(world) if r not in dumps.dumps),
        groups=tuple(groups), stops=tuple(stops), last_completed=last_completed,
        timeout_ms=timeouts.most_common(1)[0][0] if timeouts else 0)


# -- groups -----------------------------------------------------------------------------

def _entries_by_group(dumps: DumpSet) -> dict[str, dict[int, dict[int, Entry]]]:
    """group -> rank -> collective number -> its entry (p2p ops aside)."""
    out: dict[str, dict[int, dict[int, Entry]]] = {}
    for rank, dump in dumps.dumps.items():
        for entry in dump.entries:
            if not entry.is_p2p and entry.collective_seq > 0:
                out.setdefault(entry.group, {}).setdefault(rank, {})[entry.collective_seq] = entry
    return out


def _groups(dumps: DumpSet, by_group, world_size: int | None) -> list[Group]:
    stated: dict[str, tuple[int, ...]] = {}
    for dump in dumps.dumps.values():
        stated.update(dump.group_ranks)
    descs: dict[str, str] = {}
    for dump in dumps.dumps.values():
        for entry in dump.entries:
            descs.setdefault(entry.group, entry.group_desc)
    seen_world = max([*dumps.dumps, *(r for rs in stated.values() for r in rs)]) + 1
    world = world_size or seen_world
    members: dict[str, set[int]] = {}
    for name in sorted(set(by_group) | set(stated), key=_group_order):
        if name in stated:
            members[name] = set(stated[name])
        elif name == DEFAULT_GROUP:
            members[name] = set(range(world))
        else:
            members[name] = set(by_group.get(name, {}))
    no_dump = [r for r in range(world) if r not in dumps.dumps]
    inferred = _place_by_stride(members, descs, stated, no_dump)
    groups = []
    for name, ranks in members.items():
        extra = inferred.get(name, set())
        groups.append(Group(
            name=name, desc=descs.get(name, ""), members=tuple(sorted(ranks | extra)),
            inferred=tuple(sorted(extra)),
            last_seq={r: max(seqs) for r, seqs in by_group.get(name, {}).items()}))
    return groups


def _place_by_stride(members: dict[str, set[int]], descs: dict[str, str],
                     stated: dict[str, tuple[int, ...]], no_dump: list[int]) -> dict[str, set[int]]:
    """Ranks without a dump, placed in the groups of a family (one description)
    whose regular stride they complete: a dead dp peer sits where the stride
    of its dp group says, though nothing it wrote names the group."""
    if not no_dump:
        return {}
    families: dict[str, list[str]] = {}
    for name in members:
        if name not in stated and name != DEFAULT_GROUP:
            families.setdefault(descs.get(name, ""), []).append(name)
    placed: dict[str, set[int]] = {}
    for names in families.values():
        size = max(len(members[n]) for n in names)
        strides = {_stride(sorted(members[n])) for n in names if len(members[n]) == size}
        stride = strides.pop() if len(strides) == 1 else None
        if stride is None:
            continue
        for name in names:
            ranks = sorted(members[name])
            if len(ranks) >= size or not ranks:
                continue
            start = ranks[0] % stride + stride * ((ranks[0] // stride) - (size - 1))
            for first in range(max(start, ranks[0] % stride), ranks[0] + 1, stride):
                span = set(range(first, first + stride * size, stride))
                gap = span - set(ranks)
                if set(ranks) <= span and gap <= set(no_dump) and len(gap) == size - len(ranks):
                    placed[name] = gap
                    break
    return placed


def _stride(ranks: list[int]) -> int | None:
    if len(ranks) < 2:
        return None
    step = ranks[1] - ranks[0]
    return step if all(b - a == step for a, b in itertools.pairwise(ranks)) else None


def _group_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


# -- where a group stopped ----------------------------------------------------------------

def _group_stop(group: Group, records: dict[int, dict[int, Entry]], dumps: DumpSet
                ) -> tuple[Stop | None, tuple[int, Entry] | None]:
    dumped = [r for r in group.members if r in dumps.dumps]
    # a member whose dump names none of the group's collectives recorded nothing here
    lasts = {r: group.last_seq.get(r, 0) for r in dumped}
    no_dump = tuple(r for r in group.members if r not in dumps.dumps)
    if not lasts:
        return None, None
    top = max(lasts.values())
    # the first collective the members disagree on: some lack it, or call it differently
    floor = min(lasts.values())
    for seq in range(max(1, _first_common(records, dumped)), top + 1):
        have = {r: records[r][seq] for r in dumped if seq in records.get(r, {})}
        missing = tuple(r for r in dumped if lasts[r] < seq)
        mismatched = _mismatches(have)
        if missing or mismatched or (seq == top and no_dump):
            majority = _majority(have)
            last = _last_agreed(records, dumped, seq - 1)
            arrived = tuple(sorted(r for r in have if r not in {m.rank for m in mismatched}))
            issued = min(e.created_ns for e in have.values())
            return Stop(group, seq, majority, arrived, missing, no_dump, tuple(mismatched),
                        issued), last
    return None, _last_agreed(records, dumped, floor)


def _first_common(records: dict[int, dict[int, Entry]], ranks: list[int]) -> int:
    """The first collective every member's ring buffer still holds."""
    firsts = [min(records[r]) for r in ranks if records.get(r)]
    return max(firsts) if firsts else 1


def _last_agreed(records, ranks: list[int], seq: int) -> tuple[int, Entry] | None:
    for r in ranks:
        if seq in records.get(r, {}):
            return seq, records[r][seq]
    return None


def _signature(entry: Entry, kind: str) -> object:
    if kind == "op":
        return entry.op
    if kind == "dtype":
        return entry.input_dtypes
    return entry.input_sizes


def _majority(have: dict[int, Entry]) -> Entry:
    """The call most ranks made (ties: the lowest rank's, as fr_trace takes the first)."""
    counts = Counter(_key(e) for e in have.values())
    best = max(counts.values())
    return next(have[r] for r in sorted(have) if counts[_key(have[r])] == best)


def _key(entry: Entry) -> tuple:
    return (entry.op, entry.input_sizes, entry.input_dtypes)


def _mismatches(have: dict[int, Entry]) -> list[Mismatch]:
    if len({_key(e) for e in have.values()}) <= 1:
        return []
    expected = _majority(have)
    found = []
    for rank in sorted(have):
        entry = have[rank]
        for kind in ("op", "dtype", "size"):  # fr_trace checks the op before the sizes
            if _signature(entry, kind) != _signature(expected, kind):
                found.append(Mismatch(rank, kind, entry.call(), expected.call()))
                break
    return found
