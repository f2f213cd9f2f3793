"""Several real ranks under one controller (``prism-debug run --ranks``):
their collectives carry real data, checked against closed forms and against
real ``torchrun`` jobs of the same script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_gpt.py"
REAL_OPS = ROOT / "tests" / "scripts" / "real_ops.py"
# the bundled example, small enough for a test: tp 2, one stage
SMALL = ["--iterations", "3", "--layers", "2", "--hidden", "64", "--heads", "4",
         "--seq-len", "32", "--vocab", "128", "--micro-batches", "2", "--tp", "2", "--pp", "1",
         "--loss-hex"]


def losses(output: str) -> list[str]:
    """The exact losses (float.hex) an output prints, in order."""
    return re.findall(r"iter \d+ loss [\d.]+ \((\S+)\)$", output, re.MULTILINE)


def torchrun(*args: str, nproc: int = 2) -> str:
    """The bundled example as a real gloo job of ``nproc`` processes; its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(nproc), str(EXAMPLE), *args], capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def results(output: str) -> dict[int, dict]:
    """Each rank's RESULTS line (tests/scripts/real_ops.py)."""
    return {int(rank): json.loads(line) for rank, line in
            re.findall(r"^\[rank (\d+)\] RESULTS (.*)$", output, re.MULTILINE)}


