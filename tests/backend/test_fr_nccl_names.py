"""What ProcessGroupNCCL records of each op (flight recorder, watchdog line),
checked against torch's own flight recorder on a real gloo group where gloo
records what NCCL does, against ProcessGroupNCCL.cpp where they differ, and
read by torch's analyzer (fr_trace) after a real run with one real fault."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from prism_debug.backend.fr_nccl_names import NcclCall, nccl_call, nccl_call_of
from prism_debug.backend.fr_recorder import FlightLog
from prism_debug.errors import ConfigError
from tests.backend.test_fr_dump_format import fr_trace

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "list_collectives.py"
WORLD = 4
F = "Float"


def test_a_one_element_list_all_gather_over_8_ranks_is_recorded_stacked():
    """The issue's case: NCCL flattens the 8 outputs into one [8, 1] tensor."""
    outputs = [torch.empty(1) for _ in range(8)]
    call = nccl_call_of("all_gather", [outputs], [torch.ones(1)], group_size=8, group_rank=3)
    assert call == NcclCall("nccl:all_gather", "ALLGATHER", ((1,),), (F,), ((8, 1),), (F,),
                            numel_in=1, numel_out=8)


@given(n=st.integers(1, 64), shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
       group_rank=st.integers(0, 63))
def test_list_forms_pass_fr_traces_size_checks_and_numels_follow_sizes(n, shape, group_rank):
    """fr_trace's checks (types.py Op.match): all-gather output numel = input
    numel x group size, reduce-scatter input numel = output numel x group size;
    WorkNCCL's numels are the recorded sizes' (collective() sums them)."""
    one = (tuple(shape), F)
    gather = nccl_call("all_gather", [one], [one] * n, group_size=n, group_rank=group_rank % n)
    scatter = nccl_call("reduce_scatter", [one] * n, [one], group_size=n,
                        group_rank=group_rank % n)
    assert math.prod(gather.output_sizes[0]) == math.prod(gather.input_sizes[0]) * n
    assert math.prod(scatter.input_sizes[0]) == math.prod(scatter.output_sizes[0]) * n
    for call in (gather, scatter):
        assert call.numel_in == sum(math.prod(s) for s in call.input_sizes)
        assert call.numel_out == sum(math.prod(s) for s in call.output_sizes)


# ProcessGroupNCCL.cpp (2.10-2.13): collective(input, output) per op, its numels
# summed over the vectors it was given; collectiveCoalesced the first of each
@pytest.mark.parametrize("call, ins, outs, expected", [
    ("all_reduce", [], [(3, 4)], ("all_reduce", "ALLREDUCE", [(3, 4)], [(3, 4)], 12, 12)),
    ("allreduce_coalesced", [], [(2,), (3,)],
     ("allreduce_coalesced", "COALESCED", [(2,), (3,)], [(2,), (3,)], 2, 2)),
    ("barrier", [], [], ("all_reduce_barrier", "ALLREDUCE", [(1,)], [(1,)], 1, 1)),
    ("_all_gather_base", [(2,)], [(8,)], ("_all_gather_base", "_ALLGATHER_BASE", [(2,)], [(8,)],
                                          2, 8)),
    ("reduce_scatter", [(2,)] * 4, [(2,)],
     ("reduce_scatter", "REDUCE_SCATTER", [(4, 2)], [(2,)], 8, 2)),
    ("_reduce_scatter_base", [(8,)], [(2,)],
     ("_reduce_scatter_base", "_REDUCE_SCATTER_BASE", [(8,)], [(2,)], 8, 2)),
    ("reduce_scatter_tensor_coalesced", [(8,), (4,)], [(2,), (1,)],
     ("reduce_scatter_tensor_coalesced", "COALESCED", [(8,), (4,)], [(2,), (1,)], 8, 2)),
    ("all_to_all", [(2,), (1,), (3,), (2,)], [(1,)] * 4,
     ("all_to_all", "ALLTOALL", [(2,), (1,), (3,), (2,)], [(1,)] * 4, 8, 4)),
    ("all_to_all_single", [(8,)], [(8,)], ("all_to_all", "ALLTOALL_BASE", [(8,)], [(8,)], 8, 8)),
    ("gather", [(3,)], [(3,)] * 4, ("gather", "GATHER", [(3,)], [(3,)] * 4, 3, 12)),
    ("scatter", [(3,)] * 4, [(3,)], ("scatter", "SCATTER", [(3,)], [(3,)] * 4, 3, 12)),
    ("coalesced", [], [], ("coalesced", "COALESCED", [], [], 0, 0)),
])
def test_each_call_as_processgroupnccl_records_it(call, ins, outs, expected):
    got = nccl_call(call, [(s, F) for s in ins], [(s, F) for s in outs], group_size=4,
                    group_rank=0)
    title, op_type, in_sizes, out_sizes, numel_in, numel_out = expected
    assert (got.profiling_name, got.op_type, list(got.input_sizes), list(got.output_sizes),
            got.numel_in, got.numel_out) == (f"nccl:{title}", op_type, in_sizes, out_sizes,
                                             numel_in, numel_out)


