"""Scenarios: a YAML file of faults to inject into a run and what to expect of it.

This module is the model: frozen dataclasses that validate themselves, and the
rules across sections.  ``loader`` reads the YAML and reports *every* error in
a file with its line and column, like a compiler.  The schema::

    name: dp-peer-fail-stop             # required
    description: a DP peer dies          # optional
    world: {size: 64, rank: 5, gpus_per_node: 8}   # size, rank required; gpus_per_node 8
    # world: {size: 8192, ranks: "0-1"}  several real ranks (a rank list, at most 64),
    #   instead of rank: each a process of its own, every expectation judged on each
    seed: 0                              # seeds fraction selectors (and the run)
    run:                                 # exactly one of command / example / snapshot
      example: {tp: 2, pp: 2, iterations: 6}   # the bundled example's arguments
      # command: [python, train.py, --lr, 3e-4]  (or one string, split like a shell)
      # snapshot: r5-it2-abcdef            (restore it; iterations then count from it;
      #   with world.ranks, a cut of those ranks: c1a2b3c4d-it2)
      graph: gpt.prism                   # execution graph; "profile": profile one first
      iterations: 6                      # stop after this many iterations
      hardware: h100-ib400               # hardware profile
      timeout_s: 30                      # overrides the script's process-group timeout
      env: {TORCH_NCCL_ASYNC_ERROR_HANDLING: 1}
    faults:
      - action: fail                     # see below for each action's parameters
        select: {ranks: "4"}             # exactly one of:
          # ranks: "1,5-9" | node: 3 | nodes: "3-4" | family: dp, group: 0 | class: 2
          # | fraction: 0.01 (that share of the world, at least one rank, drawn with
          #   the scenario's seed, or the selector's own seed: "...")
        at: {iteration: 3}               # {iteration: N} | {iteration: N, collective: K};
                                         # absent: from iteration 1 (slow and link
                                         # act on whole iterations: no collective)
        for: {iterations: 2}             # {iterations: N}; a hang's {time_s: T} is a stall;
                                         # absent: to the end
    expect:                              # each item has exactly one key
      - exception: {type: DistBackendError, match: "Watchdog caught"}  # match: re.search
      - exit_code: 134
      - iteration_time: {iteration: 4, max_s: 1.5}     # and/or min_s; no iteration: every one
      - iteration_time: {relative: 1.16, tolerance: 0.02}  # vs an unperturbed baseline run
      - iteration_time: {predicted: true, tolerance: 0.05}  # the ratio the engine predicts
        # (relative and predicted without iteration compare the medians after iteration 1)
      - iteration_time: {percentile: 99, max_s: 0.2}  # and/or min_s: that percentile of the
        # iterations after iteration 1 (the warm-up; a restored run's all count)
    variability:                         # stochastic virtual peers (needs run.graph), drawn
      - {cv: 0.05}                       # with the scenario's seed; each item one rule, as
      - {class: 3, cv: 0.1, dist: gamma} # run --variability's terms: cv, dist, class, op,
      - {rank_cv: 0.02}                  # rank_cv; or "fitted" (the graph's distributions)
      - flight_record: {missing_ranks: [4], mismatch: size}  # any of these, as torch's
        # fr_trace prints them: exactly these ranks; culprits: [13] ("Culprit rank 13"),
        # exactly these; its crash or silence fails the verdict
      - nan_at: {iteration: 3}           # the first iteration whose values hold a NaN
      - digests: {4: 6d86199fb54262f3}   # iteration -> the report's digest (or a prefix)
        # of the lowest real rank; {rank: 1, 4: …}: of real rank 1

Fault actions and their parameters, written beside ``action``:

==========  ==================================================================
delay       ``seconds`` (> 0): the selected ranks reach each collective that late;
            ``family`` (optional): only that family's collectives
slow        ``factor`` (> 0): their compute takes ``factor`` times as long
link        ``bandwidth_factor`` (> 0), ``latency_us`` (>= 0), at least one;
            ``intermittent: {period_s, duty}``: degraded ``duty`` of each period.
            Selects nodes (``node`` or ``nodes``): their network links
fail        the ranks die (fail-stop); takes no ``for``
hang        the ranks stop answering (for ``for``, else for good)
nan, inf    their contributions become NaN / inf; ``family`` optional
corrupt     their contributions are multiplied by ``scale`` (finite, not 1)
desync      ``kind``: size | dtype | op | skip: they call a mismatched collective
            (or skip one); ``family`` optional
==========  ==================================================================

Iterations are 1-based, like optimizer steps; ``collective`` counts the
selected ranks' collectives within the iteration from 1 (for the real rank's
data-parallel peers, the real rank's count).  Scalars read as text
(``command``, ``env``, names, digests) are taken as written: ``3e-4`` stays
``"3e-4"``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from prism_debug.checked import (
    MAX_GPUS_PER_NODE,
    MAX_ITERATIONS,
    MAX_REAL_RANKS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_WORLD_SIZE,
    Checked,
    FieldErrors,
    at_least,
    at_most,
    both,
    declare,
    non_negative,
    not_empty,
    one_of,
    positive,
    safe_name,
)
from prism_debug.errors import ConfigError, KeyPath
from prism_debug.example import Example
from prism_debug.faults import (
    DesyncKind,
    Fault,
    Selector,
    Topology,
    Trigger,
    resolve,
    select,
)
from prism_debug.faults.model import TIME_TRIGGER_REFUSED
from prism_debug.graph.selectors import expand, node_spans, rank_spans, ranks_text, select_ranks
from prism_debug.variability import Variability

PROFILE_GRAPH = "profile"  # run.graph: profile the script first, then replay that graph
DEFAULT_TOLERANCE = 0.02  # iteration_time: relative's default tolerance


# -- value checks of this schema (the shared ones are prism_debug.checked's) -------------


def _exit_code(v: int) -> str | None:
    return None if -255 <= v <= 255 else f"must be in -255..255, got {v}"


def _exception_name(v: str) -> str | None:
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", v):
        return None
    return (f"{v!r} is not an exception class name "
            "(DistBackendError, torch.distributed.DistBackendError)")


def _percentile(v: float) -> str | None:
    return None if 0 <= v <= 100 else f"must be in 0..100, got {v:g}"


def _regex(v: str) -> str | None:
    try:
        re.compile(v)
    except re.error as exc:
        return f"is not a regular expression: {exc}"
    return None


def hex_digest_problem(v: str) -> str | None:
    """What is wrong with ``v`` as an expected digest (the loader checks it too)."""
    if re.fullmatch(r"[0-9a-fA-F]{8,32}", v):
        return None
    return f"{v!r} is not a digest: give 8 to 32 hex digits of the report's digest"


# -- the model ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class World(Checked):
    """The job's world and its real ranks: one (``rank``) or several (``ranks``,
    a rank list such as ``"0-1"`` or ``"0,4096"``), exactly one of the two."""

    size: int = declare("int", check=both(at_least(1), at_most(MAX_WORLD_SIZE)))
    rank: int | None = declare("int", default=None, check=at_least(0))  # the real rank
    # several real ranks (run --ranks), each a process of its own
    ranks_text: str | None = declare("text", key="ranks", default=None, check=not_empty)
    gpus_per_node: int = declare("int", default=8,
                                 check=both(at_least(1), at_most(MAX_GPUS_PER_NODE)))

    @property
    def num_nodes(self) -> int:
        return -(-self.size // self.gpus_per_node)

    @property
    def real_ranks(self) -> tuple[int, ...]:
        """The real ranks, lowest first (``rank``, or what ``ranks`` names)."""
        if self.rank is not None:
            return (self.rank,)
        assert self.ranks_text is not None  # its rules: rank or ranks, one of the two
        return tuple(sorted(select_ranks(self.ranks_text, self.size, self.gpus_per_node)))

    @property
    def several_real_ranks(self) -> bool:
        """Whether the run is of several real ranks (``ranks: "5"`` is one, as ``rank: 5``)."""
        return len(self.real_ranks) > 1

    def _rules(self) -> FieldErrors:
        yield from one_of(self, {"rank": "rank", "ranks": "ranks_text"}, "rank, ranks")
        if self.rank is not None and self.rank >= self.size:
            yield ("rank",), f"rank {self.rank} is outside the world of {self.size} ranks"
        if self.ranks_text is not None and (problem := real_ranks_problem(
                self.ranks_text, self.size, self.gpus_per_node)):
            yield ("ranks",), problem


def real_ranks_problem(text: str, world_size: int, gpus_per_node: int) -> str | None:
    """What is wrong with ``text`` as a world's ``ranks`` (a rank list of at most
    :data:`MAX_REAL_RANKS` ranks, each inside the world), or None; nothing
    is expanded before it is counted."""
    try:
        spans = rank_spans(text, world_size, gpus_per_node)
    except ConfigError as exc:
        return str(exc)
    count = len(set(expand(spans))) if sum(b - a + 1 for a, b in spans) <= MAX_REAL_RANKS \
        else MAX_REAL_RANKS + 1
    if count > MAX_REAL_RANKS:
        return (f"{text.strip()!r} names more than {MAX_REAL_RANKS} ranks: a scenario runs at "
                f"most {MAX_REAL_RANKS} real ranks (each is a process of its own)")
    return None


@dataclass(frozen=True, kw_only=True)
class Run(Checked):
    """What runs as the real rank, and how."""

    command: tuple[str, ...] | None = declare("command", default=None, check=not_empty)
    example: Example | None = declare("object", of=Example, default=None)
    snapshot: str | None = declare("text", default=None, check=not_empty)
    graph: str | None = declare("text", default=None, check=not_empty)
    iterations: int | None = declare("int", default=None,
                                     check=both(at_least(1), at_most(MAX_ITERATIONS)))
    hardware: str | None = declare("text", default=None, check=not_empty)
    timeout_s: float | None = declare("float", default=None,
                                      check=both(positive, at_most(MAX_TIMEOUT_S)))
    env: tuple[tuple[str, str], ...] = declare("env", default=())

    @property
    def profile_graph(self) -> bool:
        """True when the run profiles an execution graph before replaying it."""
        return self.graph == PROFILE_GRAPH

    @property
    def last_iteration(self) -> int | None:
        """The iteration the run stops after, when known before it starts (a
        restored snapshot counts on from the iteration it was taken at)."""
        if self.snapshot is not None:
            return None
        if self.iterations is not None:
            return self.iterations
        return self.example.iterations if self.example is not None else None

    def _rules(self) -> FieldErrors:
        yield from one_of(self, {k: k for k in ("command", "example", "snapshot")},
                           "command, example, snapshot")
        for name, _ in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                yield ("env", name), f"{name!r} is not an environment variable name"
        if self.snapshot is not None and self.env:
            yield ("env",), "a restored snapshot keeps the environment it was taken with"
        if self.snapshot is not None and self.timeout_s is not None:
            yield ("timeout_s",), ("a restored snapshot keeps its process groups' timeouts: "
                                   "take the snapshot from a run with --collective-timeout")
        if self.snapshot is not None and self.hardware is not None:
            yield ("hardware",), "a restored snapshot keeps the hardware it was taken with"
        if (self.example is not None and self.iterations is not None
                and self.iterations > self.example.iterations):
            yield ("iterations",), (f"the example runs only {self.example.iterations} "
                                    f"iterations (example.iterations), not {self.iterations}")


@dataclass(frozen=True, kw_only=True)
class Expectation(Checked):
    """One thing the run must show; the subclass's ``kind`` is its YAML key.
    ``value_field`` names the field the YAML value is, when it is not a mapping."""

    kind: ClassVar[str]
    value_field: ClassVar[str | None] = None
    line: int = field(default=0, compare=False)

    def iterations_named(self) -> list[tuple[KeyPath, int]]:
        """The iterations it looks at by number, each with its key path (none:
        it looks at the run as a whole, or at every iteration)."""
        iteration = getattr(self, "iteration", None)
        return [] if iteration is None else [((self.kind, "iteration"), iteration)]


@dataclass(frozen=True, kw_only=True)
class ExpectException(Expectation):
    kind = "exception"
    type: str = declare("text", check=_exception_name)  # class name, or dotted with its module
    match: str | None = declare("text", default=None, check=_regex)  # re.search in the message


@dataclass(frozen=True, kw_only=True)
class ExpectExitCode(Expectation):
    kind, value_field = "exit_code", "code"
    code: int = declare("int", key="exit_code", check=_exit_code)


@dataclass(frozen=True, kw_only=True)
class ExpectIterationTime(Expectation):
    """Absolute bounds (``min_s``, ``max_s``) or ``relative`` to the same
    iteration of an unperturbed baseline run, give or take ``tolerance``."""

    kind = "iteration_time"
    iteration: int | None = declare("int", default=None, check=at_least(1))  # None: every one
    min_s: float | None = declare("float", default=None, check=non_negative)
    max_s: float | None = declare("float", default=None, check=positive)
    relative: float | None = declare("float", default=None, check=positive)
    # min_s/max_s bound this percentile of the run's iterations after the first
    # (with predicted: of the iterations prism-debug predict gives)
    percentile: float | None = declare("float", default=None, check=_percentile)
    # relative to the baseline by the ratio the replay engine predicts
    predicted: bool | None = declare("bool", default=None)
    tolerance: float | None = declare("float", default=None, check=non_negative)

    @property
    def is_relative(self) -> bool:
        return self.relative is not None or (bool(self.predicted) and self.percentile is None)

    @property
    def is_predicted_percentile(self) -> bool:
        """A bound on a percentile of predict's distribution, not the run's."""
        return self.percentile is not None and bool(self.predicted)

    def bounds(self, baseline_s: float | None = None,
               predicted_ratio: float | None = None) -> tuple[float, float]:
        """The allowed iteration time, in seconds."""
        if self.is_relative and self.predicted:
            if baseline_s is None or predicted_ratio is None:
                raise ConfigError("iteration_time predicted needs the baseline run and the "
                                  "replay engine's prediction")
            tolerance = DEFAULT_TOLERANCE if self.tolerance is None else self.tolerance
            return ((predicted_ratio - tolerance) * baseline_s,
                    (predicted_ratio + tolerance) * baseline_s)
        if self.relative is None:
            return (self.min_s or 0.0, math.inf if self.max_s is None else self.max_s)
        if baseline_s is None:
            raise ConfigError("iteration_time relative needs the baseline run's iteration time")
        tolerance = DEFAULT_TOLERANCE if self.tolerance is None else self.tolerance
        return ((self.relative - tolerance) * baseline_s, (self.relative + tolerance) * baseline_s)

    def _rules(self) -> FieldErrors:
        if self.percentile is not None:
            if self.iteration is not None:
                yield ("percentile",), ("a percentile is over the run's iterations: give "
                                        "percentile or iteration, not both")
            if self.relative is not None or (self.min_s is None and self.max_s is None):
                yield ("percentile",), "a percentile takes min_s or max_s"
        if self.predicted is False:
            yield ("predicted",), "predicted: true, or leave it out"
        if not self.is_relative and self.min_s is None and self.max_s is None \
                and self.percentile is None:
            yield (), "give max_s, min_s, relative (to a baseline run) or predicted: true"
        elif self.is_relative and (self.min_s is not None or self.max_s is not None):
            bound = "min_s" if self.min_s is not None else "max_s"
            first = "relative" if self.relative is not None else "predicted"
            yield (first,), f"give {first} or {bound}, not both"
        if self.relative is not None and self.predicted:
            yield ("predicted",), "give relative or predicted, not both"
        if self.tolerance is not None and not self.is_relative:
            yield ("tolerance",), ("tolerance goes with relative or predicted (a ratio), not "
                                   "with bounds" if self.percentile is not None else
                                   "tolerance goes with relative or predicted")
        if self.min_s is not None and self.max_s is not None and self.min_s > self.max_s:
            yield ("max_s",), f"max_s {self.max_s} is less than min_s {self.min_s}"


@dataclass(frozen=True, kw_only=True)
class ExpectFlightRecord(Expectation):
    """What torch's fr_trace prints of the timed-out group's dumps: exactly these
    missing ranks (when given), a mismatch of this kind (when given), and
    exactly these culprits ("Culprit rank R", when given)."""

    kind = "flight_record"
    missing_ranks: tuple[int, ...] = declare("ints", default=())
    mismatch: DesyncKind | None = declare("enum", of=DesyncKind, default=None)
    culprits: tuple[int, ...] = declare("ints", default=())

    def _rules(self) -> FieldErrors:
        if not self.missing_ranks and self.mismatch is None and not self.culprits:
            yield (), "give missing_ranks, mismatch, culprits or several"
        for key in ("missing_ranks", "culprits"):
            for i, rank in enumerate(getattr(self, key)):
                if rank < 0:
                    yield (key, i), f"rank {rank} is negative"


@dataclass(frozen=True, kw_only=True)
class ExpectNanAt(Expectation):
    kind = "nan_at"
    iteration: int = declare("int", check=at_least(1))


@dataclass(frozen=True, kw_only=True)
class ExpectDigests(Expectation):
    """A real rank's per-iteration value digests, as the report prints them:
    ``rank``'s (written beside the iterations, ``{rank: 1, 4: 6d86…}``), or
    the lowest real rank's when it is not given."""

    kind, value_field = "digests", "digests"
    digests: tuple[tuple[int, str], ...] = declare("digests", check=not_empty)
    rank: int | None = declare("int", default=None, check=at_least(0))

    def iterations_named(self) -> list[tuple[KeyPath, int]]:
        return [(("digests", iteration), iteration) for iteration, _ in self.digests]

    def _rules(self) -> FieldErrors:
        seen: set[int] = set()
        for iteration, digest in self.digests:
            if iteration in seen:
                yield ("digests", iteration), f"iteration {iteration} is given twice"
            elif iteration < 1:
                yield ("digests", iteration), f"iteration {iteration} is not >= 1"
            elif message := hex_digest_problem(digest):
                yield ("digests", iteration), message
            seen.add(iteration)


