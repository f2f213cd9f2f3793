"""Reading scenario files: YAML text to a :class:`~prism_debug.scenario.model.Scenario`.

The loader walks the node tree ``yaml.compose`` builds, so every problem it
finds (unknown key, wrong type, missing key, bad value, conflicting choices)
carries the line and column of the node at fault, and it reports them all.
The schema is in :mod:`prism_debug.scenario.model`.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from collections.abc import Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import yaml

from prism_debug.checked import InvalidFields, declared_fields, dotted
from prism_debug.errors import ScenarioError, VariabilityError
from prism_debug.faults import FAULT_TYPES, Action, Fault
from prism_debug.scenario import surroundings
from prism_debug.scenario.keys import accepted_keys
from prism_debug.scenario.model import (
    EXPECTATION_TYPES,
    ExpectDigests,
    Scenario,
    cross_rules,
    hex_digest_problem,
)
from prism_debug.variability import parse_variability

_TAG = "tag:yaml.org,2002:"
_NULL, _BOOL, _INT, _FLOAT, _STR = (_TAG + t for t in ("null", "bool", "int", "float", "str"))
_TEXT_TAGS = {_STR, _INT, _FLOAT, _BOOL, _TAG + "timestamp"}  # scalars read as text, as written
_INVALID = object()  # a value the loader reported a problem for
_CONSTRUCTOR = yaml.constructor.SafeConstructor()  # converts scalar nodes; keeps no state


@dataclass(frozen=True, order=True)
class Problem:
    """One error in a scenario file, at a 1-based line and column."""

    line: int
    column: int
    message: str
    source: str = "<string>"

    def __str__(self) -> str:
        return f"{self.source}:{self.line}:{self.column}: {self.message}"


# a variability rule's keys in a scenario file, and the --variability words they are
VARIABILITY_KEYS = {"cv": "cv", "dist": "dist", "class": "class", "op": "op",
                    "rank_cv": "rank-cv"}

# a scenario is a page of YAML; a file far larger is not one
MAX_SCENARIO_BYTES = 1 << 20


def load_scenario(path: str | Path, machine: surroundings.Machine | None = None) -> Scenario:
    """The scenario in the YAML file at ``path``; :class:`ScenarioError` listing
    every problem in it otherwise (with ``machine``, its surroundings' too:
    ``surroundings.py``)."""
    return parse_scenario(read_scenario_text(path), str(path), machine)


def read_scenario_text(path: str | Path) -> str:
    """The text of the scenario file at ``path``: :class:`ScenarioError` when it
    cannot be read, is not UTF-8, or is larger than a scenario could be."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCENARIO_BYTES + 1)
        if len(data) > MAX_SCENARIO_BYTES:
            raise ScenarioError([], f"cannot read scenario {path}: larger than "
                                    f"{MAX_SCENARIO_BYTES >> 10} KiB, which no scenario is")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise ScenarioError([], f"cannot read scenario {path}: {why}") from exc


def parse_scenario(text: str, source: str = "<string>",
                   machine: surroundings.Machine | None = None) -> Scenario:
    """The scenario ``text`` describes; :class:`ScenarioError` listing every
    problem in it otherwise.  ``source`` names the file in messages."""
    scenario, problems = _Reader(source, machine).read(text)
    if problems:
        raise ScenarioError(problems)
    assert scenario is not None
    return scenario


def lint(text: str, source: str = "<string>",
         machine: surroundings.Machine | None = None) -> list[Problem]:
    """Every problem in scenario ``text``, in file order; never raises.  With
    ``machine``, also what the file's surroundings show: the script its command
    runs, its graph file (or the graph cache's graph of its job) and what the
    graph says of its faults — all read, nothing profiled."""
    return _Reader(source, machine).read(text)[1]


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    text = node.value if len(node.value) <= 40 else node.value[:39] + "…"
    kinds = {_NULL: "nothing", _BOOL: f"the boolean {text}", _INT: f"the integer {text}",
             _FLOAT: f"the number {text}", _STR: f"the string {text!r}"}
    return kinds.get(node.tag, f"{text!r} tagged {node.tag}")


