"""Flight-recorder dumps in the pickle format of torch 2.13's ProcessGroupNCCL.

The real rank records its collectives in a :class:`FlightRecorder`; on a hang
it dumps them, and :func:`write_group_dumps` writes the virtual peers' dumps
beside it, so torch's own analyzer
(``python -m torch.distributed.flight_recorder.fr_trace DIR``) reads an
emulated failure exactly as it reads a real job's.

Field names, order and values follow ``torch/csrc/distributed/c10d/
FlightRecorder.hpp`` and ``FlightRecorderDetail.hpp`` as shipped in the 2.13
wheel (dump ``version`` "2.10"), checked against real gloo dumps.  Pure Python:
no torch import.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from prism_debug.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "BUFFER_SIZE_ENV", "COMPLETED", "DEFAULT_BUFFER_SIZE", "DUMP_PREFIX_ENV", "DUMP_VERSION",
    "FlightRecorder", "SCHEDULED", "STARTED", "buffer_size_from_env", "dtype_of_scalar_type",
    "dump_bytes", "dump_path", "dump_prefix_from_env", "pg_status_from_entries",
    "python_frames", "scalar_type_name", "write_group_dumps",
]

#: ``version_val`` in FlightRecorder.hpp; fr_trace wants "major.minor", equal on all ranks.
DUMP_VERSION = "2.10"
#: ``FlightRecorder()`` default: the recorder is on unless the env says 0.
DEFAULT_BUFFER_SIZE = 2000
#: Earlier names win; the later ones are deprecated aliases torch still reads.
BUFFER_SIZE_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
#: torch::jit::Pickler writes protocol 2 (b"\x80\x02").
PICKLE_PROTOCOL = 2

SCHEDULED, STARTED, COMPLETED = "scheduled", "started", "completed"

# c10::toString(ScalarType), which is what torch writes as input/output dtypes.
_SCALAR_TYPE_NAMES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int8": "Char", "uint8": "Byte", "int16": "Short", "int32": "Int", "int64": "Long",
    "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble",
    "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
    "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
}


# --------------------------------------------------------------------------- env

def _lookup(env: Mapping[str, str], names: Sequence[str]) -> tuple[str, str] | None:
    """torch's getCvar*: the first name that is set wins; a set alias draws a warning."""
    for alias in names[1:]:
        if alias in env:
            log.warning("Environment variable %s is deprecated; use %s instead", alias, names[0])
    for name in names:
        if name in env:
            return name, env[name]
    return None