EXPECTATION_TYPES: dict[str, type[Expectation]] = {cls.kind: cls for cls in (
    ExpectException, ExpectExitCode, ExpectIterationTime, ExpectFlightRecord, ExpectNanAt,
    ExpectDigests)}


@dataclass(frozen=True, kw_only=True)
class Scenario(Checked):
    # the name becomes part of the run folder's path: a safe pattern, no "../"
    name: str = declare("text", check=both(not_empty, safe_name))
    description: str = declare("text", default="")
    world: World = declare("object", of=World)
    run: Run = declare("object", of=Run)
    seed: int = declare("int", default=0, check=both(at_least(0), at_most(MAX_SEED)))
    faults: tuple[Fault, ...] = declare("faults", default=())
    # the virtual peers' compute drawn per rank, op and iteration (run --variability)
    variability: Variability | None = declare("variability", default=None)
    expect: tuple[Expectation, ...] = declare("expect", default=())
    source: str = field(default="<string>", compare=False)  # the file it came from

    def seeded_faults(self) -> tuple[Fault, ...]:
        """The faults as they act: a fraction selector without a seed of its own
        draws with the scenario's seed and the fault's index, so two faults draw
        different ranks and every run of the scenario draws the same."""
        return tuple(
            dataclasses.replace(fault, select=dataclasses.replace(
                fault.select, seed=f"{self.seed}/{index}"))
            if fault.select.fraction is not None and fault.select.seed is None else fault
            for index, fault in enumerate(self.faults))

    def fault_ranks(self, index: int, topology: Topology | None = None) -> list[int]:
        """The ranks fault ``index`` hits (family and class selectors need the
        job's graph as ``topology``)."""
        world = self.world
        return list(resolve(self.seeded_faults()[index], world.size, world.gpus_per_node,
                            topology).targets)

    def _rules(self) -> FieldErrors:
        yield from cross_rules(self.world, self.run, [f.select for f in self.faults],
                               [f.at for f in self.faults], self.expect)