class _Reader:
    """Walks the composed YAML node tree, reporting problems with positions."""

    def __init__(self, source: str, machine: surroundings.Machine | None = None) -> None:
        self.source = source
        self.machine = machine
        self.world = self.run = self.variability = None  # what could be read of them
        self.problems: list[Problem] = []
        self.nodes: dict[tuple, yaml.Node] = {}  # key path -> value node
        self.keys: dict[tuple, yaml.Node] = {}  # key path -> key node
        # what could be read of each fault and expectation (None where nothing
        # could), so cross_rules still check them in a file with errors elsewhere
        self.selects: list = []
        self.triggers: list = []
        self.expectations: list = []
        self.actions: list = []  # each fault's action (None where it could not be read)
        self.families: list = []  # each fault's family key (None: none, or unreadable)
        self.action: Action | None = None  # the action of the fault being read

    def read(self, text: str) -> tuple[Scenario | None, list[Problem]]:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            what = ", ".join(filter(None, (exc.context, exc.problem)))
            self._add(mark.line + 1 if mark else 1, mark.column + 1 if mark else 1,
                      f"invalid YAML: {what}")
            return None, self.problems
        except yaml.reader.ReaderError as exc:
            line = text.count("\n", 0, exc.position) + 1
            column = exc.position - text.rfind("\n", 0, exc.position)
            char = ord(exc.character) if isinstance(exc.character, str) else exc.character
            self._add(line, column,
                      f"invalid YAML: unacceptable character #x{char:04x}: {exc.reason}")
            return None, self.problems
        except yaml.YAMLError as exc:
            self._add(1, 1, f"invalid YAML: {exc}")
            return None, self.problems
        except RecursionError:  # the composer recurses once per nesting level
            self._add(1, 1, "invalid YAML: nested too deeply")
            return None, self.problems
        if root is None:
            self._add(1, 1, "the scenario is empty: it needs name, world and run")
            return None, self.problems
        self.nodes[()] = root
        scenario = self._scenario(root)
        if self.machine is not None:
            read = surroundings.Read(self.world, self.run, self.selects, self.triggers,
                                     self.actions, self.families, self.variability)
            for path, message in surroundings.problems(read, self.source, self.machine):
                self._report(path, message)
        # one rule may find a fault's problem twice: as the fault is built, and
        # across the file (cross_rules sees what could be read of it)
        self.problems = sorted(dict.fromkeys(self.problems), key=lambda p: (p.line, p.column))
        return (None if self.problems else scenario), self.problems

    def _scenario(self, root: yaml.Node) -> Scenario | None:
        values = self._fields(Scenario, root, ())
        if values is None:
            return None
        self.world, self.run = values.get("world"), values.get("run")
        self.variability = values.get("variability")
        if values.pop(_INVALID, False) or self.problems:
            for path, message in cross_rules(values.get("world"), values.get("run"),
                                             self.selects, self.triggers, self.expectations):
                self._report(path, message)
            return None
        return self._build(Scenario, values, (), source=self.source)

    # -- reporting --

    def _add(self, line: int, column: int, message: str) -> None:
        self.problems.append(Problem(line, column, message, self.source))

    def _report(self, path: tuple, message: str, node: yaml.Node | None = None) -> None:
        """A problem at ``node``, or at the node ``path`` leads to: a scalar
        itself, a mapping or list (or an empty value) at its key."""
        where = path
        if node is None:
            while where not in self.nodes:
                where = where[:-1]
            node = self.nodes[where]
        empty = isinstance(node, yaml.ScalarNode) and node.tag == _NULL and not node.value
        if (empty or not isinstance(node, yaml.ScalarNode)) and where in self.keys \
                and self.nodes.get(where) is node:
            node = self.keys[where]
        mark = node.start_mark
        self._add(mark.line + 1, mark.column + 1, f"{dotted(path)}: {message}" if path else message)

    # -- structure --

    def _mapping(self, node, path, allowed: Sequence[str] | None,
                 accepted: Sequence[str] | None = None
                 ) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
        """``{key: (key node, value node)}``; keys not in ``allowed`` reported
        (unless it is None), with suggestions only from ``accepted`` (the keys
        taken here; default ``allowed``: see ``keys.py``)."""
        # (no suggestion is made where allowed is None: nothing is unknown there)
        accepted = (allowed or ()) if accepted is None else accepted
        if not isinstance(node, yaml.MappingNode):
            self._report(path, f"expected a mapping, got {_describe(node)}", node)
            return None
        pairs: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, value in node.value:
            if key.tag == _TAG + "merge":
                self._report(path, "merge keys (<<) are not supported: write the keys out", key)
            elif not isinstance(key, yaml.ScalarNode) or key.tag not in _TEXT_TAGS:
                self._report(path, f"keys are names, got {_describe(key)}", key)
            elif key.value in pairs:
                first = pairs[key.value][0].start_mark.line + 1
                self._report(path, f"duplicate key {key.value!r} (first on line {first})", key)
            elif allowed is not None and key.value not in allowed:
                # a key given already is no alternative (it would be a duplicate)
                given = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
                close = difflib.get_close_matches(
                    key.value, [k for k in accepted if k not in given], n=1, cutoff=0.75)
                hint = (f"did you mean {close[0]!r}?" if close
                        else f"expected one of {', '.join(accepted)}" if accepted
                        else "nothing else goes here: remove it")
                self._report(path, f"unknown key {key.value!r}: {hint}", key)
            else:
                pairs[key.value] = (key, value)
        return pairs

    def _fields(self, cls, node, path, extra: Sequence[str] = (), check_unknown: bool = True):
        """The values of ``cls``'s fields read from mapping ``node``; None when it
        is not a mapping; the key ``_INVALID`` when a field could not be read."""
        specs = dict(declared_fields(cls))
        present = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)] \
            if isinstance(node, yaml.MappingNode) else []
        accepted = [*extra, *accepted_keys(cls, present, self.action)]
        pairs = self._mapping(node, path, [*extra, *specs] if check_unknown else None, accepted)
        if pairs is None:
            return None
        values: dict[Any, Any] = {}
        for key, spec in specs.items():
            if key in pairs:
                value = self._value(spec.metadata, *pairs[key], path + (key,))
                if value is _INVALID:
                    values[_INVALID] = True
                else:
                    values[spec.name] = value
            elif spec.default is MISSING:
                self._report(path, f"missing required key {key!r}", node)
                values[_INVALID] = True
        return values

    def _object(self, cls, node, path, **extra):
        values = self._fields(cls, node, path)
        if values is None or values.pop(_INVALID, False):
            return _INVALID
        return self._build(cls, values, path, **extra)

    def _build(self, cls, values: dict, path: tuple, **extra):
        try:
            return cls(**values, **extra)
        except InvalidFields as exc:
            for sub, message in exc.errors:
                self._report(path + sub, message)
            return _INVALID

    # -- values --

    def _value(self, metadata, key_node, node, path):
        self.nodes[path], self.keys[path] = node, key_node
        kind = metadata["kind"]
        if kind == "object":
            return self._object(metadata["of"], node, path)
        value = getattr(self, "_read_" + kind)(node, path, metadata["of"])
        check = metadata["check"]
        if value is not _INVALID and check is not None and (message := check(value)):
            self._report(path, message)
            return _INVALID
        return value

    def _scalar(self, node, path, tags, expected: str, construct=None):
        if isinstance(node, yaml.ScalarNode) and node.tag in tags:
            if construct is None:
                return node.value
            try:
                return construct(node)
            except (ValueError, KeyError, TypeError, OverflowError):
                pass
        self._report(path, f"expected {expected}, got {_describe(node)}", node)
        return _INVALID

    def _read_int(self, node, path, _):
        return self._scalar(node, path, {_INT}, "an integer", _CONSTRUCTOR.construct_yaml_int)

    def _read_float(self, node, path, _):
        def construct(n):
            if n.tag == _INT:
                return float(_CONSTRUCTOR.construct_yaml_int(n))
            return _CONSTRUCTOR.construct_yaml_float(n)
        return self._scalar(node, path, {_INT, _FLOAT}, "a number", construct)

    def _read_bool(self, node, path, _):
        return self._scalar(node, path, {_BOOL}, "true or false", _CONSTRUCTOR.construct_yaml_bool)

    def _read_text(self, node, path, _):
        return self._scalar(node, path, _TEXT_TAGS, "text")

    def _read_enum(self, node, path, enum_cls):
        text = self._read_text(node, path, None)
        if text is _INVALID:
            return _INVALID
        if text not in enum_cls._value2member_map_:
            self._report(path, f"{text!r} is not one of {', '.join(enum_cls)}")
            return _INVALID
        return enum_cls(text)

    def _items(self, node, path) -> list | None:
        if not isinstance(node, yaml.SequenceNode):
            self._report(path, f"expected a list, got {_describe(node)}", node)
            return None
        for i, item in enumerate(node.value):
            self.nodes[path + (i,)] = item
        return node.value

    def _read_command(self, node, path, _):
        if isinstance(node, yaml.ScalarNode) and node.tag == _STR:
            try:
                return tuple(shlex.split(node.value))
            except ValueError as exc:
                self._report(path, f"cannot split into words: {exc}")
                return _INVALID
        items = self._items(node, path)
        if items is None:
            return _INVALID
        words = [self._read_text(item, path + (i,), None) for i, item in enumerate(items)]
        return _INVALID if _INVALID in words else tuple(words)

    def _read_ints(self, node, path, _):
        items = self._items(node, path)
        if items is None:
            return _INVALID
        values = [self._read_int(item, path + (i,), None) for i, item in enumerate(items)]
        return _INVALID if _INVALID in values else tuple(values)

    def _pairs(self, node, path, read_key, read_value):
        pairs = self._mapping(node, path, None)
        if pairs is None:
            return _INVALID
        out = []
        for key_node, value_node in pairs.values():
            key = read_key(key_node, path + (key_node.value,), None)
            if key is _INVALID:
                out.append(_INVALID)
                continue
            self.nodes[path + (key,)] = key_node
            value = read_value(value_node, path + (key,), None)
            out.append(_INVALID if value is _INVALID else (key, value))
        return _INVALID if _INVALID in out else tuple(out)

    def _read_env(self, node, path, _):
        return self._pairs(node, path, self._read_text, self._read_text)

    def _read_digests(self, node, path, _):
        def digest(value_node, value_path, _):
            text = self._read_text(value_node, value_path, None)
            if text is not _INVALID and (message := hex_digest_problem(text)):
                self._report(value_path, message, value_node)
                return _INVALID
            return text
        return self._pairs(node, path, self._read_int, digest)

    def _read_faults(self, node, path, _):
        items = self._items(node, path)
        if items is None:
            return _INVALID
        faults = [self._fault(item, path + (i,)) for i, item in enumerate(items)]
        return _INVALID if _INVALID in faults else tuple(faults)

    def _fault(self, node, path):
        values, action_node, action = None, None, _INVALID
        if isinstance(node, yaml.MappingNode):
            action_node = next((v for k, v in node.value if k.value == "action"), None)
        if action_node is None:
            values = self._fields(Fault, node, path, check_unknown=False)  # its other problems
            if values is not None:
                self._report(path, "missing required key 'action'", node)
        else:
            self.nodes[path + ("action",)] = action_node
            action = self._read_enum(action_node, path + ("action",), Action)
            cls = Fault if action is _INVALID else FAULT_TYPES[action]
            self.action = None if action is _INVALID else action
            values = self._fields(cls, node, path, extra=("action",),
                                  check_unknown=cls is not Fault)
            self.action = None
        if values is None:
            values = {_INVALID: True}
        self.selects.append(values.get("select"))
        self.triggers.append(values.get("at"))
        self.actions.append(None if action is _INVALID else action)
        self.families.append(values.get("family"))
        if values.pop(_INVALID, False) or action is _INVALID:
            return _INVALID
        return self._build(cls, values, path, line=node.start_mark.line + 1)

    def _read_variability(self, node, path, _):
        """Each item one rule, as ``run --variability`` reads it: a mapping of
        :data:`VARIABILITY_KEYS` or a term (``fitted``); each item is read on
        its own, so a bad one is reported at its line."""
        items = self._items(node, path)
        if items is None:
            return _INVALID
        if not items:
            self._report(path, "give at least one rule, or leave variability out")
            return _INVALID
        terms = [self._variability_term(item, path + (i,)) for i, item in enumerate(items)]
        if _INVALID in terms:
            return _INVALID
        try:
            return parse_variability(terms)
        except VariabilityError as exc:  # rules that clash only together
            self._report(path, str(exc))
            return _INVALID

    def _variability_term(self, node, path):
        if isinstance(node, yaml.ScalarNode):
            term = self._read_text(node, path, None)
        else:
            pairs = self._mapping(node, path, list(VARIABILITY_KEYS))
            if pairs is None or len(pairs) < len(node.value):  # (a key reported)
                return _INVALID
            if not node.value:
                self._report(path, f"an empty rule: give {', '.join(VARIABILITY_KEYS)}", node)
                return _INVALID
            words = [self._read_text(value, path + (key,), None)
                     for key, (_, value) in pairs.items()]
            if _INVALID in words:
                return _INVALID
            term = " ".join(f"{VARIABILITY_KEYS[key]}={word}"
                            for key, word in zip(pairs, words, strict=True))  # a word a key
        if term is _INVALID:
            return _INVALID
        try:
            parse_variability([term])
        except VariabilityError as exc:
            self._report(path, str(exc), node)
            return _INVALID
        return term

    def _read_expect(self, node, path, _):
        items = self._items(node, path)
        if items is None:
            return _INVALID
        expectations = [self._expectation(item, path + (i,)) for i, item in enumerate(items)]
        self.expectations = [None if e is _INVALID else e for e in expectations]
        return _INVALID if _INVALID in expectations else tuple(expectations)

    def _expectation(self, node, path):
        kinds = list(EXPECTATION_TYPES)
        pairs = self._mapping(node, path, kinds)
        if pairs is None:
            return _INVALID
        if not node.value:
            self._report(path, f"empty expectation: give one of {', '.join(kinds)}", node)
            return _INVALID
        if len(node.value) > 1:
            key = node.value[1][0]
            self._report(path, f"one expectation per item: start a new item (- ) for "
                               f"{key.value!r}", key)
            return _INVALID
        if not pairs:  # its one key was unknown: reported
            return _INVALID
        (kind, (key_node, value_node)), = pairs.items()
        cls = EXPECTATION_TYPES[kind]
        line = key_node.start_mark.line + 1
        if cls.value_field is None:
            self.nodes[path + (kind,)], self.keys[path + (kind,)] = value_node, key_node
            return self._object(cls, value_node, path + (kind,), line=line)
        spec = next(f for f in dataclasses.fields(cls) if f.name == cls.value_field)
        extra = {}
        if cls is ExpectDigests:
            value_node, extra = self._digests_rank(value_node, path + (kind,))
        value = self._value(spec.metadata, key_node, value_node, path + (kind,))
        if value is _INVALID or _INVALID in extra.values():
            return _INVALID
        return self._build(cls, {spec.name: value, **extra}, path, line=line)

    def _digests_rank(self, node, path) -> tuple[yaml.Node, dict]:
        """A digests mapping's ``rank`` (whose digests they are), read apart from
        its iterations: the mapping without it, and ``{"rank": rank}`` if given."""
        if not isinstance(node, yaml.MappingNode):
            return node, {}
        given = [(k, v) for k, v in node.value
                 if isinstance(k, yaml.ScalarNode) and k.tag == _STR and k.value == "rank"]
        if not given:
            return node, {}
        key_node, value_node = given[0]
        spec = next(f for f in dataclasses.fields(ExpectDigests) if f.name == "rank")
        rank = self._value(spec.metadata, key_node, value_node, path + ("rank",))
        for again, _ in given[1:]:
            self._report(path, f"duplicate key 'rank' (first on line "
                               f"{key_node.start_mark.line + 1})", again)
            rank = _INVALID
        keys = {id(k) for k, _ in given}
        rest = yaml.MappingNode(node.tag, [(k, v) for k, v in node.value if id(k) not in keys],
                                node.start_mark, node.end_mark, node.flow_style)
        return rest, {"rank": rank}
