"""Perturbations of virtual peers, as people type them (the console's
``perturb`` verb, ``run --perturb``, scenario files, which are turned into
these lines), applied through the replay engine's interface.

::

    slow RANKS FACTOR [from I] [for N]        compute x FACTOR from iteration I, for N iterations
    delay RANKS SECONDS [family F] [from I] [for N]   arrive SECONDS late at every (F) collective
    link NODES BANDWIDTH [LATENCY_US] [from I] [for N] [flap PERIOD_S DUTY]
                                              groups spanning NODES: bandwidth x BANDWIDTH, +LATENCY;
                                              flapping: degraded DUTY of every PERIOD_S
    fail RANKS [at I] [op K]                  fail-stop: never arrive again (and leave no
                                              flight record)
    hang RANKS [at I] [op K] [for SECONDS]    stop at collective K of iteration I: for good,
                                              or stall SECONDS there
    nan RANKS [family F] [at I] [op K] [for N]     contribute NaN to the real rank's collectives
    inf RANKS [family F] [at I] [op K] [for N]     ... +inf
    corrupt RANKS SCALE [family F] [at I] [op K] [for N]   ... their data times SCALE
    desync RANKS size|dtype|op|skip [family F] [at I] [op K]
                                              issue a mismatched collective (or skip one):
                                              the group hangs, the flight record shows it

RANKS are ``R``, ``A-B``, lists of them, ``node:N`` (or ``node:A-B``, lists), ``family:F:G`` (group G
of family F), ``class:C`` (a rank class: a pipeline stage) or
``fraction:P[:SEED]`` (that share of the world, drawn with SEED).  ``op K``
counts the collectives a rank issues in the iteration from 1; for a peer of
the real rank's class (its data-parallel peers) that is the real rank's
count.  ``at`` and ``from`` are the same word.  Pure Python.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable, Iterable

from prism_debug.errors import ConfigError
from prism_debug.graph.execution import GraphError
from prism_debug.graph.selectors import expand, node_spans, select_ranks

DESYNC_KINDS = ("size", "dtype", "op", "skip")

USAGE = {
    "slow": "slow RANKS FACTOR [from I] [for N]",
    "delay": "delay RANKS SECONDS [family F] [from I] [for N]",
    "link": "link NODES BANDWIDTH_FACTOR [LATENCY_US] [from I] [for N] [flap PERIOD_S DUTY]",
    "fail": "fail RANKS [at I] [op K]",
    "hang": "hang RANKS [at I] [op K] [for SECONDS]",
    "nan": "nan RANKS [family F] [at I] [op K] [for N]",
    "inf": "inf RANKS [family F] [at I] [op K] [for N]",
    "corrupt": "corrupt RANKS SCALE [family F] [at I] [op K] [for N]",
    "desync": "desync RANKS size|dtype|op|skip [family F] [at I] [op K]",
}
# the keywords each action takes (``at``/``from`` are one)
_TAKES = {
    "slow": {"from", "for"}, "delay": {"from", "for", "family"},
    "link": {"from", "for", "flap"}, "fail": {"from", "op"}, "hang": {"from", "op", "for"},
    "nan": {"from", "op", "for", "family"}, "inf": {"from", "op", "for", "family"},
    "corrupt": {"from", "op", "for", "family"}, "desync": {"from", "op", "family"},
}
#: actions that change what the real rank receives (the backend applies them)
VALUE_ACTIONS = frozenset({"nan", "inf", "corrupt"})
#: actions after which the peers never arrive (the flight record tells them apart)
MISSING_ACTIONS = frozenset({"fail", "hang", "desync"})


@dataclasses.dataclass(frozen=True)
class Perturbation:
    action: str
    ranks: tuple[int, ...]  # nodes, for link
    value: float = 1.0  # factor, seconds, bandwidth factor or scale
    latency_s: float = 0.0  # link
    family: str | None = None
    first_iteration: int = 1
    iterations: float = math.inf  # how many iterations (hang: see stall_s)
    collective: int | None = None  # ``op K``: from the K-th collective of first_iteration
    stall_s: float | None = None  # hang for this long, then go on
    kind: str | None = None  # desync
    period_s: float | None = None  # link flap
    duty: float = 1.0
    text: str = ""

    @property
    def first_op(self) -> int:
        return 0 if self.collective is None else self.collective - 1

    @property
    def last_iteration(self) -> float:
        return self.first_iteration + self.iterations - 1

    def covers(self, iteration: int, collective: int) -> bool:
        """Whether it acts at the ``collective``-th collective (from 1) of ``iteration``."""
        return ((iteration, collective) >= (self.first_iteration, self.first_op + 1)
                and iteration <= self.last_iteration)

    def apply(self, engine) -> object | None:
        """Hand it to a :class:`~prism_debug.engine.replay.ReplayEngine`; the
        handle ``engine.remove`` takes back, or None when it changes values only."""
        if self.action == "slow":
            return engine.slow(self.ranks, self.value, first_iteration=self.first_iteration,
                               iterations=self.iterations)
        if self.action == "delay":
            return engine.delay(self.ranks, self.value, family=self.family,
                                first_iteration=self.first_iteration, iterations=self.iterations)
        if self.action == "link":
            return engine.link(self.ranks, bandwidth_factor=self.value,
                               added_latency_s=self.latency_s,
                               first_iteration=self.first_iteration, iterations=self.iterations,
                               period_s=self.period_s, duty=self.duty)
        if self.action == "hang" and self.stall_s is not None:
            return engine.delay(self.ranks, self.stall_s, first_iteration=self.first_iteration,
                                iterations=1, first_op=self.first_op, ops=1)
        if self.action in MISSING_ACTIONS:
            return engine.fail(self.ranks, at_iteration=self.first_iteration,
                               at_op=self.first_op,
                               family=self.family if self.action == "desync" else None)
        return None  # nan, inf, corrupt: the backend changes what the real rank receives

    def summary(self) -> str:
        """One line for ``perturb list``."""
        count = len(self.ranks)
        what = "nodes" if self.action == "link" else "ranks"
        shown = ",".join(map(str, self.ranks[:4])) + (",…" if count > 4 else "")
        return f"{self.text}  ({count} {what}: {shown})"


class Selectors:
    """What selectors beyond plain ranks need of the job: its execution graph
    (families and classes).  Without one only ranks, nodes and fractions work."""

    def __init__(self, family_group: Callable[[str, int], list[int]] | None = None,
                 class_ranks: Callable[[int], list[int]] | None = None) -> None:
        self.family_group = family_group
        self.class_ranks = class_ranks

    @classmethod
    def of_graph(cls, graph) -> "Selectors":
        return cls(graph.family_group, graph.class_ranks)


def select(where: str, world_size: int, gpus_per_node: int,
           selectors: Selectors | None = None) -> list[int]:
    """The ranks one RANKS word selects."""
    selectors = selectors or Selectors()
    head, _, rest = where.partition(":")
    if head == "node" and rest:  # node:3, node:3-4, node:1,5
        nodes = expand(node_spans(rest, -(-world_size // gpus_per_node)))
        return [rank for node in nodes for rank in
                range(node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node))]
    if head == "fraction" and rest:
        share, _, seed = rest.partition(":")
        try:
            fraction = float(share)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ConfigError(f"fraction:{share}: give a share of the world in (0, 1]")
        count = max(1, round(fraction * world_size))
        return sorted(random.Random(seed or "0").sample(range(world_size), count))
    if head == "family" and rest:
        family, _, group = rest.partition(":")
        if not group.isdigit():
            raise ConfigError(f"{where}: write family:FAMILY:GROUP, the group's index counting "
                              "from 0 (family:dp:3)")
        if selectors.family_group is None:
            raise ConfigError(f"{where}: selecting a family's group needs the job's execution "
                              "graph: run with --graph")
        return _from_graph(selectors.family_group, where, family, int(group))
    if head == "class" and rest:
        if not rest.isdigit():
            raise ConfigError(f"{where}: write class:C, a rank class's number (class:2)")
        if selectors.class_ranks is None:
            raise ConfigError(f"{where}: selecting a class needs the job's execution graph: "
                              "run with --graph")
        return _from_graph(selectors.class_ranks, where, int(rest))
    return select_ranks(where, world_size, gpus_per_node)


def _from_graph(lookup, where: str, *args) -> list[int]:
    try:
        return lookup(*args)
    except GraphError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_perturbation(text: str, world_size: int, gpus_per_node: int,
                       selectors: Selectors | None = None) -> Perturbation:
    """One perturbation; :class:`ConfigError` with the usage when it is not one."""
    words = text.split()
    if not words or words[0] not in USAGE:
        raise ConfigError(f"unknown perturbation {text!r}: use one of "
                          + "; ".join(USAGE.values()))
    action, rest = words[0], words[1:]
    usage = USAGE[action]
    if not rest:
        raise ConfigError(f"{action} needs ranks: {usage}")
    where, rest = rest[0], rest[1:]
    if action == "link":
        targets = expand(node_spans(where.removeprefix("node:"),
                                    -(-world_size // gpus_per_node)))
    else:
        targets = select(where, world_size, gpus_per_node, selectors)
    kind = None
    if action == "desync" and rest and rest[0] in DESYNC_KINDS:
        kind, rest = rest[0], rest[1:]  # read first: "op" is a kind and a keyword
    options, positional = _split(rest, usage)
    if kind is not None:
        positional.insert(0, kind)
    unknown = set(options) - _TAKES[action]
    if unknown:
        raise ConfigError(f"{action} does not take {', '.join(sorted(unknown))}: {usage}")
    fields: dict = {"action": action, "ranks": tuple(targets), "text": " ".join(words)}
    low, high = {"slow": (1, 1), "delay": (1, 1), "corrupt": (1, 1), "desync": (1, 1),
                 "link": (1, 2)}.get(action, (0, 0))
    if not low <= len(positional) <= high:
        what = "a value" if high else "no value"
        raise ConfigError(f"{action} takes {what} after the ranks: {usage}")
    if action == "desync":
        if positional[0] not in DESYNC_KINDS:
            raise ConfigError(f"desync {positional[0]!r}: the kind is one of "
                              f"{', '.join(DESYNC_KINDS)}: {usage}")
        fields["kind"] = positional[0]
    elif positional:
        value = _number(positional[0], usage)
        if action == "corrupt":
            if not math.isfinite(value) or value == 1:
                raise ConfigError(f"corrupt: the scale must be a finite number other than 1, "
                                  f"got {positional[0]}: {usage}")
        elif not math.isfinite(value) or value < 0 or (action != "delay" and value == 0):
            raise ConfigError(f"{action}: {positional[0]} must be positive: {usage}")
        fields["value"] = value
        if len(positional) > 1:
            latency = _number(positional[1], usage)
            if not math.isfinite(latency) or latency < 0:
                raise ConfigError(f"link: the added latency must be >= 0 us: {usage}")
            fields["latency_s"] = latency * 1e-6
    if "from" in options:
        fields["first_iteration"] = _count(options["from"], "from", usage, low=1)
    if "op" in options:
        fields["collective"] = _count(options["op"], "op", usage, low=1)
    if "family" in options:
        fields["family"] = options["family"]
    if "for" in options:
        if action == "hang":
            stall = _number(options["for"], usage)
            if not math.isfinite(stall) or stall <= 0:
                raise ConfigError(f"hang: for takes seconds > 0: {usage}")
            fields["stall_s"] = stall
        else:
            fields["iterations"] = _count(options["for"], "for", usage, low=1)
    if "flap" in options:
        period, duty = options["flap"]
        fields["period_s"], fields["duty"] = _number(period, usage), _number(duty, usage)
        if not (fields["period_s"] > 0 and 0 < fields["duty"] <= 1):
            raise ConfigError(f"link: flap takes a period > 0 s and a duty in (0, 1]: {usage}")
    return Perturbation(**fields)


_ARITY = {"from": 1, "at": 1, "for": 1, "op": 1, "family": 1, "flap": 2}


def _split(words: list[str], usage: str) -> tuple[dict, list[str]]:
    """Keyword options (``at`` read as ``from``) and the positional words."""
    options: dict = {}
    positional: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        arity = _ARITY.get(word)
        if arity is None:
            if options:
                raise ConfigError(f"{word!r} is out of place: values come before the options: "
                                  f"{usage}")
            positional.append(word)
            i += 1
            continue
        values = words[i + 1:i + 1 + arity]
        if len(values) < arity or any(v in _ARITY for v in values):
            raise ConfigError(f"{word} needs {'a value' if arity == 1 else 'two values'}: {usage}")
        key = "from" if word == "at" else word
        if key in options:
            raise ConfigError(f"{word} is given twice: {usage}")
        options[key] = values[0] if arity == 1 else tuple(values)
        i += 1 + arity
    return options, positional


def _count(word: str, keyword: str, usage: str, low: int) -> int:
    if not word.isdigit() or int(word) < low:
        raise ConfigError(f"{keyword} takes a whole number >= {low}, got {word!r}: {usage}")
    return int(word)


def _number(word: str, usage: str) -> float:
    try:
        return float(word)
    except ValueError:
        raise ConfigError(f"{word!r} is not a number: {usage}") from None


def rank_text(ranks: Iterable[int]) -> str:
    """Ranks as the shortest RANKS word (``0-3,8``), for perturbations written
    by programs (scenarios)."""
    spans: list[str] = []
    run: list[int] = []
    for rank in sorted(set(ranks)):
        if run and rank == run[-1] + 1:
            run.append(rank)
            continue
        if run:
            spans.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [rank]
    if run:
        spans.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(spans)
