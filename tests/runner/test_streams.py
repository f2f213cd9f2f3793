"""DDP's gradient buckets under ``run --graph``: each bucket's all-reduce is
issued async right after the last, on one process group, so they run one
after the other on its stream and the iteration's communication is their sum."""

from __future__ import annotations

import json
import re
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from prism_debug.cost import CostModel, Placement
from prism_debug.cost.hardware import BUNDLED_DIR, load_profile
from prism_debug.graph import ExecutionGraph
from tests.cli import cli

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WORLD, RANK, BUCKETS, BUCKET_BYTES = 16, 5, 4, 66_048  # 128x128 weight and bias, float32
pytestmark = pytest.mark.slow


def slow_network(path: Path) -> Path:
    """The bundled H100 profile with 0.5 MB/s links: one bucket's all-reduce
    takes about 0.25 s, far longer than the backward compute between two
    buckets even on a loaded machine, so every bucket queues behind the last."""
    text = (BUNDLED_DIR / "h100-ib400.toml").read_text()
    text = re.sub(r"(?m)^(nvlink|nvls|nic) = .*$", r"\1 = 0.0005", text)
    path.write_text(text.replace('name = "h100-ib400"', 'name = "slow-links"'))
    return path


def test_ddp_buckets_on_one_group_run_one_after_the_other(tmp_path):
    graph_path, trace = tmp_path / "ddp.prism", tmp_path / "trace.json"
    command = ["--", sys.executable, str(SCRIPTS / "ddp_buckets.py")]
    proc = cli("profile", "--world-size", str(WORLD), "--out", str(graph_path), *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steady = ExecutionGraph.load(graph_path).programs[0]
    assert [(op.kind, op.nbytes) for op in (steady.ops[e.op] for e in steady.steady
                                            if e.action == "issue")] == [
        ("all_reduce", BUCKET_BYTES)] * BUCKETS
    hardware = slow_network(tmp_path / "slow.toml")
    proc = cli("run", "--world-size", str(WORLD), "--rank", str(RANK), "--graph", str(graph_path),
               "--hardware", str(hardware), "--trace", str(trace), "--no-bus",
               "--run-dir", str(tmp_path / "run"), *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cost = CostModel(load_profile(str(hardware))).time_s(
        "all_reduce", BUCKET_BYTES, Placement.of(range(WORLD), 8))
    assert cost == pytest.approx(0.2477, rel=1e-3)
    events = json.loads(trace.read_text())["traceEvents"]
    iterations = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                        if e["pid"] == RANK and e["name"].startswith("iteration "))
    buckets = [(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events
               if e["pid"] == RANK and e["name"] == "all_reduce"
               and e["args"]["bytes"] == BUCKET_BYTES]
    for start, stop in iterations[2:]:  # past DDP's warm-up (it rebuilds its buckets)
        ops = [b for b in buckets if start / 1e6 <= b[0] < stop / 1e6]
        assert len(ops) == BUCKETS
        # each bucket starts when the previous one ends (it was issued before)
        for (_, before), (arrival, done) in pairwise(ops):
            assert arrival < before
            assert done == pytest.approx(before + cost, abs=2e-6)
        # The first bucket starts once the last member is in (a peer whose
        # profiled compute was longer, or the real rank), the rest follow it:
        # the group's stream is busy for the serialised sum.  (Without streams
        # each bucket ended one cost after the last member issued it.)
        assert ops[0][1] >= ops[0][0] + cost - 2e-6
        assert ops[-1][1] - (ops[0][1] - cost) == pytest.approx(BUCKETS * cost, abs=5e-6)
