"""Fuzzing every reader of outside input: whatever a graph file, a hardware
profile, an nccl-tests log, a command-line number or a scenario name holds,
the only exception out of its reader is a typed PrismError — never a
TypeError, KeyError, ValueError, RecursionError or MemoryError.

Each test counts the inputs it tried; ``PRISM_FUZZ_EXAMPLES`` raises the
number Hypothesis draws per test (default 150: the file runs in seconds), and
with ``-s`` the counts are printed when the module is done.
"""

from __future__ import annotations

import collections
import copy
import gzip
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism_debug.cost import CostModel, Placement, load_profile
from prism_debug.cost.calibrate import parse_nccl_tests
from prism_debug.cost.hardware import BUNDLED_DIR
from prism_debug.engine import ReplayEngine
from prism_debug.errors import ConfigError, GraphError, HardwareProfileError, ScenarioError
from prism_debug.graph import ExecutionGraph
from prism_debug.graph.selectors import number_list, rank_list
from prism_debug.process.options import OPTION_BOUNDS, option_number, parse_bytes
from prism_debug.scenario import parse_scenario
from tests.engine.test_replay import pipeline_graph, tp_then_dp_graph

EXAMPLES = int(os.environ.get("PRISM_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
TRIED: collections.Counter = collections.Counter()  # reader -> inputs tried
REFUSED: collections.Counter = collections.Counter()  # reader -> inputs refused (typed)


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    for reader in sorted(TRIED):
        print(f"\nfuzz {reader}: {TRIED[reader]} inputs, {REFUSED[reader]} refused with a "
              "typed error, the rest read")


def tried(reader: str, call, *errors):
    """``call()``, counting it; a typed refusal (one of ``errors``) is counted too."""
    TRIED[reader] += 1
    try:
        return call()
    except errors:
        REFUSED[reader] += 1
        return None


# -- graph files -------------------------------------------------------------------------

JSON_SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
                | st.sampled_from(["tp", "pp", "issue", "wait", "end", "send", "all_reduce",
                                   "objects", "tensor", "0", "1"]))
JSON = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=8)
GRAPHS = [pipeline_graph().to_dict(), tp_then_dp_graph().to_dict()]


def paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, path + (i,))


@st.composite
def mutated_graphs(draw):
    """A valid graph's dict with 1-3 places replaced by random JSON, removed,
    or duplicated."""
    data = copy.deepcopy(draw(st.sampled_from(GRAPHS)))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(paths(data))))
        if not where:
            data = draw(JSON)
            continue
        parent = data
        try:
            for key in where[:-1]:
                parent = parent[key]
            how = draw(st.sampled_from(["set", "set", "number", "number", "drop", "copy"]))
            old = parent[where[-1]]
            if how == "number" and isinstance(old, (int, float)) and not isinstance(old, bool):
                # a plausible value of the same type: most such graphs still load
                parent[where[-1]] = draw(st.integers(-3, 9) if isinstance(old, int) else
                                         st.floats(-1, 10, allow_nan=True))
            elif how in ("set", "number"):
                parent[where[-1]] = draw(JSON)
            elif how == "drop":
                del parent[where[-1]]
            elif isinstance(parent, list):
                parent.insert(where[-1], copy.deepcopy(parent[where[-1]]))
        except (KeyError, IndexError, TypeError):  # an earlier change moved it
            pass
    return data


COST = CostModel(load_profile("h100-ib400")).op_time_s


@FUZZ
@given(mutated_graphs())
def test_fuzz_graph_dicts(data):
    graph = tried("graph (mutated dicts)", lambda: ExecutionGraph.from_dict(data), GraphError)
    if graph is not None:  # what loads, replays (or the engine says, typed, why it cannot)
        tried("graph replayed after loading", lambda: ReplayEngine(graph, COST).run(2),
              GraphError)


@FUZZ
@given(st.data())
def test_fuzz_graph_files(tmp_path_factory, data):
    """Gzip streams cut short, bytes flipped, and JSON texts a graph cannot be."""
    path = tmp_path_factory.mktemp("fuzz", numbered=True) / "g.prism"
    text = json.dumps(data.draw(st.sampled_from(GRAPHS))).encode()
    whole = gzip.compress(text)
    kind = data.draw(st.sampled_from(["cut", "flip", "text", "raw"]))
    if kind == "cut":
        raw = whole[:data.draw(st.integers(0, len(whole) - 1))]
    elif kind == "flip":
        at = data.draw(st.integers(0, len(whole) - 1))
        raw = whole[:at] + bytes([whole[at] ^ data.draw(st.integers(1, 255))]) + whole[at + 1:]
    elif kind == "text":
        body = text.decode()
        at = data.draw(st.integers(0, len(body)))
        raw = gzip.compress((body[:at] + data.draw(st.text(max_size=20)) + body[at:]).encode())
    else:
        raw = data.draw(st.binary(max_size=200))
    path.write_bytes(raw)
    tried("graph (files: cut, flipped, spliced, raw)", lambda: ExecutionGraph.load(path),
          GraphError)


# -- hardware profiles -------------------------------------------------------------------

BASE = (BUNDLED_DIR / "h100-ib400.toml").read_text()
TOML_VALUES = st.sampled_from([
    "3", "-3", "0", "1e999", "nan", "inf", "-inf", "-0.0", "1.5", "true", '"370"', "'x'",
    "[]", "[1, 2, 3]", "[nan, 1, 2]", "['a', 'b', 'c']", "{}", "{ a = 1 }",
    "9" * 30, "[[1], [2], [3]]", "2026-01-01",
])


