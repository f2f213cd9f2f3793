"""Perturbations of virtual peers, as people type them (the console's
``perturb`` verb, ``run --perturb``), applied through the replay engine's
interface (``slow``, ``delay``, ``fail``, ``link``).

::

    slow 4096-4103 1.16 [from 3] [for 2]     compute x1.16 from iteration 3, for 2 iterations
    delay 4100 0.005 [family dp] [from 3] [for 1]   arrive 5 ms late at every (dp) op
    fail 4099 [at 3]                          fail-stop from iteration 3: never arrives again
    link 512,513 0.5 [20]                     groups spanning nodes 512/513: half bandwidth, +20 us

Ranks are ``R``, ``A-B``, lists of them, or ``node:N``.  Pure Python.
"""

from __future__ import annotations

import dataclasses
import math

from prism_debug.errors import ConfigError
from prism_debug.graph.selectors import expand, node_spans, select_ranks

USAGE = {
    "slow": "slow RANKS FACTOR [from ITERATION] [for ITERATIONS]",
    "delay": "delay RANKS SECONDS [family FAMILY] [from ITERATION] [for ITERATIONS]",
    "fail": "fail RANKS [at ITERATION]",
    "link": "link NODES BANDWIDTH_FACTOR [ADDED_LATENCY_US]",
}


@dataclasses.dataclass(frozen=True)
class Perturbation:
    action: str
    ranks: tuple[int, ...]  # nodes, for link
    value: float = 1.0  # factor, seconds or bandwidth factor
    latency_s: float = 0.0  # link
    family: str | None = None  # delay
    first_iteration: int = 1
    iterations: float = math.inf
    text: str = ""

    def apply(self, engine) -> None:
        """Hand it to a :class:`~prism_debug.engine.replay.ReplayEngine`."""
        if self.action == "slow":
            engine.slow(self.ranks, self.value, first_iteration=self.first_iteration,
                        iterations=self.iterations)
        elif self.action == "delay":
            engine.delay(self.ranks, self.value, family=self.family,
                         first_iteration=self.first_iteration, iterations=self.iterations)
        elif self.action == "fail":
            engine.fail(self.ranks, at_iteration=self.first_iteration)
        else:
            engine.link(self.ranks, bandwidth_factor=self.value, added_latency_s=self.latency_s)


def parse_perturbation(text: str, world_size: int, gpus_per_node: int) -> Perturbation:
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
        targets = expand(node_spans(where, -(-world_size // gpus_per_node)))
    elif where.startswith("node:"):
        targets = select_ranks("node " + where[5:], world_size, gpus_per_node)
    else:
        targets = select_ranks(where, world_size, gpus_per_node)
    fields: dict = {"action": action, "ranks": tuple(targets), "text": " ".join(words)}
    positional = [w for w in _positional(rest)]
    options = _options(rest, usage)
    if action in ("slow", "delay", "link"):
        if not positional:
            raise ConfigError(f"{action} needs a value: {usage}")
        fields["value"] = _number(positional[0], usage)
        if fields["value"] < 0 or (action != "delay" and fields["value"] <= 0):
            raise ConfigError(f"{action}: {positional[0]} must be positive: {usage}")
    if action == "link" and len(positional) > 1:
        fields["latency_s"] = _number(positional[1], usage) * 1e-6
    if action == "fail":
        fields["first_iteration"] = int(options.pop("at", 1))
    else:
        fields["first_iteration"] = int(options.pop("from", 1))
        if "for" in options:
            fields["iterations"] = int(options.pop("for"))
        if action == "delay" and "family" in options:
            fields["family"] = options.pop("family")
    if options:
        raise ConfigError(f"{action} does not take {', '.join(options)}: {usage}")
    if fields["first_iteration"] < 1:
        raise ConfigError(f"iterations count from 1: {usage}")
    return Perturbation(**fields)


_KEYWORDS = ("from", "for", "at", "family")


def _positional(words: list[str]) -> list[str]:
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in _KEYWORDS:
            skip = True
        else:
            out.append(word)
    return out


def _options(words: list[str], usage: str) -> dict[str, str]:
    options = {}
    for i, word in enumerate(words):
        if word in _KEYWORDS:
            if i + 1 >= len(words):
                raise ConfigError(f"{word} needs a value: {usage}")
            value = words[i + 1]
            if word != "family" and not value.isdigit():
                raise ConfigError(f"{word} takes an iteration number, got {value!r}: {usage}")
            options[word] = value
    return options


def _number(word: str, usage: str) -> float:
    try:
        return float(word)
    except ValueError:
        raise ConfigError(f"{word!r} is not a number: {usage}") from None