def test_off_the_root_gather_and_scatter_hold_nccls_undefined_placeholder():
    # "outputs.emplace_back()": an undefined tensor, sizes [0], dtype Undefined
    got = nccl_call("gather", [((3,), F)], [], group_size=4, group_rank=1)
    assert (got.output_sizes, got.output_dtypes, got.numel_out) == (((0,),), ("Undefined",), 0)
    got = nccl_call("scatter", [], [((3,), F)], group_size=4, group_rank=1)
    assert (got.input_sizes, got.output_sizes) == (((3,),), ((0,),))


def test_point_to_point_names_use_nccls_arrows_and_group_ranks():
    send = nccl_call("send", [], [((5,), F)], group_size=4, group_rank=2, peer=3)
    recv = nccl_call("recv", [], [((5,), F)], group_size=4, group_rank=3, peer=2)
    assert (send.profiling_name, recv.profiling_name) == ("nccl:send 2->3", "nccl:recv 3<-2")
    assert (recv.op_type, recv.numel_in, recv.numel_out) == ("RECV", 5, 5)
    with pytest.raises(ConfigError, match="a recv needs its peer"):
        nccl_call("recv", [], [((5,), F)], group_size=4, group_rank=3)
    with pytest.raises(ConfigError, match="no NCCL record known for 'allgather'"):
        nccl_call("allgather", [], [], group_size=4, group_rank=3)


def test_a_pipeline_pairs_send_and_receive_in_fr_trace(tmp_path):
    """Rank 0 of a two-rank group sends, receives, then waits in an all-reduce
    its peer never joins: the peer's record holds the matching receive and
    send, and fr_trace names only the missing peer."""
    log = FlightLog(0, 100, f"{tmp_path}/trace_rank_", SimpleNamespace(now=lambda: 10.0))
    pg = SimpleNamespace(pg_id=1, getGroupName=lambda: "1", getGroupDesc=lambda: "pp",
                         global_ranks=[0, 4], timeout_s=2.0, rank=lambda: 0)
    log.note(pg, "send", [torch.ones(5)], None, 1, 1.0, iteration=1)
    log.note(pg, "recv", [torch.empty(5)], None, 1, 2.0, iteration=1)
    log.note(pg, "all_reduce", [torch.ones(2)], None, None, math.inf, iteration=1)
    from prism_debug.faults import parse_fault, resolve
    log.dump(1, 3, [resolve(parse_fault("hang 4 at 1"), 8, 8)])
    peer = pickle.loads((tmp_path / "peers" / "trace_rank_4").read_bytes())["entries"]
    assert [e["profiling_name"] for e in peer] == ["nccl:recv 1<-0", "nccl:send 1->0"]
    rc, out = fr_trace(tmp_path)
    assert rc == 0, out
    assert "has errors" not in out and "missing ranks: {4}" in out.splitlines()


# -- against torch's own recorder, and fr_trace, on real runs -------------------------------

