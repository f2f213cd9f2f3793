"""A graph file is untrusted until read: each malformed one is refused with one
GraphError line naming the key at fault and what to do, a gzip bomb is refused
after the cap without being held, and the CLI prints that line, no traceback."""

import copy
import gzip
import json
import subprocess
import sys
import zlib

import pytest

from prism_debug.errors import GraphError
from prism_debug.graph import ExecutionGraph
from tests.engine.test_replay import pipeline_graph

MAX_GRAPH_ENV = "PRISM_DEBUG_MAX_GRAPH_MB"  # (a literal: the test runs against older code too)
ADVICE = ": give a file prism-debug profile wrote, or profile the job again"
NOT_A_GRAPH = ": give a file prism-debug profile wrote (a gzipped JSON graph)"


def write(path, data=None, raw: bytes | None = None):
    with gzip.open(path, "wb") as f:
        f.write(raw if raw is not None else json.dumps(data).encode())
    return path


def mutated(change):
    data = copy.deepcopy(pipeline_graph().to_dict())  # world of 4: pp 2 x tp 2
    change(data)
    return data


def put(*path_value):
    *path, value = path_value

    def change(data):
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value
    return change


MALFORMED = [
    ("not-an-object", lambda d: None, [1, 2], "the top level must be a mapping, got a list"),
    ("mesh-int", put("mesh", 3), None, "mesh must be a mapping, got 3"),
    ("shape-string", put("mesh", "shape", 1, "2"), None,
     "mesh.shape[1] must be an integer, got '2'"),
    ("shape-negative", put("mesh", "shape", 1, -2), None,
     "mesh.shape[1] must be in [1, 2147483647], got -2"),
    ("world-too-large", put("mesh", "shape", [2**20, 2**20]), None,
     "mesh.shape must make at most 2147483647 ranks, got 1099511627776"),
    ("op-index-nowhere", put("programs", 0, "steady", 0, ["issue", 1.0, 9]), None,
     "programs[0].steady[0][2] must name an op of class 0 (0-1), got 9"),
    ("wait-before-issue", put("programs", 0, "steady", 1, ["wait", 0.0, 1]), None,
     "programs[0].steady[1][2] must wait for an op the iteration issued, got 1"),
    ("gap-negative", put("programs", 0, "steady", 0, ["issue", -1.0, 0]), None,
     "programs[0].steady[0][1] must be >= 0, got -1.0"),
    ("gap-string", put("programs", 0, "steady", 0, ["issue", "1", 0]), None,
     "programs[0].steady[0][1] must be a number, got '1'"),
    ("no-end", put("programs", 0, "steady", 4, ["wait", 0.0, 1]), None,
     "programs[0].steady[4][0] must end with one end event, its last"),
    ("class-id", put("programs", 1, "class_id", 5), None,
     "programs[1].class_id must be 1, its position, got 5"),
    ("nbytes-float", put("programs", 0, "ops", 0, 2, 1.5), None,
     "programs[0].ops[0][2] must be an integer, got 1.5"),
    ("op-kind", put("programs", 0, "ops", 0, 0, "rm -rf"), None,
     "programs[0].ops[0][0] must be one of all_reduce, all_gather, reduce_scatter, "
     "all_to_all, broadcast, reduce, gather, scatter, barrier, send, recv, got 'rm -rf'"),
    ("peer-outside", put("programs", 0, "ops", 1, 4, 99), None,
     "programs[0].ops[1][4] must be in [-4, 4], got 99"),
    ("group-family-nowhere", put("programs", 0, "ops", 0, 1, "dp"), None,
     "class 0 uses family 'dp', which the graph does not define"),
    ("family-axis-nowhere", put("families", "tp", ["zz"]), None,
     "the mesh has no axis 'zz' (axes: pp, tp)"),
    ("gpus-zero", put("gpus_per_node", 0), None, "gpus_per_node must be in [1, 65536], got 0"),
    ("gpus-bool", put("gpus_per_node", True), None, "gpus_per_node must be an integer, got True"),
    ("message-class", put("messages", {"7": []}), None,
     "messages.7 must name a class of the graph (0-1)"),
    ("programs-missing", lambda d: d.pop("programs"), None, "missing programs"),
    ("command-ints", put("command", [1, 2]), None, "command[0] must be a string, got 1"),
]


@pytest.mark.parametrize(("name", "change", "data", "message"), MALFORMED,
                         ids=[m[0] for m in MALFORMED])
def test_each_malformed_graph_gives_its_one_line(tmp_path, name, change, data, message):
    path = write(tmp_path / "g.prism", data if data is not None else mutated(change))
    with pytest.raises(GraphError) as caught:
        ExecutionGraph.load(path)
    assert str(caught.value) == f"malformed graph {path}: {message}{ADVICE}"


