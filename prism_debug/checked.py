"""Frozen dataclasses that check themselves, and say how a YAML loader reads them.

A field declared with :func:`declare` carries its reading (``kind``), its YAML
key when that is not the field's name, and a check that both the loader and
``__post_init__`` run, so a value built in Python and one read from a file are
held to the same rules.  Faults (``prism_debug.faults``) and scenarios
(``prism_debug.scenario``) are built from these.  :class:`Untrusted` reads
parsed JSON and TOML (graph files, hardware profiles) with the same checks,
and the ``MAX_*`` limits bound every number that comes in.  Pure Python.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import math
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sized
from dataclasses import MISSING, field
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

from prism_debug.errors import ConfigError, InvalidFields, KeyPath
from prism_debug.errors import key_path as dotted

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# a check takes whatever its field holds (a number, text, a tuple): None when fine
Check = Callable[[Any], "str | None"]
#: what the checks of an object find wrong: (key path, message), the path relative to it
FieldErrors = Iterator[tuple[KeyPath, str]]
__all__ = ["SAFE_NAME", "Checked", "FieldErrors", "InvalidFields", "Untrusted", "at_least",
           "at_most", "both", "declare", "declared_fields", "dotted", "field_errors",
           "from_mapping", "member_of", "non_negative", "not_empty", "one_of", "positive",
           "safe_name", "to_mapping", "unit_interval"]


# -- limits: what prism-debug accepts anywhere a number comes in ---------------------
# (the ranks torch numbers (int32), GPUs per node beyond any machine, a run's
# iterations, seeds torch takes, a timeout that is "never" in practice)
MAX_WORLD_SIZE = 2**31 - 1
MAX_GPUS_PER_NODE = 1 << 16
MAX_ITERATIONS = 10**9
MAX_SEED = 2**63 - 1
MAX_TIMEOUT_S = 1e6
# real ranks one controller starts (--ranks, a scenario's world.ranks): each is a
# process with its own agent
MAX_REAL_RANKS = 64


def declare(kind: str, *, key: str | None = None, default: Any = MISSING,
            check: Check | None = None, of: Any = None) -> Any:
    """A field the loader reads as ``kind`` (``int``, ``float``, ``text``,
    ``object`` of class ``of``, ...) from YAML key ``key`` (default: its name)."""
    metadata = {"kind": kind, "key": key, "check": check, "of": of}
    return field(default=default, metadata=metadata)


# -- value checks: None when fine, else what is wrong ----------------------------------


def at_least(low: int) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}, got {v}"


def at_most(high: float) -> Check:
    shown = high if isinstance(high, int) else f"{high:.10g}"
    return lambda v: None if v <= high else f"must be <= {shown}, got {v}"


def member_of(choices: Collection[str]) -> Check:
    """A value that must be one of ``choices``."""
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"


def both(*checks: Check) -> Check:
    """The first problem any of ``checks`` finds."""
    return lambda v: next((p for check in checks if (p := check(v)) is not None), None)


# what a name that becomes part of a path may be: no separators, no "..", no
# leading dot or dash, not empty, not longer than a file name should be
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def safe_name(v: str) -> str | None:
    return None if SAFE_NAME.fullmatch(v) else (
        f"must be a safe name, got {_short(v)}: use 1-64 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit")


def positive(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else f"must be > 0, got {v}"


def non_negative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else f"must be >= 0, got {v}"


def unit_interval(v: float) -> str | None:
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}"


def not_empty(v: Sized) -> str | None:
    return None if len(v) else "must not be empty"


class Checked:
    """Runs the fields' checks, then the class's own ``_rules``, on construction."""

    # every subclass is a dataclass (declared with @dataclass): what field_errors reads
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        errors = list(field_errors(type(self), vars(self))) or list(self._rules())
        if errors:
            raise InvalidFields(type(self).__name__, errors)

    def _rules(self) -> FieldErrors:
        return iter(())


def field_errors(cls: type[DataclassInstance], values: Mapping[str, object]) -> FieldErrors:
    """What the declared checks find wrong in ``values`` (field name -> value)."""
    for f in dataclasses.fields(cls):
        check = f.metadata.get("check")
        value = values.get(f.name)
        if check is not None and value is not None and (message := check(value)):
            yield (f.metadata["key"] or f.name,), message


def one_of(obj: object, keys: Mapping[str, str], what: str) -> FieldErrors:
    """Exactly one of ``keys`` (YAML key -> attribute) is set."""
    given = [key for key, attr in keys.items() if getattr(obj, attr) is not None]
    if not given:
        yield (), f"give one of {what}"
    elif len(given) > 1:
        yield (given[1],), f"give one of {what}, not both {given[0]} and {given[1]}"


# -- the dict form: YAML keys, nested objects as mappings (what a file holds) ---------


def declared_fields(cls: type[DataclassInstance]
                    ) -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    """``cls``'s declared fields, each with its YAML key, in order."""
    for f in dataclasses.fields(cls):
        if f.metadata:
            yield f.metadata["key"] or f.name, f


def to_mapping(obj: DataclassInstance) -> dict[str, Any]:
    """``obj`` as a file writes it: its declared fields by YAML key, unset ones left out."""
    out: dict[str, Any] = {}
    for key, f in declared_fields(type(obj)):
        value = getattr(obj, f.name)
        if value is None:
            continue
        if f.metadata["kind"] == "object":
            value = to_mapping(value)
        elif isinstance(value, enum.Enum):
            value = value.value
        out[key] = value
    return out