def cross_rules(world: World | None, run: Run | None, selects: Sequence[Selector | None],
                triggers: Sequence[Trigger | None], expect: Sequence[Expectation | None],
                ) -> FieldErrors:
    """Rules across sections, as (key path, message).  The loader runs them on
    what it could read of a broken file (``None`` for what it could not), so an
    error in one place hides none elsewhere; ``selects`` and ``triggers`` are
    the faults'."""
    if world is not None:
        yield from _world_rules(world, run, selects, expect)
    for i, trigger in enumerate(triggers):
        # (a fault that reads cleanly refuses it too; here it is found beside
        # other errors in the same fault)
        if trigger is not None and trigger.time_s is not None:
            yield ("faults", i, "at", "time_s"), TIME_TRIGGER_REFUSED
    last = run.last_iteration if run is not None else None
    if last is not None:
        yield from _after_the_run(last, triggers, expect)


def _world_rules(world: World, run: Run | None, selects: Sequence[Selector | None],
                 expect: Sequence[Expectation | None]) -> FieldErrors:
    """What the world rules out: an example that does not divide it, faults
    and expectations of ranks outside it, and what several real ranks refuse."""
    example = run.example if run is not None else None
    if example is not None and world.size % (example.tp * example.pp):
        product = example.tp * example.pp
        yield ("run", "example", "tp"), (f"world size {world.size} is not divisible by "
                                         f"tp*pp = {example.tp}*{example.pp} = {product}")
    for i, selector in enumerate(selects):
        if selector is not None and (problem := selector.problem(world.size, world.gpus_per_node)):
            yield ("faults", i, "select", selector.kind), problem
    yield from _expected_ranks(world, expect)
    if world.several_real_ranks:
        yield from several_real_ranks_rules(world, run, selects, expect)