@pytest.mark.parametrize(("raw", "why"), [
    (b'{"version": 2, "x": NaN}', "NaN is not a number a graph holds"),
    (b"[" * 100_000, "nested too deeply"),
    (b"\xff\xfe{}", "not UTF-8 JSON (invalid start byte at byte 0)"),
    (b'{"version": 2, "gpus_per_node": ' + b"9" * 5000 + b"}",
     "Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"),
])
def test_json_a_graph_cannot_hold_is_refused(tmp_path, raw, why):
    path = write(tmp_path / "g.prism", raw=raw)
    with pytest.raises(GraphError) as caught:
        ExecutionGraph.load(path)
    assert str(caught.value) == f"{path} is not a prism-debug graph file: {why}{NOT_A_GRAPH}"


def test_truncated_and_corrupted_gzip_are_refused(tmp_path):
    path = tmp_path / "g.prism"
    whole = gzip.compress(json.dumps(pipeline_graph().to_dict()).encode())
    path.write_bytes(whole[:50])
    with pytest.raises(GraphError, match="Compressed file ended before the end-of-stream"):
        ExecutionGraph.load(path)
    path.write_bytes(whole[:10] + b"garbage, not deflate")
    with pytest.raises(GraphError) as caught:
        ExecutionGraph.load(path)
    assert str(caught.value) == (f"{path} is not a prism-debug graph file: Error -3 while "
                                 f"decompressing data: invalid block type{NOT_A_GRAPH}")


def bomb(path, mib: int):
    """``mib`` MiB of zeros as concatenated gzip members: a thousandfold smaller."""
    member = gzip.compress(bytes(16 << 20), compresslevel=9)
    with open(path, "wb") as f:
        for _ in range(mib // 16):
            f.write(member)
    return path


# Loads a graph in a fresh interpreter and prints (its peak RSS growth in MiB,
# seconds, the error); a fresh process, so the growth is the load's alone.
MEASURE = """
import resource, sys, time
from prism_debug.graph import ExecutionGraph
from prism_debug.errors import PrismError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    ExecutionGraph.load(sys.argv[1]); error = ""
except PrismError as exc:
    error = f"{type(exc).__name__}: {exc}"
except Exception as exc:
    error = f"{type(exc).__name__}"
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(f"{grown:.1f}|{time.perf_counter() - started:.2f}|{error}")
"""


def measure_load(path, env=None):
    import os

    out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, **(env or {})})
    grown, seconds, error = out.stdout.strip().split("|", 2)
    return float(grown), float(seconds), error


def test_a_gzip_bomb_over_a_lowered_cap_is_refused_without_holding_it(tmp_path):
    path = bomb(tmp_path / "bomb.prism", 64)  # 64 MiB of zeros in ~70 KB
    assert path.stat().st_size < 200_000
    grown, seconds, error = measure_load(path, {MAX_GRAPH_ENV: "1"})
    print(f"64 MiB bomb, cap 1 MiB: RSS +{grown} MiB, {seconds} s")
    assert error == (f"GraphError: {path} decompresses to more than 1 MiB, the most a graph "
                     f"may: if you trust it, raise the cap with {MAX_GRAPH_ENV}=MiB")
    assert grown < 16 and seconds < 5


def test_a_gzip_bomb_over_the_default_cap_is_counted_not_held(tmp_path):
    path = bomb(tmp_path / "bomb.prism", 512)  # 512 MiB of zeros, over the 256 MiB cap
    grown, seconds, error = measure_load(path)
    print(f"512 MiB bomb, default cap 256 MiB: RSS +{grown} MiB, {seconds} s")
    assert error.startswith(f"GraphError: {path} decompresses to more than 256 MiB")
    assert grown < 32 and seconds < 30  # (decompressing 256 MiB: ~0.5 s on a quiet core)


def test_a_bad_cap_setting_is_one_line(tmp_path, monkeypatch):
    path = pipeline_graph().save(tmp_path / "g.prism") or tmp_path / "g.prism"
    monkeypatch.setenv(MAX_GRAPH_ENV, "lots")
    with pytest.raises(GraphError) as caught:
        ExecutionGraph.load(path)
    assert str(caught.value) == f"{MAX_GRAPH_ENV}='lots': give a whole number of MiB, 1 to 1048576"
    monkeypatch.setenv(MAX_GRAPH_ENV, "1")
    assert ExecutionGraph.load(path) == pipeline_graph()  # small graphs load under any cap


def test_a_valid_graph_still_round_trips(tmp_path):
    graph = pipeline_graph()
    graph.save(tmp_path / "g.prism")
    assert ExecutionGraph.load(tmp_path / "g.prism") == graph


@pytest.mark.parametrize("command", ["replay", "graph show"])
def test_the_cli_prints_one_line_and_no_traceback(tmp_path, command):
    path = write(tmp_path / "g.prism", [1, 2])
    out = subprocess.run([sys.executable, "-m", "prism_debug.cli", *command.split(), str(path)],
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (f"prism-debug: error: malformed graph {path}: the top level must be a "
                          f"mapping, got a list{ADVICE}\n")


def test_zlib_error_is_what_corrupt_deflate_raises():
    # why load catches zlib.error: gzip lets it through for a damaged block
    with pytest.raises(zlib.error):
        gzip.decompress(gzip.compress(b"x" * 100)[:10] + b"garbage, not deflate")
