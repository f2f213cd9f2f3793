"""``prism-debug run`` end to end: real scripts, real torch, at 8,192 and 65,536 ranks,
with lockstep peers: the values and the ops (graphs: test_graph_run, test_graph_default).

A run that several tests read (their checks only read its output and
report) is made once for the module: ``shared(script, *options)``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WORLDS = [8192, 65536]
pytestmark = pytest.mark.slow


def prism(*args: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    run_dir = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    return subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", *args[:1], "--lockstep", "--run-dir",
         str(run_dir), *args[1:]],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def run_script(tmp_path, script, *options, world=8192, rank=4097):
    report_path = tmp_path / f"report{len(list(tmp_path.glob('report*')))}.json"
    proc = prism("run", "--world-size", str(world), "--rank", str(rank), "--report",
                 str(report_path), *options, "--", sys.executable, str(SCRIPTS / script),
                 tmp_path=tmp_path)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return proc, report


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """``shared(script, *options, world=, rank=)``: ``run_script``'s (proc,
    report), run once for the module for each set of arguments (``script``
    None: the bundled example).  Read only."""
    made: dict[tuple, tuple] = {}

    def get(script, *options, world=8192, rank=4097):
        key = (script, options, world, rank)
        if key not in made:
            where = tmp_path_factory.mktemp("shared-run")
            if script is None:
                report = where / "report.json"
                proc = prism("run", "--world-size", str(world), "--rank", str(rank),
                             "--report", str(report), *options, tmp_path=where)
                made[key] = proc, json.loads(report.read_text()) if report.exists() else None
            else:
                made[key] = run_script(where, script, *options, world=world, rank=rank)
        return made[key]

    return get


def families(report) -> dict:
    return {f["name"]: (f["num_groups"], f["group_size"]) for f in report["families"]}


def digests(report) -> list[str]:
    return [it["digest"] for it in report["iterations"]]


def result_line(proc) -> dict:
    (line,) = [text for text in proc.stdout.splitlines()
               if text.startswith("[rank ") and " RESULT " in text]
    return json.loads(line.split(" RESULT ", 1)[1])


# -- every op, exact values ----------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_every_op_has_mirror_values_and_nccl_stays_nccl(shared, world):
    proc, report = shared("collectives.py", "--seed", "3", world=world)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = result_line(proc)
    assert (r["backend"], r["tp_backend"], r["tp_rank"]) == ("nccl", "nccl", 1)
    assert r["all_reduce_world"] == [float(world)] * 2
    assert r["all_reduce_tp"] == [8.0, 8.0]
    assert r["avg"] == [3.0, 3.0]
    assert r["product"] == [256.0, 256.0]
    assert r["bf16"] == [True, [8.0, 8.0]]
    assert r["broadcast"] == [0.0, 1.0, 2.0]
    assert r["all_gather"] == [[1.0, 2.0]] * 8
    assert r["all_gather_into_tensor"] == [5.0, 6.0] * 8
    assert r["reduce_scatter_tensor"] == [16.0, 24.0]  # 8 x chunk 1 of arange(16)
    assert r["reduce_scatter"] == [8.0]
    assert r["all_to_all_single"] == [1.0] * 8  # every peer sends its chunk 1
    assert r["all_to_all"] == [1.0] * 8
    assert r["gather"] == [4.0] * 8
    assert r["async_completed"] is True
    assert r["future_value"] == [8.0, 8.0]
    assert r["coalesced"] == [[8.0], [8.0, 8.0]]
    assert r["broadcast_object_list"] == [{"config": "a"}]
    assert r["all_gather_object"] == [{"rank": 4097}] * 8
    assert r["recv_object_list"] == ["meta", 3]
    assert r["recv_any_source"] == 0  # every lockstep peer is ready; the lowest wins
    assert r["all_gather_coalesced"] == [[[7.0], [1.0, 2.0, 3.0]]] * 8
    assert r["split_group"] == [world // 2, 4097 - world // 2 if world == 8192 else 4097]
    assert families(report) == {"world": (1, world), "tp": (world // 8, 8),
                                "half": (2, world // 2)}
    assert report["backend"] == "nccl"


def test_seeded_values_for_data_no_peer_model_knows(tmp_path, shared):
    first, _ = shared("collectives.py", "--seed", "3")
    second, _ = run_script(tmp_path, "collectives.py", "--seed", "3")
    other, _ = run_script(tmp_path, "collectives.py", "--seed", "4")
    a, b, c = (result_line(p) for p in (first, second, other))
    assert a["recv"] == b["recv"] and a["scatter_from_peer"] == b["scatter_from_peer"]
    assert a["recv"] != c["recv"]


def test_zero_peers(tmp_path):
    proc, _ = run_script(tmp_path, "collectives.py", "--values", "zeros")
    r = result_line(proc)
    assert r["all_reduce_tp"] == [1.0, 1.0]
    assert r["avg"] == [0.375, 0.375]
    assert r["all_gather"] == [[0.0, 0.0], [1.0, 2.0]] + [[0.0, 0.0]] * 6
    assert r["reduce_scatter_tensor"] == [2.0, 3.0]
    # objects are always mirrored: a pickle cannot be zeros
    assert r["all_gather_object"] == [{"rank": 4097}] * 8


# -- frameworks -------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_bundled_example(shared, world):
    proc, report = shared(None, "--seed", "1", world=world)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert families(report) == {"world": (1, world), "tp": (world // 8, 8),
                                "dp": (32, world // 32), "pp": (world // 4, 4)}
    assert [it["iteration"] for it in report["iterations"]] == [1, 2, 3, 4]
    assert all(it["num_collectives"] > 0 and it["comm_wait_s"] > 0
               for it in report["iterations"])
    assert re.search(r"^summary: 4 iterations · median [\d.]+ ms after warm-up", proc.stdout,
                     re.MULTILINE)


@pytest.mark.parametrize("script,rank", [
    (None, 4097), ("ddp.py", 4097), ("fsdp2.py", 1), ("fsdp2_tp.py", 3),
    ("pipeline_1f1b.py", 4097),
], ids=["bundled", "ddp", "fsdp2", "fsdp2_tp", "pipeline"])
def test_digests_are_stable_with_a_seed_and_change_with_another(tmp_path, shared, script,
                                                               rank):
    def run(seed):
        if script is not None:
            return run_script(tmp_path, script, "--seed", seed, rank=rank)[1]
        path = tmp_path / f"bundled{seed}-{len(list(tmp_path.iterdir()))}.json"
        prism("run", "--seed", seed, "--report", str(path), tmp_path=tmp_path)
        return json.loads(path.read_text())

    # (the first run is the one each framework's own test reads: test_bundled_example,
    # test_ddp, test_fsdp2, …)
    a, b, c = shared(script, "--seed", "1", rank=rank)[1], run("1"), run("2")
    assert len(digests(a)) >= 3
    assert digests(a) == digests(b)
    assert all(x != y for x, y in zip(digests(a), digests(c), strict=True))
    assert len(set(digests(a))) == len(digests(a))  # training changes values every step


def test_ddp_under_mirror_values_trains_exactly_like_one_process(shared):
    """Mirrored peers hold the same gradients, so DDP's averaged all-reduce
    leaves them unchanged: rank 4097 of 8192 must follow plain local training."""
    import torch

    proc, _ = shared("ddp.py", "--seed", "1")
    emulated = re.findall(r"step \d loss ([\d.]+)", proc.stdout)
    torch.manual_seed(1)  # what the agent does before the script runs
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    local = []
    for _ in range(4):
        inputs, targets = torch.randn(16, 32), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        local.append(f"{loss.item():.6f}")
    assert emulated == local


@pytest.mark.parametrize("world", WORLDS)
def test_ddp(shared, world):
    proc, report = shared("ddp.py", "--seed", "1", world=world)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert families(report) == {"world": (1, world)}
    losses = re.findall(r"step \d loss ([\d.]+)", proc.stdout)
    assert len(losses) == 4 and all(float(v) > 0 for v in losses)
    # DDP waits for its gradient all-reduce inside C++; the wait still counts (seen
    # from the main thread's state when the op completes: on a loaded machine the
    # thread may not be asleep yet in some iteration, so not every one must show it)
    assert all(it["num_collectives"] >= 1 for it in report["iterations"])
    assert any(it["comm_wait_s"] > 0 for it in report["iterations"][1:])


@pytest.mark.parametrize("world", WORLDS)
def test_fsdp2(shared, world):
    # rank 1 holds a real shard: FSDP pads the shards of high ranks with zeros
    proc, report = shared("fsdp2.py", "--seed", "1", world=world, rank=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert families(report) == {"world": (1, world)}
    assert len(report["iterations"]) == 3
    assert all(it["num_collectives"] >= 4 for it in report["iterations"])


@pytest.mark.parametrize("world", WORLDS)
def test_fsdp2_with_tensor_parallel_on_a_2d_mesh(shared, world):
    proc, report = shared("fsdp2_tp.py", "--seed", "1", world=world, rank=3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert families(report) == {"world": (1, world), "dp": (8, world // 8),
                                "tp": (world // 8, 8)}
    assert "[rank 3] backend cpu:gloo,cuda:nccl" in proc.stdout
    assert len(report["iterations"]) == 3


@pytest.mark.parametrize("world", WORLDS)
def test_hsdp_reduces_within_shard_groups_and_all_reduces_across_replicas(tmp_path, world):
    trace = tmp_path / "trace.json"
    proc, report = run_script(tmp_path, "hsdp.py", "--trace", str(trace), world=world)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert families(report) == {"world": (1, world), "replicate": (8, world // 8),
                                "shard": (world // 8, 8)}
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    per_step = {(e["name"], e["args"]["family"]) for e in spans if "family" in e.get("args", {})}
    assert per_step == {("all_gather", "shard"), ("reduce_scatter", "shard"),
                        ("all_reduce", "replicate")}


@pytest.mark.parametrize("world", WORLDS)
def test_pipelining_schedule_1f1b(shared, world):
    proc, report = shared("pipeline_1f1b.py", "--seed", "1", world=world)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stage = 4097 // (world // 4)
    assert f"step 2 stage {stage} weights" in proc.stdout
    assert families(report) == {"world": (1, world), "pp": (world // 4, 4)}
    # per micro-batch (4): a middle stage receives and sends activations and
    # gradients; the first stage only sends activations and receives gradients
    assert report["iterations"][1]["num_collectives"] == (8 if stage == 0 else 16)


# -- run options -----------------------------------------------------------------------


def test_iterations_stops_cleanly_and_trace_opens_in_perfetto(tmp_path):
    trace = tmp_path / "trace.json"
    proc = prism("run", "--iterations", "2", "--trace", str(trace), "--report",
                 str(tmp_path / "r.json"), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert [it["iteration"] for it in report["iterations"]] == [1, 2]
    events = json.loads(trace.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"iterations", "waits", "comm tp", "comm dp", "comm pp"} <= lanes
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in spans)
    assert sum(e["name"] == "all_reduce" for e in spans) == sum(
        it["num_collectives"] for it in report["iterations"]) - sum(
        e["name"] in ("send", "recv") for e in spans)


def test_report_schema(tmp_path):
    proc, report = run_script(tmp_path, "ddp.py", "--iterations", "1")
    assert proc.returncode == 0
    assert set(report) == {"version", "world_size", "rank", "command", "exit_code", "hardware",
                           "backend", "families", "iterations", "peak_rss_bytes", "variability",
                           "waits"}
    (it,) = report["iterations"]
    assert report["variability"] is None
    # one iteration: its waits count, warm-up though it is; one per collective
    assert report["waits"]["iterations"] == [1]
    assert report["waits"]["all"]["count"] == it["num_collectives"]
    assert sum(row["count"] for row in report["waits"]["ops"].values()) == it["num_collectives"]
    assert set(it) == {"iteration", "time_s", "compute_s", "comm_wait_s", "num_collectives",
                       "digest"}
    assert it["time_s"] == pytest.approx(it["compute_s"] + it["comm_wait_s"])
    assert (report["world_size"], report["rank"], report["exit_code"]) == (8192, 4097, 0)
    assert report["hardware"] == "h100-ib400"
    assert report["peak_rss_bytes"] > 50 * 2**20


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("args,message", [
    (["--rank", "8192"], "rank 8192 is outside the world: --rank must be in [0, 8191] for "
                         "--world-size 8192"),
    (["--world-size", "1000"], "world size 1000 cannot be laid out as tp=8 x pp=4 x dp: use a "
                               "multiple of 32"),
    (["--hardware", "tpu-v5"], "unknown hardware profile 'tpu-v5': give a TOML file or one of "
                               "h100-ib400, zero"),
    (["--iterations", "0"], "--iterations must be at least 1, got 0"),
    (["--", sys.executable, "missing_train.py"], "script not found: missing_train.py"),
    (["--", "no-such-program-xyz"], "command not found: no-such-program-xyz"),
])
def test_bad_input_gets_one_clear_error(tmp_path, args, message):
    proc = prism("run", *args, tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == f"prism-debug: error: {message}\n"


def test_a_report_path_in_a_missing_directory_is_refused_before_running(tmp_path):
    proc = prism("run", "--report", str(tmp_path / "nope" / "r.json"), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: --report {tmp_path / 'nope' / 'r.json'}: "
                           f"directory {tmp_path / 'nope'} does not exist\n")


@pytest.mark.serial  # the script must reach future.wait() within the op's 0.6 ms
def test_future_waits_count_only_while_the_script_blocks_on_them(tmp_path):
    proc, report = run_script(tmp_path, "future_wait.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sleeping, blocking = report["iterations"]
    cost = float(re.search(r"cost_s=([\d.e-]+)", proc.stdout).group(1))
    assert sleeping["comm_wait_s"] < 0.05 * cost  # asleep in time.sleep: not a wait
    assert blocking["comm_wait_s"] == pytest.approx(cost, rel=0.2)


def test_terminating_the_controller_takes_the_rank_down(tmp_path):
    import os
    import signal
    import time

    controller = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--run-dir",
         str(tmp_path / "run"), "--", sys.executable, str(SCRIPTS / "sleep_forever.py")],
        stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    for line in controller.stdout:
        if "pid=" in line:
            rank_pid = int(line.rsplit("pid=", 1)[1])
            break
    controller.send_signal(signal.SIGTERM)
    assert controller.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(rank_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"rank {rank_pid} outlived its controller")


def test_a_crashing_script_keeps_its_exit_code_and_its_report(tmp_path):
    proc, report = run_script(tmp_path, "crash.py")
    assert proc.returncode == 7
    assert "[rank 4097] about to fail" in proc.stdout
    assert report["exit_code"] == 7
    assert report["backend"] == "gloo"
    assert len(report["iterations"]) == 1


def test_a_script_that_never_initialises_is_told_so(tmp_path):
    proc, report = run_script(tmp_path, "no_init.py")
    assert proc.returncode == 3
    assert proc.stderr.startswith(
        "prism-debug: error: the script never called torch.distributed.init_process_group "
        "(exit code 0)")
    assert report["exit_code"] == 0 and report["iterations"] == []


def test_cost_command_prints_time_and_busbw(tmp_path):
    out = subprocess.run([sys.executable, "-m", "prism_debug.cli", "cost", "--op", "all_reduce",
                          "--bytes", "1GiB", "--ranks", "8", "--json"],
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    assert (result["algorithm"], result["nodes"], result["bytes"]) == ("nvls", 1, 2**30)
    assert result["busbw_gbs"] == pytest.approx(477.0, abs=0.5)
