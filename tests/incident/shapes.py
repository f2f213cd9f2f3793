"""Dumps shaped as torch 2.13's gloo writes them (checked against real ones:
tests/incident/test_real_incidents.py), for the cases a real job cannot
stage on demand: damaged files, ties, groups of every shape."""

import pickle
from pathlib import Path

PREFIX = "nccl_trace_rank_"


def entry(group: str, desc: str, seq: int, numel: int = 1024, *, op: str = "all_reduce",
          dtype: str = "Float", created_ns: int = 0, timeout_ms: int = 5000) -> dict:
    return {"record_id": seq - 1, "pg_id": int(group) if group.isdigit() else 0,
            "process_group": (group, desc), "thread_name": "python", "thread_id": "1",
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"gloo:{op}", "time_created_ns": created_ns or seq * 1_000_000,
            "input_sizes": [[numel]], "input_dtypes": [dtype], "output_sizes": [[numel]],
            "output_dtypes": [dtype], "state": "scheduled", "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": True, "timeout_ms": timeout_ms,
            "is_p2p": False, "frames": [{"name": "all_reduce", "filename": "train.py",
                                         "line": 7}]}


def dump(entries: list[dict], world: int | None = None) -> dict:
    ranks = f"[{', '.join(map(str, range(world)))}]" if world else "[]"
    return {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": ranks}},
            "comm_lib_version": "", "pg_status": {}, "entries": entries}


def write(directory: Path, rank: int, data, prefix: str = PREFIX) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}{rank}"
    path.write_bytes(data if isinstance(data, bytes) else pickle.dumps(data, protocol=2))
    return path


def world_job(directory: Path, world: int, reached: dict[int, int], *,
              numel: dict[int, int] | None = None) -> Path:
    """A job of one group, the world, whose ranks recorded collectives 1..N
    (``reached``: rank -> N; a rank not in it left no dump)."""
    numel = numel or {}
    for rank, last in reached.items():
        entries = [entry("0", "default_pg", seq, numel.get(rank, 1024) if seq == last else 1024,
                         created_ns=seq * 1_000_000 + rank) for seq in range(1, last + 1)]
        write(directory, rank, dump(entries, world))
    return directory
