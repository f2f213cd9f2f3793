"""The pytest plugin in real pytest sessions (pytester, a subprocess each) with
real CRIU: a golden written by --prism-update, passing unchanged, failing
with the first difference when the script's learning rate changes; two
xdist workers sharing one cache, which then holds one snapshot (the fixture
and the marker form with a fault); a desync reproduced from a snapshot, then
its fix verified from the same snapshot with ``reload=True``; and the plugin
loaded both by ``-p`` and by its entry point at once.

The session's runs share one graph cache (``tests/conftest.py``) and one
snapshot cache (``snapshot_cache``): the bundled example is profiled once
and each job is recorded once.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from prism_debug.process.paths import SOURCE_ROOT

PLUGIN = ("-p", "prism_debug.testing.plugin")
# iteration times here are this (shared, busy) machine's: the goldens hold them
# to a loose tolerance, digests and collectives bit for bit
TEST_FILE = """\
WORLD = dict(world_size=64, rank=5, collective_timeout_s=2)

def test_example_after_iteration_3(prism, prism_golden):
    result = prism(**WORLD, iteration=3, iterations=2, time_rtol=50, example={EXAMPLE})
    assert result.exit_code == 0 and result.exception is None
    assert [it.iteration for it in result.iterations] == [4, 5]
    assert prism_golden == result
"""


@pytest.fixture(scope="session")
def snapshot_cache(tmp_path_factory) -> Path:
    """The test snapshots the session's pytest runs share."""
    return tmp_path_factory.mktemp("test-snapshots")


@pytest.fixture
def session(pytester, monkeypatch, snapshot_cache):
    """Run pytest in a subprocess on this checkout's code, with the plugin."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(SOURCE_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def run(*args: str):
        return pytester.runpytest_subprocess(*PLUGIN, "--prism-cache", str(snapshot_cache),
                                             "-p", "no:cacheprovider", *args, timeout=1200)
    return run


@pytest.mark.slow
def test_a_golden_is_written_then_passes_then_names_the_first_difference(pytester, session):
    pytester.makepyfile(test_lr=TEST_FILE.replace("{EXAMPLE}", "{}"))
    golden = (pytester.path / "__snapshots__" / "test_lr"
              / "test_example_after_iteration_3.prism.json")

    missing = session()
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*no golden yet: run pytest --prism-update to write it*"])
    assert not golden.exists()

    written = session("--prism-update")
    written.assert_outcomes(passed=1)
    written.stdout.fnmatch_lines(["*1 snapshot generated*"])
    view = json.loads(golden.read_text())
    assert (view["exit_code"], view["exception"], view["time_rtol"]) == (0, None, 50)
    assert [it["iteration"] for it in view["iterations"]] == [4, 5]
    ops = view["iterations"][0]["collectives"]
    assert len(ops) == 81 and ops[0].startswith("all_reduce tp[0] 262144 B ")
    assert len({it["digest"] for it in view["iterations"]}) == 2

    session().assert_outcomes(passed=1)  # unchanged: restored again, the same bit for bit

    # the script's numerics change: the learning rate (a new snapshot: its key changed)
    pytester.makepyfile(test_lr=TEST_FILE.replace("{EXAMPLE}", "{'lr': 1e-3}"))
    changed = session()
    changed.assert_outcomes(failed=1)
    first = re.escape(ops[0].rsplit(" ", 1)[0])
    changed.stdout.re_match_lines([
        rf".*iteration 4, collective #1: digest differs: {first} [0-9a-f]{{16}}; the golden "
        rf"had {re.escape(ops[0])} \(iteration digest [0-9a-f]{{16}}, golden "
        rf"{view['iterations'][0]['digest'][:16]}\)$"])


XDIST_FILE = """\
import pytest

WORLD = dict(world_size=64, rank=13, collective_timeout_s=2, iteration=2)

def test_two_iterations(prism):
    result = prism(**WORLD, iterations=2)
    assert result.exit_code == 0 and sorted(result.digests) == [3, 4]
    assert all(len(it.collectives) == 81 for it in result.iterations)

@pytest.mark.prism(**WORLD, iterations=2, faults=["fail 5 at 3"])
def test_a_dead_peer(prism_result):
    assert prism_result.exit_code != 0
    kind, message = prism_result.exception
    assert kind.endswith("DistBackendError"), prism_result.exception
    assert "Watchdog caught collective operation timeout" in message
    assert [it.iteration for it in prism_result.iterations] == []
"""


@pytest.mark.slow
def test_two_xdist_workers_share_one_cache_and_record_once(pytester, session, snapshot_cache):
    pytester.makepyfile(test_shared=XDIST_FILE)
    before = set((snapshot_cache / "store").glob("r13-*")) if (snapshot_cache / "store").exists() \
        else set()
    result = session("-n", "2", "-v")
    result.assert_outcomes(passed=2)
    passed = {line.split()[0] for line in result.outlines if " PASSED " in line}
    assert passed == {"[gw0]", "[gw1]"}  # one test each, at once
    recorded = set((snapshot_cache / "store").glob("r13-*")) - before
    assert len(recorded) == 1, recorded  # both workers asked at once: one dump
    entries = [json.loads(p.read_text()) for p in snapshot_cache.glob("*.json")]
    assert [e["snapshot"] for e in entries].count(next(iter(recorded)).name) == 1


RELOAD_FILE = """\
import pytest

