"""prism-debug predict from the command line: what it prints, its JSON and
picture, and one clear line for bad input."""

import json

import pytest
from click.testing import CliRunner

from prism_debug.cli import main
from prism_debug.cost import CostModel, Placement, load_profile
from prism_debug.predict.closedform import ddp_graph

GAP_S = 0.1


@pytest.fixture
def ddp_file(tmp_path):
    path = tmp_path / "ddp.prism"
    ddp_graph(64, GAP_S).save(path)
    return str(path)


def invoke(*args):
    return CliRunner().invoke(main, ["predict", *args, "--jobs", "1"])


def cost_s(ranks):
    graph = ddp_graph(ranks, GAP_S)
    return CostModel(load_profile("h100-ib400")).op_time_s(graph.programs[0].ops[0],
                                                           Placement.of(range(ranks), 8))


def test_predict_prints_the_table_beside_the_deterministic_replay(ddp_file):
    result = invoke(ddp_file, "--samples", "20", "--iterations", "2",
                    "--variability", "cv=0.05 dist=normal", "--slowdown", "1.05")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"predict: {ddp_file}, world 64, rank 0 (class 0); 20 samples × "
                               "2 iterations, seed 0; ")
    deterministic = f"{(GAP_S + cost_s(64)) * 1e3:.3f}"
    assert lines[3].split()[:2] == ["iteration", deterministic]
    assert lines[4].split()[:2] == ["2", "iterations"]
    assert float(lines[4].split()[2]) == pytest.approx(2 * float(deterministic), abs=1e-3)
    assert lines[5].startswith("P(slowdown > 1.05×) = ")
    assert "tail attribution: the first 20 samples again" in result.output
    # one class, one op kind with compute before it: the same gaps removed, the same change
    class_row, op_row = sorted(lines[-2:])
    assert class_row.split()[:3] == ["class", "0", "100.0%"]
    assert op_row.split()[:3] == ["op", "all_reduce", "100.0%"]
    assert class_row.split()[3:] == op_row.split()[3:]
    assert float(class_row.split()[3]) < 0


def test_predict_json_and_plot(ddp_file, tmp_path):
    picture = tmp_path / "cdf.png"
    result = invoke(ddp_file, "--samples", "5", "--iterations", "3", "--variability",
                    "cv=0.05", "--json", "--plot", str(picture), "--perturb",
                    "slow fraction:0.01 1.2", "--seed", "4", "--no-attribution")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["samples"], data["iterations"], data["seed"]) == (5, 3, 4)
    assert len(data["times_s"]) == 5 and all(len(row) == 3 for row in data["times_s"])
    # one rank in 64 computes 1.2 g: the whole world waits for it at the all-reduce
    assert data["deterministic_times_s"] == pytest.approx([1.2 * GAP_S + cost_s(64)] * 3)
    assert data["perturbations"] == [{"text": "slow fraction:0.01 1.2", "hits": 1}]
    assert data["attribution"] is None
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("args", "message"), [
    (["missing.prism"], "no graph file at missing.prism: make one with prism-debug profile"),
    (["GRAPH", "--samples", "0", "--variability", "cv=0.05"],
     "--samples must be at least 1, got 0"),
    (["GRAPH", "--variability", "cv=0.05", "--plot", "no/such/dir/cdf.png"], None),
    (["GRAPH"], "GRAPH holds no fitted distributions (profile the job again for them, with "
                "repeated steady iterations): give --variability, e.g. --variability cv=0.05"),
    (["GRAPH", "--variability", "class=3 cv=0.1"],
     "--variability 'class=3 cv=0.1 dist=lognormal': class 3 is not in the graph: it has "
     "classes 0-0"),
    (["GRAPH", "--variability", "cv=0.05", "--slowdown", "0"],
     "--slowdown must be a positive number, got 0"),
])
def test_bad_input_is_one_line(ddp_file, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    args = [ddp_file if a == "GRAPH" else a for a in args]
    if message is None:
        message = (f"--plot no/such/dir/cdf.png: directory {tmp_path / 'no/such/dir'} does "
                   "not exist")
    message = message.replace("GRAPH", ddp_file)
    result = invoke(*args)
    assert (result.exit_code, result.stderr) == (2, f"prism-debug: error: {message}\n")


def test_the_help_states_the_cores_defaults():
    from prism_debug.predict import (
        ATTRIBUTION_SAMPLES,
        DEFAULT_ITERATIONS,
        DEFAULT_SAMPLES,
        DEFAULT_SLOWDOWNS,
    )

    text = " ".join(CliRunner().invoke(main, ["predict", "--help"]).output.split())
    assert f"whole world [default: {DEFAULT_SAMPLES}]" in text
    assert f"after the warm-up [default: {DEFAULT_ITERATIONS}]" in text
    assert f"[default: {', '.join(map(str, DEFAULT_SLOWDOWNS))}]" in text
    assert f"up to {ATTRIBUTION_SAMPLES} samples" in text
