import json
import pickle
import subprocess
import sys
import textwrap

import pytest

from prism_debug.backend.fr_dump_format import (
    DEFAULT_BUFFER_SIZE,
    FlightRecorder,
    buffer_size_from_env,
    dump_path,
    dump_prefix_from_env,
    pg_status_from_entries,
    python_frames,
    scalar_type_name,
    write_group_dumps,
)
from prism_debug.errors import ConfigError

GROUP = [0, 1, 2, 3]
# getCollectiveTrace's insertion order (FlightRecorderDetail.hpp), duration_ms only once known
ENTRY_KEYS = ["frames", "record_id", "pg_id", "process_group", "thread_name", "thread_id",
              "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "time_created_ns",
              "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state",
              "time_discovered_started_ns", "time_discovered_completed_ns", "retired",
              "timeout_ms", "is_p2p"]


def record_all_reduce(recorder, seq, numel=1024):
    return recorder.record(
        pg_id=0, pg_name="0", pg_desc="default_pg", ranks=GROUP, collective_seq_id=seq,
        p2p_seq_id=0, op_id=seq, profiling_name="nccl:all_reduce", input_sizes=[[numel]],
        input_dtypes=["Float"], output_sizes=[[numel]], output_dtypes=["Float"],
        timeout_ms=600_000, is_p2p=False, time_created_ns=1_000_000 * seq)


@pytest.fixture
def hung_at_fifth():
    """Rank 0 ran four all_reduces and is stuck in the fifth (started, never completed)."""
    recorder = FlightRecorder(0, DEFAULT_BUFFER_SIZE)
    for seq in range(1, 6):
        entry_id = record_all_reduce(recorder, seq)
        recorder.started(entry_id, 1_000_000 * seq + 10)
        if seq < 5:
            recorder.completed(entry_id, 1_000_000 * seq + 500)
    return recorder


def peers_like(recorder):
    return {rank: recorder.entries() for rank in GROUP}


def fr_trace(directory, *args):
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(directory), *args],
        capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr  # fr_trace logs to stderr


# ------------------------------------------------------------------------ env

