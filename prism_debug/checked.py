"""Frozen dataclasses that check themselves, and say how a YAML loader reads them.

A field declared with :func:`declare` carries its reading (``kind``), its YAML
key when that is not the field's name, and a check that both the loader and
``__post_init__`` run, so a value built in Python and one read from a file are
held to the same rules.  Faults (``prism_debug.faults``) and scenarios
(``prism_debug.scenario``) are built from these.  Pure Python.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING, field
from typing import Any, Callable, Iterator

from prism_debug.errors import InvalidFields
from prism_debug.errors import key_path as dotted

Check = Callable[[Any], "str | None"]
__all__ = ["Checked", "InvalidFields", "at_least", "declare", "dotted", "field_errors",
           "non_negative", "not_empty", "one_of", "positive", "unit_interval"]


def declare(kind: str, *, key: str | None = None, default: Any = MISSING,
            check: Check | None = None, of: Any = None) -> Any:
    """A field the loader reads as ``kind`` (``int``, ``float``, ``text``,
    ``object`` of class ``of``, ...) from YAML key ``key`` (default: its name)."""
    metadata = {"kind": kind, "key": key, "check": check, "of": of}
    return field(default=default, metadata=metadata)


# -- value checks: None when fine, else what is wrong ----------------------------------


def at_least(low: int) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}, got {v}"


def positive(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else f"must be > 0, got {v}"


def non_negative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else f"must be >= 0, got {v}"


def unit_interval(v: float) -> str | None:
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}"


def not_empty(v) -> str | None:
    return None if len(v) else "must not be empty"


class Checked:
    """Runs the fields' checks, then the class's own ``_rules``, on construction."""

    def __post_init__(self) -> None:
        errors = list(field_errors(type(self), vars(self))) or list(self._rules())
        if errors:
            raise InvalidFields(type(self).__name__, errors)

    def _rules(self) -> Iterator[tuple[tuple, str]]:
        return iter(())


def field_errors(cls, values: dict) -> Iterator[tuple[tuple, str]]:
    """What the declared checks find wrong in ``values`` (field name -> value)."""
    for f in dataclasses.fields(cls):
        check = f.metadata.get("check")
        value = values.get(f.name)
        if check is not None and value is not None and (message := check(value)):
            yield (f.metadata["key"] or f.name,), message


def one_of(obj, keys: dict[str, str], what: str) -> Iterator[tuple[tuple, str]]:
    """Exactly one of ``keys`` (YAML key -> attribute) is set."""
    given = [key for key, attr in keys.items() if getattr(obj, attr) is not None]
    if not given:
        yield (), f"give one of {what}"
    elif len(given) > 1:
        yield (given[1],), f"give one of {what}, not both {given[0]} and {given[1]}"
