"""What a restored rank can take of a changed source, decided before anything
is restored: old and new text in, the functions to patch (qualname, line) or
what is refused and why out.

Patching replaces a live function's ``__code__`` (``agent/reload.py``), so
only what a code object carries can change: function and method bodies,
nested functions included.  Everything Python evaluated once, when the module
or class body ran, stays as it was in memory and is refused: module-level
statements (constants, imports, globals), a class's header and non-def body
(its layout: fields, slots, bases, class attributes), methods added to or
removed from a class, decorators and default values, functions removed, and
a closure whose free variables change (its cells are fixed).  New top-level
functions are allowed: their ``def`` runs alone in the module.  Refusal is
all or nothing: a plan with a refusal patches nothing.

Functions compare by their AST (``ast.dump`` leaves out positions, so an
edit of comments or of lines above a function does not count as a change);
one that did not change but moved gets its new code too (``relined``), so
tracebacks name the right lines.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
import types
from collections.abc import Mapping

_DEF = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclasses.dataclass(frozen=True)
class Patch:
    qualname: str  # as the code object's co_qualname: ``outer.<locals>.inner``
    path: str
    line: int  # of its ``def`` in the new source

    def text(self) -> str:
        return f"{self.qualname} ({os.path.basename(self.path)}:{self.line})"


@dataclasses.dataclass(frozen=True)
class FilePlan:
    path: str
    patched: tuple[Patch, ...] = ()  # bodies that changed
    added: tuple[Patch, ...] = ()  # new top-level functions
    relined: tuple[str, ...] = ()  # unchanged bodies on new lines
    refused: tuple[str, ...] = ()  # "file:line: why", sorted

    def to_dict(self, source: str) -> dict:
        """What the restored rank's agent needs to apply it (the control file)."""
        return {"path": self.path, "source": source,
                "changed": [p.qualname for p in self.patched],
                "patch": [p.qualname for p in self.patched] + list(self.relined),
                "add": [p.qualname for p in self.added]}


@dataclasses.dataclass(frozen=True)
class ReloadPlan:
    files: tuple[FilePlan, ...] = ()

    @property
    def refused(self) -> tuple[str, ...]:
        return tuple(r for f in self.files for r in f.refused)

    @property
    def patched(self) -> tuple[Patch, ...]:
        return tuple(p for f in self.files for p in (*f.patched, *f.added))


def plan(changes: Mapping[str, tuple[str | None, str | None]]) -> ReloadPlan:
    """``changes``: path -> (source at the snapshot, source now); None for
    a source the snapshot could not keep (the file was edited between its
    import and the snapshot) or a file that is gone now."""
    return ReloadPlan(tuple(plan_file(path, old, new)
                            for path, (old, new) in sorted(changes.items())))


