"""torch.distributed.pipelining with shape inference at 8,192 ranks (pp=4 x dp=2048):
profiled once, each stage's messages recorded, then every stage run as the real rank."""

from __future__ import annotations

import math
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prism_debug.graph import ExecutionGraph
from prism_debug.graph.messages import OBJECTS, TENSOR
from tests.conftest import profile_output

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "pipeline_shapes.py"
WORLD, DP, MICRO_BATCH = 8192, 2048, 2
WIDTHS = (16, 32, 48, 24, 8)  # as the script: stage s is Linear(WIDTHS[s] -> WIDTHS[s + 1])
pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def profiled(profiled_graph) -> tuple[Path, str]:
    """The script profiled once for the session: the graph and what profile said."""
    out = profiled_graph("--world-size", WORLD, "--", sys.executable, SCRIPT)
    return out, profile_output(out)


@pytest.fixture(scope="module")
def stage_runs(profiled, tmp_path_factory):
    """Each stage's rank run once against the graph: its exit code and output."""
    graph, _ = profiled
    made: dict[int, tuple[int, str]] = {}

    def get(rank: int) -> tuple[int, str]:
        if rank not in made:
            made[rank] = run_rank(graph, rank, tmp_path_factory.mktemp(f"rank{rank}"))
        return made[rank]

    return get


def run_rank(graph: Path | None, rank: int, run_dir: Path) -> tuple[int, str]:
    args = ["--graph", graph] if graph is not None else ["--lockstep"]
    proc = cli("run", "--world-size", WORLD, "--rank", rank, *args, "--run-dir", run_dir,
               "--", sys.executable, SCRIPT)
    return proc.returncode, (run_dir / "rank.log").read_text() + proc.stderr


def expected_shapes(stage: int) -> str:
    inputs, outputs = [[MICRO_BATCH, WIDTHS[stage]]], [[MICRO_BATCH, WIDTHS[stage + 1]]]
    # the last stage computes the loss: nothing sends it output gradients
    grads = outputs if stage < 3 else []
    return f"stage {stage} shapes {{'inputs': {inputs}, 'outputs': {outputs}, " \
           f"'output_grads': {grads}}}"


def test_profiling_runs_each_stage_again_until_its_neighbours_have_sent(profiled):
    _, said = profiled
    # the vote forward, its result back, shapes forward, gradient shapes back: four
    # chains, each one sweep across the stages not done yet
    assert re.search(r"profile: class 4/4: rank 6144 stopped after [\d.]+ s, waiting for "
                     r"objects \(send_object_list\) #0 that rank 4096 sends \+2048 ranks away "
                     r"in iteration 1; it runs again once that class has run", said), said
    assert re.search(r"wrote .* after 13 slice runs", said), said


def test_the_graph_holds_what_each_stage_sends_its_neighbours(profiled):
    graph = ExecutionGraph.load(profiled[0])
    assert graph.class_axis == "pp" and graph.message_iterations == 3
    sent = {c: sorted((m.iteration, m.kind, m.peer_delta, m.order) for m in ms)
            for c, ms in graph.messages.items()}
    forward, backward = [(1, OBJECTS, DP, 0), (1, TENSOR, DP, 0)], \
        [(1, OBJECTS, -DP, 0), (1, TENSOR, -DP, 0)]
    assert sent == {0: forward, 1: sorted(forward + backward), 2: sorted(forward + backward),
                    3: backward}
    for stage, messages in graph.messages.items():
        for m in messages:
            if m.kind == TENSOR:  # the warm-up vote: 0, for every stage asks for inference
                assert (m.dtype, m.shape, m.payload) == ("int32", (1,), bytes(4))
                continue
            (meta,) = pickle.loads(m.payload)  # the user's own graph: trusted
            if m.peer_delta > 0:  # forward: this stage's output shapes
                assert [tuple(t.shape) for t in meta.forward_metas] == [
                    (MICRO_BATCH, WIDTHS[stage + 1])]
            else:  # backward: the gradients of this stage's inputs
                assert [tuple(t.shape) for t in meta.backward_metas] == [
                    (MICRO_BATCH, WIDTHS[stage])]


@pytest.mark.parametrize("stage", range(4))
def test_every_stage_runs_with_the_shapes_its_neighbours_send(stage_runs, stage):
    code, output = stage_runs(stage * DP)
    assert code == 0, output
    assert expected_shapes(stage) in output.splitlines()


def test_the_last_stage_loss_is_finite_and_the_same_for_the_same_seed(profiled, stage_runs,
                                                                      tmp_path):
    def losses(output: str) -> list[str]:
        return re.findall(r"^step \d loss (\S+)$", output, re.MULTILINE)

    first = losses(stage_runs(3 * DP)[1])
    code, output = run_rank(profiled[0], 3 * DP, tmp_path)
    assert code == 0, output
    assert len(first) == 3 and all(math.isfinite(float(x)) for x in first)
    assert losses(output) == first


def test_without_a_graph_the_last_stage_is_told_what_is_missing(tmp_path):
    code, output = run_rank(None, 3 * DP, tmp_path)
    assert code != 0
    assert "recv_object_list from virtual rank 4096: what that rank sends is not known " \
           "before the real rank sends objects itself.  Run with a graph" in output


def test_profile_refuses_a_receive_no_stage_answers(tmp_path):
    proc = cli("profile", "--world-size", 8, "--out", tmp_path / "g.prism", "--",
               sys.executable, SCRIPTS / "objects_unanswered.py")
    assert proc.returncode == 2
    assert proc.stderr.endswith(
        "prism-debug: error: profiling cannot finish: rank 0 needs objects (send_object_list) "
        "#0 that rank 4 sends -4 ranks away in iteration 1, and no slice gets as far "
        "as sending it (each waits for a message first: a real job would hang there too)\n")
    assert not (tmp_path / "g.prism").exists()
