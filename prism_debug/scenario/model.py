"""Scenarios: a YAML file of faults to inject into a run and what to expect of it.

This module is the model: frozen dataclasses that validate themselves, and the
rules across sections.  ``loader`` reads the YAML and reports *every* error in
a file with its line and column, like a compiler.  The schema::

    name: dp-peer-fail-stop             # required
    description: a DP peer dies          # optional
    world: {size: 64, rank: 5, gpus_per_node: 8}   # size, rank required; gpus_per_node 8
    seed: 0                              # seeds fraction selectors (and the run)
    run:                                 # exactly one of command / example / snapshot
      example: {tp: 2, pp: 2, iterations: 6}   # the bundled example's arguments
      # command: [python, train.py, --lr, 3e-4]  (or one string, split like a shell)
      # snapshot: r5-it2-abcdef            (restore it; iterations then count from it)
      graph: gpt.prism                   # execution graph; "profile": profile one first
      iterations: 6                      # stop after this many iterations
      hardware: h100-ib400               # hardware profile
      timeout_s: 30                      # overrides the script's process-group timeout
      env: {TORCH_NCCL_ASYNC_ERROR_HANDLING: 1}
    faults:
      - action: fail                     # see below for each action's parameters
        select: {ranks: "4"}             # exactly one of:
          # ranks: "1,5-9" | node: 3 | nodes: "3-4" | family: dp, group: 0 | class: 2
          # | fraction: 0.01 (that share of the world, at least one rank, drawn with seed)
        at: {iteration: 3}               # {iteration: N} | {iteration: N, collective: K};
                                         # absent: from iteration 1
        for: {iterations: 2}             # {iterations: N}; a hang's {time_s: T} is a stall;
                                         # absent: to the end
    expect:                              # each item has exactly one key
      - exception: {type: DistBackendError, match: "Watchdog caught"}  # match: re.search
      - exit_code: 134
      - iteration_time: {iteration: 4, max_s: 1.5}     # and/or min_s; no iteration: every one
      - iteration_time: {relative: 1.16, tolerance: 0.02}  # vs an unperturbed baseline run
      - iteration_time: {predicted: true, tolerance: 0.05}  # the ratio the engine predicts
        # (relative and predicted without iteration compare the medians after iteration 1)
      - flight_record: {missing_ranks: [4], mismatch: size}  # either or both
      - nan_at: {iteration: 3}           # the first iteration whose values hold a NaN
      - digests: {4: 6d86199fb54262f3}   # iteration -> the report's digest (or a prefix)

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
import enum
import math
import random
import re
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

from prism_debug.errors import ConfigError
from prism_debug.graph.selectors import expand, node_spans, rank_spans, select_ranks

PROFILE_GRAPH = "profile"  # run.graph: profile the script first, then replay that graph
DEFAULT_TOLERANCE = 0.02  # iteration_time: relative's default tolerance


class Action(enum.StrEnum):
    DELAY = "delay"
    SLOW = "slow"
    LINK = "link"
    FAIL = "fail"
    HANG = "hang"
    NAN = "nan"
    INF = "inf"
    CORRUPT = "corrupt"
    DESYNC = "desync"


class DesyncKind(enum.StrEnum):
    """How a collective disagrees across ranks (a desync fault, a flight-record mismatch)."""

    SIZE = "size"
    DTYPE = "dtype"
    OP = "op"
    SKIP = "skip"


class InvalidFields(ConfigError):
    """Raised by a model dataclass built with bad values; ``errors`` pairs each
    key path (YAML keys, relative to the object) with what is wrong there."""

    def __init__(self, name: str, errors: list[tuple[tuple, str]]) -> None:
        self.errors = errors
        super().__init__(f"{name}: " + "; ".join(
            f"{dotted(path)}: {message}" if path else message for path, message in errors))


# -- field declarations and value checks ------------------------------------------
# A field's metadata says how the loader reads it ("kind"), its YAML key when it
# is not the field's name, and a check shared by the loader and __post_init__.


def _f(kind: str, *, key: str | None = None, default: Any = MISSING,
       check: Callable[[Any], str | None] | None = None, of: Any = None) -> Any:
    metadata = {"kind": kind, "key": key, "check": check, "of": of}
    return field(default=default, metadata=metadata)


def _at_least(low: int) -> Callable[[int], str | None]:
    return lambda v: None if v >= low else f"must be >= {low}, got {v}"


def _positive(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else f"must be > 0, got {v}"


def _non_negative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else f"must be >= 0, got {v}"


def _unit(v: float) -> str | None:
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}"


def _not_empty(v) -> str | None:
    return None if len(v) else "must not be empty"


def _exit_code(v: int) -> str | None:
    return None if -255 <= v <= 255 else f"must be in -255..255, got {v}"


def _exception_name(v: str) -> str | None:
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", v):
        return None
    return (f"{v!r} is not an exception class name "
            "(DistBackendError, torch.distributed.DistBackendError)")


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


class _Checked:
    """Validates the fields' checks, then the class's own ``_rules``, on construction."""

    def __post_init__(self) -> None:
        errors = list(_field_errors(type(self), vars(self))) or list(self._rules())
        if errors:
            raise InvalidFields(type(self).__name__, errors)

    def _rules(self) -> Iterator[tuple[tuple, str]]:
        return iter(())


def _field_errors(cls, values: dict) -> Iterator[tuple[tuple, str]]:
    for f in dataclasses.fields(cls):
        check = f.metadata.get("check")
        value = values.get(f.name)
        if check is not None and value is not None and (message := check(value)):
            yield (f.metadata["key"] or f.name,), message


def _one_of(obj, keys: dict[str, str], what: str) -> Iterator[tuple[tuple, str]]:
    """Exactly one of ``keys`` (YAML key -> attribute) is set."""
    given = [key for key, attr in keys.items() if getattr(obj, attr) is not None]
    if not given:
        yield (), f"give one of {what}"
    elif len(given) > 1:
        yield (given[1],), f"give one of {what}, not both {given[0]} and {given[1]}"


# -- the model ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class World(_Checked):
    size: int = _f("int", check=_at_least(1))
    rank: int = _f("int", check=_at_least(0))  # the real rank
    gpus_per_node: int = _f("int", default=8, check=_at_least(1))

    @property
    def num_nodes(self) -> int:
        return -(-self.size // self.gpus_per_node)

    def _rules(self):
        if self.rank >= self.size:
            yield ("rank",), f"rank {self.rank} is outside the world of {self.size} ranks"


@dataclass(frozen=True, kw_only=True)
class Example(_Checked):
    """The bundled example's arguments (examples/train_gpt.py), its defaults included."""

    iterations: int = _f("int", default=5, check=_at_least(1))
    layers: int = _f("int", default=8, check=_at_least(1))
    hidden: int = _f("int", default=256, check=_at_least(1))
    heads: int = _f("int", default=8, check=_at_least(1))
    seq_len: int = _f("int", default=128, check=_at_least(1))
    vocab: int = _f("int", default=1024, check=_at_least(1))
    micro_batches: int = _f("int", default=8, check=_at_least(1))
    micro_batch_size: int = _f("int", default=2, check=_at_least(1))
    tp: int = _f("int", default=8, check=_at_least(1))
    pp: int = _f("int", default=4, check=_at_least(1))
    backend: str = _f("text", default="gloo", check=_not_empty)
    lr: float = _f("float", default=3e-4, check=_positive)
    seed: int = _f("int", default=0)
    timing: bool = _f("bool", default=False)

    def argv(self) -> list[str]:
        """The example's command-line arguments."""
        args: list[str] = []
        for f in dataclasses.fields(self):
            flag, value = "--" + f.name.replace("_", "-"), getattr(self, f.name)
            if isinstance(value, bool):
                args += [flag] if value else []
            else:
                args += [flag, str(value)]
        return args

    def _rules(self):  # the example's own checks, so a bad layout fails at lint time
        if self.layers % self.pp:
            yield ("pp",), f"layers {self.layers} is not divisible by pp {self.pp}"
        if self.heads % self.tp:
            yield ("tp",), f"heads {self.heads} is not divisible by tp {self.tp}"
        if self.hidden % self.heads:
            yield ("heads",), f"hidden {self.hidden} is not divisible by heads {self.heads}"