def _expected_ranks(world: World, expect: Sequence[Expectation | None]) -> FieldErrors:
    """The ranks expectations name that ``world`` lacks: a flight record's
    outside it, digests' not among its real ranks."""
    for i, expectation in enumerate(expect):
        if isinstance(expectation, ExpectFlightRecord):
            for key in ("missing_ranks", "culprits"):
                for j, rank in enumerate(getattr(expectation, key)):
                    if rank >= world.size:
                        yield (("expect", i, "flight_record", key, j),
                               f"rank {rank} is outside the world of {world.size} ranks")
        if isinstance(expectation, ExpectDigests) and expectation.rank is not None \
                and expectation.rank not in world.real_ranks:
            yield (("expect", i, "digests", "rank"),
                   f"rank {expectation.rank} is not a real rank: the report has digests "
                   f"of {_real_ranks_named(world)} only")


def _after_the_run(last: int, triggers: Sequence[Trigger | None],
                   expect: Sequence[Expectation | None]) -> FieldErrors:
    """Faults and expectations of iterations after ``last``, where the run stops."""
    late = f"the run stops after iteration {last}"
    for i, trigger in enumerate(triggers):
        if trigger is not None and trigger.iteration is not None and trigger.iteration > last:
            yield ("faults", i, "at", "iteration"), f"iteration {trigger.iteration}: {late}"
    for i, expectation in enumerate(expect):
        for path, n in expectation.iterations_named() if expectation is not None else ():
            if n > last:
                yield ("expect", i, *path), f"iteration {n}: {late}"


