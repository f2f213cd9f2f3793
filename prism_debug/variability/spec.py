"""What variability the user states: the ``--variability`` language and its files.

One option (or one item of a file's ``variability`` list) is one
:class:`Rule`; later rules win where they overlap (per class and op kind,
the per-gap noise and the per-rank factor each on their own)::

    cv=0.05                       every gap of every class × a fresh draw per rank, op, iteration
    cv=0.05 dist=gamma            the family (default lognormal; normal, gamma, lognormal)
    class=3 cv=0.1                only class 3 (class=0-2: a range)
    op=all_reduce cv=0.02         only the gaps before an op of that kind (its issue or its
                                  wait; op=end: before the iteration's end)
    rank-cv=0.03                  a persistent factor per rank, drawn once (the slow-GPU
                                  lottery), beside any cv; takes class= but not op=
    fitted                        the graph's fitted distributions (graph version 3)
    PATH                          a YAML file of the same terms:
                                  variability: [{cv: 0.05, dist: gamma, class: 3,
                                                 op: all_reduce, rank_cv: 0.03}, fitted]

Every problem is one :class:`VariabilityError` naming the term and what to give.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from prism_debug.cost.ops import COLLECTIVES, known_op
from prism_debug.errors import KeyPath, VariabilityError
from prism_debug.graph.execution import ExecutionGraph
from prism_debug.variability.distributions import FAMILIES, MAX_CV, Distribution

DEFAULT_FAMILY = "lognormal"
END = "end"  # op=end: the gap before the iteration's end
KEYS = ("cv", "dist", "class", "op", "rank-cv")
FITTED = "fitted"
_USE = "use cv, dist, class, op, rank-cv or fitted"
MAX_RULES = 1024  # a file may hold at most this many

# a rule's item as a file holds it (YAML keys)
Item = dict[str, bool | float | str]
# says what is wrong with a rule's key (None: the rule as a whole), never returns
_Fail = Callable[[str | None, str], NoReturn]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One term: which gaps it covers (classes, op kind) and how they vary."""

    cv: float | None = None  # per-gap noise: a fresh factor per rank, op, iteration
    dist: str = DEFAULT_FAMILY  # the family of cv's and rank_cv's factors
    classes: tuple[int, int] | None = None  # first and last class covered; None: every class
    op: str | None = None  # canonical op kind or "end"; None: every gap
    rank_cv: float | None = None  # a persistent factor per rank
    fitted: bool = False  # the graph's fitted distributions

    def covers_class(self, class_id: int) -> bool:
        return self.classes is None or self.classes[0] <= class_id <= self.classes[1]

    def covers(self, class_id: int, op_kind: str) -> bool:
        """Whether the rule speaks of class ``class_id``'s gaps before an
        event of ``op_kind`` (an op's kind, or "end")."""
        return self.covers_class(class_id) and (self.op is None or self.op == op_kind)

    def noise(self) -> Distribution | None:
        return None if self.cv is None else Distribution.with_cv(self.dist, self.cv)

    def rank_distribution(self) -> Distribution | None:
        return None if self.rank_cv is None else Distribution.with_cv(self.dist, self.rank_cv)

    def term(self) -> str:
        """The rule as ``--variability`` spells it."""
        words = [FITTED] if self.fitted else []
        if self.classes is not None:
            words.append(f"class={_range(self.classes)}")
        if self.op is not None:
            words.append(f"op={self.op}")
        if self.cv is not None:
            words.append(f"cv={self.cv:g}")
        if self.cv is not None or self.rank_cv is not None:
            words.append(f"dist={self.dist}")
        if self.rank_cv is not None:
            words.append(f"rank-cv={self.rank_cv:g}")
        return " ".join(words)

    def describe(self) -> str:
        where = "every class" if self.classes is None else \
            f"class {self.classes[0]}" if self.classes[0] == self.classes[1] else \
            f"classes {_range(self.classes)}"
        before = f" before {self.op}" if self.op else ""
        parts = []
        if self.fitted:
            parts.append(f"fitted distributions on {where}{before}")
        if self.cv is not None:
            parts.append(f"cv={self.cv:g} {self.dist} on {where}{before}")
        if self.rank_cv is not None:
            family = "" if self.cv is not None else f" {self.dist}"
            on = "" if self.classes is None or self.cv is not None else f" on {where}"
            parts.append(f"rank-cv={self.rank_cv:g}{family}{on}")
        return "; ".join(parts)

    def to_item(self) -> Item:
        """The rule as a file's item (YAML keys)."""
        item: Item = {FITTED: True} if self.fitted else {}
        if self.cv is not None:
            item["cv"] = self.cv
        if self.cv is not None or self.rank_cv is not None:
            item["dist"] = self.dist
        if self.classes is not None:
            item["class"] = self.classes[0] if self.classes[0] == self.classes[1] \
                else _range(self.classes)
        if self.op is not None:
            item["op"] = self.op
        if self.rank_cv is not None:
            item["rank_cv"] = self.rank_cv
        return item