def plan_file(path: str, old: str | None, new: str | None) -> FilePlan:
    name = os.path.basename(path)
    if old is None:
        return FilePlan(path, refused=(f"{name}: it changed between its import and the "
                                       "snapshot, so the snapshot does not hold the source "
                                       "the rank runs",))
    if new is None:
        return FilePlan(path, refused=(f"{name}: the file is gone",))
    try:
        new_tree = ast.parse(new, path)
        new_code = compile(new_tree, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return FilePlan(path, refused=(f"{name}:{exc.lineno}: syntax error: {exc.msg}",))
    try:
        old_tree = ast.parse(old, path)
        old_code = compile(old_tree, path, "exec", dont_inherit=True)
    except SyntaxError as exc:  # (a snapshot of a rank running it cannot hold one)
        return FilePlan(path, refused=(f"{name}:{exc.lineno}: the snapshot's copy does not "
                                       f"parse: {exc.msg}",))
    before, after = _Scopes(old_tree), _Scopes(new_tree)
    refused = _layout_changes(before, after)
    patched, added, relined = _function_changes(path, before, after, old_code, new_code,
                                                refused)
    refused += _removals(before, after)
    if refused:
        return FilePlan(path, refused=tuple(f"{name}:{line}: {why}"
                                            for line, why in sorted(set(refused))))
    return FilePlan(path, tuple(patched), tuple(added), tuple(relined))


def _layout_changes(before: _Scopes, after: _Scopes) -> list[tuple[int, str]]:
    """(line, why) of each scope whose statements outside defs changed: the
    module's, a class's header or body, a class added or removed."""
    refused: list[tuple[int, str]] = []
    for scope in sorted(before.statements.keys() | after.statements.keys()):
        header = scope.removesuffix(" body")
        if header != scope and not (header in before.statements and header in after.statements):
            continue  # a class added or removed: said once, by its header
        old_s, new_s = before.statements.get(scope, []), after.statements.get(scope, [])
        if [dump for dump, _ in old_s] != [dump for dump, _ in new_s]:
            refused.append((_first_difference(old_s, new_s),
                            _layout_reason(scope, scope in before.statements,
                                           scope in after.statements)))
    return refused


def _function_changes(path: str, before: _Scopes, after: _Scopes, old_code: types.CodeType,
                      new_code: types.CodeType, refused: list[tuple[int, str]]
                      ) -> tuple[list[Patch], list[Patch], list[str]]:
    """The new source's functions against the old: those patched, added and
    relined; (line, why) of those that cannot be go to ``refused``."""
    old_freevars, new_freevars = _freevars(old_code), _freevars(new_code)
    patched: list[Patch] = []
    added: list[Patch] = []
    relined: list[str] = []
    for qualname, node in sorted(after.functions.items(), key=lambda kv: kv[1].lineno):
        old_node = before.functions.get(qualname)
        if old_node is None:
            if "." in qualname:  # new methods change a class; new nested defs its function
                if _owner(qualname) in after.classes:
                    refused.append((node.lineno, f"method {qualname} added (a class's layout "
                                                 "is fixed when its body runs)"))
            else:
                added.append(Patch(qualname, path, node.lineno))
            continue
        if ast.dump(old_node) == ast.dump(node):
            if (old_node.lineno, old_node.end_lineno) != (node.lineno, node.end_lineno):
                relined.append(qualname)
            continue
        if _once(old_node) != _once(node):
            refused.append((node.lineno, f"{qualname}: its decorators or default values "
                                         "changed (evaluated once, when it was defined)"))
        elif old_freevars.get(qualname) != new_freevars.get(qualname):
            refused.append((node.lineno, f"{qualname}: the variables its closure takes from "
                                         "the enclosing function changed"))
        else:
            patched.append(Patch(qualname, path, node.lineno))
    return patched, added, relined


def _removals(before: _Scopes, after: _Scopes) -> list[tuple[int, str]]:
    """(line, why) of each function removed that callers in memory still reach."""
    refused: list[tuple[int, str]] = []
    for qualname in sorted(before.functions.keys() - after.functions.keys()):
        gone_with_class = _owner(qualname) in before.classes - after.classes
        if not gone_with_class and not _inside_changed(qualname, before, after):
            refused.append((before.functions[qualname].lineno,
                            f"{qualname} removed (callers in memory still reach it)"))
    return refused


class _Scopes:
    """A module's defs by qualname, and each scope's other statements (the
    module's, each class's, each class's header) as comparable text."""

    def __init__(self, tree: ast.Module) -> None:
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: set[str] = set()
        self.statements: dict[str, list[tuple[str, int]]] = {}  # (ast.dump, line)
        self._walk(_body(tree.body), "", "<module>")

    def _walk(self, body: list[ast.stmt], prefix: str, scope: str | None) -> None:
        for node in body:
            if isinstance(node, _DEF):
                qualname = prefix + node.name
                self.functions[qualname] = node
                self._walk(node.body, qualname + ".<locals>.", None)
            elif isinstance(node, ast.ClassDef) and scope is not None:
                qualname = prefix + node.name
                self.classes.add(qualname)
                self._statement(f"class {qualname}", _class_header(node), node.lineno)
                self.statements.setdefault(f"class {qualname} body", [])
                self._walk(_body(node.body), qualname + ".", f"class {qualname} body")
            elif scope is not None:
                self._statement(scope, node, node.lineno)
            elif isinstance(node, ast.ClassDef):  # inside a function: compared with it
                self._walk(node.body, prefix + node.name + ".", None)

    def _statement(self, scope: str, node: ast.AST, line: int) -> None:
        self.statements.setdefault(scope, []).append((ast.dump(node), line))


def _class_header(node: ast.ClassDef) -> ast.ClassDef:
    """The class statement less its body (a class's header, compared as a statement)."""
    if sys.version_info >= (3, 12):
        return ast.ClassDef(name=node.name, bases=node.bases, keywords=node.keywords, body=[],
                            decorator_list=node.decorator_list, type_params=[])
    return ast.ClassDef(name=node.name, bases=node.bases, keywords=node.keywords, body=[],
                        decorator_list=node.decorator_list)


def _body(body: list[ast.stmt]) -> list[ast.stmt]:
    """A body less its docstring (only ``__doc__`` holds it)."""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _first_difference(old: list[tuple[str, int]], new: list[tuple[str, int]]) -> int:
    """The new source's line of the first statement that differs (or the
    last one's, where statements were only removed)."""
    # (the shorter list's statements: the rest were added or removed)
    for (old_dump, _), (new_dump, new_line) in zip(old, new, strict=False):
        if old_dump != new_dump:
            return new_line
    if len(new) > len(old):
        return new[len(old)][1]
    return new[-1][1] if new else old[len(new)][1]


def _layout_reason(scope: str, was: bool, is_now: bool) -> str:
    if not was:
        return f"{scope} added (classes are made when the module runs)"
    if not is_now:
        return f"{scope} removed (its instances and subclasses live on in memory)"
    if scope == "<module>":
        return "module-level code changed (it ran once, at import: constants, imports and " \
               "globals keep their values in memory)"
    if scope.endswith(" body"):
        return f"{scope.removesuffix(' body')}'s body changed outside its methods (a class's " \
               "layout: fields, slots, class attributes)"
    return f"{scope}'s header changed (bases, keywords or decorators: a class's layout)"


def _once(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """What a ``def`` evaluates once, when it runs: decorators and defaults."""
    args = node.args
    return ast.dump(ast.Tuple(elts=[*node.decorator_list, *args.defaults,
                                    *[d for d in args.kw_defaults if d is not None]],
                              ctx=ast.Load()))


def _owner(qualname: str) -> str:
    return qualname.rpartition(".")[0]


def _inside_changed(qualname: str, before: _Scopes, after: _Scopes) -> bool:
    """A nested def removed with its enclosing function's change (the next
    call of that function makes none): not a removal callers can reach."""
    outer = qualname.partition(".<locals>.")[0]
    return outer != qualname and outer in after.functions \
        and ast.dump(before.functions[outer]) != ast.dump(after.functions[outer])


def _freevars(code: types.CodeType) -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    stack = [code]
    while stack:
        for const in stack.pop().co_consts:
            if isinstance(const, types.CodeType):
                found[const.co_qualname] = const.co_freevars
                stack.append(const)
    return found
