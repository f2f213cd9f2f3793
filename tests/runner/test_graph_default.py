"""``prism-debug run`` replays the job's own graph by default: profiled on the
first run into the private graph cache, taken from it by later runs; lockstep
on request (--lockstep), or with a warning where no graph can describe the job."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prism_debug
from prism_debug.example import RUN_DEFAULTS, RUN_FLAGS
from prism_debug.example import SCRIPT as EXAMPLE_SCRIPT
from prism_debug.graph import ExecutionGraph
from prism_debug.process.options import python_command
from prism_debug.snapshot.store import Store, sha256_file
from prism_debug.workflows import graph_cache

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
STEPS = [sys.executable, str(SCRIPTS / "train_steps.py"), "--iterations", "4"]
pytestmark = pytest.mark.slow


def cli(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = os.environ if cache is None else os.environ | {graph_cache.CACHE_ENV: str(cache)}
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, env=env)


def own_lines(proc) -> list[str]:
    """prism-debug's lines, without the script's."""
    return [line for line in proc.stdout.splitlines() if not line.startswith("[rank ")]


def rows(proc) -> list[str]:
    return [line for line in own_lines(proc) if line[:5].strip().isdigit()]


def steps_graph() -> Path:
    """Where the session's cache keeps the graph of rank 5 of 64 running STEPS."""
    return graph_cache.cache_dir() / f"{graph_cache.cache_key(STEPS, 64, 8)}.prism"


def test_the_first_run_profiles_with_progress_and_the_second_starts_from_the_cache(tmp_path):
    cache = tmp_path / "cache" / "graphs"  # neither folder exists yet
    args = ("run", "--world-size", "64", "--rank", "5", "--no-bus", "--report",
            str(tmp_path / "r.json"), "--", *STEPS)
    first = cli(*args, cache=cache)
    assert first.returncode == 0, first.stdout + first.stderr
    key = graph_cache.cache_key(STEPS, 64, 8)
    # the graph, and the lock that runs of the job started together profile under
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.lock", f"{key}.prism"]
    path, lock = cache / f"{key}.prism", cache / f"{key}.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    lines = own_lines(first)
    assert lines[0] == (f"graph: profiling the job once into {path} (4 iterations per slice, one "
                        "slice per rank class)")
    assert lines[1] == "profile: layout: rank 0 …"
    assert lines[2].startswith("profile: layout: rank 0 done in ")
    assert lines[2].endswith(" s: 4 iterations, 2 ops per iteration")
    assert lines[4].startswith("graph: profiled in ")
    assert lines[4].endswith(f" s; cached {path} ({path.stat().st_size} bytes)")
    # private: the graph holds the command line
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.stat().st_mode) == stat.S_IMODE(cache.parent.stat().st_mode) \
        == 0o700
    graph = ExecutionGraph.load(path)
    assert (graph.world_size, graph.gpus_per_node) == (64, 8)
    assert len(rows(first)) == 4 and all("last in: rank" in row for row in rows(first))
    profiled_at = path.stat().st_mtime_ns

    second = cli(*args, cache=cache)
    assert second.returncode == 0, second.stdout + second.stderr
    assert own_lines(second)[0] == (f"graph: {path} (cached: profiled before for this command, "
                                    "script and layout)")
    assert not any(line.startswith(("profile:", "graph: profil")) for line in own_lines(second))
    assert path.stat().st_mtime_ns == profiled_at
    assert sorted(cache.iterdir()) == [lock, path]
    assert [r.split()[5] for r in rows(second)] == [r.split()[5] for r in rows(first)]  # digests


