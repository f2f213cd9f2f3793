"""The skeleton of real jobs' flight-recorder dumps: the groups, the ops per
iteration and their sizes are the ones the job's script issues (derived from
its arguments here, never from what the skeleton made), and the graph replays
at the pace the job really ran."""

import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from prism_debug.graph.execution import ExecutionGraph
from prism_debug.incident.dumps import read_dumps
from prism_debug.incident.skeleton import build_skeleton

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "device_time.py"
# 8 ranks: pp 2 x dp 2 x tp 2 (tp fastest), 5 iterations
LAYERS, MICRO_BATCHES, BUCKETS, ITERATIONS = 2, 2, 2, 5
TP_KIB, GRAD_KIB = 64, 1024
ARGS = ["--pp", "2", "--tp", "2", "--iterations", str(ITERATIONS), "--layers", str(LAYERS),
        "--micro-batches", str(MICRO_BATCHES), "--buckets", str(BUCKETS),
        "--tp-kib", str(TP_KIB), "--grad-kib", str(GRAD_KIB), "--forward-ms", "4",
        "--backward-ms", "8", "--optimizer-ms", "5", "--activation-kib", "16"]
# what device_time.py issues per iteration on every rank: a tp all-reduce after
# each layer of each micro-batch's forward and backward, then one dp all-reduce
# per gradient bucket
TP_PER_ITERATION = 2 * LAYERS * MICRO_BATCHES
DP_PER_ITERATION = BUCKETS
TP_BYTES = TP_KIB * 1024
DP_BYTES = GRAD_KIB * 1024 // BUCKETS
# the job with torch's own dump call where it ends (the script's destroy_process_group)
DUMPING = """\
import os, sys, torch
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import device_time
prefix = os.environ["SKELETON_DUMP_PREFIX"]
destroy = dist.destroy_process_group
def dump_then_destroy(*args, **kwargs):
    data = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    with open(prefix + os.environ["RANK"], "wb") as f:
        f.write(data)
    destroy(*args, **kwargs)
dist.destroy_process_group = dump_then_destroy
device_time.main(sys.argv[2:])
"""


def cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def device_time_run(tmp_path_factory) -> Path:
    """A real 8-process gloo run of device_time.py: its dumps in dumps/, its
    measured iteration times in timing/."""
    where = tmp_path_factory.mktemp("device_time")
    script = where / "dumping.py"
    script.write_text(DUMPING)
    (where / "dumps").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
         "--log-dir", str(where / "logs"), "--redirects", "3", str(script),
         str(WORKLOAD.parent), *ARGS, "--timing-dir", str(where / "timing")],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1",
                 SKELETON_DUMP_PREFIX=str(where / "dumps" / "rank_")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where


def steady_issues(graph: ExecutionGraph, class_id: int = 0):
    program = graph.programs[class_id]
    return [program.ops[e.op] for e in program.steady if e.action == "issue"]


