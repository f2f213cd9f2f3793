"""The reload planner: which changes a restored rank can take, and the exact
reason for each it cannot (all or nothing)."""

from __future__ import annotations

import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.reload import Patch, plan, plan_file

PATH = "/work/job/train.py"
OLD = textwrap.dedent('''\
    """A job."""
    import math

    LR = 0.1


    def helper(x, k=2):
        return x * k


    class Model:
        size: int = 3

        def forward(self, x):
            return x + 1


    def outer():
        y = 1

        def inner():
            return y

        return inner


    def train_step(iteration, rank):
        if rank == 1 and iteration == 5:
            return 0
        return helper(iteration)
    ''')


def test_changed_bodies_are_patched_with_their_new_lines():
    new = OLD.replace("    if rank == 1 and iteration == 5:\n        return 0\n", "") \
        .replace("return x + 1", "return x + 2")
    result = plan_file(PATH, OLD, new)
    assert result.refused == ()
    assert result.patched == (Patch("Model.forward", PATH, 14), Patch("train_step", PATH, 27))
    assert [p.text() for p in result.patched] == ["Model.forward (train.py:14)",
                                                  "train_step (train.py:27)"]
    assert result.relined == ()


def test_a_nested_function_is_patched_under_its_qualname():
    result = plan_file(PATH, OLD, OLD.replace("return y\n", "return y + 1\n"))
    assert [p.qualname for p in result.patched] == ["outer", "outer.<locals>.inner"]


def test_comments_docstrings_and_moved_lines_patch_nothing_but_reline():
    new = "# a comment above everything\n" + OLD.replace('"""A job."""', '"""The job."""') \
        .replace("return x * k", "return x * k  # why")
    result = plan_file(PATH, OLD, new)
    assert (result.patched, result.refused) == ((), ())
    assert result.relined == ("helper", "Model.forward", "outer", "outer.<locals>.inner",
                              "train_step")


def test_a_new_top_level_function_is_added():
    result = plan_file(PATH, OLD, OLD + "\n\ndef fresh():\n    return 1\n")
    assert result.added == (Patch("fresh", PATH, 33),)
    assert result.refused == ()


def test_every_unpatchable_change_is_refused_with_its_line_and_reason():
    new = (OLD.replace("LR = 0.1", "LR = 0.2")
              .replace("size: int = 3", "size: int = 4")
              .replace("k=2", "k=3")
              .replace("class Model:", "class Model(object):")
              .replace("    y = 1\n", "    y = 1\n    z = 2\n")
              .replace("return y\n", "return z\n"))
    result = plan_file(PATH, OLD, new)
    assert result.patched == result.added == result.relined == ()  # all or nothing
    assert result.refused == (
        "train.py:4: module-level code changed (it ran once, at import: constants, imports "
        "and globals keep their values in memory)",
        "train.py:7: helper: its decorators or default values changed (evaluated once, when "
        "it was defined)",
        "train.py:11: class Model's header changed (bases, keywords or decorators: a class's "
        "layout)",
        "train.py:12: class Model's body changed outside its methods (a class's layout: "
        "fields, slots, class attributes)",
        "train.py:22: outer.<locals>.inner: the variables its closure takes from the "
        "enclosing function changed")


def test_removed_functions_added_methods_and_decorators_are_refused():
    new = OLD.replace("def helper(x, k=2):\n    return x * k\n", "") \
        .replace("    def forward(self, x):", "    def extra(self):\n        return 0\n\n"
                 "    def forward(self, x):") \
        .replace("def train_step", "@staticmethod\ndef train_step")
    assert plan_file(PATH, OLD, new).refused == (
        "train.py:7: helper removed (callers in memory still reach it)",
        "train.py:12: method Model.extra added (a class's layout is fixed when its body runs)",
        "train.py:29: train_step: its decorators or default values changed (evaluated once, "
        "when it was defined)")


def test_classes_added_or_removed_are_refused():
    assert plan_file(PATH, OLD, OLD + "\n\nclass Extra:\n    pass\n").refused == (
        "train.py:33: class Extra added (classes are made when the module runs)",)
    removed = OLD.replace("class Model:\n    size: int = 3\n\n    def forward(self, x):\n"
                          "        return x + 1\n", "")
    assert plan_file(PATH, OLD, removed).refused == (  # (its methods with it)
        "train.py:11: class Model removed (its instances and subclasses live on in memory)",)


def test_syntax_errors_missing_copies_and_gone_files_are_refused():
    assert plan_file(PATH, OLD, OLD + "\ndef broken(:\n").refused == (
        "train.py:32: syntax error: invalid syntax",)
    assert plan_file(PATH, None, OLD).refused == (
        "train.py: it changed between its import and the snapshot, so the snapshot does not "
        "hold the source the rank runs",)
    assert plan_file(PATH, OLD, None).refused == ("train.py: the file is gone",)


def test_a_plan_over_files_refuses_if_any_file_does():
    good = OLD.replace("return x + 1", "return x + 2")
    whole = plan({PATH: (OLD, good), "/work/job/util.py": ("A = 1\n", "A = 2\n")})
    assert [p.qualname for p in whole.patched] == ["Model.forward"]
    assert whole.refused == ("util.py:1: module-level code changed (it ran once, at import: "
                             "constants, imports and globals keep their values in memory)",)
    entry = whole.files[0].to_dict(good)
    assert entry == {"path": PATH, "source": good, "changed": ["Model.forward"],
                     "patch": ["Model.forward"], "add": []}


BODY_LINES = st.lists(st.sampled_from(["x = 1", "x += 2", "y = x * 3", "pass",
                                       "x = [i for i in range(3)]"]), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(old=BODY_LINES, new=BODY_LINES, blank=st.integers(0, 3))
def test_body_edits_are_always_patchable_and_the_same_source_plans_nothing(old, new, blank):
    def source(lines):
        body = "".join(f"    {line}\n" for line in lines)
        return f"import os\n\ndef step():\n{body}    return 0\n"

    same = plan_file(PATH, source(old), "\n" * blank + source(old))
    assert (same.patched, same.refused) == ((), ())
    assert same.relined == (("step",) if blank else ())
    edited = plan_file(PATH, source(old), source(new))
    assert edited.refused == ()
    assert [p.qualname for p in edited.patched] == (["step"] if old != new else [])