def test_lockstep_runs_at_once_without_profiling(tmp_path):
    cache = tmp_path / "graphs"
    proc = cli("run", "--lockstep", "--world-size", "64", "--rank", "5", "--no-bus", "--",
               *STEPS, cache=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert own_lines(proc)[0].startswith("prism-debug: rank 5 of 64 ")
    assert len(rows(proc)) == 4 and not any("last in" in row for row in rows(proc))
    assert not cache.exists()


def test_lockstep_and_a_graph_are_refused_together(tmp_path):
    proc = cli("run", "--lockstep", "--graph", str(tmp_path / "g.prism"), "--", *STEPS)
    assert proc.returncode == 2
    assert proc.stderr == ("prism-debug: error: --lockstep and --graph exclude each other: "
                           "--graph replays virtual peers from a graph, --lockstep lets them "
                           "arrive with the real rank\n")


def test_a_job_no_graph_describes_runs_in_lockstep_with_a_warning(tmp_path):
    script = tmp_path / "no_steps.py"  # no optimizer step: no iteration to profile
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('nccl')\n"
                      "x = torch.ones(2)\ndist.all_reduce(x)\nprint('sum', x.tolist())\n")
    cache = tmp_path / "graphs"
    args = ("run", "--world-size", "16", "--rank", "3", "--no-bus", "--", sys.executable,
            str(script))
    first = cli(*args, cache=cache)
    assert first.returncode == 0, first.stdout + first.stderr
    refused = cache / f"{graph_cache.cache_key([sys.executable, str(script)], 16, 8)}.unprofilable"
    why = "rank 0 finished 0 iterations; profiling needs at least 3"
    warning = ("prism-debug: warning: virtual peers arrive in lockstep, as no execution graph "
               "can describe this job: {}. --lockstep skips profiling and this warning")
    assert warning.format(why) in own_lines(first)
    assert "[rank 3] sum [16.0, 16.0]" in first.stdout  # the run itself, in lockstep
    assert stat.S_IMODE(refused.stat().st_mode) == 0o600
    # the next run knows at once, and says how to profile again
    second = cli(*args, cache=cache)
    assert own_lines(second)[0] == warning.format(
        f"{why} (profiled before; remove {refused} to profile again)")
    # perturbations cannot fall back: they need the graph
    perturbed = cli(*args[:-3], "--perturb", "fail 13", "--", *args[-2:], cache=cache)
    assert perturbed.returncode == 2
    assert perturbed.stderr == (f"prism-debug: error: --perturb needs an execution graph, and "
                                f"none can describe this job: {why} (profiled before; remove "
                                f"{refused} to profile again)\n")


def test_a_script_that_fails_in_its_slice_fails_the_run_with_its_log(tmp_path):
    proc = cli("run", "--world-size", "64", "--rank", "5", "--no-bus", "--run-dir",
               str(tmp_path / "run"), "--", sys.executable, str(SCRIPTS / "crash.py"),
               cache=tmp_path / "graphs")
    assert proc.returncode == 3
    log = tmp_path / "run" / "profile" / "rank0-run1" / "rank.log"  # a slice's first run
    assert proc.stderr == (f"prism-debug: error: the slice for rank 0 exited with code 7; its "
                           f"output is in {log}\n")
    assert "about to fail" in log.read_text()