_PLAIN: dict[str, type[int | float | str] | tuple[type[int | float], ...]] = {
    "int": int, "float": (int, float), "text": str}
_Read = TypeVar("_Read", bound="DataclassInstance")


def from_mapping(cls: type[_Read], data: Mapping[str, Any], where: str) -> _Read:
    """A ``cls`` from :func:`to_mapping`'s form; :class:`ConfigError` naming the key
    (``where`` leads the path) that is unknown, missing or of the wrong kind."""
    fields = dict(declared_fields(cls))
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}: use {', '.join(fields)}")
    missing = [key for key, f in fields.items()
               if key not in data and f.default is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing required key {missing[0]!r}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        f = fields[key]
        kind, of = f.metadata["kind"], f.metadata["of"]
        if value is None:
            values[f.name] = None
        elif kind == "object":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}.{key}: expected a mapping, got {value!r}")
            values[f.name] = from_mapping(of, value, f"{where}.{key}")
        elif kind == "enum":
            if value not in of._value2member_map_:
                raise ConfigError(f"{where}.{key}: {value!r} is not one of {', '.join(of)}")
            values[f.name] = of(value)
        elif kind in _PLAIN and isinstance(value, _PLAIN[kind]) and not isinstance(value, bool):
            values[f.name] = float(value) if kind == "float" else value
        else:
            raise ConfigError(f"{where}.{key}: expected {kind}, got {value!r}")
    try:
        return cls(**values)
    except InvalidFields as exc:
        raise ConfigError(f"{where}: {exc}") from exc


# -- untrusted nested data (JSON, TOML): typed values or one error naming the key path --


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _found(value: Any) -> str:
    words = {list: "a list", dict: "a mapping", type(None): "nothing"}
    return words.get(type(value)) or _short(value)


class Untrusted:
    """Reads values out of parsed JSON or TOML that anyone may have written.

    Each method returns the value with the type asked for, or raises
    ``error`` (a :class:`~prism_debug.errors.PrismError` class) with one line:
    ``{what}: {place} must be …, got …{advice}``, ``place`` naming the key path
    (``place`` turns a path into words: :func:`dotted` by default).  Numbers
    must be finite unless ``infinite`` allows ``+inf``; NaN never passes;
    booleans are not numbers; lists and text are capped, so a crafted file
    cannot make the caller loop or allocate without bound."""

    def __init__(self, error: type[Exception], what: str, advice: str = "",
                 place: Callable[[KeyPath], str] = dotted) -> None:
        self.error, self.what, self.advice, self.place = error, what, advice, place

    def fail(self, path: KeyPath, problem: str) -> NoReturn:
        """``problem`` says what is wrong with the value at ``path``: "must be …"."""
        where = self.place(path) if path else "the top level"
        raise self.error(f"{self.what}: {where} {problem}{self.advice}")

    def mapping(self, value: Any, path: KeyPath) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"must be a mapping, got {_found(value)}")
        return value

    def get(self, data: Mapping[str, Any], key: str, path: KeyPath,
            default: Any = MISSING) -> Any:
        """``data[key]`` (``data`` is at ``path``), ``default`` when absent
        (required when no default)."""
        if key in data:
            return data[key]
        if default is MISSING:
            raise self.error(f"{self.what}: missing {self.place(path + (key,))}{self.advice}")
        return default

    def known(self, data: dict[str, Any], path: KeyPath, keys: Collection[str]
              ) -> dict[str, Any]:
        """``data`` (at ``path``), refused when it holds a key not in ``keys`` (a typo)."""
        for key in data:
            if key not in keys:
                raise self.error(f"{self.what}: unknown key {self.place(path + (key,))}: use "
                                 f"{', '.join(keys)}{self.advice}")
        return data

    def items(self, value: Any, path: KeyPath, *, most: int, length: int | None = None
              ) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, f"must be a list, got {_found(value)}")
        if length is not None and len(value) != length:
            self.fail(path, f"must be a list of {length}, got {len(value)} items")
        if len(value) > most:
            self.fail(path, f"must hold at most {most} items, got {len(value)}")
        return value

    def int(self, value: Any, path: KeyPath, low: int = 0, high: int = 2**63 - 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, got {_found(value)}")
        if not low <= value <= high:
            self.fail(path, f"must be in [{low}, {high}], got {_short(value)}")
        return value

    # (annotations below here spell the builtin builtins.int: in the class body
    # the method ``int`` hides it)

    def number(self, value: Any, path: KeyPath, check: Check = non_negative, *,
               infinite: bool = False) -> float:
        """A float; ``check`` (of finite values) says what else it must be."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"must be a number, got {_found(value)}")
        number = float(value)
        if infinite and number == math.inf:
            return number
        if not math.isfinite(number):
            self.fail(path, f"must be a finite number{' or inf' if infinite else ''}, "
                            f"got {number}")
        if (problem := check(number)) is not None:
            self.fail(path, problem)
        return number

    def text(self, value: Any, path: KeyPath, *, most: builtins.int = 4096,
             check: Check | None = None) -> str:
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {_found(value)}")
        if len(value) > most:
            self.fail(path, f"must be at most {most} characters, got {len(value)}")
        if check is not None and (problem := check(value)) is not None:
            self.fail(path, problem)
        return value
