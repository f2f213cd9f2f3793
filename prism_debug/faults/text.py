"""Faults as people type them: ``run --perturb`` and the console's ``perturb``.

::

    slow RANKS FACTOR [from I] [for N]        compute x FACTOR from iteration I, for N iterations
    delay RANKS SECONDS [family F] [from I] [op K] [for N]
                                              arrive SECONDS late at every (F) collective
    link NODES BANDWIDTH [LATENCY_US] [from I] [for N] [flap PERIOD_S DUTY]
                                              groups spanning NODES: bandwidth x BANDWIDTH,
                                              +LATENCY; flapping: degraded DUTY of every
                                              PERIOD_S
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

RANKS are ``R``, ``A-B``, lists of them, ``node:N`` (or ``node:A-B``, lists),
``family:F:G`` (group G of family F), ``class:C`` (a rank class: a pipeline
stage) or ``fraction:P[:SEED]`` (that share of the world, drawn with SEED).
``at`` and ``from`` are the same word.

:func:`parse_fault` reads a line into a :class:`~prism_debug.faults.model.Fault`
(checking the ranks against a world when it is given); :func:`fault_text`
writes one back, so that ``parse_fault(fault_text(f)) == f``.  Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from prism_debug.checked import InvalidFields
from prism_debug.errors import ConfigError
from prism_debug.faults.model import (
    FAULT_TYPES,
    Action,
    DesyncFault,
    DesyncKind,
    Duration,
    Fault,
    Intermittent,
    LinkFault,
    Selector,
    Trigger,
)

USAGE = {
    "slow": "slow RANKS FACTOR [from I] [for N]",
    "delay": "delay RANKS SECONDS [family F] [from I] [op K] [for N]",
    "link": "link NODES BANDWIDTH_FACTOR [LATENCY_US] [from I] [for N] [flap PERIOD_S DUTY]",
    "fail": "fail RANKS [at I] [op K]",
    "hang": "hang RANKS [at I] [op K] [for SECONDS]",
    "nan": "nan RANKS [family F] [at I] [op K] [for N]",
    "inf": "inf RANKS [family F] [at I] [op K] [for N]",
    "corrupt": "corrupt RANKS SCALE [family F] [at I] [op K] [for N]",
    "desync": "desync RANKS size|dtype|op|skip [family F] [at I] [op K]",
}
#: the whole grammar, one action a line (the console's help quotes it)
USAGE_TEXT = "\n".join(USAGE.values())

# the keywords each action takes (``at``/``from`` are one)
_TAKES = {
    "slow": {"from", "for"}, "delay": {"from", "op", "for", "family"},
    "link": {"from", "for", "flap"}, "fail": {"from", "op"}, "hang": {"from", "op", "for"},
    "nan": {"from", "op", "for", "family"}, "inf": {"from", "op", "for", "family"},
    "corrupt": {"from", "op", "for", "family"}, "desync": {"from", "op", "family"},
}
# how many values follow the ranks: (fewest, most)
_VALUES = {"slow": (1, 1), "delay": (1, 1), "corrupt": (1, 1), "desync": (1, 1),
           "link": (1, 2)}
# the field the first value fills
_VALUE_FIELD = {"slow": "factor", "delay": "seconds", "corrupt": "scale",
                "link": "bandwidth_factor"}
_ARITY = {"from": 1, "at": 1, "for": 1, "op": 1, "family": 1, "flap": 2}


def parse_fault(text: str, world_size: int | None = None,
                gpus_per_node: int = 8) -> Fault:
    """One fault; :class:`ConfigError` with the usage when it is not one.  With
    ``world_size``, ranks and nodes outside that world are refused too (family,
    class and fraction selectors are checked when they are resolved)."""
    words = text.split()
    if not words or words[0] not in USAGE:
        raise ConfigError(f"unknown perturbation {text!r}: use one of "
                          + "; ".join(USAGE.values()))
    action, rest = words[0], words[1:]
    usage = USAGE[action]
    if not rest:
        raise ConfigError(f"{action} needs ranks: {usage}")
    where, rest = rest[0], rest[1:]
    select = _nodes(where) if action == "link" else _selector(where)
    if world_size is not None and (problem := select.problem(world_size, gpus_per_node)):
        raise ConfigError(problem)
    options, positional = _words(action, rest, usage)
    # the keyword arguments of the class the action picks, each field of its own type
    fields: dict[str, Any] = {"select": select, **_values(action, positional, usage),
                              **_window(action, options, usage)}
    try:
        return FAULT_TYPES[Action(action)](**fields)
    except InvalidFields as exc:
        raise ConfigError(f"{exc}: {usage}") from exc


def _words(action: str, rest: list[str], usage: str) -> tuple[dict[str, list[str]], list[str]]:
    """The words after the ranks: the options and the values, refused where
    ``action`` does not take them."""
    kind = None
    if action == "desync" and rest and rest[0] in DesyncKind._value2member_map_:
        kind, rest = rest[0], rest[1:]  # read first: "op" is a kind and a keyword
    options, positional = _split(rest, usage)
    if kind is not None:
        positional.insert(0, kind)
    unknown = set(options) - _TAKES[action]
    if unknown:
        raise ConfigError(f"{action} does not take {', '.join(sorted(unknown))}: {usage}")
    low, high = _VALUES.get(action, (0, 0))
    if not low <= len(positional) <= high:
        what = "a value" if high else "no value"
        raise ConfigError(f"{action} takes {what} after the ranks: {usage}")
    return options, positional


def _values(action: str, positional: list[str], usage: str) -> dict[str, DesyncKind | float]:
    """The fields the values after the ranks fill: a desync's kind, or the
    action's number (and a link's added latency)."""
    if action == "desync":
        if positional[0] not in DesyncKind._value2member_map_:
            raise ConfigError(f"desync {positional[0]!r}: the kind is one of "
                              f"{', '.join(DesyncKind)}: {usage}")
        return {"kind": DesyncKind(positional[0])}
    fields: dict[str, DesyncKind | float] = {}
    if positional:
        fields[_VALUE_FIELD[action]] = _value(action, positional[0], usage)
        if len(positional) > 1:
            latency = _number(positional[1], usage)
            if not math.isfinite(latency) or latency < 0:
                raise ConfigError(f"link: the added latency must be >= 0 us: {usage}")
            fields["latency_us"] = latency
    return fields


def _window(action: str, options: dict[str, list[str]], usage: str
            ) -> dict[str, Trigger | str | Duration | Intermittent]:
    """The fields the options fill: where it starts, its family, how long it
    lasts and how a link flaps."""
    iteration = _count(options["from"][0], "from", usage) if "from" in options else 1
    collective = _count(options["op"][0], "op", usage) if "op" in options else None
    fields: dict[str, Trigger | str | Duration | Intermittent] = {
        "at": Trigger(iteration=iteration, collective=collective)}
    if "family" in options:
        fields["family"] = options["family"][0]
    if "for" in options:
        fields["duration"] = _duration(action, options["for"][0], usage)
    if "flap" in options:
        period, duty = (_number(v, usage) for v in options["flap"])
        if not (period > 0 and 0 < duty <= 1):
            raise ConfigError(f"link: flap takes a period > 0 s and a duty in (0, 1]: {usage}")
        fields["intermittent"] = Intermittent(period_s=period, duty=duty)
    return fields


def _duration(action: str, word: str, usage: str) -> Duration:
    """``for``'s word: a hang's stall in seconds, any other fault's iterations."""
    if action == "hang":
        stall = _number(word, usage)
        if not math.isfinite(stall) or stall <= 0:
            raise ConfigError(f"hang: for takes seconds > 0: {usage}")
        return Duration(time_s=stall)
    return Duration(iterations=_count(word, "for", usage))