# a test that will verify a fix reloads from the start: its snapshot is keyed
# without the script's contents, so the fixed script is patched into the old one
@pytest.mark.prism(world_size=4, rank=3, iteration=4, iterations=2, reload=True,
                   command="python desync.py --iterations 6")
def test_iterations_5_and_6(prism_result):
    assert prism_result.exit_code == 0
    assert prism_result.reloaded == ("train_step",)
    assert sorted(prism_result.digests) == [5, 6]
"""


@pytest.mark.slow
def test_the_marker_reproduces_a_desync_then_verifies_its_fix_from_the_same_snapshot(
        pytester, session, snapshot_cache):
    scripts = SOURCE_ROOT / "tests" / "scripts"
    bug = "if dist.get_rank() == dist.get_world_size() - 1 and iteration == 5:"
    (pytester.path / "desync_model.py").write_text((scripts / "desync_model.py").read_text())
    (pytester.path / "desync.py").write_text((scripts / "desync_at.py").read_text())
    pytester.makepyfile(test_fix=RELOAD_FILE)
    buggy = session()
    buggy.assert_outcomes(errors=1)  # (the marker's fixture raised)
    buggy.stdout.fnmatch_lines(["*the restored rank refused: the script does not follow the "
                                "graph: rank 3 ended iteration 5 without issuing all_reduce*"])
    (pytester.path / "desync.py").write_text(
        (scripts / "desync_at.py").read_text().replace(bug, "if False:"))
    fixed = session("-rP")
    fixed.assert_outcomes(passed=1)
    assert len(list((snapshot_cache / "store").glob("r3-*"))) == 1  # the buggy one, reused


def test_the_plugin_loads_by_entry_point_and_by_p_at_once(pytester, monkeypatch):
    """Installed, the plugin autoloads (pytest11); ``-p`` naming it as well is
    no double registration, as its entry point is named by its module."""
    site = pytester.mkdir("site")
    info = site / "prism_debug_ep-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: prism-debug-ep\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[pytest11]\nprism_debug.testing.plugin = prism_debug.testing.plugin\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SOURCE_ROOT), str(site)]))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile(test_nothing="def test_nothing(prism):\n    assert callable(prism)\n")
    for args in ((), PLUGIN):
        result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", "-q")
        assert result.ret == 0, result.stdout.str() + result.stderr.str()
        result.assert_outcomes(passed=1)
    help_text = pytester.runpytest_subprocess(*PLUGIN, "--help").stdout.str()
    assert "--prism-update" in help_text and "--prism-scenarios=GLOB" in help_text


@pytest.mark.slow
def test_the_readme_example_file_passes_and_its_golden_holds_bit_for_bit(pytester, session):
    """``examples/test_regression.py`` as the documentation shows it: its three
    restore tests pass here; its golden, refreshed here, holds bit for bit on
    a second run, and has the committed golden's iterations and collectives
    (op, group, bytes).  The digests themselves are this CPU's: the values a
    float model computes depend on the math kernels MKL picks for the
    instruction set, so the committed ones match only on a CPU like the one
    they were made on (and times may move: the committed ones are a quiet
    machine's, held to ±50 %, which a busy test machine need not meet)."""
    examples = SOURCE_ROOT / "examples"
    name = "test_iterations_4_and_5_match_the_golden.prism.json"
    committed = json.loads((examples / "__snapshots__" / "test_regression" / name).read_text())
    (pytester.path / "test_regression.py").write_text(
        (examples / "test_regression.py").read_text())
    (pytester.path / "__snapshots__" / "test_regression").mkdir(parents=True)
    golden = pytester.path / "__snapshots__" / "test_regression" / name
    golden.write_text(json.dumps(committed))

    # (-k also matches this test's folder name: select by the golden test's own)
    session("-k", "not match_the_golden").assert_outcomes(passed=3, deselected=1)
    session("-k", "match_the_golden", "--prism-update").assert_outcomes(passed=1,
                                                                         deselected=3)
    refreshed = json.loads(golden.read_text())
    session("-k", "match_the_golden").assert_outcomes(passed=1, deselected=3)
    assert json.loads(golden.read_text()) == refreshed  # (a passing check writes nothing)

    def shape(view: dict) -> dict:
        """The golden without times and digests: what no CPU changes."""
        return {**view, "iterations": [
            {**{k: v for k, v in it.items() if k not in ("time_s", "digest")},
             "collectives": [c.rsplit(" ", 1)[0] for c in it["collectives"]]}
            for it in view["iterations"]]}
    assert shape(refreshed) == shape(committed)
    assert [it["iteration"] for it in refreshed["iterations"]] == [4, 5]
    digests = [c.rsplit(" ", 1)[1] for it in refreshed["iterations"] for c in it["collectives"]]
    assert all(re.fullmatch("[0-9a-f]{16}", d) for d in digests)
    assert len(set(digests)) > len(digests) // 2  # (the values' own, not one constant)
