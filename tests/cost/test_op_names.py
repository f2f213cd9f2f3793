"""One spelling set for collectives everywhere (issue 15, point 7): every
reader of an op name — ``cost --op``, ``calibrate --nccl-tests OP=PATH``, the
console's ``break coll OP``, graph files, the cost model — accepts the same
spellings, reads them as the same canonical name, and refuses the same
others with one message naming the canonical names.

Before issue 15, ``cost --op allreduce`` was refused while the console took
``break coll allreduce``, and the console took any word at all."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.cli import main
from prism_debug.console.parsing import parse_break
from prism_debug.cost import ALIASES, COLLECTIVES, CostModel, Placement, load_profile
from prism_debug.errors import ConfigError, GraphError
from prism_debug.graph import ExecutionGraph
from tests.engine.test_replay import pipeline_graph

DATA = Path(__file__).parent / "data"
NAMES = ("all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, "
         "scatter, barrier, send, recv")
MODEL = CostModel(load_profile("h100-ib400"))
GRAPH = pipeline_graph().to_dict()  # world of 4: pp 2 x tp 2


# -- every reader, as one function: the canonical name it reads, or the error ----------


def via_model(word: str) -> str:
    return MODEL.estimate(word, 1024, Placement(8, 1, 8)).op


def via_console(word: str) -> str:
    return parse_break(f"coll {word} dp seq 2")["op"]


def via_graph(word: str) -> str:
    data = copy.deepcopy(GRAPH)
    data["programs"][0]["ops"][0][0] = word  # an op on tp, one mesh axis: any kind fits
    return ExecutionGraph.from_dict(data).programs[0].ops[0].kind


def via_cost_cli(word: str) -> str:
    result = CliRunner().invoke(main, ["cost", "--op", word, "--bytes", "1M", "--ranks", "8",
                                       "--json"])
    if result.exit_code != 0:
        raise ConfigError(result.output)
    return json.loads(result.output)["op"]


READERS = [via_model, via_console, via_graph, via_cost_cli]


# spellings: a listed alias, its letters' case changed, its separators any of _ - or none
@st.composite
def spellings(draw):
    alias, canonical = draw(st.sampled_from(sorted(ALIASES.items())))
    parts = alias.replace("-", "_").split("_")
    seps = [draw(st.sampled_from(["_", "-", ""])) for _ in parts[1:]]
    word = parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=True))
    word = "".join(c.upper() if draw(st.booleans()) else c for c in word)
    return word, canonical


@settings(max_examples=150, deadline=None)
@given(spellings())
def test_every_spelling_one_reader_takes_every_reader_takes_as_the_same_op(spelling):
    word, canonical = spelling
    assert [read(word) for read in READERS] == [canonical] * len(READERS)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=20))
def test_a_word_one_reader_refuses_every_reader_refuses(word):
    outcomes = []
    for read in READERS:
        try:
            outcomes.append(read(word))
        except (ConfigError, GraphError) as exc:
            outcomes.append(None)
            assert NAMES in str(exc)
    assert len(set(outcomes)) == 1, (word, outcomes)


def test_the_table_names_the_spellings_people_type():
    for word, canonical in [("allreduce", "all_reduce"), ("all-reduce", "all_reduce"),
                            ("AllReduce", "all_reduce"), ("reducescatter", "reduce_scatter"),
                            ("reduce-scatter", "reduce_scatter"), ("allgather", "all_gather"),
                            ("all_gather_into_tensor", "all_gather"),
                            ("reduce_scatter_tensor", "reduce_scatter"),
                            ("alltoall", "all_to_all"), ("all_to_all_single", "all_to_all"),
                            ("isend", "send"), ("irecv", "recv"), ("sendrecv", "send"),
                            ("broadcast", "broadcast")]:
        assert [read(word) for read in READERS] == [canonical] * len(READERS), word
    assert set(ALIASES.values()) == set(COLLECTIVES)


def test_an_unknown_op_is_one_line_naming_the_canonical_names():
    proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", "cost", "--op", "alreduce",
                           "--bytes", "1M", "--ranks", "8"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == (
        "prism-debug: error: --op: unknown collective 'alreduce' (did you mean all_reduce?); "
        f"use one of {NAMES} (case, '_' and '-' do not matter: allreduce and all-reduce are "
        "all_reduce)\n")
    with pytest.raises(ConfigError) as info:
        parse_break("coll alreduce")
    assert str(info.value).startswith("break coll: unknown collective 'alreduce' (did you "
                                      "mean all_reduce?); use one of ")
    data = copy.deepcopy(GRAPH)
    data["programs"][0]["ops"][0][0] = "alreduce"
    with pytest.raises(GraphError, match=f"must be one of {NAMES}, got 'alreduce'"):
        ExecutionGraph.from_dict(data)


def test_cost_cli_takes_the_console_s_spelling_in_a_real_process():
    out = {}
    for word in ("all_reduce", "allreduce", "all-reduce"):
        proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", "cost", "--op", word,
                               "--bytes", "1G", "--ranks", "16"], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        out[word] = proc.stdout
    assert out["allreduce"] == out["all-reduce"] == out["all_reduce"]
    assert out["allreduce"].startswith("all_reduce of 1073741824 bytes on 16 ranks")


def test_calibrate_reads_op_equals_path_in_any_spelling(tmp_path):
    log = DATA / "all_reduce_perf_8xh100.txt"
    outs = []
    for word in ("all_reduce", "AllReduce", "all-reduce"):
        proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", "calibrate",
                               "--nccl-tests", f"{word}={log}", "--out",
                               str(tmp_path / f"{word}.toml")], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout.splitlines()[:-1])  # (the last line names the file)
    assert outs[0] == outs[1] == outs[2]
    proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", "calibrate",
                           "--nccl-tests", f"alreduce={log}", "--out", str(tmp_path / "x.toml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"prism-debug: error: --nccl-tests alreduce={log}: unknown "
                                  "collective 'alreduce' (did you mean all_reduce?)")