@st.composite
def mutated_profiles(draw):
    lines = BASE.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["value", "value", "drop", "key", "table", "text"]))
        key = lines[at].split("=")[0].strip() if "=" in lines[at] else "x"
        if how == "value":
            lines[at] = f"{key} = {draw(TOML_VALUES)}"
        elif how == "drop":
            del lines[at]
        elif how == "key":
            lines.insert(at, f"{draw(st.sampled_from(['links', 'fit', 'scale', 'nvlink']))} = "
                             f"{draw(TOML_VALUES)}")
        elif how == "table":
            lines.insert(at, draw(st.sampled_from(["[fit.send]", "[fit]", "[scale]", "[x]",
                                                   "[fit.all_reduce.deeper]"])))
        else:
            lines.insert(at, draw(st.text(max_size=20)))
    return "\n".join(lines) + "\n"


@FUZZ
@given(mutated_profiles())
def test_fuzz_hardware_profiles(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("hw", numbered=True) / "hw.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    profile = tried("hardware TOML", lambda: load_profile(str(path)), HardwareProfileError)
    if profile is not None:  # what loads prices every collective with a number, never NaN
        for op in ("all_reduce", "send", "all_to_all"):
            assert not math.isnan(CostModel(profile).time_s(op, 1 << 20, Placement(16, 2, 8)))


# -- nccl-tests logs ---------------------------------------------------------------------

LOG_HEAD = ("#  Rank  0 Group  0 Pid   1 on node-a device  0 [0x18] H100\n"
            "#  Rank  1 Group  0 Pid   1 on node-b device  1 [0x2a] H100\n"
            "#       size         count      type   redop    root     time   algbw   busbw "
            "#wrong\n")
TOKENS = st.sampled_from(["N/A", "nan", "inf", "-1", "0", "0.0", "1e999", "42.0", "1_000",
                          "²", "٣", "9" * 30, "1048576", "float", "sum", "", "#", "-"])


ROWS = st.tuples(st.integers(1, 1 << 40), st.floats(0, 1e6)).map(
    lambda r: f"{r[0]:>12} {r[0] // 4:>12} float sum -1 {r[1]:.2f} 1.0 1.0 0")


@FUZZ
@given(st.lists(ROWS | ROWS | st.lists(TOKENS | st.text(max_size=6), min_size=1, max_size=10)
                .map(" ".join) | st.text(max_size=40), min_size=1, max_size=6))
def test_fuzz_nccl_tests_logs(lines):
    text = LOG_HEAD + "\n".join(lines) + "\n"
    measured = tried("nccl-tests log", lambda: parse_nccl_tests(text, "all_reduce_perf.log"),
                     ConfigError)
    if measured is not None:  # what parses is sizes and times a fit can take logs of
        assert all(size > 0 and 0 < seconds < math.inf for size, seconds in measured.samples)


# -- command-line numbers and lists ------------------------------------------------------

NUMBER_TEXT = (st.text(max_size=12) | st.sampled_from([
    "nan", "-nan", "inf", "-inf", "1e999", "1e3", "0x10", "1_0", " 7 ", "+3", "٣", "²", "-0",
    "9" * 5000, "1.5", "0.0", "-1"]) | st.integers(-2**70, 2**70).map(str)
    | st.floats().map(repr))


@FUZZ
@given(st.sampled_from(sorted(OPTION_BOUNDS)), NUMBER_TEXT)
def test_fuzz_cli_numbers(option, text):
    value = tried("CLI numbers", lambda: option_number(option, text), ConfigError)
    if value is not None:
        kind, low, high = OPTION_BOUNDS[option]
        assert isinstance(value, kind) and low <= value <= high and math.isfinite(value)


LIST_TEXT = st.text(alphabet="0123456789-, node²x", max_size=30) | st.sampled_from([
    "1-10000000000", "0-2147483646", "1-" + "9" * 5000, "node 99999999999", ",", "-", "1--2"])


@FUZZ
@given(LIST_TEXT, st.sampled_from(["snapshot", "ranks", "bytes"]))
def test_fuzz_cli_lists_and_sizes(text, which):
    if which == "snapshot":
        call = lambda: number_list(text, "--snapshot-at", "iterations")  # noqa: E731
    elif which == "ranks":
        call = lambda: rank_list(text, 2**31 - 1, 8, "--trace-ranks")  # noqa: E731
    else:
        call = lambda: parse_bytes(text + "T")  # noqa: E731
    tried("CLI lists and sizes", call, ConfigError)


# -- scenario names ----------------------------------------------------------------------

@FUZZ
@given(st.text(max_size=70) | st.sampled_from(["../../x", "..", ".", "a/b", "-x", "x" * 64,
                                                "x" * 65, "a\x00b"]))
def test_fuzz_scenario_names(name):
    text = (f"name: {json.dumps(name)}\nworld: {{size: 8, rank: 0}}\n"
            "run: {command: [python, train.py]}\n")
    scenario = tried("scenario names", lambda: parse_scenario(text), ScenarioError)
    if scenario is not None:  # what is accepted is one path component, never "." or ".."
        assert scenario.name == name and "/" not in name and name not in (".", "..")
        assert not name.startswith((".", "-")) and len(name) <= 64