@dataclasses.dataclass(frozen=True)
class Variability:
    """What the user stated, rule by rule (later rules win where they overlap)."""

    rules: tuple[Rule, ...] = ()

    def describe(self) -> str:
        """One line, as reports print it: ``cv=0.05 lognormal on every class; rank-cv=0.02``."""
        return "; ".join(rule.describe() for rule in self.rules) or "none"

    def to_dict(self) -> dict[str, list[Item]]:
        return {"variability": [rule.to_item() for rule in self.rules]}

    @classmethod
    def from_dict(cls, data: object, source: str = "variability") -> Variability:
        """What :meth:`to_dict` (or a variability file) holds; ``source``
        begins every error message."""
        return _from_data(data, source, lambda key_path: None)

    def check(self, graph: ExecutionGraph) -> None:
        """:class:`VariabilityError` when a rule names a class or op kind the
        graph lacks, or says ``fitted`` of a graph without fits."""
        count = len(graph.programs)
        for rule in self.rules:
            say = f"--variability {rule.term()!r}: "
            if rule.classes is not None and rule.classes[1] >= count:
                raise VariabilityError(f"{say}class {_range(rule.classes)} is not in the graph: "
                                       f"it has classes 0-{count - 1}")
            covered = [p for p in graph.programs if rule.covers_class(p.class_id)]
            if rule.op not in (None, END):
                kinds = {op.kind for p in covered for op in p.ops}
                if rule.op not in kinds:
                    raise VariabilityError(
                        f"{say}the graph's {_classes(rule)} issue no {rule.op}: they issue "
                        f"{', '.join(sorted(kinds)) or 'no ops'} (op=end: the gap before the "
                        "iteration's end)")
            fits = getattr(graph, "gap_fits", {}) or {}
            if rule.fitted and not any(f is not None for p in covered
                                       for f in fits.get(p.class_id, ())):
                raise VariabilityError(
                    f"{say}the graph (format version {graph.version}) has no fitted "
                    f"distributions for its {_classes(rule)}: profile the job again with "
                    "this prism-debug (graph version 3 fits the steady iterations' gaps), or "
                    "state cv=")


def _classes(rule: Rule) -> str:
    return "classes" if rule.classes is None else f"class {_range(rule.classes)}"


def _range(classes: tuple[int, int]) -> str:
    first, last = classes
    return str(first) if first == last else f"{first}-{last}"


# -- the command line -----------------------------------------------------------------


def parse_variability(terms: Sequence[str]) -> Variability:
    """The rules ``--variability`` gave (repeatable): terms, or paths of YAML files."""
    rules: list[Rule] = []
    for term in terms:
        words = term.split()
        if len(words) == 1 and "=" not in words[0] and words[0] != FITTED:
            try:
                path = Path(words[0]).expanduser()
            except (RuntimeError, ValueError):  # ~user of no such user (or a NUL in it)
                path = Path(words[0])
            try:
                found = path.exists()
            except (OSError, ValueError):  # a name no file can have (a NUL, too long)
                found = False
            if not found:
                raise VariabilityError(
                    f"--variability {term!r}: no such file, and not a term: give cv=0.05, "
                    f"rank-cv=0.02, fitted (with class=, op=, dist=), or a YAML file's path")
            try:
                rules.extend(load_variability(path).rules)
            except VariabilityError as exc:  # every error of an option names the option
                raise VariabilityError(f"--variability {term!r}: {exc}") from None
            continue
        rules.append(_term(term))
    return Variability(tuple(rules))


def _term(term: str) -> Rule:
    say = f"--variability {term!r}: "

    def fail(key: str | None, problem: str) -> NoReturn:
        raise VariabilityError(say + problem)

    fields: dict[str, str | bool] = {}
    if not term.split():
        fail(None, "is empty: give cv=0.05, rank-cv=0.02 or fitted")
    value: str | bool  # as typed, or True for the word fitted
    for word in term.split():
        key, eq, value = word.partition("=")
        if word == FITTED:
            key, value = FITTED, True
        elif not eq:
            fail(None, f"{word!r} is not key=value: {_USE}")
        key = "rank-cv" if key == "rank_cv" else key
        if key in fields:
            fail(key, f"{key} given twice: give it once")
        fields[key] = value
    return _rule(fields, fail, text=True)


