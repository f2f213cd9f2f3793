"""Hot reload on the rank's side: which of the user's own sources the rank
runs (kept in each snapshot, so a later restore can diff them), and patching
a restored rank with a plan the controller made (``prism_debug.reload``).

Sources are hashed when the agent first sees their module — as the script
imports torch, at ``init_process_group``, and at each snapshot for modules
imported since — and a module whose bytecode cache says its file changed
after it was compiled is marked edited (:data:`EDITED_SINCE_IMPORT`): the
controller keeps no copy of it, and a reload of it is refused.  Only the
user's files count: not the standard library's, not site-packages', not
prism-debug's own or its hook's.

Patching runs on the main thread at the iteration boundary where the rank was
restored, before it resumes: the new source is compiled, and every live
function of that file whose ``co_qualname`` the plan names gets the new code
object (found through the garbage collector, so ``from m import f`` copies,
bound methods of live instances and closures already made see it too).  All
or nothing: every swap is checked before the first is made.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import hashlib
import linecache
import os
import sys
import sysconfig
import types

import prism_debug
from prism_debug.reload.sources import read_text

_PACKAGE = os.path.dirname(prism_debug.__file__)
# not the user's: Python's own, installed packages', prism-debug's and its hook
# (process/paths.py's HOOKS_DIR, which the rank's sitecustomize loads from)
_NOT_USER = tuple(os.path.realpath(p) + os.sep for p in {
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    _PACKAGE, os.path.join(os.path.dirname(_PACKAGE), "hooks")})


# A file edited between its import and the snapshot: no text has this hash,
# so the controller keeps no copy and a reload of it is refused.
EDITED_SINCE_IMPORT = "0" * 64


class Sources:
    """The user's source files the rank imported, each with its SHA-256 when
    first seen (or :data:`EDITED_SINCE_IMPORT`)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}
        self._looked_at: set[str] = set()  # module names: each is looked at once

    def scan(self) -> dict[str, str]:
        for name, module in list(sys.modules.items()):
            if name in self._looked_at:
                continue
            self._looked_at.add(name)
            path = _user_file(module)
            if path is not None and path not in self.seen:
                found = read_text(path)
                if found is not None:
                    self.seen[path] = EDITED_SINCE_IMPORT if _edited(module, path) \
                        else found[1]
        return dict(self.seen)

    def replaced(self, path: str, source: str) -> None:
        """The rank now runs ``source`` for ``path`` (a reload)."""
        self.seen[path] = hashlib.sha256(source.encode("utf-8")).hexdigest()