@dataclass(frozen=True, kw_only=True)
class Run(_Checked):
    """What runs as the real rank, and how."""

    command: tuple[str, ...] | None = _f("command", default=None, check=_not_empty)
    example: Example | None = _f("object", of=Example, default=None)
    snapshot: str | None = _f("text", default=None, check=_not_empty)
    graph: str | None = _f("text", default=None, check=_not_empty)
    iterations: int | None = _f("int", default=None, check=_at_least(1))
    hardware: str | None = _f("text", default=None, check=_not_empty)
    timeout_s: float | None = _f("float", default=None, check=_positive)
    env: tuple[tuple[str, str], ...] = _f("env", default=())

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

    def _rules(self):
        yield from _one_of(self, {k: k for k in ("command", "example", "snapshot")},
                           "command, example, snapshot")
        for name, _ in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                yield ("env", name), f"{name!r} is not an environment variable name"
        if self.snapshot is not None and self.env:
            yield ("env",), "a restored snapshot keeps the environment it was taken with"
        if (self.example is not None and self.iterations is not None
                and self.iterations > self.example.iterations):
            yield ("iterations",), (f"the example runs only {self.example.iterations} "
                                    f"iterations (example.iterations), not {self.iterations}")


@dataclass(frozen=True, kw_only=True)
class Selector(_Checked):
    """Which ranks a fault hits: exactly one of ranks, node, nodes, family (with
    group), class, fraction."""

    ranks_text: str | None = _f("text", key="ranks", default=None, check=_not_empty)  # "1,5-9"
    node: int | None = _f("int", default=None, check=_at_least(0))
    nodes: str | None = _f("text", default=None, check=_not_empty)  # "3,4", "0-7"
    family: str | None = _f("text", default=None, check=_not_empty)
    group: int | None = _f("int", default=None, check=_at_least(0))  # index in the family
    class_: int | None = _f("int", key="class", default=None, check=_at_least(0))
    fraction: float | None = _f("float", default=None, check=_unit)

    _KINDS: ClassVar[dict[str, str]] = {
        "ranks": "ranks_text", "node": "node", "nodes": "nodes", "family": "family",
        "class": "class_", "fraction": "fraction"}

    @property
    def kind(self) -> str:
        """The YAML key that chose the ranks (``ranks``, ``node``, ... ``fraction``)."""
        return next(key for key, attr in self._KINDS.items() if getattr(self, attr) is not None)

    def _rules(self):
        yield from _one_of(self, self._KINDS, ", ".join(self._KINDS))
        if self.family is not None and self.group is None:
            yield (), "family needs group: the group's index in the family"
        if self.group is not None and self.family is None:
            yield ("group",), "group goes with family"

    def problem(self, world_size: int, gpus_per_node: int) -> str | None:
        """What is wrong with this selector in a world of ``world_size`` ranks,
        or None; cheap for any world (nothing is expanded).  Family and class
        selectors need a graph: None."""
        if world_size < 1 or gpus_per_node < 1:
            return f"no ranks in a world of {world_size} ({gpus_per_node} per node)"
        try:
            if self.ranks_text is not None:
                rank_spans(self.ranks_text, world_size, gpus_per_node)
            elif self.node is not None or self.nodes is not None:
                node_spans(str(self.node) if self.nodes is None else self.nodes,
                           -(-world_size // gpus_per_node))
        except ConfigError as exc:
            return str(exc)
        return None

    def ranks(self, world_size: int, gpus_per_node: int, *,
              families: Callable[[str, int], Iterable[int]] | None = None,
              classes: Callable[[int], Iterable[int]] | None = None,
              seed: int | str = 0) -> list[int]:
        """The ranks selected, in order, each once; :class:`ConfigError` when
        they are not in the world.  ``families(family, group)`` and
        ``classes(class)`` answer from an execution graph; ``fraction`` draws
        with ``seed`` (same seed, same ranks)."""
        if world_size < 1 or gpus_per_node < 1:
            raise ConfigError(f"no ranks in a world of {world_size} ({gpus_per_node} per node)")
        if self.ranks_text is not None:
            return select_ranks(self.ranks_text, world_size, gpus_per_node)
        if self.node is not None or self.nodes is not None:
            nodes = expand(node_spans(str(self.node) if self.nodes is None else self.nodes,
                                      -(-world_size // gpus_per_node)))
            return [rank for node in nodes for rank in
                    range(node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node))]
        if self.fraction is not None:
            count = max(1, round(self.fraction * world_size))
            return sorted(random.Random(seed).sample(range(world_size), count))
        if self.family is not None:
            if families is None:
                raise ConfigError(f"selecting family {self.family} group {self.group} needs the "
                                  "job's group families: run with an execution graph")
            return list(dict.fromkeys(families(self.family, self.group)))
        if classes is None:
            raise ConfigError(f"selecting class {self.class_} needs the job's rank classes: "
                              "run with an execution graph")
        return list(dict.fromkeys(classes(self.class_)))


@dataclass(frozen=True, kw_only=True)
class Trigger(_Checked):
    """When a fault starts: at an iteration (optionally its K-th collective) or
    at a time on the emulated clock."""

    iteration: int | None = _f("int", default=None, check=_at_least(1))
    collective: int | None = _f("int", default=None, check=_at_least(1))
    time_s: float | None = _f("float", default=None, check=_non_negative)

    def _rules(self):
        yield from _one_of(self, {"iteration": "iteration", "time_s": "time_s"},
                           "iteration, time_s")
        if self.collective is not None and self.iteration is None:
            yield ("collective",), "collective counts within an iteration: give iteration too"


@dataclass(frozen=True, kw_only=True)
class Duration(_Checked):
    iterations: int | None = _f("int", default=None, check=_at_least(1))
    time_s: float | None = _f("float", default=None, check=_positive)

    def _rules(self):
        yield from _one_of(self, {"iterations": "iterations", "time_s": "time_s"},
                           "iterations, time_s")


@dataclass(frozen=True, kw_only=True)
class Intermittent(_Checked):
    """A link degraded for ``duty`` of every ``period_s``."""

    period_s: float = _f("float", check=_positive)
    duty: float = _f("float", check=_unit)


@dataclass(frozen=True, kw_only=True)
class Fault(_Checked):
    """One perturbation: the subclass says what, ``select`` to whom, ``at`` from
    when, ``duration`` (YAML ``for``) how long (None: to the end)."""

    action: ClassVar[Action]
    select: Selector = _f("object", of=Selector)
    at: Trigger = _f("object", of=Trigger, default=Trigger(iteration=1))
    duration: Duration | None = _f("object", of=Duration, key="for", default=None)
    line: int = field(default=0, compare=False)  # where the file defines it, for reports

    def _rules(self):
        # The replay engine counts iterations and collectives, not seconds:
        # only a hang's stall is a time.
        if self.at.time_s is not None:
            yield ("at", "time_s"), ("faults start at an iteration (and a collective in it); "
                                     "time_s triggers are not supported")
        if self.duration is not None:
            if self.action == Action.HANG and self.duration.iterations is not None:
                yield ("for", "iterations"), ("a hang stalls for time_s seconds, or lasts "
                                              "for good without for")
            elif self.action != Action.HANG and self.duration.time_s is not None:
                yield ("for", "time_s"), (f"a {self.action} fault lasts whole iterations: "
                                          "for: {iterations: N} (time_s is a hang's stall)")


@dataclass(frozen=True, kw_only=True)
class DelayFault(Fault):
    action = Action.DELAY
    seconds: float = _f("float", check=_positive)
    family: str | None = _f("text", default=None, check=_not_empty)


@dataclass(frozen=True, kw_only=True)
class SlowFault(Fault):
    action = Action.SLOW
    factor: float = _f("float", check=_positive)


@dataclass(frozen=True, kw_only=True)
class LinkFault(Fault):
    action = Action.LINK
    bandwidth_factor: float | None = _f("float", default=None, check=_positive)
    latency_us: float | None = _f("float", default=None, check=_non_negative)
    intermittent: Intermittent | None = _f("object", of=Intermittent, default=None)

    def _rules(self):
        yield from super()._rules()
        if self.bandwidth_factor is None and self.latency_us is None:
            yield (), "a link fault needs bandwidth_factor, latency_us or both"
        if self.select.node is None and self.select.nodes is None:
            yield ("select",), "a link fault selects nodes (their network links): use node or nodes"


@dataclass(frozen=True, kw_only=True)
class FailFault(Fault):
    action = Action.FAIL

    def _rules(self):
        if self.at.time_s is not None:
            yield from super()._rules()
        if self.duration is not None:
            yield ("for",), "a failed rank does not come back: remove for (hang with for resumes)"


@dataclass(frozen=True, kw_only=True)
class HangFault(Fault):
    action = Action.HANG


@dataclass(frozen=True, kw_only=True)
class NanFault(Fault):
    action = Action.NAN
    family: str | None = _f("text", default=None, check=_not_empty)


@dataclass(frozen=True, kw_only=True)
class InfFault(Fault):
    action = Action.INF
    family: str | None = _f("text", default=None, check=_not_empty)


@dataclass(frozen=True, kw_only=True)
class CorruptFault(Fault):
    action = Action.CORRUPT
    scale: float = _f("float", check=lambda v: None if math.isfinite(v) and v != 1
                      else f"must be a finite number other than 1, got {v}")
    family: str | None = _f("text", default=None, check=_not_empty)


@dataclass(frozen=True, kw_only=True)
class DesyncFault(Fault):
    action = Action.DESYNC
    kind: DesyncKind = _f("enum", of=DesyncKind)
    family: str | None = _f("text", default=None, check=_not_empty)


FAULT_TYPES: dict[Action, type[Fault]] = {cls.action: cls for cls in (
    DelayFault, SlowFault, LinkFault, FailFault, HangFault, NanFault, InfFault, CorruptFault,
    DesyncFault)}


@dataclass(frozen=True, kw_only=True)
class Expectation(_Checked):
    """One thing the run must show; the subclass's ``kind`` is its YAML key.
    ``value_field`` names the field the YAML value is, when it is not a mapping."""

    kind: ClassVar[str]
    value_field: ClassVar[str | None] = None
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, kw_only=True)
class ExpectException(Expectation):
    kind = "exception"
    type: str = _f("text", check=_exception_name)  # class name, or dotted with its module
    match: str | None = _f("text", default=None, check=_regex)  # re.search in the message


@dataclass(frozen=True, kw_only=True)
class ExpectExitCode(Expectation):
    kind, value_field = "exit_code", "code"
    code: int = _f("int", key="exit_code", check=_exit_code)


@dataclass(frozen=True, kw_only=True)
class ExpectIterationTime(Expectation):
    """Absolute bounds (``min_s``, ``max_s``) or ``relative`` to the same
    iteration of an unperturbed baseline run, give or take ``tolerance``."""

    kind = "iteration_time"
    iteration: int | None = _f("int", default=None, check=_at_least(1))  # None: every one
    min_s: float | None = _f("float", default=None, check=_non_negative)
    max_s: float | None = _f("float", default=None, check=_positive)
    relative: float | None = _f("float", default=None, check=_positive)
    # relative to the baseline by the ratio the replay engine predicts
    predicted: bool | None = _f("bool", default=None)
    tolerance: float | None = _f("float", default=None, check=_non_negative)

    @property
    def is_relative(self) -> bool:
        return self.relative is not None or bool(self.predicted)

    def bounds(self, baseline_s: float | None = None,
               predicted_ratio: float | None = None) -> tuple[float, float]:
        """The allowed iteration time, in seconds."""
        if self.predicted:
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

    def _rules(self):
        if self.predicted is False:
            yield ("predicted",), "predicted: true, or leave it out"
        if not self.is_relative and self.min_s is None and self.max_s is None:
            yield (), "give max_s, min_s, relative (to a baseline run) or predicted: true"
        elif self.is_relative and (self.min_s is not None or self.max_s is not None):
            bound = "min_s" if self.min_s is not None else "max_s"
            first = "relative" if self.relative is not None else "predicted"
            yield (first,), f"give {first} or {bound}, not both"
        if self.relative is not None and self.predicted:
            yield ("predicted",), "give relative or predicted, not both"
        if self.tolerance is not None and not self.is_relative:
            yield ("tolerance",), "tolerance goes with relative or predicted"
        if self.min_s is not None and self.max_s is not None and self.min_s > self.max_s:
            yield ("max_s",), f"max_s {self.max_s} is less than min_s {self.min_s}"


@dataclass(frozen=True, kw_only=True)
class ExpectFlightRecord(Expectation):
    kind = "flight_record"
    missing_ranks: tuple[int, ...] = _f("ints", default=())
    mismatch: DesyncKind | None = _f("enum", of=DesyncKind, default=None)

    def _rules(self):
        if not self.missing_ranks and self.mismatch is None:
            yield (), "give missing_ranks, mismatch or both"
        for i, rank in enumerate(self.missing_ranks):
            if rank < 0:
                yield ("missing_ranks", i), f"rank {rank} is negative"


@dataclass(frozen=True, kw_only=True)
class ExpectNanAt(Expectation):
    kind = "nan_at"
    iteration: int = _f("int", check=_at_least(1))


@dataclass(frozen=True, kw_only=True)
class ExpectDigests(Expectation):
    """The real rank's per-iteration value digests, as the report prints them."""

    kind, value_field = "digests", "digests"
    digests: tuple[tuple[int, str], ...] = _f("digests", check=_not_empty)

    def _rules(self):
        seen = set()
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
class Scenario(_Checked):
    name: str = _f("text", check=_not_empty)
    description: str = _f("text", default="")
    world: World = _f("object", of=World)
    run: Run = _f("object", of=Run)
    seed: int = _f("int", default=0, check=_at_least(0))
    faults: tuple[Fault, ...] = _f("faults", default=())
    expect: tuple[Expectation, ...] = _f("expect", default=())
    source: str = field(default="<string>", compare=False)  # the file it came from

    def fault_ranks(self, index: int, **kwargs) -> list[int]:
        """The ranks fault ``index`` hits; a fraction is drawn with the scenario's
        seed and the fault's index, so two faults draw different ranks."""
        world = self.world
        return self.faults[index].select.ranks(world.size, world.gpus_per_node,
                                               seed=f"{self.seed}/{index}", **kwargs)

    def _rules(self):
        yield from cross_rules(self.world, self.run, [f.select for f in self.faults],
                               [f.at for f in self.faults], self.expect)


def cross_rules(world: World | None, run: Run | None, selects: Sequence[Selector | None],
                triggers: Sequence[Trigger | None], expect: Sequence[Expectation | None],
                ) -> Iterator[tuple[tuple, str]]:
    """Rules across sections, as (key path, message).  The loader runs them on
    what it could read of a broken file (``None`` for what it could not), so an
    error in one place hides none elsewhere; ``selects`` and ``triggers`` are
    the faults'."""
    if world is not None:
        example = run.example if run is not None else None
        if example is not None and world.size % (example.tp * example.pp):
            product = example.tp * example.pp
            yield ("run", "example", "tp"), (f"world size {world.size} is not divisible by "
                                             f"tp*pp = {example.tp}*{example.pp} = {product}")
        for i, select in enumerate(selects):
            if select is not None and (problem := select.problem(world.size, world.gpus_per_node)):
                yield ("faults", i, "select", select.kind), problem
        for i, expectation in enumerate(expect):
            if isinstance(expectation, ExpectFlightRecord):
                for j, rank in enumerate(expectation.missing_ranks):
                    if rank >= world.size:
                        yield (("expect", i, "flight_record", "missing_ranks", j),
                               f"rank {rank} is outside the world of {world.size} ranks")
    last = run.last_iteration if run is not None else None
    if last is None:
        return
    late = f"the run stops after iteration {last}"
    for i, trigger in enumerate(triggers):
        if trigger is not None and trigger.iteration is not None and trigger.iteration > last:
            yield ("faults", i, "at", "iteration"), f"iteration {trigger.iteration}: {late}"
    for i, expectation in enumerate(expect):
        if isinstance(expectation, (ExpectIterationTime, ExpectNanAt)):
            n = expectation.iteration
            if n is not None and n > last:
                yield ("expect", i, expectation.kind, "iteration"), f"iteration {n}: {late}"
        elif isinstance(expectation, ExpectDigests):
            for n, _ in expectation.digests:
                if n > last:
                    yield ("expect", i, "digests", n), f"iteration {n}: {late}"


def dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
