"""A directory of flight-recorder dumps, read as the untrusted input it is.

One file per rank that managed to write one, in torch's pickle format (what
``_dump_fr_trace`` returns and ``TORCH_FR_DUMP_TEMP_FILE`` + rank names): the
rank is the file name's trailing number, as torch's own reader takes it (the
dump itself does not say).  The files come from a production incident, so
nothing in them is trusted: pickles are read with an unpickler that builds
only plain data (a crafted file cannot name a class to run), sizes and
counts are capped, and every field is checked as it is read.  A damaged
file costs that file, never the directory: it is named with why, and the
others are read.

What a dump holds is kept as torch wrote it, in :class:`Entry` records; what
the entries *mean* (who never arrived where) is :mod:`.analysis`'s.  Pure
Python: no torch import.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

from prism_debug.checked import MAX_WORLD_SIZE, Untrusted
from prism_debug.errors import IncidentError

# A dump is torch's ring buffer (TORCH_FR_BUFFER_SIZE, 2,000 entries by
# default) of a few hundred bytes each; a file beyond this is not a dump.
MAX_DUMP_BYTES = 256 << 20
MAX_ENTRIES = 1 << 20
MAX_DIMS = 64
MAX_DEPTH = 4  # subfolders read below the dump directory
DEFAULT_GROUP = "0"  # the default process group's name in every backend's entries
# torch's loader: the rank is the trailing number of the file name
_RANK_SUFFIX = re.compile(r"^(.*?)(\d+)$")


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One op as a rank's flight recorder kept it (slots: a few million of
    them make a large incident)."""

    group: str  # the process group's name ("0" for the default group, "3", ...)
    group_desc: str  # what the script called it ("default_pg", "tp", ...)
    collective_seq: int  # the group's count of collectives (p2p ops: not counted)
    p2p_seq: int
    op: str  # "all_reduce", "send", ...: profiling_name without its backend
    backend: str  # "nccl", "gloo": profiling_name's prefix
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    state: str  # scheduled / started / completed (gloo never moves it on)
    created_ns: int
    started_ns: int | None
    completed_ns: int | None
    duration_ms: float | None  # NCCL with timing enabled; gloo: never
    timeout_ms: int
    frames: tuple[str, ...] = ()  # "name (file:line)", innermost first
    # a send's or recv's (sender, receiver), group ranks: "nccl:send 0->1" is (0, 1)
    p2p_ends: tuple[int, int] | None = None

    @property
    def numel(self) -> int:
        return sum(_product(shape) for shape in self.input_sizes)

    def call(self) -> str:
        """The op as a user reads it: ``all_reduce of 1024 Float``."""
        dtypes = "/".join(sorted(set(self.input_dtypes))) or "no tensor"
        return f"{self.op} of {self.numel} {dtypes}"


@dataclasses.dataclass(frozen=True)
class Dump:
    rank: int
    path: Path
    version: str
    entries: tuple[Entry, ...]
    # pg_config where it says something: group name -> its global ranks
    # (NCCL dumps list every group; gloo's name only the default one, or none)
    group_ranks: dict[str, tuple[int, ...]]
    # (name, description) of each group pg_config lists, as written: fr_trace
    # needs every group the entries name among them
    config_groups: frozenset[tuple[str, str]] = frozenset()


@dataclasses.dataclass(frozen=True)
class DumpSet:
    directory: Path
    prefix: str
    dumps: dict[int, Dump]  # by rank
    damaged: dict[str, str]  # file name -> why it could not be read

    @property
    def ranks(self) -> list[int]:
        return sorted(self.dumps)