def _edited(module: object, path: str) -> bool:
    """Whether the file changed since the module was imported, as far as its
    bytecode cache tells: the cache's header records the source's mtime and
    size when it was compiled (a module imported before the agent loaded, or
    since its last scan; the script itself has no cache, and is hashed as it
    imports torch)."""
    cached = getattr(module, "__cached__", None)
    if not isinstance(cached, str):
        return False  # no cache (None)
    try:
        with open(cached, "rb") as f:
            header = f.read(16)
        info = os.stat(path)
    except OSError:
        return False
    if len(header) < 16 or int.from_bytes(header[4:8], "little") != 0:
        return False  # a hash-based cache (PEP 552) says nothing of times
    return (int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")) \
        != (int(info.st_mtime) & 0xFFFFFFFF, info.st_size & 0xFFFFFFFF)


def _user_file(module: object) -> str | None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or "site-packages" in path:
        return None  # (most modules: no realpath asked of them)
    path = os.path.realpath(path)
    if path.startswith(_NOT_USER) or "site-packages" in path or "dist-packages" in path:
        return None
    return path


def apply(entries: list[dict], sources: Sources) -> dict:
    """Patch the live functions ``entries`` name (the control file's
    ``reload``: path, source, patch, add); the ``reloaded`` event, with
    ``refused`` and nothing changed where any swap cannot be made."""
    plan = _compile(entries)
    swaps = _swaps(plan)
    if plan.refused:
        return {"kind": "reloaded", "patched": [], "running": [], "relined": 0,
                "refused": sorted(set(plan.refused))}
    on_stack = _on_stack()
    for fn, new in swaps:
        fn.__code__ = new
    for namespace, module_ast, path in plan.added:
        exec(compile(module_ast, path, "exec", dont_inherit=True), namespace)
    return _reloaded(entries, plan, sources, on_stack)


@dataclasses.dataclass
class _Plan:
    """A reload's entries, compiled: what it swaps in and what it adds, or
    why not (``refused``)."""

    # path -> qualname -> the new code of every function its new text defines
    by_file: dict[str, dict[str, types.CodeType]] = dataclasses.field(default_factory=dict)
    wanted: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (path, qualname)
    texts: dict[str, str] = dataclasses.field(default_factory=dict)  # path -> its new text
    # (the module's namespace, the new definitions, their path)
    added: list[tuple[dict, ast.Module, str]] = dataclasses.field(default_factory=list)
    refused: list[str] = dataclasses.field(default_factory=list)


def _compile(entries: list[dict]) -> _Plan:
    """Each entry's new text, read back and compiled (refused where the rank
    never imported the file, the staged text changed or it does not parse)."""
    plan = _Plan()
    for entry in entries:
        path = os.path.realpath(entry["path"])
        module = _module_of(path)
        if module is None:
            plan.refused.append(f"{os.path.basename(path)}: the rank has not imported it")
            continue
        source = _staged_text(entry)
        if source is None:
            plan.refused.append(f"{os.path.basename(path)}: the new text the controller staged "
                                f"({entry['text']}) is gone or changed")
            continue
        entry = {**entry, "source": source}
        plan.texts[path] = source
        try:
            tree = ast.parse(source, path)
            plan.by_file[path] = _codes(compile(tree, path, "exec", dont_inherit=True))
        except SyntaxError as exc:
            plan.refused.append(f"{os.path.basename(path)}:{exc.lineno}: syntax error: "
                                f"{exc.msg}")
            continue
        plan.wanted |= {(path, q) for q in entry["patch"]}
        defs = [node for node in tree.body if getattr(node, "name", None) in entry["add"]]
        if defs:
            plan.added.append((module.__dict__, ast.Module(body=defs, type_ignores=[]), path))
    return plan


def _swaps(plan: _Plan) -> list[tuple[types.FunctionType, types.CodeType]]:
    """Every live function the plan patches, with its new code (refusing, in
    ``plan``, those whose closure's variables changed)."""
    swaps: list[tuple[types.FunctionType, types.CodeType]] = []
    wanted = plan.wanted
    files = {path for path, _ in wanted}
    real: dict[str, str] = {}  # co_filename -> its real path, once each (torch has 10⁵ functions)
    for obj in gc.get_objects():
        if type(obj) is not types.FunctionType:
            continue
        code = obj.__code__
        name = code.co_filename
        path = real.get(name)
        if path is None:
            path = real[name] = os.path.realpath(name)
        if path not in files or (path, code.co_qualname) not in wanted:
            continue
        key = (path, code.co_qualname)
        new = plan.by_file[key[0]][key[1]]
        if new.co_freevars != code.co_freevars:
            plan.refused.append(f"{os.path.basename(key[0])}: {key[1]}: the variables its "
                                "closure takes changed")
        swaps.append((obj, new))
    return swaps


def _reloaded(entries: list[dict], plan: _Plan, sources: Sources,
              on_stack: set[tuple[str, str]]) -> dict:
    """The swaps made: the rank's sources and tracebacks follow, and the
    ``reloaded`` event says what changed (and what runs its old code still)."""
    patched, running = [], []
    for entry in entries:
        path = os.path.realpath(entry["path"])
        linecache.checkcache(path)  # tracebacks show the new text
        sources.replaced(path, plan.texts[path])
        for qualname in [*entry["changed"], *entry["add"]]:
            patched.append({"qualname": qualname, "path": path,
                            "line": plan.by_file[path][qualname].co_firstlineno})
            if (path, qualname) in on_stack:
                running.append(qualname)
    return {"kind": "reloaded", "patched": patched, "running": running,
            "relined": sum(len(e["patch"]) - len(e["changed"]) for e in entries),
            "refused": []}


def _staged_text(entry: dict) -> str | None:
    found = read_text(entry["text"])
    return found[0] if found is not None and found[1] == entry["sha256"] else None


def _module_of(path: str) -> types.ModuleType | None:
    real = os.path.realpath(path)
    for module in list(sys.modules.values()):
        if _user_file(module) == real:
            return module
    return None


def _codes(code: types.CodeType) -> dict[str, types.CodeType]:
    found: dict[str, types.CodeType] = {}
    stack = [code]
    while stack:
        for const in stack.pop().co_consts:
            if isinstance(const, types.CodeType):
                found.setdefault(const.co_qualname, const)
                stack.append(const)
    return found


def _on_stack() -> set[tuple[str, str]]:
    """(file, qualname) of every function the main thread is in now: a
    patched one keeps running its old code until it returns."""
    frames: set[tuple[str, str]] = set()
    frame: types.FrameType | None = sys._getframe()
    while frame is not None:
        code = frame.f_code
        frames.add((os.path.realpath(code.co_filename), code.co_qualname))
        frame = frame.f_back
    return frames