@pytest.mark.slow
def test_the_device_time_jobs_skeleton_has_its_groups_ops_and_sizes(device_time_run):
    dumps = read_dumps(device_time_run / "dumps")
    skeleton = build_skeleton(dumps, world_size=8)
    graph = skeleton.graph
    assert graph.world_size == 8
    assert graph.families["tp"] == ("tp",) and graph.families["dp"] == ("dp",)
    assert [graph.family_group("tp", i) for i in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [graph.family_group("dp", i) for i in range(4)] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # gloo records no sends: both stages issue the same collectives, one class
    assert graph.class_axis is None and len(graph.programs) == 1
    issues = steady_issues(graph)
    assert [(op.kind, op.family, op.nbytes, op.dtype) for op in issues] == (
        [("all_reduce", "tp", TP_BYTES, "float32")] * TP_PER_ITERATION
        + [("all_reduce", "dp", DP_BYTES, "float32")] * DP_PER_ITERATION)
    assert graph.programs[0].warmup == ()  # every iteration issues the same
    assert "iteration boundaries inferred from a period of 10 ops (ranks 0-7)" in skeleton.notes
    assert any(n.startswith("gloo records no point-to-point ops") for n in skeleton.notes)
    # sequence numbers place: rank 0's dp group's 7th all-reduce is iteration 4's first
    dp_group = next(e.group for e in dumps.dumps[0].entries if e.group_desc == "dp")
    assert skeleton.groups[dp_group].ranks == (0, 2)
    assert skeleton.locate(dp_group, 7) == (4, 1)
    tp_group = next(e.group for e in dumps.dumps[0].entries if e.group_desc == "tp")
    assert skeleton.locate(tp_group, TP_PER_ITERATION * ITERATIONS) == (ITERATIONS,
                                                                        TP_PER_ITERATION)
    assert skeleton.last_iteration == {rank: ITERATIONS for rank in range(8)}


@pytest.mark.slow
def test_the_skeleton_replays_at_the_pace_the_job_ran(device_time_run, tmp_path):
    skeleton = build_skeleton(read_dumps(device_time_run / "dumps"), world_size=8)
    path = tmp_path / "skeleton.prism"
    skeleton.graph.save(path)
    assert ExecutionGraph.load(path).to_dict() == skeleton.graph.to_dict()
    shown = cli("graph", "show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "world 8 = _axis2 2 x dp 2 x tp 2, 1 class(es)" in shown.stdout
    assert "tp 0.50 MiB, dp 1.00 MiB" in shown.stdout  # 8 x 64 KiB, 2 x 512 KiB
    replayed = cli("replay", str(path), "--iterations", "3", "--json")
    assert replayed.returncode == 0, replayed.stderr
    replay_s = json.loads(replayed.stdout)["times_s"]["0"][-1]
    measured = [json.loads((device_time_run / "timing" / f"rank{r}.json").read_text())
                ["iteration_s"][1:] for r in range(8)]
    job_s = statistics.median(t for rank in measured for t in rank)
    # gloo's gaps are creation-time differences, which hold each op's own time:
    # an iteration's gaps add up to the median iteration (the replay's own op
    # times on top: 0.1 ms of 94 ms here); on 2 shared cores the job varies ~10 %
    assert job_s * 0.9 < replay_s < job_s * 1.1, (replay_s, job_s)


@pytest.mark.slow
def test_ranks_without_a_dump_and_a_damaged_one_leave_the_same_skeleton(device_time_run,
                                                                        tmp_path):
    full = build_skeleton(read_dumps(device_time_run / "dumps"), world_size=8)
    for rank in (0, 1, 2, 4, 5):
        shutil.copy(device_time_run / "dumps" / f"rank_{rank}", tmp_path / f"rank_{rank}")
    whole = (device_time_run / "dumps" / "rank_3").read_bytes()
    (tmp_path / "rank_3").write_bytes(whole[:len(whole) // 2])  # cut short while written
    dumps = read_dumps(tmp_path)
    assert sorted(dumps.dumps) == [0, 1, 2, 4, 5] and list(dumps.damaged) == ["rank_3"]
    skeleton = build_skeleton(dumps)  # no world size: the dumps' highest rank is 5
    graph = skeleton.graph
    assert graph.world_size == 8  # 6 ranks rounded up to the tp x dp span of 4
    assert graph.to_dict()["mesh"] == full.graph.to_dict()["mesh"]
    assert graph.families == full.graph.families
    assert steady_issues(graph) == steady_issues(full.graph)
    assert skeleton.notes[0].startswith("world size 8 is a lower bound")
    assert "ranks 3, 6-7 left no dump: their programs are their class's" in skeleton.notes
    # rank 0's dp group (0, 2) gives the stride; rank 4's was seen without 6
    assert any(n.startswith("dp: 2 ranks 2 apart per group; groups ") for n in skeleton.notes)
    dp_group = next(e.group for e in dumps.dumps[4].entries if e.group_desc == "dp")
    assert skeleton.groups[dp_group].ranks == (4,)  # what the dumps show of it
    assert graph.family_group("dp", 2) == [4, 6]


@pytest.mark.slow
def test_a_wrapped_ring_places_iterations_by_sequence_numbers(device_time_run, tmp_path):
    """A ring of 25 entries keeps each rank's last 25 ops: iteration 1 is
    gone, the record starts mid-iteration, and the boundaries come from the
    groups' sequence numbers."""
    full = build_skeleton(read_dumps(device_time_run / "dumps"), world_size=8)
    for path in (device_time_run / "dumps").iterdir():
        dump = pickle.loads(path.read_bytes())
        dump["entries"] = dump["entries"][-25:]
        (tmp_path / path.name).write_bytes(pickle.dumps(dump))
    dumps = read_dumps(tmp_path)
    assert dumps.dumps[0].entries[0].collective_seq != 1
    skeleton = build_skeleton(dumps, world_size=8)
    assert steady_issues(skeleton.graph) == steady_issues(full.graph)  # not a rotation
    assert any(n.startswith("the ring buffer no longer holds collective 1") for n in
               skeleton.notes)
    for entry in dumps.dumps[0].entries:
        assert skeleton.locate(entry.group, entry.collective_seq) == \
            full.locate(entry.group, entry.collective_seq)
    assert skeleton.last_iteration[0] == ITERATIONS


PIPELINE_HANG = """\
name: pipeline-hang
description: rank 2 (the second stage) stops at iteration 3; rank 0's send to it times out
world: {size: 4, rank: 0}
run:
  command: [python, %(script)s, --pp, "2", --iterations, "4", --micro-batches, "2",
            --forward-ms, "2", --backward-ms, "4", --activation-kib, "16", --grad-kib, "64"]
  graph: profile
  timeout_s: 2
faults:
  - action: hang
    select: {ranks: "2"}
    at: {iteration: 3}
expect:
  - exit_code: 134
  - flight_record: {missing_ranks: [2]}
"""


@pytest.mark.slow
# the skeleton takes p2p ops created within 1 ms of each other as one batch (the
# dumps do not mark batches): a busy machine's pause between two ops of one
# batch_isend_irecv splits it
@pytest.mark.serial
def test_prism_debugs_own_dumps_give_the_pipelines_sends_and_receives(tmp_path):
    """A scenario's flight record (prism-debug's own recorder, NCCL's
    format) holds the timed-out pipeline group's sends and receives, with
    both ends named: the skeleton has them on the pp axis, one class per
    stage, in the batches device_time.py's 1F1B schedule issues."""
    scenario = tmp_path / "pipeline_hang.yaml"
    scenario.write_text(PIPELINE_HANG % {"script": WORKLOAD})
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "scenario", "run", str(scenario),
         "--run-dir", str(tmp_path / "run"), "--store", str(tmp_path / "store")],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(ROOT), PRISM_DEBUG_GRAPH_CACHE=str(tmp_path / "g")))
    assert "PASS  exit code 134" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    flight = tmp_path / "run" / "1-pipeline-hang" / "flight"
    dumps_dir = tmp_path / "dumps"
    dumps_dir.mkdir()
    for path in [flight / "trace_rank_0", *(flight / "peers").iterdir()]:
        shutil.copy(path, dumps_dir / path.name)
    dumps = read_dumps(dumps_dir)
    assert sorted(dumps.dumps) == [0, 2]  # the pp group of rank 0: stages 0 and 1
    skeleton = build_skeleton(dumps, world_size=4)
    graph = skeleton.graph
    assert graph.class_axis == "pp" and graph.family_group("pp", 0) == [0, 2]
    # stage 0 of a 2-stage 1F1B over 2 micro-batches: the first forward's send,
    # then the second's send with the first gradient's receive in one batch,
    # then the second gradient's receive; 16 KiB of activations each
    stage0 = graph.programs[0]
    issues = [e for e in stage0.steady if e.action == "issue"]
    assert [(stage0.ops[e.op].kind, stage0.ops[e.op].peer, stage0.ops[e.op].nbytes, e.batch)
            for e in issues] == [("send", 1, 16384, 1), ("send", 1, 16384, 2),
                                 ("recv", 1, 16384, 2), ("recv", 1, 16384, 3)]
    assert {op.peer for op in graph.programs[1].ops} == {-1}  # stage 1 talks back to stage 0
    assert "2 programs, one per pp coordinate: pp is the class axis" in skeleton.notes
    # the send that timed out is the first op of iteration 3, where rank 2 hung
    stuck = dumps.dumps[0].entries[-1]
    assert stuck.op == "send" and stuck.state == "scheduled"
    assert skeleton.locate(stuck.group, stuck.p2p_seq, p2p=True) == (3, 1)
    path = tmp_path / "skeleton.prism"
    graph.save(path)
    replayed = cli("replay", str(path), "--iterations", "2")
    assert replayed.returncode == 0, replayed.stderr


HANGING = """\
import datetime, os, signal, sys, time, torch
import torch.distributed as dist
rank, prefix = int(os.environ["RANK"]), os.environ["SKELETON_DUMP_PREFIX"]
def dump(*_):
    data = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    with open(prefix + str(rank), "wb") as f:
        f.write(data)
signal.signal(signal.SIGTERM, lambda *a: (dump(), os._exit(143)))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
try:
    for step in range(1, 6):
        if rank == 2 and step == 3:
            time.sleep(1000)
        dist.all_reduce(torch.ones(1024))
        dist.all_reduce(torch.ones(16))
except Exception:
    dump()
    sys.exit(1)
"""


@pytest.mark.slow
def test_a_real_hang_stops_the_record_in_the_iteration_it_hung(tmp_path):
    """4 gloo processes, two all-reduces a step; rank 2 stops before step 3's:
    the others time out there and dump, torchrun's SIGTERM makes rank 2 dump."""
    script = tmp_path / "hanging.py"
    script.write_text(HANGING)
    (tmp_path / "dumps").mkdir()
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "--log-dir", str(tmp_path / "logs"), "--redirects", "3", str(script)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1",
                 SKELETON_DUMP_PREFIX=str(tmp_path / "dumps" / "rank_")))
    dumps = read_dumps(tmp_path / "dumps")
    assert sorted(dumps.dumps) == [0, 1, 2, 3]
    skeleton = build_skeleton(dumps)
    graph = skeleton.graph
    assert graph.world_size == 4  # the default group's pg_config lists the world
    assert [(op.kind, op.family, op.nbytes) for op in steady_issues(graph)] == [
        ("all_reduce", "world", 4096), ("all_reduce", "world", 64)]
    assert "iteration boundaries inferred from a period of 2 ops (ranks 0-3)" in skeleton.notes
    assert skeleton.last_iteration == {0: 3, 1: 3, 2: 2, 3: 3}
    stuck = dumps.dumps[0].entries[-1]
    assert (stuck.collective_seq, skeleton.locate(stuck.group, stuck.collective_seq)) == (5, (3, 1))
