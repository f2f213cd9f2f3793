"""The execution graph: what every rank of the world does in one iteration.

Size O(classes × ops), never O(ranks × ops) (DESIGN.md §4).  The world is a
*mesh*: ranks numbered row-major over named axes (``pp × dp × tp`` for the
bundled example), and every group family is a set of axes — a tensor-parallel
group varies ``tp`` and fixes the rest.  Ranks whose coordinate on the *class
axis* is the same run the same program (one class per pipeline stage); a
graph without a class axis has one class.

A class program is a list of events, each after ``gap_s`` seconds of compute
since the previous event of the same rank: *issue* an op (a collective on a
family, or a point-to-point op with the rank ``peer`` steps away on a
family's axis), *wait* for an issued op, or *end* the iteration.  Programs
have ``warmup`` iterations (DDP builds and then rebuilds its buckets,
pipelines handshake) and a ``steady`` part that repeats after them.

Point-to-point ops issued by one ``batch_isend_irecv`` carry the batch's
number (counted from 1 in each iteration): NCCL runs them as one group.

A steady gap is the median of the profiled iterations' gaps; beside it the
graph keeps how those gaps spread (``gap_fits``, graph/fits.py): a fitted
distribution of the factor a gap varies by, where the profile had the samples.

Beside the programs, the graph keeps the messages each class sends outside
the tensor data path (``graph/messages.py``: pipelining's shape metadata),
so a virtual peer hands the real rank what that stage really sends.  They
are pickles: a graph file is as trusted as code (see :meth:`ExecutionGraph.load`).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import stat
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from prism_debug.checked import MAX_GPUS_PER_NODE, MAX_WORLD_SIZE, Untrusted, member_of
from prism_debug.cost.ops import op_name, op_problem
from prism_debug.errors import GraphError
from prism_debug.graph.fits import FAMILIES as FIT_FAMILIES
from prism_debug.graph.fits import MIN_SAMPLES as MIN_FIT_SAMPLES
from prism_debug.graph.fits import POOLINGS, GapFit, param_problem
from prism_debug.graph.messages import KINDS as MESSAGE_KINDS
from prism_debug.graph.messages import PeerMessage, messages_from_json, messages_to_json

# 2: p2p batches and the messages (peer objects, control tensors) classes send.
# Version 1 had neither: still read where it has no point-to-point ops
# (nothing to batch, no messages), refused where it has (its batches would
# run one by one).  3: fitted gap distributions (gap_fits); versions 1 and 2
# read with none.
GRAPH_VERSION = 3
READABLE_VERSIONS = (1, 2, GRAPH_VERSION)
P2P_KINDS = ("send", "recv")
ACTIONS = ("issue", "wait", "end")
# Caps on what a graph file may hold, checked as it is read (a file is
# untrusted until then): its decompressed size (a gzip bomb inflates a
# thousandfold), the world (checked.MAX_WORLD_SIZE), axes, events per
# program, an op's bytes (1 PiB).
MAX_GRAPH_MB = 256
MAX_GRAPH_ENV = "PRISM_DEBUG_MAX_GRAPH_MB"
NOT_A_GRAPH = ": give a file prism-debug profile wrote (a gzipped JSON graph)"
MAX_AXES = 16
MAX_EVENTS = 1 << 24
MAX_OP_BYTES = 1 << 50
# where a value sits in a graph file: keys and list positions
KeyPath = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class Mesh:
    """The world as a row-major grid: rank = Σ coordinate[i] × stride[i]."""

    shape: tuple[int, ...]
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.names) or len(set(self.names)) != len(self.names):
            raise GraphError(f"mesh names {self.names} do not match its shape {self.shape}")
        if any(size < 1 for size in self.shape):
            raise GraphError(f"mesh sizes must be positive, got {self.shape}")

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        strides, step = [], 1
        for size in reversed(self.shape):
            strides.append(step)
            step *= size
        return tuple(reversed(strides))

    def axis(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise GraphError(f"the mesh has no axis {name!r} "
                             f"(axes: {', '.join(self.names)})") from None

    def coordinates(self, rank: int) -> tuple[int, ...]:
        return tuple((rank // stride) % size
                     for stride, size in zip(self.strides, self.shape, strict=True))

    def rank(self, coordinates: Sequence[int]) -> int:
        return sum(c * s for c, s in zip(coordinates, self.strides, strict=True))

    def group_ranks(self, axes: tuple[int, ...], rank: int) -> list[int]:
        """The ranks of ``rank``'s group in a family that varies ``axes``."""
        coords = list(self.coordinates(rank))
        ranks = []
        for index in range(math.prod(self.shape[a] for a in axes)):
            for a in reversed(axes):
                coords[a] = index % self.shape[a]
                index //= self.shape[a]
            ranks.append(self.rank(coords))
        return sorted(ranks)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One communication op of a class program."""

    kind: str  # all_reduce, all_gather, …, send, recv
    family: str
    nbytes: int
    dtype: str = "float32"
    peer: int = 0  # for send/recv: steps along the family's axis (+1 = next stage)

    @property
    def is_p2p(self) -> bool:
        return self.kind in P2P_KINDS


@dataclasses.dataclass(frozen=True)
class Event:
    action: str  # "issue", "wait" or "end"
    gap_s: float  # compute since the rank's previous event
    op: int = -1  # index into the program's ops (issue, wait)
    # issue of a p2p op: its batch_isend_irecv call's number in the iteration
    # (0: issued alone); one batch's ops are consecutive issues
    batch: int = 0


@dataclasses.dataclass(frozen=True)
class ClassProgram:
    class_id: int
    ops: tuple[OpSpec, ...]
    warmup: tuple[tuple[Event, ...], ...]  # the first iterations, each its own program
    steady: tuple[Event, ...]  # every iteration after them

    def events(self, iteration: int) -> tuple[Event, ...]:
        if iteration <= len(self.warmup):
            return self.warmup[iteration - 1]
        return self.steady

    def iteration_bytes(self) -> dict[str, int]:
        """Bytes issued per steady iteration, by family."""
        totals: dict[str, int] = {}
        for event in self.steady:
            if event.action == "issue":
                op = self.ops[event.op]
                totals[op.family] = totals.get(op.family, 0) + op.nbytes
        return totals


@dataclasses.dataclass(frozen=True)
class ExecutionGraph:
    mesh: Mesh
    families: dict[str, tuple[str, ...]]  # family name -> the mesh axes its groups vary
    class_axis: str | None  # ranks with one coordinate here run one program
    programs: tuple[ClassProgram, ...]
    gpus_per_node: int
    command: tuple[str, ...] = ()
    version: int = GRAPH_VERSION
    # class id -> the messages its ranks send (graph/messages.py), and how
    # many iterations were profiled (later iterations use the last one's)
    messages: dict[int, tuple[PeerMessage, ...]] = dataclasses.field(default_factory=dict)
    message_iterations: int = 0
    # class id -> one entry per steady event: how its gap varies (a factor on
    # it; graph/fits.py), None where it is deterministic or was not fitted
    gap_fits: dict[int, tuple[GapFit | None, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for axes in self.families.values():
            for axis in axes:
                self.mesh.axis(axis)
        expected = self.mesh.shape[self.mesh.axis(self.class_axis)] if self.class_axis else 1
        if len(self.programs) != expected:
            raise GraphError(f"the graph has {len(self.programs)} class programs; its class "
                             f"axis {self.class_axis!r} needs {expected}")
        for program in self.programs:
            for op in program.ops:
                if op.family not in self.families:
                    raise GraphError(f"class {program.class_id} uses family {op.family!r}, "
                                     f"which the graph does not define")
        for class_id, fits in self.gap_fits.items():
            if not 0 <= class_id < len(self.programs):
                raise GraphError(f"gap fits for class {class_id}, which the graph lacks")
            if len(fits) != len(self.programs[class_id].steady):
                raise GraphError(f"class {class_id} has {len(self.programs[class_id].steady)} "
                                 f"steady events and {len(fits)} gap fits")

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    def family_axes(self, name: str) -> tuple[int, ...]:
        return tuple(self.mesh.axis(a) for a in self.families[name])

    def class_of(self, rank: int) -> int:
        if self.class_axis is None:
            return 0
        return self.mesh.coordinates(rank)[self.mesh.axis(self.class_axis)]

    def class_ranks(self, class_id: int) -> list[int]:
        """The ranks of one class (a pipeline stage, say), in order."""
        count = len(self.programs)
        if not 0 <= class_id < count:
            raise GraphError(f"class {class_id} does not exist: the graph has classes 0-"
                             f"{count - 1}")
        if self.class_axis is None:
            return list(range(self.world_size))
        axis = self.mesh.axis(self.class_axis)
        return [rank for rank in range(self.world_size)
                if self.mesh.coordinates(rank)[axis] == class_id]

    def family_group(self, name: str, index: int) -> list[int]:
        """Group ``index`` of family ``name``, groups counted from 0 in the
        order of their lowest ranks."""
        if name not in self.families:
            raise GraphError(f"no family {name!r}: the graph has {', '.join(self.families)}")
        axes = self.family_axes(name)
        others = [a for a in range(len(self.mesh.shape)) if a not in axes]
        count = math.prod(self.mesh.shape[a] for a in others)
        if not 0 <= index < count:
            raise GraphError(f"family {name} has groups 0-{count - 1}, not {index}")
        coords = [0] * len(self.mesh.shape)
        for a in reversed(others):  # row-major, as ranks are: lowest ranks first
            coords[a] = index % self.mesh.shape[a]
            index //= self.mesh.shape[a]
        return self.mesh.group_ranks(axes, self.mesh.rank(coords))

    # -- the file ------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The graph as JSON holds it (what :meth:`from_dict` reads back)."""
        return {
            "version": self.version,
            "mesh": {"shape": list(self.mesh.shape), "names": list(self.mesh.names)},
            "families": {k: list(v) for k, v in self.families.items()},
            "class_axis": self.class_axis,
            "gpus_per_node": self.gpus_per_node,
            "command": list(self.command),
            "programs": [{
                "class_id": p.class_id,
                "ops": [[o.kind, o.family, o.nbytes, o.dtype, o.peer] for o in p.ops],
                "warmup": [[_event_row(e) for e in it] for it in p.warmup],
                "steady": [_event_row(e) for e in p.steady],
            } for p in self.programs],
            "messages": messages_to_json(self.messages),
            "message_iterations": self.message_iterations,
            "gap_fits": {str(c): [None if f is None else f.to_json() for f in fits]
                         for c, fits in sorted(self.gap_fits.items())},
        }

    @classmethod
    def from_dict(cls, data: object, source: str = "graph") -> ExecutionGraph:
        """The graph ``data`` (a parsed graph file) describes; :class:`GraphError`
        naming the key path of the first thing wrong otherwise (``source``
        names the file).  Every value is checked for its type and range and
        every index for what it points at before anything is built."""
        read = Untrusted(GraphError, f"malformed graph {source}",
                         ": give a file prism-debug profile wrote, or profile the job again")
        data = read.mapping(data, ())
        version = data.get("version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise GraphError(f"graph format version {version!r}; this prism-debug reads "
                             f"versions {', '.join(map(str, READABLE_VERSIONS))}: profile the "
                             "job again")
        mesh_data = read.mapping(read.get(data, "mesh", ()), ("mesh",))
        shape = tuple(read.int(v, ("mesh", "shape", i), 1, MAX_WORLD_SIZE) for i, v in
                      enumerate(read.items(read.get(mesh_data, "shape", ("mesh",)),
                                           ("mesh", "shape"), most=MAX_AXES)))
        names = tuple(read.text(v, ("mesh", "names", i), most=64) for i, v in
                      enumerate(read.items(read.get(mesh_data, "names", ("mesh",)),
                                           ("mesh", "names"), most=MAX_AXES)))
        if math.prod(shape) > MAX_WORLD_SIZE:
            read.fail(("mesh", "shape"), f"must make at most {MAX_WORLD_SIZE} ranks, "
                                         f"got {math.prod(shape)}")
        families = {}
        for name, axes in read.mapping(read.get(data, "families", ()), ("families",)).items():
            at = ("families", name)
            axes = tuple(read.text(a, at + (i,), most=64)
                         for i, a in enumerate(read.items(axes, at, most=MAX_AXES)))
            if len(set(axes)) != len(axes):
                read.fail(at, f"must name each axis once, got {list(axes)}")
            families[read.text(name, at, most=256)] = axes
        class_axis = read.get(data, "class_axis", ())
        if class_axis is not None:
            read.text(class_axis, ("class_axis",), most=64)
        world = math.prod(shape)
        programs = tuple(_program(read, p, i, world, families) for i, p in enumerate(
            read.items(read.get(data, "programs", ()), ("programs",), most=MAX_WORLD_SIZE)))
        raw_messages = read.mapping(data.get("messages", {}), ("messages",))
        for key, rows in raw_messages.items():
            if not (key.isdecimal() and int(key) < len(programs)):
                read.fail(("messages", key), f"must name a class of the graph (0-"
                                             f"{len(programs) - 1})")
            for j, row in enumerate(read.items(rows, ("messages", key), most=MAX_EVENTS)):
                _message_row(read, row, ("messages", key, j), world)
        gpus_per_node = read.int(read.get(data, "gpus_per_node", ()), ("gpus_per_node",), 1,
                                 MAX_GPUS_PER_NODE)
        command = tuple(read.text(w, ("command", i), most=1 << 16) for i, w in
                        enumerate(read.items(data.get("command", []), ("command",),
                                             most=1 << 16)))
        message_iterations = read.int(data.get("message_iterations", 0),
                                      ("message_iterations",), 0, 1 << 20)
        # versions 1 and 2 fitted nothing: whatever such a file says of fits is ignored
        gap_fits = _gap_fits(read, data.get("gap_fits", {}), programs) \
            if version == GRAPH_VERSION else {}
        try:
            graph = cls(
                mesh=Mesh(shape, names), families=families, class_axis=class_axis,
                gpus_per_node=gpus_per_node, command=command, programs=programs,
                # version 1 graphs recorded no messages: peers mirror the real rank's
                messages=messages_from_json(raw_messages),
                message_iterations=message_iterations, gap_fits=gap_fits,
            )
        except ValueError as exc:  # base64 a row's checks let through
            raise GraphError(f"malformed graph {source}: messages: {exc}{read.advice}") from exc
        except GraphError as exc:  # what only the whole graph shows (axes, classes)
            raise GraphError(f"malformed graph {source}: {exc}{read.advice}") from exc
        if version == 1 and any(op.is_p2p for p in graph.programs for op in p.ops):
            raise GraphError(f"graph format version {version!r} does not record which "
                             "point-to-point ops form one batch (batch_isend_irecv); this "
                             "prism-debug reads that from version 2 on: profile the job again")
        return graph

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        # private to the user, as everything prism-debug writes: its messages
        # are pickles the real rank will unpickle
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, separators=(",", ":"))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ExecutionGraph:
        """Read a graph file.  One that carries pickled messages must be the
        user's own and writable by nobody else: unpickling a message runs
        whatever code its author put there, as ``recv_object_list`` from a
        stranger would.  (The payloads stay bytes here; the real rank
        unpickles the ones its script receives.)  The file is untrusted until
        read: it may decompress to at most ``$PRISM_DEBUG_MAX_GRAPH_MB`` MiB
        (default 256), and :meth:`from_dict` checks every value in it."""
        path = Path(path)
        text = _decompressed(path, max_graph_bytes())
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:  # (JSONDecodeError, too many digits, NaN)
            why = "nested too deeply" if isinstance(exc, RecursionError) else \
                str(exc).split(";")[0]
            raise GraphError(f"{path} is not a prism-debug graph file: {why}{NOT_A_GRAPH}") \
                from None
        graph = cls.from_dict(data, str(path))
        if any(m.kind == "objects" for ms in graph.messages.values() for m in ms):
            check_trusted(Path(path))
        return graph