# -- several real ranks ------------------------------------------------------------------

def several_real_ranks_rules(world: World, run: Run | None, selects: Sequence[Selector | None],
                             expect: Sequence[Expectation | None],
                             ) -> FieldErrors:
    """What a scenario of several real ranks refuses: a fault that would hit
    only real ranks (faults act on virtual peers: it would hit nobody), and
    the expectations that judge one rank's view only (a flight record,
    predict's distribution of one rank).  (It starts from the script or from
    a cut of its ranks, which the runner checks against the store.)"""
    for i, selector in enumerate(selects):
        if selector is not None and (hit := only_real_ranks(selector, world)):
            yield ("faults", i, "select", selector.kind), only_real_ranks_message(hit, world)
    for i, expectation in enumerate(expect):
        if isinstance(expectation, ExpectFlightRecord):
            yield ("expect", i, "flight_record"), (
                "a scenario of several real ranks does not judge a flight record: each real "
                "rank dumps its own; expect an exception or an exit_code instead")
        if isinstance(expectation, ExpectIterationTime) and expectation.is_predicted_percentile:
            yield ("expect", i, "iteration_time", "predicted"), (
                "prism-debug predict gives one rank's iteration times; a scenario of several "
                "real ranks bounds the run's own percentile (leave predicted out)")