def fault_text(fault: Fault) -> str:
    """``fault`` as the line :func:`parse_fault` reads back into it."""
    action = fault.action
    if isinstance(fault, LinkFault):
        words = ["link", fault.select.node_text,
                 _num(1.0 if fault.bandwidth_factor is None else fault.bandwidth_factor)]
        if fault.latency_us is not None:
            words.append(_num(fault.latency_us))
    else:
        words = [str(action), fault.select.word()]
        if action in _VALUE_FIELD:
            words.append(_num(getattr(fault, _VALUE_FIELD[action])))
        elif isinstance(fault, DesyncFault):
            words.append(str(fault.kind))
    if fault.family is not None:
        words += ["family", fault.family]
    if fault.first_iteration != 1:
        words += ["from", str(fault.first_iteration)]
    if fault.collective is not None:
        words += ["op", str(fault.collective)]
    if fault.duration is not None:
        stall = fault.duration.time_s
        words += ["for", _num(stall) if stall is not None else str(fault.duration.iterations)]
    intermittent = getattr(fault, "intermittent", None)
    if intermittent is not None:
        words += ["flap", _num(intermittent.period_s), _num(intermittent.duty)]
    return " ".join(words)


def rank_text(ranks: Iterable[int]) -> str:
    """Ranks as the shortest RANKS word (``0-3,8``)."""
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


# -- words --------------------------------------------------------------------------------


def _selector(where: str) -> Selector:
    head, _, rest = where.partition(":")
    if head == "node" and rest:  # node:3, node:3-4, node:1,5
        return _nodes(rest)
    if head == "fraction" and rest:
        share, _, seed = rest.partition(":")
        try:
            fraction = float(share)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ConfigError(f"fraction:{share}: give a share of the world in (0, 1]")
        return Selector(fraction=fraction, seed=seed or None)
    if head == "family" and rest:
        family, _, group = rest.partition(":")
        if not family or not group.isdecimal():
            raise ConfigError(f"{where}: write family:FAMILY:GROUP, the group's index counting "
                              "from 0 (family:dp:3)")
        return Selector(family=family, group=int(group))
    if head == "class" and rest:
        if not rest.isdecimal():
            raise ConfigError(f"{where}: write class:C, a rank class's number (class:2)")
        return Selector(class_=int(rest))
    return Selector(ranks_text=where)


def _nodes(text: str) -> Selector:
    text = text.removeprefix("node:")
    return Selector(node=int(text)) if text.isdecimal() else Selector(nodes=text)


def _split(words: list[str], usage: str) -> tuple[dict[str, list[str]], list[str]]:
    """Keyword options (``at`` read as ``from``), each with its values, and the
    positional words."""
    options: dict[str, list[str]] = {}
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
        options[key] = values
        i += 1 + arity
    return options, positional


def _value(action: str, word: str, usage: str) -> float:
    value = _number(word, usage)
    if action == "corrupt":
        if not math.isfinite(value) or value == 1:
            raise ConfigError(f"corrupt: the scale must be a finite number other than 1, "
                              f"got {word}: {usage}")
    elif not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{action}: {word} must be positive: {usage}")
    return value


def _count(word: str, keyword: str, usage: str) -> int:
    if not word.isdecimal() or int(word) < 1:
        raise ConfigError(f"{keyword} takes a whole number >= 1, got {word!r}: {usage}")
    return int(word)


def _number(word: str, usage: str) -> float:
    try:
        return float(word)
    except ValueError:
        raise ConfigError(f"{word!r} is not a number: {usage}") from None


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