def check_trusted(path: Path) -> None:
    """Refuse a file of pickles that someone else wrote or could have written."""
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise GraphError(f"{path} carries pickled objects (what pipeline stages send each "
                         f"other) and belongs to another user (uid {info.st_uid}); loading it "
                         "would run their code: profile the job yourself, or copy the file "
                         "and make it yours only if you trust its author")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise GraphError(f"{path} carries pickled objects and others may write to it (mode "
                         f"{stat.filemode(info.st_mode)}); make it private (chmod go-w) if you "
                         "trust it, or profile the job again")


def max_graph_bytes() -> int:
    """The most bytes a graph file may decompress to: ``$PRISM_DEBUG_MAX_GRAPH_MB`` MiB."""
    named = os.environ.get(MAX_GRAPH_ENV, "")
    if named.isdecimal() and 0 < int(named) <= 1 << 20:
        return int(named) << 20
    if named:
        raise GraphError(f"{MAX_GRAPH_ENV}={named!r}: give a whole number of MiB, 1 to "
                         f"{1 << 20}")
    return MAX_GRAPH_MB << 20


def _decompressed(path: Path, limit: int) -> str:
    """The graph file's text, counting decompressed bytes as they come, so
    a file that inflates past ``limit`` (a gzip bomb) is refused after
    reading ``limit`` bytes, a chunk at a time, never holding them."""
    try:
        with gzip.open(path, "rb") as f:
            size = 0
            while chunk := f.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise GraphError(
                        f"{path} decompresses to more than {limit >> 20} MiB, the most a graph "
                        f"may: if you trust it, raise the cap with {MAX_GRAPH_ENV}=MiB")
            f.seek(0)
            raw = f.read(limit + 1)  # bounded again: the file may have grown since
    except FileNotFoundError:
        raise GraphError(f"no graph file at {path}: make one with prism-debug profile") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise GraphError(f"{path} is not a prism-debug graph file: {exc}{NOT_A_GRAPH}") from None
    if len(raw) > limit:
        raise GraphError(f"{path} changed while being read: read it again")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GraphError(f"{path} is not a prism-debug graph file: not UTF-8 JSON ({exc.reason} "
                         f"at byte {exc.start}){NOT_A_GRAPH}") from None


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a number a graph holds")