def read_dumps(directory: str | os.PathLike[str], prefix: str | None = None) -> DumpSet:
    """Every dump under ``directory`` whose name is ``prefix`` + rank, in
    subfolders too, as torch's reader walks them (prism-debug's own dumps put
    the peers' under ``peers/``); without ``prefix``, the one prefix the
    files share.  A rank found twice is an error: which one is the dump?"""
    directory = Path(directory)
    if not directory.is_dir():
        raise IncidentError(f"{directory}: no such directory: give the folder the job's "
                            "flight-recorder dumps were written to")
    files = _files(directory)
    if prefix is None:
        prefix = _common_prefix(directory, sorted({p.name for p in files}))
    ranked: dict[str, int] = {}
    where: dict[int, Path] = {}
    for path in files:
        rank = _rank_of(path.name, prefix)
        if rank is None:
            continue
        if rank in where:
            raise IncidentError(f"{directory}: two dumps of rank {rank} ({where[rank]}, "
                                f"{path}): give the folder of one incident")
        where[rank] = path
        ranked[str(path.relative_to(directory))] = rank
    if not ranked:
        raise IncidentError(f"{directory}: no file is named {prefix!r} followed by a rank: "
                            "give --prefix (the dump files' name before the rank)")
    dumps: dict[int, Dump] = {}
    damaged: dict[str, str] = {}
    # millions of entries, none in a cycle: the cyclic collector would walk
    # them all again and again as they pile up (torch's read_dir turns it off too)
    collecting = gc.isenabled()
    gc.disable()
    try:
        for name, rank in ranked.items():
            try:
                dumps[rank] = read_dump(directory / name, rank)
            except IncidentError as error:
                damaged[name] = str(error).removeprefix(f"{directory / name}: ")
    finally:
        if collecting:
            gc.enable()
    if not dumps:
        detail = "; ".join(f"{name}: {why}" for name, why in list(damaged.items())[:3])
        raise IncidentError(f"{directory}: none of the {len(damaged)} dump files reads "
                            f"({detail}): give the files torch's flight recorder wrote")
    return DumpSet(directory, prefix, dumps, damaged)


def _files(directory: Path, depth: int = MAX_DEPTH) -> list[Path]:
    """The files under ``directory``, ``depth`` folders down at most; links
    are not followed (a link out of the folder is not the incident's)."""
    found = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False):
            found.append(Path(entry.path))
        elif entry.is_dir(follow_symlinks=False) and depth > 0:
            found += _files(Path(entry.path), depth - 1)
    return found


def _common_prefix(directory: Path, names: list[str]) -> str:
    """torch's rule: the files' names end in a rank; they must share the rest."""
    prefixes: dict[str, int] = {}
    for name in names:
        match = _RANK_SUFFIX.match(name)
        if match:
            prefixes[match.group(1)] = prefixes.get(match.group(1), 0) + 1
    if not prefixes:
        raise IncidentError(f"{directory}: no file name ends in a rank number: give the "
                            "folder torch's flight recorder wrote its dumps to")
    if len(prefixes) > 1:
        shown = ", ".join(f"{p!r} ({n})" for p, n in sorted(prefixes.items())[:5])
        raise IncidentError(f"{directory}: the files have several prefixes ({shown}): "
                            "give --prefix")
    return next(iter(prefixes))


def _rank_of(name: str, prefix: str) -> int | None:
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    if not rest.isdigit() or not rest.isascii():
        return None
    rank = int(rest)
    return rank if rank < MAX_WORLD_SIZE else None


# -- one file ------------------------------------------------------------------------