def _gloo_records(tmp_path: Path) -> list:
    """Rank 0's torch flight-recorder entries per op of the script's first
    iteration, from a real gloo job of WORLD processes."""
    record_dir = tmp_path / "gloo"
    record_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR", "PRISM"))}
    env.update(WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               BACKEND="gloo", RECORD_DIR=str(record_dir))
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", str(SCRIPT)],
                              env=env | {"RANK": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
    return json.loads((record_dir / "0.json").read_text())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prism_dump(tmp_path: Path) -> tuple[Path, list[dict], str]:
    """The script as rank 0 of WORLD under prism-debug, rank 3 hanging in
    iteration 3: the flight-record folder, rank 0's entries, what it printed."""
    graph = tmp_path / "g.prism"
    cli = [sys.executable, "-m", "prism_debug.cli"]
    proc = subprocess.run([*cli, "profile", "--world-size", str(WORLD), "--out", str(graph),
                           "--", sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / "fr"
    env = os.environ | {"TORCH_FR_BUFFER_SIZE": "2000",
                        "TORCH_FR_DUMP_TEMP_FILE": f"{folder}/trace_rank_"}
    proc = subprocess.run([*cli, "run", "--world-size", str(WORLD), "--rank", "0", "--graph",
                           str(graph), "--perturb", "hang 3 at 3", "--collective-timeout", "2",
                           "--no-bus", "--run-dir", str(tmp_path / "run"), "--",
                           sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 134, proc.stdout + proc.stderr
    entries = pickle.loads((folder / "trace_rank_0").read_bytes())["entries"]
    return folder, entries, proc.stdout + proc.stderr


# where gloo records what NCCL records: ours must equal torch's own, field by field
SAME_AS_GLOO = ("all_gather list", "all_gather list 2x3", "all_to_all list",
                "all_to_all_single", "all_reduce", "broadcast", "reduce")
# where they differ: NCCL's, from ProcessGroupNCCL.cpp (gloo's is in the docs' table,
# docs/how-to/fault-injection.md)
NCCL_ONLY = {
    "all_gather_into_tensor": ("nccl:_all_gather_base", [[2]], [[8]]),
    "reduce_scatter list": ("nccl:reduce_scatter", [[4, 2]], [[2]]),
    "reduce_scatter_tensor": ("nccl:_reduce_scatter_base", [[8]], [[2]]),
    "gather": ("nccl:gather", [[3]], [[3], [3], [3], [3]]),
    "scatter": ("nccl:scatter", [[3]], [[3], [3], [3], [3]]),
    "all_reduce_coalesced": ("nccl:allreduce_coalesced", [[2], [3]], [[2], [3]]),
    "barrier": ("nccl:all_reduce_barrier", [[1]], [[1]]),
}
FIELDS = ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes")


@pytest.mark.slow
def test_the_record_matches_torchs_own_and_fr_trace_names_only_the_hung_rank(tmp_path):
    gloo = _gloo_records(tmp_path)
    folder, ours, said = _prism_dump(tmp_path)
    assert "OpType=ALLGATHER, NumelIn=1, NumelOut=4," in said  # the timed-out list all-gather
    labels = [label for label, _ in gloo][:len(SAME_AS_GLOO) + len(NCCL_ONLY)]
    assert len(ours) > 2 * len(labels)  # two full iterations and the stuck op
    # gloo's records are of the first iteration; ours run on (the second, the stuck op)
    for (label, real), mine in zip(gloo, ours, strict=False):
        if label in SAME_AS_GLOO:
            (real,) = real
            assert mine["profiling_name"].removeprefix("nccl:") == \
                real["profiling_name"].removeprefix("gloo:"), label
            assert {k: mine[k] for k in FIELDS} == {k: real[k] for k in FIELDS}, label
        else:
            name, ins, outs = NCCL_ONLY[label]
            assert (mine["profiling_name"], mine["input_sizes"], mine["output_sizes"]) == \
                (name, ins, outs), label
    assert sorted(SAME_AS_GLOO + tuple(NCCL_ONLY)) == sorted(labels)

    rc, out = fr_trace(folder)
    assert rc == 0, out
    lines = out.splitlines()
    # every completed call matches on every rank; only the hung rank is named
    assert "has errors" not in out and "Culprit" not in out, out
    assert [line for line in lines if line.startswith("missing ranks")] == ["missing ranks: {3}"]
    assert "collective: nccl:all_gather" in lines