def _program(read: Untrusted, data: object, index: int, world: int,
             families: dict[str, tuple[str, ...]]) -> ClassProgram:
    at = ("programs", index)
    data = read.mapping(data, at)
    class_id = read.int(read.get(data, "class_id", at), at + ("class_id",), 0, MAX_WORLD_SIZE)
    if class_id != index:
        read.fail(at + ("class_id",), f"must be {index}, its position, got {class_id}")
    ops = []
    for i, row in enumerate(read.items(read.get(data, "ops", at), at + ("ops",),
                                       most=MAX_EVENTS)):
        here = at + ("ops", i)
        row = read.items(row, here, most=5)
        if len(row) < 3:
            read.fail(here, "must be [kind, family, nbytes, dtype, peer]")
        # any spelling of an op (cost/ops.py), kept as its canonical name
        kind = op_name(read.text(row[0], here + (0,), most=64, check=op_problem))
        ops.append(OpSpec(
            kind, read.text(row[1], here + (1,), most=256),
            read.int(row[2], here + (2,), 0, MAX_OP_BYTES),
            read.text(row[3], here + (3,), most=64) if len(row) > 3 else "float32",
            read.int(row[4], here + (4,), -world, world) if len(row) > 4 else 0))
        if ops[-1].is_p2p and len(families.get(ops[-1].family, ())) != 1:
            read.fail(here + (1,), f"must vary exactly one axis (a {kind} moves along "
                                   f"one), got {ops[-1].family!r}")

    def events(rows: object, where: KeyPath) -> tuple[Event, ...]:
        out: list[Event] = []
        issued: set[int] = set()
        rows = read.items(rows, where, most=MAX_EVENTS)
        if not rows:
            read.fail(where, "must end with one end event, its last")
        for i, row in enumerate(rows):
            here = where + (i,)
            row = read.items(row, here, most=4)
            if len(row) < 2:
                read.fail(here, "must be [action, gap_s, op, batch]")
            action = read.text(row[0], here + (0,), most=8, check=member_of(ACTIONS))
            op = read.int(row[2], here + (2,), -1, MAX_EVENTS) if len(row) > 2 else -1
            if action != "end" and op >= len(ops) or action != "end" and op < 0:
                read.fail(here + (2,), f"must name an op of class {index} (0-{len(ops) - 1}), "
                                       f"got {op}")
            if action == "wait" and op not in issued:
                read.fail(here + (2,), f"must wait for an op the iteration issued, got {op}")
            if (action == "end") != (i == len(rows) - 1):
                read.fail(here + (0,), "must end with one end event, its last")
            issued.add(op)
            out.append(Event(action, read.number(row[1], here + (1,)), op,
                             read.int(row[3], here + (3,), 0, MAX_EVENTS) if len(row) > 3 else 0))
        return tuple(out)

    warmup = tuple(events(it, at + ("warmup", i)) for i, it in enumerate(
        read.items(read.get(data, "warmup", at), at + ("warmup",), most=1 << 10)))
    return ClassProgram(class_id, tuple(ops), warmup,
                        events(read.get(data, "steady", at), at + ("steady",)))