class _PlainData(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers, and nothing else: a
    dump needs no class, and a pickle that names one is not a dump."""

    def find_class(self, module: str, name: str) -> Any:
        raise IncidentError(f"holds a reference to {module}.{name}, which no flight-recorder "
                            "dump has (it is not one, or was tampered with)")


def read_dump(path: Path, rank: int) -> Dump:
    return _dump(load_plain(path), path, rank)


def load_plain(path: Path) -> Any:
    """The file's pickle as plain data, unchecked (read_dump checks it)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DUMP_BYTES + 1)
    except OSError as error:
        raise IncidentError(f"{path}: cannot be read ({error.strerror or error})") from None
    if len(data) > MAX_DUMP_BYTES:
        raise IncidentError(f"{path}: larger than {MAX_DUMP_BYTES >> 20} MiB, which no dump is")
    try:
        raw = _PlainData(io.BytesIO(data)).load()
    except IncidentError as error:
        raise IncidentError(f"{path}: {error}") from None
    except Exception as error:  # any way a damaged pickle fails
        raise IncidentError(f"{path}: not a pickle ({type(error).__name__}: {error}); "
                            "damaged or cut short") from None
    return raw


def _dump(raw: Any, path: Path, rank: int) -> Dump:
    read = Untrusted(IncidentError, str(path))
    top = read.mapping(raw, ())
    version = read.text(read.get(top, "version", ()), ("version",), most=32)
    rows = read.items(read.get(top, "entries", ()), ("entries",), most=MAX_ENTRIES)
    fast = _FastEntries()
    # the checked reading, field by field, only where the quick one finds
    # something off: it is the one that says what and where
    entries = tuple(fast.entry(row) or _entry(read, row, ("entries", i))
                    for i, row in enumerate(rows))
    groups: dict[str, tuple[int, ...]] = {}
    named: set[tuple[str, str]] = set()
    config = read.mapping(read.get(top, "pg_config", (), {}), ("pg_config",))
    for key, value in config.items():
        where = ("pg_config", str(key))
        value = read.mapping(value, where)
        name = read.text(value.get("name", key), where + ("name",), most=256)
        named.add((name, read.text(value.get("desc", ""), where + ("desc",), most=256)))
        ranks = _rank_list(read, value.get("ranks", "[]"), where + ("ranks",))
        # gloo keys and names its default group "" (its entries call it "0"),
        # and lists no ranks at all once the script has made other groups
        if ranks:
            groups[name or DEFAULT_GROUP] = ranks
    return Dump(rank, path, version, entries, groups, frozenset(named))


class _FastEntries:
    """The entries of one dump read quickly: a ring buffer repeats its ops'
    groups, names, shapes, dtypes and stacks thousands of times, so each
    distinct combination is checked once and shared.  ``entry`` returns None
    for anything the checked reading (:func:`_entry`) must look at."""

    _INT = (1 << 63) - 1
    _REPEATED = ("process_group", "profiling_name", "state", "is_p2p", "input_sizes",
                 "input_dtypes", "output_sizes", "output_dtypes", "frames")

    def __init__(self) -> None:
        self._seen: dict[str, tuple | None] = {}

    def entry(self, row: Any) -> Entry | None:
        if type(row) is not dict:
            return None
        get = row.get
        seq, p2p, created, timeout = (get("collective_seq_id", 0), get("p2p_seq_id", 0),
                                      get("time_created_ns", 0), get("timeout_ms", 0))
        started, completed = get("time_discovered_started_ns"), get("time_discovered_completed_ns")
        if not (all(type(v) is int and 0 <= v <= self._INT for v in (seq, p2p, created, timeout))
                and all(v is None or (type(v) is int and 0 <= v <= self._INT)
                        for v in (started, completed))
                and get("duration_ms") is None):  # NCCL's timing: the checked reading's
            return None
        repeated = tuple(get(k) for k in self._REPEATED)
        # repr is a faithful key for plain data (all an unpickler that builds no
        # class can give) and C-fast; the first of each combination is checked
        key = repr(repeated)
        try:
            shared = self._seen[key]
        except KeyError:
            shared = self._seen[key] = _shared_fields(repeated) if len(key) < 1 << 16 else None
        if shared is None:
            return None
        (name, desc, op, backend, state, is_p2p, ends, in_sizes, in_dtypes, out_sizes,
         out_dtypes, frames) = shared
        return Entry(name, desc, seq, p2p, op, backend, is_p2p, in_sizes, in_dtypes,
                     out_sizes, out_dtypes, state, created, started, completed, None, timeout,
                     frames, ends)


def _shared_fields(repeated: tuple) -> tuple | None:
    group, profiling, state, is_p2p, in_sizes, in_dtypes, out_sizes, out_dtypes, frames = \
        repeated
    head = _head((group, profiling, "" if state is None else state,
                  False if is_p2p is None else is_p2p))
    shapes = [_shapes([] if v is None else v) for v in (in_sizes, out_sizes)]
    dtypes = [_names([] if v is None else v) for v in (in_dtypes, out_dtypes)]
    if head is None or None in shapes or None in dtypes:
        return None
    return (*head, shapes[0], dtypes[0], shapes[1], dtypes[1],
            _frame_lines([] if frames is None else frames))


def _head(value: tuple) -> tuple | None:
    group, profiling, state, is_p2p = value
    if not (type(group) in (tuple, list) and len(group) == 2
            and all(type(g) is str and len(g) <= 256 for g in group)
            and type(profiling) is str and len(profiling) <= 256
            and type(state) is str and len(state) <= 32 and type(is_p2p) is bool):
        return None
    backend, _, op = profiling.partition(":")
    if not op:
        backend, op = "", profiling
    return group[0], group[1], op.split(" ")[0], backend, state, is_p2p, _ends(op)


def _shapes(value: Any) -> tuple | None:
    if type(value) not in (list, tuple) or len(value) > 4096:
        return None
    out = []
    for shape in value:
        if type(shape) not in (list, tuple) or len(shape) > MAX_DIMS or not all(
                type(d) is int and 0 <= d < 1 << 63 for d in shape):
            return None
        out.append(tuple(shape))
    return tuple(out)


def _names(value: Any) -> tuple | None:
    if type(value) not in (list, tuple) or len(value) > 4096 or not all(
            type(d) is str and len(d) <= 64 for d in value):
        return None
    return tuple(value)


def _frame_lines(value: Any) -> tuple[str, ...]:
    return _frames(Untrusted(IncidentError, ""), value, ())


def _entry(read: Untrusted, row: Any, at: tuple) -> Entry:
    row = read.mapping(row, at)
    group = read.get(row, "process_group", at)
    if not isinstance(group, (tuple, list)) or len(group) != 2:
        read.fail(at + ("process_group",), "must be a pair (name, description)")
    name = read.text(group[0], at + ("process_group", 0), most=256)
    desc = read.text(group[1], at + ("process_group", 1), most=256)
    profiling = read.text(read.get(row, "profiling_name", at), at + ("profiling_name",),
                          most=256)
    backend, _, op = profiling.partition(":")
    if not op:
        backend, op = "", profiling
    return Entry(
        group=name, group_desc=desc,
        collective_seq=read.int(read.get(row, "collective_seq_id", at, 0),
                                at + ("collective_seq_id",)),
        p2p_seq=read.int(read.get(row, "p2p_seq_id", at, 0), at + ("p2p_seq_id",)),
        op=op.split(" ")[0], backend=backend,
        is_p2p=bool(read.get(row, "is_p2p", at, False)),
        input_sizes=_sizes(read, row.get("input_sizes", []), at + ("input_sizes",)),
        input_dtypes=_dtypes(read, row.get("input_dtypes", []), at + ("input_dtypes",)),
        output_sizes=_sizes(read, row.get("output_sizes", []), at + ("output_sizes",)),
        output_dtypes=_dtypes(read, row.get("output_dtypes", []), at + ("output_dtypes",)),
        state=read.text(read.get(row, "state", at, ""), at + ("state",), most=32),
        created_ns=read.int(read.get(row, "time_created_ns", at, 0), at + ("time_created_ns",)),
        started_ns=_optional_int(read, row, "time_discovered_started_ns", at),
        completed_ns=_optional_int(read, row, "time_discovered_completed_ns", at),
        duration_ms=(None if row.get("duration_ms") is None
                     else read.number(row["duration_ms"], at + ("duration_ms",))),
        timeout_ms=read.int(read.get(row, "timeout_ms", at, 0), at + ("timeout_ms",)),
        frames=_frames(read, row.get("frames", []), at + ("frames",)),
        p2p_ends=_ends(op),
    )


def _ends(op: str) -> tuple[int, int] | None:
    """(sender, receiver) of "send 0->1" / "recv 1<-0"; None for a collective."""
    _, _, arrow = op.partition(" ")
    left, sep, right = arrow.partition("->") if "->" in arrow else arrow.partition("<-")
    if not (sep and left.isdecimal() and right.isdecimal() and len(arrow) < 24):
        return None
    return (int(left), int(right)) if sep == "->" else (int(right), int(left))


def _optional_int(read: Untrusted, row: dict, key: str, at: tuple) -> int | None:
    value = row.get(key)
    return None if value is None else read.int(value, at + (key,))


def _sizes(read: Untrusted, value: Any, at: tuple) -> tuple[tuple[int, ...], ...]:
    shapes = read.items(list(value) if isinstance(value, tuple) else value, at, most=4096)
    return tuple(tuple(read.int(d, at + (i, j)) for j, d in enumerate(
        read.items(list(s) if isinstance(s, tuple) else s, at + (i,), most=MAX_DIMS)))
        for i, s in enumerate(shapes))


def _dtypes(read: Untrusted, value: Any, at: tuple) -> tuple[str, ...]:
    names = read.items(list(value) if isinstance(value, tuple) else value, at, most=4096)
    return tuple(read.text(d, at + (i,), most=64) for i, d in enumerate(names))


def _frames(read: Untrusted, value: Any, at: tuple) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    frames = []
    for frame in value[:64]:
        if isinstance(frame, dict):
            frames.append(f"{frame.get('name', '?')} ({frame.get('filename', '?')}:"
                          f"{frame.get('line', '?')})")
    return tuple(frames)


def _rank_list(read: Untrusted, value: Any, at: tuple) -> tuple[int, ...]:
    """pg_config's ranks: torch writes them as text ("[0, 1, 2]"); read without eval."""
    text = read.text(value, at, most=1 << 24)
    body = text.strip().removeprefix("[").removesuffix("]").strip()
    if not body:
        return ()
    try:
        ranks = tuple(int(part) for part in body.split(","))
    except ValueError:
        read.fail(at, f"must be a list of ranks, got {text[:40]!r}")
    if any(not 0 <= r < MAX_WORLD_SIZE for r in ranks):
        read.fail(at, "holds a rank outside 0..2^31-2")
    return ranks


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