# which rank arrives last is wall time: on a loaded machine the real rank's own
# compute can outlast the peer's 50 ms
@pytest.mark.serial
def test_perturbations_need_no_graph_flag():
    """The session's cached graph of STEPS (profiled here if no test did yet)."""
    proc = cli("run", "--world-size", "64", "--rank", "5", "--no-bus", "--perturb",
               "delay 13 0.05 from 2", "--", *STEPS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert steps_graph().is_file()
    # rank 13 comes 50 ms late to both all-reduces of every iteration from the second
    assert [row.rsplit(" ", 1)[1] for row in rows(proc)] == ["5", "13", "13", "13"]
    assert all(float(row.split()[1]) > 90 for row in rows(proc)[1:])  # ~2 x 50 ms


def test_a_snapshot_of_a_default_run_restores_with_its_graph(tmp_path):
    store = tmp_path / "store"
    proc = cli("run", "--world-size", "64", "--rank", "5", "--no-bus", "--snapshot-at", "2",
               "--store", str(store), "--report", str(tmp_path / "original.json"), "--", *STEPS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = Store(store).list()
    assert manifest.graph_digest == sha256_file(steps_graph())
    # eager: a lazy restore's first iteration faults its pages in, and a rank
    # that slow arrives last at every op, which leaves no last arrival to name
    restored = cli("snapshot", "restore", manifest.id, "--store", str(store), "--no-bus",
                   "--eager", "--report", str(tmp_path / "restored.json"))
    assert restored.returncode == 0, restored.stdout + restored.stderr
    # the restored rank replays the graph it was started with (rows name the last arrival)
    assert len(rows(restored)) == 2 and all("last in: rank" in row for row in rows(restored))
    original, again = (json.loads((tmp_path / f"{n}.json").read_text())["iterations"]
                       for n in ("original", "restored"))
    assert [it["digest"] for it in again] == [it["digest"] for it in original[2:]]


def test_an_attached_console_sees_the_replayed_peers(tmp_path, monkeypatch):
    from prism_debug.bus import sessions
    from tests.runner.test_debug_session import attach, finish, wait_for_session

    monkeypatch.setenv(sessions.ENV_VAR, str(tmp_path / "sessions"))
    run = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--world-size", "64", "--rank", "5",
         "--paused", "--run-dir", str(tmp_path / "run"), "--", *STEPS],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_session(run)
    console = attach("--json", "--command", "peers 4-6; c")
    assert console.returncode == 0, console.stderr
    peers = json.loads(console.stdout.splitlines()[0])
    assert peers["mode"] == "graph"
    assert [(p["rank"], p["class"]) for p in peers["peers"]] == [(4, 0), (5, 0), (6, 0)]
    finish(run)


def test_the_bundled_example_shares_one_graph_whatever_its_iterations(example_graph):
    """Profiled told the slices' count, its graph serves a run of 2 iterations."""
    assert RUN_DEFAULTS.iterations == graph_cache.PROFILE_ITERATIONS
    profiled = python_command(EXAMPLE_SCRIPT, RUN_DEFAULTS.argv(RUN_FLAGS))
    path = graph_cache.cache_dir() / f"{graph_cache.cache_key(profiled, 64, 8)}.prism"
    shutil.copyfile(example_graph, path)  # what `prism-debug profile` wrote for that command
    proc = cli("run", "--world-size", "64", "--rank", "5", "--iterations", "2", "--no-bus")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert own_lines(proc)[0] == (f"graph: {path} (cached: profiled before for this command, "
                                  "script and layout)")
    assert own_lines(proc)[2].endswith("--tp 8 --pp 4 --iterations 2")
    assert len(rows(proc)) == 2 and all("last in: rank" in row for row in rows(proc))


# -- the key ------------------------------------------------------------------------------


def test_the_key_follows_the_script_its_arguments_the_layout_and_the_versions(tmp_path,
                                                                             monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('v1')\n")
    command = [sys.executable, str(script), "--lr", "3e-4"]
    key = graph_cache.cache_key(command, 64, 8)
    assert graph_cache.cache_key(list(command), 64, 8) == key
    # this Python by name only: a moved checkout keeps its graphs
    assert graph_cache.cache_key([Path(sys.executable).name, *command[1:]], 64, 8) == key
    # the script by where it is: `python train.py` run beside it is the
    # command a scenario beside it spells with the whole path
    monkeypatch.chdir(tmp_path)
    assert graph_cache.cache_key([sys.executable, "train.py", "--lr", "3e-4"], 64, 8) == key
    assert graph_cache.cache_key(command[:2] + ["--lr", "1e-3"], 64, 8) != key
    assert graph_cache.cache_key(command, 128, 8) != key
    assert graph_cache.cache_key(command, 64, 4) != key
    script.write_text("print('v2')\n")
    edited = graph_cache.cache_key(command, 64, 8)
    assert edited != key
    monkeypatch.setattr(prism_debug, "__version__", "99.0")
    assert graph_cache.cache_key(command, 64, 8) != edited
    monkeypatch.setattr(graph_cache, "GRAPH_VERSION", 99)
    assert len({graph_cache.cache_key(command, 64, 8), edited}) == 2


@settings(max_examples=25, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4),
       st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4))
def test_different_command_lines_never_share_a_graph(a, b):
    if a != b:
        assert graph_cache.cache_key(["python3", *a], 8, 8) != \
            graph_cache.cache_key(["python3", *b], 8, 8)