def _gap_fits(read: Untrusted, data: object, programs: tuple[ClassProgram, ...]
              ) -> dict[int, tuple[GapFit | None, ...]]:
    """The ``gap_fits`` of a version 3 file: per class (a decimal key), one
    entry per steady event, each null or [family, params, ks, samples, pooled]."""
    out: dict[int, tuple[GapFit | None, ...]] = {}
    for key, rows in read.mapping(data, ("gap_fits",)).items():
        at = ("gap_fits", key)
        if not (key.isdecimal() and int(key) < len(programs)):
            read.fail(at, f"must name a class of the graph (0-{len(programs) - 1})")
        steady = len(programs[int(key)].steady)
        fits: list[GapFit | None] = []
        for i, row in enumerate(read.items(rows, at, most=MAX_EVENTS, length=steady)):
            if row is None:
                fits.append(None)
                continue
            here = at + (i,)
            row = read.items(row, here, most=5, length=5)
            family = read.text(row[0], here + (0,), most=16, check=member_of(FIT_FAMILIES))
            params = read.items(row[1], here + (1,), most=3)
            for j, value in enumerate(params):
                read.number(value, here + (1, j), check=lambda v: None)
            if (problem := param_problem(family, params)) is not None:
                read.fail(here + (1,), problem)
            ks = read.number(row[2], here + (2,), check=_distance)
            samples = read.int(row[3], here + (3,), MIN_FIT_SAMPLES, MAX_EVENTS)
            pooled = read.text(row[4], here + (4,), most=8, check=member_of(POOLINGS))
            fits.append(GapFit(family, tuple(float(p) for p in params), ks, samples, pooled))
        out[int(key)] = tuple(fits)
    return out


def _distance(value: float) -> str | None:  # a Kolmogorov–Smirnov distance
    return None if 0 <= value <= 1 else f"must be in [0, 1], got {value}"


def _message_row(read: Untrusted, row: object, at: KeyPath, world: int) -> None:
    """Checks what :meth:`PeerMessage.from_list` reads (its payload's base64 it checks itself)."""
    row = read.items(row, at, most=7, length=7)
    read.int(row[0], at + (0,), 1, 1 << 20)
    read.int(row[1], at + (1,), -world, world)
    read.text(row[2], at + (2,), most=16, check=member_of(MESSAGE_KINDS))
    read.int(row[3], at + (3,), 0, MAX_EVENTS)
    read.text(row[4], at + (4,), most=MAX_GRAPH_MB << 20)
    read.text(row[5], at + (5,), most=64)
    for i, size in enumerate(read.items(row[6], at + (6,), most=MAX_AXES)):
        read.int(size, at + (6, i), 0, MAX_OP_BYTES)


def _event_row(event: Event) -> list[str | float | int]:
    row: list[str | float | int] = [event.action, event.gap_s, event.op]
    return row + [event.batch] if event.batch else row
