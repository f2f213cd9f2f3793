"""Patching a live process (the restored rank's side of a reload): real
modules, real functions, the garbage collector's view of them."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from prism_debug.agent.reload import Sources, apply
from prism_debug.reload import plan_file, sources

OLD = textwrap.dedent('''\
    LR = 0.1


    def helper(x):
        return x * 2


    class Model:
        def forward(self, x):
            return helper(x) + 1


    def outer():
        y = 1

        def inner():
            return y + 10

        return inner


    def run(fn):
        return fn()
    ''')
NEW = OLD.replace("x * 2", "x * 3").replace("y + 10", "y + 20").replace("+ 1\n", "+ 5\n")


@pytest.fixture
def module(tmp_path, monkeypatch):
    name = f"reload_job_{tmp_path.name.replace('-', '_')}"
    path = tmp_path / f"{name}.py"
    path.write_text(OLD)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    yield mod
    sys.modules.pop(name, None)


def staged(module, new: str, folder):
    path = module.__file__
    entry = plan_file(path, OLD, new).to_dict(new)
    return sources.stage([entry], folder)


def test_every_live_reference_runs_the_new_code(module, tmp_path):
    helper, model, inner = module.helper, module.Model(), module.outer()
    tracked = Sources()
    tracked.scan()
    event = module.run(lambda: apply(staged(module, NEW, tmp_path), tracked))
    assert [(p["qualname"], p["line"]) for p in event["patched"]] == [
        ("helper", 4), ("Model.forward", 9), ("outer", 13), ("outer.<locals>.inner", 16)]
    assert event["refused"] == [] and event["running"] == []
    # a from-import copy, a live instance's method, a closure made before
    assert (helper(1), model.forward(1), inner()) == (3, 8, 21)
    assert module.LR == 0.1  # module state is never re-run
    assert tracked.seen[module.__file__] == sources.read_text(tmp_path / "reload-0.py")[1]


def test_a_function_on_the_stack_is_named_as_running(module, tmp_path):
    new = NEW.replace("return fn()", "return fn() + 0")
    event = module.run(lambda: apply(staged(module, new, tmp_path), Sources()))
    assert event["running"] == ["run"]
    assert module.run(lambda: 4) == 4  # the next call runs the new code


def test_a_refused_apply_changes_nothing(module, tmp_path):
    entries = staged(module, NEW, tmp_path)
    (tmp_path / "reload-0.py").write_text(NEW + "\n# edited after the plan\n")
    missing = [{**entries[0], "path": str(tmp_path / "never_imported.py")}]
    for bad in (entries, missing):
        event = apply(bad, Sources())
        assert event["patched"] == [] and len(event["refused"]) == 1
    assert event["refused"] == ["never_imported.py: the rank has not imported it"]
    assert (module.helper(1), module.Model().forward(1), module.outer()()) == (2, 3, 11)


def test_a_file_edited_after_its_import_is_marked_so(module, tmp_path, monkeypatch):
    from prism_debug.agent.reload import EDITED_SINCE_IMPORT

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = tmp_path / "edited_later.py"
    path.write_text("A = 1\n")
    importlib.import_module("edited_later")  # compiles, caching the source's mtime and size
    try:
        path.write_text("A = 22\n")
        seen = Sources().scan()
    finally:
        sys.modules.pop("edited_later", None)
    assert seen[str(path.resolve())] == EDITED_SINCE_IMPORT
    assert seen[module.__file__] == sources.read_text(module.__file__)[1]
    # the snapshot keeps no copy of it, so a reload refuses it
    kept = tmp_path / "snap"
    kept.mkdir()
    recorded = sources.keep(kept, seen)
    assert sources.changes(kept, recorded)[str(path.resolve())] == (None, "A = 22\n")
    assert plan_file(str(path), None, "A = 22\n").refused == (
        "edited_later.py: it changed between its import and the snapshot, so the snapshot "
        "does not hold the source the rank runs",)