def only_real_ranks(selector: Selector, world: World,
                    topology: Topology | None = None) -> tuple[int, ...] | None:
    """The ranks ``selector`` hits when every one of them is a real rank of
    ``world`` (a fault that would hit nobody), else None.  Family and class
    selectors need ``topology`` (None without it); a selector that names more
    ranks than there are real ones is never expanded."""
    real = set(world.real_ranks)
    size, per_node = world.size, world.gpus_per_node
    if selector.problem(size, per_node) is not None:
        return None  # (said elsewhere)
    if selector.ranks_text is not None:
        spans = rank_spans(selector.ranks_text, size, per_node)
        count = sum(last - first + 1 for first, last in spans)
    elif selector.selects_nodes:
        spans = node_spans(selector.node_text, world.num_nodes)
        count = sum(last - first + 1 for first, last in spans)  # nodes: at least a rank each
    elif selector.fraction is not None:
        if selector.seed is None:
            return None  # drawn with the scenario's seed (seeded_faults): the run checks it
        count = max(1, round(selector.fraction * size))
    elif topology is None:
        return None
    else:
        count = 0  # a group or a class: the graph's own size
    if count > len(real):
        return None
    try:
        hit = select(selector, size, per_node, topology)
    except ConfigError:
        return None  # (a family or class the graph lacks: said elsewhere)
    return tuple(hit) if hit and set(hit) <= real else None


def only_real_ranks_message(hit: Sequence[int], world: World) -> str:
    which = f"rank {hit[0]} is a real rank" if len(hit) == 1 \
        else f"ranks {ranks_text(hit)} are real ranks"
    return (f"{which} (world.ranks {world.ranks_text}): a fault acts on virtual peers only, so "
            "this one would hit nobody; select a virtual rank")


def _real_ranks_named(world: World) -> str:
    ranks = world.real_ranks
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks_text(ranks)}"
