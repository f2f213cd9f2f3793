"""One timeline: every real rank's replay engine agrees on every op's time.

Four real ranks of an 8,192-rank job (``examples/device_time.py``, tp 2 x
dp 4,096: ranks 0-3 are two tensor-parallel pairs, and each data-parallel
group holds two of them among 4,096), one of them a real straggler.  Each
replica reports, per iteration, every real rank's completions as it
computed them; they must be equal to the last bit, and
equal to an offline replay fed the arrivals the ranks recorded — what the
graph implies for those arrivals, computed without any process, exchange or
clock."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from prism_debug.cost import CostModel, HardwareProfile
from prism_debug.engine import ReplayEngine
from prism_debug.graph import ExecutionGraph
from tests.cli import cli
from tests.runner.hosts import run_on_two_hosts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEVICE_TIME = ROOT / "examples" / "device_time.py"
RANKS = (0, 1, 2, 3)
ITERATIONS = 4


def replicas(run_dir: Path) -> dict[int, dict[int, dict]]:
    """Per real rank, per iteration, its ``real_ops`` (the rank folders may be
    under one run folder or one per host)."""
    found = {}
    for events in sorted(run_dir.rglob("rank-*/events.jsonl")):
        rank = int(events.parent.name.removeprefix("rank-"))
        records = [json.loads(line) for line in events.read_text().splitlines()]
        found[rank] = {e["real_ops"]["iteration"]: e["real_ops"] for e in records
                       if e["kind"] == "iteration" and "real_ops" in e}
    return found


def assert_one_timeline(views: dict[int, dict[int, dict]]) -> None:
    assert sorted(views) == list(RANKS)
    iterations = sorted(views[0])
    assert iterations == list(range(1, ITERATIONS))  # the last one's is never reported
    for iteration in iterations:
        done = [views[rank][iteration]["done"] for rank in RANKS]
        assert all(d == done[0] for d in done), f"replicas differ in iteration {iteration}"
        assert sorted(done[0]) == [str(r) for r in RANKS]
        assert "inf" not in sum(done[0].values(), [])


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("timeline")
    run = cli("run", "--world-size", "8192", "--ranks", "0-3", "--no-bus",
              "--run-dir", str(run_dir), "--", sys.executable, str(DEVICE_TIME),
              "--tp", "2", "--pp", "1", "--iterations", str(ITERATIONS),
              env={"DEVICE_TIME_SLOW_RANK": "3", "DEVICE_TIME_SLOW_FACTOR": "3"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run_dir


def test_four_replicas_agree_to_the_last_bit(straggler_run):
    assert_one_timeline(replicas(straggler_run))


def replay_offline(run_dir: Path, views, slower: dict | None = None) -> ReplayEngine:
    """Rank 0's replica again, fed the ranks' recorded arrivals (``slower``:
    a rank's arrivals taken from another rank instead)."""
    config = json.loads((run_dir / "rank-0" / "agent.json").read_text())
    return replay_offline_from(Path(config["graph_path"]), config, views, slower)


def replay_offline_from(graph_path: Path, config: dict, views,
                        slower: dict | None = None) -> ReplayEngine:
    graph = ExecutionGraph.load(graph_path)
    cost = CostModel(HardwareProfile.from_dict(config["hardware"])).op_time_s
    offline = ReplayEngine(graph, cost, real_rank=0, real_ranks=RANKS, seed=config["seed"])
    own_ops = graph.programs[graph.class_of(0)].ops
    for iteration in sorted(views[0]):
        for rank in RANKS[1:]:
            source = (slower or {}).get(rank, rank)
            for op, arrival in views[source][iteration]["arrivals"]:
                offline.peer_issue(rank, iteration, op, float.fromhex(arrival))
            offline.peer_iteration_end(rank, iteration)
        for op, arrival in views[0][iteration]["arrivals"]:
            offline.real_issue(own_ops[op], float.fromhex(arrival))
        offline.real_iteration_end()
    offline.graph = graph
    return offline


def completions(engine: ReplayEngine, rank: int, iteration: int) -> list[str]:
    program = engine.graph.programs[engine.graph.class_of(rank)]
    return [engine.completion(rank, iteration, e.op).hex()
            for e in program.events(iteration) if e.action == "issue"]


def held_back(recorded: dict, quick: ReplayEngine, iteration: int) -> float:
    """How much sooner rank 0's first data-parallel all-reduce of ``iteration``
    would have completed in the ``quick`` replay than it did."""
    program = quick.graph.programs[quick.graph.class_of(0)]
    issues = [e.op for e in program.events(iteration) if e.action == "issue"]
    first_dp = next(i for i, op in enumerate(issues) if program.ops[op].family == "dp")
    return (float.fromhex(recorded[iteration]["done"]["0"][first_dp])
            - float.fromhex(completions(quick, 0, iteration)[first_dp]))


def test_the_replicas_are_what_the_graph_implies_for_the_ranks_arrivals(straggler_run):
    views = replicas(straggler_run)
    offline = replay_offline(straggler_run, views)
    for iteration in sorted(views[0]):
        for rank in RANKS:
            assert views[0][iteration]["done"][str(rank)] == completions(offline, rank, iteration)


def test_the_straggler_holds_back_a_real_rank_it_never_meets(straggler_run):
    # rank 3 (three times slower) is in a tp group with 2 and a dp group with 1;
    # rank 0 is in neither: its last op of the iteration (a dp all-reduce with
    # 2) waits for 2, whom 3 held back.  Had 2 and 3 arrived as 0 and 1 did
    # (the same classes: tp ranks 0 and 1), 0 would be done sooner.
    views = replicas(straggler_run)
    quick = replay_offline(straggler_run, views, slower={2: 0, 3: 1})
    for iteration in sorted(views[0])[1:]:  # (the first: start-up skews the arrivals)
        assert held_back(views[0], quick, iteration) > 0.01


def test_two_torchrun_hosts_share_one_timeline(straggler_run, tmp_path):
    # the same job, ranks 0-1 on one "host" and 2-3 (the straggler's) on the
    # other: two torchrun agents on this machine, each with its controller
    graph = json.loads((straggler_run / "rank-0" / "agent.json").read_text())["graph_path"]
    hosts = run_on_two_hosts(
        ["--world-size", "8192", "--ranks", "0-3", "--no-bus", "--graph", graph,
         "--run-dir", str(tmp_path), "--", sys.executable, str(DEVICE_TIME),
         "--tp", "2", "--pp", "1", "--iterations", str(ITERATIONS)],
        env={"DEVICE_TIME_SLOW_RANK": "3", "DEVICE_TIME_SLOW_FACTOR": "3"})
    assert [host.returncode for host in hosts] == [0, 0], \
        "\n".join(host.stdout for host in hosts)[-4000:]
    views = replicas(tmp_path)
    assert_one_timeline(views)
    hosts = {p.parent.name for p in tmp_path.rglob("rank-*")}
    assert hosts == {"node-0", "node-1"}
    # and the offline replay of the hosts' arrivals is what they computed
    config = json.loads(next(tmp_path.rglob("rank-0/agent.json")).read_text())
    offline = replay_offline_from(Path(graph), config, views)
    for iteration in sorted(views[0]):
        for rank in RANKS:
            assert views[0][iteration]["done"][str(rank)] == completions(offline, rank, iteration)
    # host 1's straggler holds back host 0's rank 0
    quick = replay_offline_from(Path(graph), config, views, slower={2: 0, 3: 1})
    for iteration in sorted(views[0])[1:]:
        assert held_back(views[0], quick, iteration) > 0.01


def test_perturbed_and_stochastic_peers_keep_one_timeline(straggler_run, tmp_path):
    # a slowed virtual rank and every virtual rank's compute drawn: each replica
    # puts the perturbation in force and draws the peers itself, the same way
    graph = json.loads((straggler_run / "rank-0" / "agent.json").read_text())["graph_path"]
    run = cli("run", "--world-size", "8192", "--ranks", "0-3", "--no-bus", "--graph", graph,
              "--perturb", "slow 6 2", "--variability", "cv=0.05", "--seed", "3",
              "--run-dir", str(tmp_path), "--", sys.executable, str(DEVICE_TIME),
              "--tp", "2", "--pp", "1", "--iterations", str(ITERATIONS))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    views = replicas(tmp_path)
    assert_one_timeline(views)
    # not the unperturbed timeline: the slowed peer shares rank 0's dp group
    quiet = replicas(straggler_run)
    assert views[0][2]["done"] != quiet[0][2]["done"]