def test_buffer_size_defaults_to_2000_and_zero_disables():
    assert buffer_size_from_env({}) == 2000
    assert buffer_size_from_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) == 0
    assert buffer_size_from_env({"TORCH_FR_BUFFER_SIZE": "64",
                                 "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) == 64
    for bad in ("", "lots", "-1"):
        with pytest.raises(ConfigError, match="TORCH_FR_BUFFER_SIZE"):
            buffer_size_from_env({"TORCH_FR_BUFFER_SIZE": bad})


def test_dump_prefix_follows_torch_cache_dir_rules():
    assert dump_prefix_from_env({"HOME": "/home/u"}) == "/home/u/.cache/torch/comm_lib_trace_rank_"
    assert dump_prefix_from_env({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}) == \
        "/c/torch/comm_lib_trace_rank_"
    assert dump_prefix_from_env({}) == "/tmp/.cache/torch/comm_lib_trace_rank_"
    assert dump_prefix_from_env({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/old_",
                                 "TORCH_FR_DUMP_TEMP_FILE": "/new_"}) == "/new_"
    assert str(dump_path(7, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/fr_"})) == "/d/fr_7"


# --------------------------------------------------------------------- format

def test_dump_has_torch_keys_states_and_status(hung_at_fifth, tmp_path):
    recorder = hung_at_fifth
    sixth = record_all_reduce(recorder, 6)
    recorder.completed(sixth, 7_000_000, duration_ms=0.25)
    path = recorder.dump(tmp_path / "fr_0")
    raw = path.read_bytes()
    assert raw[:2] == b"\x80\x02"
    dump = pickle.loads(raw)
    assert list(dump) == ["version", "pg_config", "comm_lib_version", "pg_status", "entries"]
    assert dump["version"] == "2.10"
    assert dump["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    assert dump["pg_status"] == {"0": {"last_enqueued_collective": 6, "last_started_collective": 5,
                                       "last_completed_collective": 6}}
    entries = dump["entries"]
    assert [e["state"] for e in entries] == ["completed"] * 4 + ["started", "completed"]
    assert list(entries[4]) == ENTRY_KEYS
    assert list(entries[5]) == ENTRY_KEYS[:11] + ["duration_ms"] + ENTRY_KEYS[11:]
    fifth = entries[4]
    assert (fifth["process_group"], fifth["record_id"], fifth["time_discovered_started_ns"],
            fifth["time_discovered_completed_ns"], fifth["retired"]) == \
        (("0", "default_pg"), 4, 5_000_010, None, False)
    assert (entries[5]["time_discovered_started_ns"], entries[5]["retired"],
            entries[5]["duration_ms"]) == (None, True, 0.25)
    assert pg_status_from_entries(entries) == dump["pg_status"]
    assert [p.name for p in tmp_path.iterdir()] == ["fr_0"]


def test_ring_buffer_keeps_the_newest_entries():
    recorder = FlightRecorder(3, 3)
    ids = [record_all_reduce(recorder, seq) for seq in range(1, 6)]
    assert ids == [0, 1, 2, 3, 4]
    recorder.completed(ids[0], 99)  # overwritten: ignored, as torch's retire_id does
    recorder.completed(ids[3], 99)
    entries = recorder.entries(only_active=True)
    assert [e["record_id"] for e in entries] == [2, 4]
    assert recorder.pg_status()["0"]["last_completed_collective"] == 4


def test_disabled_recorder_records_nothing():
    recorder = FlightRecorder(0, 0)
    assert record_all_reduce(recorder, 1) is None
    recorder.completed(None, 5)
    dump = pickle.loads(recorder.dumps())
    assert (dump["entries"], dump["pg_config"], dump["pg_status"]) == ([], {}, {})


def test_python_frames_are_innermost_first():
    frames = python_frames()
    assert frames[0]["name"] == "test_python_frames_are_innermost_first"
    assert set(frames[0]) == {"name", "filename", "line"}


def test_format_matches_a_real_torch_dump(tmp_path):
    """torch's own recorder (gloo, one rank) against ours for the same all_reduce."""
    script = textwrap.dedent(f"""
        import json, pickle, torch, torch.distributed as dist
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        dist.all_reduce(torch.ones(3, 4))
        dist.broadcast(torch.ones(2, dtype=torch.bfloat16), 0)
        dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, True, False))
        dist.destroy_process_group()
        print(json.dumps({{"keys": list(dump), "entries": [
            {{k: [type(v).__name__, v if k.endswith(("sizes", "dtypes", "state")) else None]
             for k, v in e.items()}} for e in dump["entries"]]}}))
    """)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    real = json.loads(out.stdout.strip().splitlines()[-1])

    recorder = FlightRecorder(0, 10)
    recorder.record(pg_id=0, pg_name="0", pg_desc="default_pg", ranks=[0], collective_seq_id=1,
                    p2p_seq_id=0, op_id=1, profiling_name="gloo:all_reduce",
                    input_sizes=[[3, 4]], input_dtypes=[scalar_type_name("torch.float32")],
                    output_sizes=[[3, 4]], output_dtypes=[scalar_type_name("torch.float32")],
                    timeout_ms=1_800_000, is_p2p=False, time_created_ns=1, frames=python_frames())
    mine = pickle.loads(recorder.dumps())
    assert list(mine) == real["keys"]
    ours = {k: [type(v).__name__, v if k.endswith(("sizes", "dtypes", "state")) else None]
            for k, v in mine["entries"][0].items()}
    ours["retired"] = real["entries"][0]["retired"]  # gloo retires at once; the value differs
    assert ours == real["entries"][0]
    assert real["entries"][1]["input_dtypes"][1] == [scalar_type_name("torch.bfloat16")]


# -------------------------------------------------------------------- fr_trace

def test_fr_trace_finds_nothing_in_a_healthy_hang(hung_at_fifth, tmp_path):
    write_group_dumps(f"{tmp_path}/comm_lib_trace_rank_", peers_like(hung_at_fifth),
                      pg_config=hung_at_fifth.pg_config(), pg_name="0", lead_rank=0)
    rc, out = fr_trace(tmp_path)
    assert rc == 0
    assert "sequence number" not in out and "Culprit" not in out


def test_fr_trace_names_the_rank_that_never_issued_the_collective(hung_at_fifth, tmp_path):
    by_rank = peers_like(hung_at_fifth)
    by_rank[2] = by_rank[2][:4]  # rank 2 hangs before its fifth all_reduce
    write_group_dumps(f"{tmp_path}/comm_lib_trace_rank_", by_rank,
                      pg_config=hung_at_fifth.pg_config(), pg_name="0", lead_rank=0)
    rc, out = fr_trace(tmp_path)
    assert rc == 0
    lines = out.splitlines()
    assert "Not all ranks joining collective, sequence number: 5" in lines
    assert "collective: nccl:all_reduce" in lines
    assert "missing ranks: {2}" in lines
    assert "collective state: started" in lines


def test_fr_trace_wants_every_dump_unless_told_a_rank_died(hung_at_fifth, tmp_path):
    by_rank = peers_like(hung_at_fifth)
    del by_rank[2]  # fail-stopped: a dead process writes no dump
    paths = write_group_dumps(f"{tmp_path}/comm_lib_trace_rank_", by_rank,
                              pg_config=hung_at_fifth.pg_config(), pg_name="0", lead_rank=0)
    assert sorted(paths) == [0, 1, 3]
    rc, out = fr_trace(tmp_path)
    assert rc != 0
    assert "AssertionError: Missing dump files from ranks {2}" in out
    rc, out = fr_trace(tmp_path, "--allow-incomplete-ranks")
    assert rc == 0
    assert "because we missed FR dumps from ranks ({2})" in out


def test_fr_trace_blames_the_rank_with_the_other_size(hung_at_fifth, tmp_path):
    by_rank = peers_like(hung_at_fifth)
    by_rank[1][4].update(input_sizes=[[2048]], output_sizes=[[2048]])
    write_group_dumps(f"{tmp_path}/comm_lib_trace_rank_", by_rank,
                      pg_config=hung_at_fifth.pg_config(), pg_name="0", lead_rank=0)
    rc, out = fr_trace(tmp_path, "-p", "comm_lib_trace_rank_")
    assert rc == 0
    lines = out.splitlines()
    assert "Collective sequence number: 5 has errors" in lines
    assert ("error msg: Culprit rank 1; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input "
            "sizes: '[[1024]]' does not match found input sizes: '[[2048]]'") in lines


def test_group_dumps_keep_only_the_named_group(hung_at_fifth, tmp_path):
    recorder = hung_at_fifth
    recorder.record(pg_id=1, pg_name="1", pg_desc="tp", ranks=[0, 1], collective_seq_id=1,
                    p2p_seq_id=0, op_id=1, profiling_name="nccl:all_gather",
                    input_sizes=[[8]], input_dtypes=["BFloat16"], output_sizes=[[16]],
                    output_dtypes=["BFloat16"], timeout_ms=600_000, is_p2p=False,
                    time_created_ns=9)
    paths = write_group_dumps(f"{tmp_path}/fr_", {0: recorder.entries(), 1: recorder.entries()},
                              pg_config=recorder.pg_config(), pg_name="1")
    dump = pickle.loads(paths[1].read_bytes())
    assert list(dump["pg_config"]) == ["1"]
    assert [e["profiling_name"] for e in dump["entries"]] == ["nccl:all_gather"]
    assert paths[1] == tmp_path / "fr_1"
    with pytest.raises(ConfigError, match=r"ranks \[2\] are not members"):
        write_group_dumps(f"{tmp_path}/fr_", {2: []}, pg_config=recorder.pg_config(), pg_name="1")
    with pytest.raises(ConfigError, match="not in pg_config"):
        write_group_dumps(f"{tmp_path}/fr_", {0: []}, pg_config={}, pg_name="7")