def _rule(fields: Mapping[str, Any], fail: _Fail, text: bool) -> Rule:
    """The rule ``fields`` (key -> value; ``text``: values as typed, else as a
    file's YAML holds them, of any type) state."""
    for key in fields:
        if key not in KEYS and key != FITTED:
            fail(key, f"unknown key {key!r}: {_USE}")
    cv = _cv(fields, "cv", fail, text)
    rank_cv = _cv(fields, "rank-cv", fail, text)
    fitted = fields.get(FITTED, False)
    if fitted is not True and fitted is not False:
        fail(FITTED, f"fitted must be true, got {fitted!r}")
    dist = fields.get("dist", DEFAULT_FAMILY)
    if dist not in FAMILIES:
        fail("dist", f"dist must be one of {', '.join(FAMILIES)}, got {dist!r}")
    if cv is None and rank_cv is None and not fitted:
        fail(None, "states no variability: give cv=, rank-cv= or fitted")
    if fitted and cv is not None:
        fail("cv", "fitted and cv= both say how the gaps vary: give one per term (a later "
                   "term overrides an earlier one)")
    if "dist" in fields and cv is None and rank_cv is None:
        fail("dist", "dist= is the family of cv= and rank-cv=: give one of them with it")
    op = fields.get("op")
    if op is not None:
        op = END if op == END else known_op(op)
        if op is None:
            fail("op", f"op must be an op kind ({', '.join(COLLECTIVES)}) or end, got "
                       f"{fields['op']!r}")
        if rank_cv is not None:
            fail("op", "rank-cv is a rank's factor on all its compute: it takes class= but "
                       "not op= (give the op's noise in a term of its own)")
    classes = None
    if "class" in fields:
        classes = _classes_of(fields["class"])
        if classes is None:
            fail("class", f"class must be a class number or a range like 0-2, got "
                          f"{fields['class']!r}")
    return Rule(cv=cv, dist=dist, classes=classes, op=op, rank_cv=rank_cv, fitted=fitted)


def _cv(fields: Mapping[str, Any], key: str, fail: _Fail, text: bool) -> float | None:
    if key not in fields:
        return None
    value = fields[key]
    try:
        number = float(value) if text or not isinstance(value, (bool, str)) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not 0 <= number <= MAX_CV:  # (NaN fails both)
        fail(key, f"{key} must be a number from 0 to {MAX_CV:g} (a coefficient of "
                  f"variation: 0.05 is 5 %), got {value!r}")
    return number


def _classes_of(value: object) -> tuple[int, int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value) if value >= 0 else None
    if not isinstance(value, str):
        return None
    first, dash, last = value.partition("-")
    if not first.isdecimal() or (dash and not last.isdecimal()):
        return None
    low, high = int(first), int(last) if dash else int(first)
    return (low, high) if low <= high else None


# -- files ------------------------------------------------------------------------------


def load_variability(path: str | os.PathLike[str]) -> Variability:
    """The rules of a YAML file ``{variability: [items]}``; an item is a mapping
    of the term's keys (``rank_cv`` or ``rank-cv``; ``fitted: true``) or a term's
    text.  Errors name the file and line."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise VariabilityError(f"no variability file at {path}: give a YAML file "
                               "(variability: [{cv: 0.05}]) or terms like cv=0.05") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise VariabilityError(f"cannot read the variability file {path}: {why}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise VariabilityError(f"{path}{line}: not YAML: {exc.problem or exc.context}; give "
                               "variability: [{cv: 0.05}]") from None
    except yaml.YAMLError as exc:
        raise VariabilityError(f"{path}: not YAML: {exc}") from None

    def line_of(key_path: KeyPath) -> int | None:
        node = root
        for key in key_path:
            if isinstance(node, yaml.SequenceNode) and isinstance(key, int) \
                    and key < len(node.value):
                node = node.value[key]
            elif isinstance(node, yaml.MappingNode):
                found = [(k, v) for k, v in node.value if k.value == key]
                if not found:
                    break
                node = found[0][0] if key_path[-1] == key else found[0][1]
            else:
                break
        return None if node is None else node.start_mark.line + 1

    return _from_data(data, str(path), line_of)


def _from_data(data: object, source: str, line_of: Callable[[KeyPath], int | None]
               ) -> Variability:
    def where(key_path: KeyPath) -> str:
        line = line_of(key_path)
        place = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in key_path)
        return f"{source}{'' if line is None else f':{line}'}: {place.lstrip('.') or 'the file'}"

    if not isinstance(data, dict) or set(data) != {"variability"}:
        raise VariabilityError(f"{where(())} must be a mapping with one key, variability: "
                               "a list of rules (variability: [{cv: 0.05}, fitted])")
    items = data["variability"]
    if not isinstance(items, list) or len(items) > MAX_RULES:
        raise VariabilityError(f"{where(('variability',))} must be a list of at most "
                               f"{MAX_RULES} rules, got {type(items).__name__}")
    rules = []
    for i, item in enumerate(items):
        at: KeyPath = ("variability", i)
        if isinstance(item, str):
            try:
                rules.append(_term(item))
            except VariabilityError as exc:
                raise VariabilityError(f"{where(at)}: {exc}") from None
            continue
        if not isinstance(item, dict):
            raise VariabilityError(f"{where(at)} must be a mapping of cv, dist, class, op, "
                                   f"rank_cv, fitted, or a term's text, got {item!r:.60}")

        def fail(key: str | None, problem: str, at: KeyPath = at) -> NoReturn:
            raise VariabilityError(f"{where(at if key is None else at + (key,))}: {problem}")

        fields = {("rank-cv" if k == "rank_cv" else k): v for k, v in item.items()}
        rules.append(_rule(fields, fail, text=False))
    return Variability(tuple(rules))