def test_an_all_real_world_prints_torchruns_losses(tmp_path):
    real = losses(torchrun(*SMALL))
    run = cli("run", "--world-size", "2", "--ranks", "0-1", "--lockstep", "--no-bus",
              "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(EXAMPLE), *SMALL)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert len(real) == 3
    assert losses(run.stdout.replace("[rank 0] ", "")) == real  # bit for bit


def test_two_real_ranks_of_8192_under_mirror_are_one_replica_of_a_real_tp2_job(tmp_path):
    # dp = 4096: each data-parallel group has one real member, which the
    # 4095 virtual ones mirror (x 4096, then the script's / 4096: exact)
    real = losses(torchrun(*SMALL, "--data-parallel-size", "4096", "--data-parallel-rank", "0"))
    run = cli("run", "--world-size", "8192", "--ranks", "0-1", "--lockstep",
              "--report", str(tmp_path / "report.json"),
              "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(EXAMPLE), *SMALL)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert losses(run.stdout.replace("[rank 0] ", "")) == real
    # one real rank's own losses differ: its batches are another replica's
    assert real != losses(torchrun(*SMALL))
    report = json.loads((tmp_path / "report.json").read_text())
    assert sorted(report["ranks"]) == ["0", "1"]
    for rank in (0, 1):
        own = json.loads((tmp_path / "run" / f"rank-{rank}" / "report.json").read_text())
        assert own["rank"] == rank and len(own["iterations"]) == 3
        assert report["ranks"][str(rank)] == own
    assert re.search(r"^debugger: prism-debug attach --rank R, R one of 0-1 \(session "
                     r"[0-9a-f]{8}\)$", run.stdout, re.MULTILINE)


def test_every_collective_among_three_real_ranks_is_the_real_one(tmp_path):
    run = cli("run", "--world-size", "3", "--ranks", "0-2", "--lockstep", "--no-bus",
              "--run-dir", str(tmp_path), "--", sys.executable, str(REAL_OPS))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = results(run.stdout)
    assert sorted(got) == [0, 1, 2]
    n = 3
    for r, res in got.items():
        assert res["sum"] == 6.0
        assert res["avg"] == 6.0  # NCCL's AVG, which gloo lacks: a sum, then / n
        assert res["product"] == 2 * 3 * 4
        assert res["max"] == 2.0
        assert res["broadcast"] == [10.0, 11.0, 12.0]
        assert res["all_gather"] == [[float(i)] * 2 for i in range(n)]
        assert res["all_gather_into_tensor"] == [0.0, 2.0, 4.0]
        # chunk r of arange(2n) + rank, summed over the ranks
        assert res["reduce_scatter_tensor"] == [n * (2 * r) + 3.0, n * (2 * r + 1) + 3.0]
        assert res["reduce_scatter"] == [30.0 * r + 3]
        assert res["all_to_all_single"] == [r + 10.0 * j for j in range(n)]
        assert res["all_to_all"] == [100.0 * j + r for j in range(n)]
        assert res["gather"] == ([0.5, 1.5, 2.5] if r == 0 else None)
        assert res["scatter"] == 7.0 * r
        assert res["reduce"] == (6.0 if r == 0 else r + 1.0)  # NCCL: the root's only
        assert res["ring"] == [float((r - 1) % n)] * 2


@pytest.mark.parametrize("values, world_sum, gathered, broadcast", [
    # virtual peers 2, 3 of the world are assigned real members 0, 1 round-robin
    ("mirror", 2 * 1.0 + 2 * 2.0, [1.0, 2.0, 1.0, 2.0], 2.0),
    ("zeros", 3.0, [1.0, 2.0, 0.0, 0.0], 0.0),
])
def test_two_real_ranks_among_virtual_peers_exchange_real_data(tmp_path, values, world_sum,
                                                                gathered, broadcast):
    run = cli("run", "--world-size", "4", "--ranks", "0-1", "--lockstep", "--no-bus",
              "--values", values, "--run-dir", str(tmp_path), "--", sys.executable,
              str(REAL_OPS), "--pair")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    common = {"pair_sum": 3.0, "world_sum": world_sum, "world_gather": gathered,
              "world_broadcast": broadcast}
    assert results(run.stdout) == {0: {**common, "from_peer": [6.0, 6.0]},
                                   1: {**common, "from_peer": [5.0, 5.0]}}


def test_seeded_virtual_peers_agree_on_every_real_rank(tmp_path):
    run = cli("run", "--world-size", "4", "--ranks", "0-1", "--lockstep", "--no-bus",
              "--values", "random", "--seed", "5", "--run-dir", str(tmp_path), "--",
              sys.executable, str(REAL_OPS), "--pair")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = results(run.stdout)
    for key in ("world_sum", "world_gather", "world_broadcast"):
        assert got[0][key] == got[1][key]
    assert got[0]["world_gather"][:2] == [1.0, 2.0]
    assert got[0]["world_gather"][2:] != [0.0, 0.0] and got[0]["world_sum"] != 6.0


def test_a_rank_that_fails_stops_the_others_and_sets_the_exit_code(tmp_path):
    script = tmp_path / "one_fails.py"
    script.write_text(
        "import os, sys, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if int(os.environ['RANK']) == 1:\n"
        "    sys.exit(3)\n"
        "time.sleep(120)\n")
    run = cli("run", "--world-size", "2", "--ranks", "0-1", "--lockstep", "--no-bus",
              "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(script))
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]
    assert ("prism-debug: rank 1 exited with code 3: stopping rank 0, as torchrun stops a "
            "job's other workers") in run.stdout


@pytest.mark.parametrize("args, error", [
    (["--ranks", "0-1", "--rank", "3"], "--rank and --ranks exclude each other"),
    (["--ranks", "6-9"], "--ranks: "),
    (["--ranks", "0-1", "--paused"],
     "--paused works with one real rank; a run of several real ranks (--ranks) does not "
     "take it yet"),
    (["--ranks", "0-99"], "--ranks names 100 ranks: one host runs at most 64 real ranks"),
])
def test_what_several_real_ranks_cannot_take_is_refused_before_anything_starts(
        tmp_path, args, error):
    run = cli("run", "--world-size", "8" if "0-99" not in args else "128", "--lockstep",
              "--run-dir", str(tmp_path), *args, "--", sys.executable, str(REAL_OPS))
    assert run.returncode == 2
    assert error in run.stderr
    assert not any(tmp_path.iterdir())  # nothing started


def test_the_side_store_prefix_is_only_in_the_ranks_private_configs(tmp_path):
    run = cli("run", "--world-size", "2", "--ranks", "0-1", "--lockstep", "--no-bus",
              "--run-dir", str(tmp_path), "--", sys.executable, str(REAL_OPS))
    assert run.returncode == 0
    for rank in (0, 1):
        config = tmp_path / f"rank-{rank}" / "agent.json"
        assert config.stat().st_mode & 0o777 == 0o600
        side = json.loads(config.read_text())["side_store"]
        assert side["host"] == "127.0.0.1"
        assert re.fullmatch(r"prism/[0-9a-f]{32}/", side["prefix"])
        assert side["prefix"] not in run.stdout + run.stderr
    assert os.stat(tmp_path / "rank-0").st_mode & 0o777 == 0o700