def buffer_size_from_env(env: Mapping[str, str] = os.environ) -> int:
    """Number of entries the ring buffer holds; 0 disables the recorder.

    Unset means :data:`DEFAULT_BUFFER_SIZE` (2000): torch 2.13 records by default.
    """
    found = _lookup(env, BUFFER_SIZE_ENV)
    if found is None:
        return DEFAULT_BUFFER_SIZE
    name, value = found
    try:
        size = int(value.strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer (torch refuses it too: "
                          f"'Invalid value for environment variable: {name}')") from None
    if size < 0:
        raise ConfigError(f"{name}={size}: the flight-recorder buffer size cannot be negative")
    return size


def dump_prefix_from_env(env: Mapping[str, str] = os.environ) -> str:
    """The dump file prefix; the file of rank R is ``prefix + str(R)``.

    Unset means ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_``, or
    ``${HOME:-/tmp}/.cache/torch/comm_lib_trace_rank_`` (DebugInfoWriter::getWriter).
    An empty value is taken as is, as torch does.
    """
    found = _lookup(env, DUMP_PREFIX_ENV)
    if found is not None:
        return found[1]
    cache = env.get("XDG_CACHE_HOME")
    if cache is None:
        cache = env.get("HOME", "/tmp") + "/.cache"
    return cache + "/torch/comm_lib_trace_rank_"


def dump_path(rank: int, env: Mapping[str, str] = os.environ) -> Path:
    """Where torch would write the dump of ``rank``."""
    return Path(dump_prefix_from_env(env) + str(rank))


def scalar_type_name(dtype: Any) -> str:
    """The dtype name torch writes ("Float" for ``torch.float32``); takes a dtype or its str."""
    key = str(dtype).removeprefix("torch.")
    try:
        return _SCALAR_TYPE_NAMES[key]
    except KeyError:
        raise ConfigError(f"no flight-recorder name known for dtype {dtype!r}") from None


def dtype_of_scalar_type(name: str) -> str | None:
    """The other way: torch's dtype name ("float32") for a dump's "Float"; None if unknown."""
    return next((dtype for dtype, scalar in _SCALAR_TYPE_NAMES.items() if scalar == name), None)


def python_frames(skip: int = 0, limit: int | None = 32, *,
                  frame: FrameType | None = None) -> list[dict[str, Any]]:
    """The caller's Python stack as torch writes ``frames``: innermost first,
    each ``{"name", "filename", "line"}``.  ``skip`` drops that many callers;
    ``frame`` starts from another frame (another thread's); ``limit`` None: all."""
    if frame is None:
        frame = sys._getframe(1 + skip)
    frames: list[dict[str, Any]] = []
    while frame is not None and (limit is None or len(frames) < limit):
        code = frame.f_code
        frames.append({"name": code.co_name, "filename": code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return frames


# ----------------------------------------------------------------------- entries

@dataclasses.dataclass(slots=True)
class _Entry:
    record_id: int
    pg_id: int
    process_group: tuple[str, str]
    thread_name: str
    thread_id: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    time_created_ns: int
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    output_sizes: list[list[int]]
    output_dtypes: list[str]
    timeout_ms: int
    is_p2p: bool
    frames: list[dict[str, Any]]
    duration_ms: float | None = None
    time_discovered_started_ns: int | None = None
    time_discovered_completed_ns: int | None = None
    retired: bool = False

    @property
    def state(self) -> str:
        if self.time_discovered_completed_ns is not None:
            return COMPLETED
        return STARTED if self.time_discovered_started_ns is not None else SCHEDULED

    def to_dict(self, include_frames: bool) -> dict[str, Any]:
        """Keys in the order getCollectiveTrace inserts them."""
        d: dict[str, Any] = {"frames": [dict(f) for f in self.frames]} if include_frames else {}
        d.update(record_id=self.record_id, pg_id=self.pg_id, process_group=self.process_group,
                 thread_name=self.thread_name, thread_id=self.thread_id,
                 collective_seq_id=self.collective_seq_id, p2p_seq_id=self.p2p_seq_id,
                 op_id=self.op_id, profiling_name=self.profiling_name,
                 time_created_ns=self.time_created_ns)
        if self.duration_ms is not None:
            d["duration_ms"] = self.duration_ms
        d.update(input_sizes=[list(s) for s in self.input_sizes],
                 input_dtypes=list(self.input_dtypes),
                 output_sizes=[list(s) for s in self.output_sizes],
                 output_dtypes=list(self.output_dtypes), state=self.state,
                 time_discovered_started_ns=self.time_discovered_started_ns,
                 time_discovered_completed_ns=self.time_discovered_completed_ns,
                 retired=self.retired, timeout_ms=self.timeout_ms, is_p2p=self.is_p2p)
        return d


def _ranks_str(ranks: Iterable[int]) -> str:
    # ranks_str() in TraceUtils.h: fr_trace parses it back with ast.literal_eval
    return "[" + ", ".join(str(int(r)) for r in ranks) + "]"


def _thread_identity() -> tuple[str, str]:
    """(thread_name, thread_id) as c10::getThreadName() and std::thread::id print them."""
    try:
        name = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
    except OSError:
        name = "python"
    return name, str(threading.get_ident())


class FlightRecorder:
    """One rank's ring buffer of collective entries, as torch's FlightRecorder keeps it.

    ``record`` returns the entry id (``record_id``), or None when the recorder is
    disabled (``buffer_size`` 0), which ``started``/``completed`` accept and ignore.
    Thread-safe: the watchdog marks entries while the main thread records.
    """

    def __init__(self, rank: int, buffer_size: int, *, comm_lib_version: str = "") -> None:
        if rank < 0:
            raise ConfigError(f"rank must be >= 0, not {rank}")
        if buffer_size < 0:
            raise ConfigError(f"buffer_size must be >= 0, not {buffer_size}")
        self.rank = rank
        self.buffer_size = buffer_size
        self.comm_lib_version = comm_lib_version
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._next_slot = 0
        self._next_id = 0
        self._pg_config: dict[str, dict[str, str]] = {}
        # pg_id -> [last enqueued, last started, last completed] collective_seq_id;
        # kept outside the ring, like ProcessGroupStatus, so it survives wrap-around
        self._pg_status: dict[int, list[int]] = {}

    @property
    def enabled(self) -> bool:
        return self.buffer_size > 0

    def register_group(self, pg_name: str, pg_desc: str, ranks: Sequence[int]) -> None:
        """Add a group to ``pg_config`` (torch: record_pg_ranks at communicator init)."""
        if not self.enabled:
            return
        with self._lock:
            self._pg_config[pg_name] = {"name": pg_name, "desc": pg_desc,
                                        "ranks": _ranks_str(ranks)}

    def record(self, *, pg_id: int, pg_name: str, pg_desc: str, collective_seq_id: int,
               p2p_seq_id: int, op_id: int, profiling_name: str,
               input_sizes: Sequence[Sequence[int]], input_dtypes: Sequence[str],
               output_sizes: Sequence[Sequence[int]], output_dtypes: Sequence[str],
               timeout_ms: int, is_p2p: bool, time_created_ns: int,
               ranks: Sequence[int] | None = None,
               frames: Sequence[Mapping[str, Any]] | None = None) -> int | None:
        """Record one op as scheduled; ``ranks`` also registers its group.

        ``profiling_name`` is "<backend>:<op>" ("nccl:all_reduce", "nccl:send 0->1"
        with group-local ranks); dtypes are torch's names (:func:`scalar_type_name`).
        """
        if not self.enabled:
            return None
        if len(input_sizes) != len(input_dtypes) or len(output_sizes) != len(output_dtypes):
            raise ValueError("one dtype per input/output size list is needed")
        if ranks is not None:
            self.register_group(pg_name, pg_desc, ranks)
        thread_name, thread_id = _thread_identity()
        entry = _Entry(
            record_id=-1, pg_id=pg_id, process_group=(pg_name, pg_desc),
            thread_name=thread_name, thread_id=thread_id,
            collective_seq_id=collective_seq_id, p2p_seq_id=p2p_seq_id, op_id=op_id,
            profiling_name=profiling_name, time_created_ns=time_created_ns,
            input_sizes=[[int(d) for d in s] for s in input_sizes], input_dtypes=list(input_dtypes),
            output_sizes=[[int(d) for d in s] for s in output_sizes],
            output_dtypes=list(output_dtypes), timeout_ms=int(timeout_ms), is_p2p=is_p2p,
            frames=[dict(f) for f in frames or ()])
        with self._lock:
            entry.record_id = self._next_id
            self._next_id += 1
            if len(self._entries) < self.buffer_size:
                self._entries.append(entry)
            else:
                self._entries[self._next_slot] = entry
            self._next_slot = (self._next_slot + 1) % self.buffer_size
            status = self._pg_status.setdefault(pg_id, [-1, -1, -1])
            if not is_p2p:
                status[0] = max(status[0], collective_seq_id)
        return entry.record_id

    def _find(self, entry_id: int | None) -> _Entry | None:
        # caller holds the lock; an overwritten entry is gone, as in getEntry()
        if entry_id is None or not self.enabled:
            return None
        slot = entry_id % self.buffer_size
        if slot < len(self._entries) and self._entries[slot].record_id == entry_id:
            return self._entries[slot]
        return None

    def _mark(self, entry: _Entry, index: int, seq: int) -> None:
        if not entry.is_p2p:
            status = self._pg_status[entry.pg_id]
            status[index] = max(status[index], seq)

    def started(self, entry_id: int | None, time_ns: int) -> None:
        """The op's kernel was seen running (time_discovered_started_ns)."""
        with self._lock:
            entry = self._find(entry_id)
            if entry is not None and entry.time_discovered_started_ns is None:
                entry.time_discovered_started_ns = time_ns
                self._mark(entry, 1, entry.collective_seq_id)

    def completed(self, entry_id: int | None, time_ns: int, *,
                  duration_ms: float | None = None) -> None:
        """The op was seen done; the watchdog retires it (``retired`` True).

        torch leaves time_discovered_started_ns None here unless timing
        (TORCH_NCCL_ENABLE_TIMING) is on; call ``started`` for that."""
        with self._lock:
            entry = self._find(entry_id)
            if entry is None:
                return
            if entry.time_discovered_completed_ns is None:
                entry.time_discovered_completed_ns = time_ns
                self._mark(entry, 2, entry.collective_seq_id)
            entry.retired = True
            if duration_ms is not None:
                entry.duration_ms = float(duration_ms)

    def entries(self, *, include_stack_traces: bool = True,
                only_active: bool = False) -> list[dict[str, Any]]:
        """The buffer oldest first, as dump dicts; ``only_active`` drops completed ones."""
        with self._lock:
            ordered = self._entries[self._next_slot:] + self._entries[:self._next_slot]
            return [e.to_dict(include_stack_traces) for e in ordered
                    if not (only_active and e.state == COMPLETED)]

    def pg_config(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return {name: dict(info) for name, info in self._pg_config.items()}

    def pg_status(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {str(pg_id): _status_dict(*self._pg_status[pg_id])
                    for pg_id in sorted(self._pg_status)}

    def dumps(self, pg_status: Mapping[str, Mapping[str, int]] | None = None, *,
              include_stack_traces: bool = True, only_active: bool = False) -> bytes:
        """The pickle torch's ``_dump_fr_trace`` returns; ``pg_status`` overrides the
        tracked one."""
        return dump_bytes(
            entries=self.entries(include_stack_traces=include_stack_traces,
                                 only_active=only_active),
            pg_config=self.pg_config(),
            pg_status=self.pg_status() if pg_status is None else pg_status,
            comm_lib_version=self.comm_lib_version)

    def dump(self, path: str | os.PathLike[str] | None = None,
             pg_status: Mapping[str, Mapping[str, int]] | None = None, **options: bool) -> Path:
        """Write the dump atomically to ``path`` (default: :func:`dump_path` of this rank)."""
        target = dump_path(self.rank) if path is None else Path(path)
        _write_atomically(target, self.dumps(pg_status, **options))
        log.info("Finished writing Flight Recorder debug info to %s", target)
        return target


def _status_dict(enqueued: int, started: int, completed: int) -> dict[str, int]:
    return {"last_enqueued_collective": enqueued, "last_started_collective": started,
            "last_completed_collective": completed}


def pg_status_from_entries(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """``pg_status`` as a rank with these (collective) entries would report it."""
    status: dict[int, list[int]] = {}
    for e in entries:
        last = status.setdefault(int(e["pg_id"]), [-1, -1, -1])
        if e["is_p2p"]:
            continue
        seq = int(e["collective_seq_id"])
        last[0] = max(last[0], seq)
        if e["time_discovered_started_ns"] is not None:
            last[1] = max(last[1], seq)
        if e["state"] == COMPLETED:
            last[2] = max(last[2], seq)
    return {str(pg_id): _status_dict(*status[pg_id]) for pg_id in sorted(status)}


def dump_bytes(*, entries: Sequence[Mapping[str, Any]], pg_config: Mapping[str, Mapping[str, str]],
               pg_status: Mapping[str, Mapping[str, int]], comm_lib_version: str = "") -> bytes:
    """One rank's dump, top-level keys in FlightRecorder::dump() order."""
    return pickle.dumps({
        "version": DUMP_VERSION,
        "pg_config": {name: dict(info) for name, info in pg_config.items()},
        "comm_lib_version": comm_lib_version,
        "pg_status": {pg: dict(s) for pg, s in pg_status.items()},
        "entries": [dict(e) for e in entries],
    }, protocol=PICKLE_PROTOCOL)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".fr-", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        # fr_trace loads every file whose name holds the prefix: leave no debris
        Path(partial).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------ group dumps

def write_group_dumps(prefix: str | os.PathLike[str],
                      entries_by_rank: Mapping[int, Sequence[Mapping[str, Any]]], *,
                      pg_config: Mapping[str, Mapping[str, str]], pg_name: str | None = None,
                      lead_rank: int | None = None, comm_lib_version: str = "") -> dict[int, Path]:
    """Write one dump per rank (``prefix + str(rank)``) so fr_trace sees a whole group.

    ``entries_by_rank`` holds each rank's entries as :meth:`FlightRecorder.entries`
    gives them (a virtual peer's are usually the real rank's, edited: an op left
    out, another size).  A rank of the group missing from it gets no file: that is
    how a fail-stopped rank looks (fr_trace then needs ``--allow-incomplete-ranks``).

    ``pg_name`` restricts every dump to that group, both entries and
    ``pg_config``: fr_trace insists on a dump from every member of every group
    it is shown, which for the default group of a huge job means every rank.

    fr_trace takes the first dump it loads as the reference and blames the
    ranks that differ from it.  It walks the directory top-down, a folder's files
    before its subfolders', so with ``lead_rank`` that rank's dump goes at
    ``prefix`` and the others under ``peers/`` beside it: the reference is
    pinned instead of left to the order ``os.scandir`` happens to give.
    """
    prefix = os.fspath(prefix)
    config = {name: dict(info) for name, info in pg_config.items()}
    if pg_name is not None:
        if pg_name not in config:
            raise ConfigError(f"group {pg_name!r} is not in pg_config ({sorted(config)})")
        config = {pg_name: config[pg_name]}
        members = {int(r) for r in _parse_ranks(config[pg_name]["ranks"])}
        strangers = set(entries_by_rank) - members
        if strangers:
            raise ConfigError(f"ranks {sorted(strangers)} are not members of group {pg_name!r} "
                              f"{sorted(members)}")
        absent = members - set(entries_by_rank)
        if absent:
            log.info("no flight-recorder dump for ranks %s of group %r (fail-stopped)",
                     sorted(absent), pg_name)
    if lead_rank is not None and lead_rank not in entries_by_rank:
        raise ConfigError(f"lead rank {lead_rank} has no entries to dump")
    head, name = os.path.split(prefix)
    written: dict[int, Path] = {}
    for rank in sorted(entries_by_rank):
        entries = [dict(e) for e in entries_by_rank[rank]
                   if pg_name is None or e["process_group"][0] == pg_name]
        if lead_rank is None or rank == lead_rank:
            path = Path(prefix + str(rank))
        else:
            path = Path(head, "peers", name + str(rank))
        _write_atomically(path, dump_bytes(entries=entries, pg_config=config,
                                           pg_status=pg_status_from_entries(entries),
                                           comm_lib_version=comm_lib_version))
        written[rank] = path
    return written


def _parse_ranks(text: str) -> list[int]:
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ConfigError(f"pg_config ranks {text!r} is not a list like '[0, 1]'")
    inner = body[1:-1].strip()
    return [int(r) for r in inner.split(",")] if inner else []
