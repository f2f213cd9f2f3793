"""A snapshot's manifest: what was dumped, of which run, and how to check it.

``manifest.json`` in a snapshot's folder says which rank of which run the
images hold, at which iteration, what the run rested on (script, graph,
environment digests), the files the rank had open, each image's checksum,
and — for a run of several real ranks — the consistent cut the snapshot is
one rank's part of.  It is read back from disk, damaged perhaps, so every
field is checked for its declared type and every id and image name for its
form (:meth:`Manifest.from_json`) before any path is made from it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from pathlib import Path

from prism_debug.errors import SnapshotError
from prism_debug.snapshot import checksum

MANIFEST = "manifest.json"
MANIFEST_VERSION = 4
# version 1 recorded no working directory (``cwd``): still read, as None;
# versions 1 and 2 checksummed with SHA-256 and named no algorithm; versions
# before 4 named no cut (every snapshot then was of one real rank)
READ_VERSIONS = (1, 2, 3, 4)

# r<rank>-it<iteration>-<6 hex digits>; ASCII digits only (``\d`` takes any script's)
ID_PATTERN = re.compile(r"r[0-9]{1,10}-it[0-9]{1,12}-[0-9a-f]{6}")
ID_FORM = "r<rank>-it<iteration>-<6 hex digits>, e.g. r4097-it2-a1b2c3"
# a consistent cut of several real ranks: c<8 hex digits of the run>-it<iteration>
CUT_PATTERN = re.compile(r"c[0-9a-f]{8}-it[0-9]{1,12}")
_IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.(img|idx)")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def cut_prefix(cut_run: str) -> str:
    """What every cut id of the run ``cut_run`` (8 hex digits) starts with."""
    return f"c{cut_run}-it"


def cut_id(cut_run: str, iteration: int) -> str:
    """The id of the run's cut at the boundary that ended ``iteration``."""
    return f"{cut_prefix(cut_run)}{iteration}"


def check_id(snapshot_id: object) -> str:
    """``snapshot_id`` if it has the form :func:`new_id` gives, else
    :class:`SnapshotError` saying what an id looks like."""
    if isinstance(snapshot_id, str) and ID_PATTERN.fullmatch(snapshot_id):
        return snapshot_id
    shown = repr(snapshot_id)
    shown = shown if len(shown) <= 200 else shown[:197] + "..."  # one line, of a size to read
    raise SnapshotError(f"{shown} is not a snapshot id: ids look like {ID_FORM} "
                        "(prism-debug snapshot ls lists them)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    id: str
    parent: str | None  # the snapshot an incremental dump builds on
    iteration: int  # iterations finished when the rank was dumped
    world_size: int
    rank: int
    graph_digest: str | None  # SHA-256 of the graph file the run replayed, if any
    script_digest: str | None  # SHA-256 of the script the command runs
    command: list[str]
    environment_digest: str  # what else the run depended on: hardware, seed, values, …
    hardware: str  # the hardware profile's name
    # files the rank had open, as the restore must replace them
    open_files: dict[str, str]  # role (log, events, control) -> absolute path at dump time
    image_bytes: int
    dump_s: float
    created: str
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # image -> SHA-256
    cuda: bool = False  # CUDA state was checkpointed into host memory (cuda-checkpoint)
    # the directory the rank ran in, where its command's relative paths point
    # (None: a version 1 manifest, which did not record it)
    cwd: str | None = None
    # taken for a run's --history ring, not asked for: pruned as the ring moves on
    history: bool = False
    version: int = MANIFEST_VERSION
    # the user's sources the rank ran (absolute path -> SHA-256 when it imported
    # them), each kept as source-<SHA-256>.py where the file still had it at the
    # dump: a restore with reload diffs them (prism_debug.reload)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    hash: str = checksum.LEGACY  # the algorithm of ``files``' checksums (absent before v3)
    # seconds each step of the snapshot took (handshake, criu, compare, hash, …)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    # of a run of several real ranks: the consistent cut this snapshot is one
    # rank's part of (cut_id's form), and every real rank of the job, all of
    # which the cut holds (each host's store those it ran)
    cut: str | None = None
    cut_ranks: list[int] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: Path) -> Manifest:
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if data.get("version") not in READ_VERSIONS:
                raise SnapshotError(f"{where}: manifest version {data.get('version')}; this "
                                    f"prism-debug reads versions "
                                    f"{', '.join(map(str, READ_VERSIONS))}")
            manifest = cls(**data)
            _check_fields(manifest)
            return manifest
        except (ValueError, TypeError) as exc:
            raise SnapshotError(f"{where}: the manifest is damaged ({exc})") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


_FIELD_TYPES = {
    "str": lambda v: isinstance(v, str),
    "str | None": lambda v: v is None or isinstance(v, str),
    "int": lambda v: _is_int(v) and v >= 0,
    "float": lambda v: (_is_int(v) or isinstance(v, float)) and v >= 0,
    "bool": lambda v: isinstance(v, bool),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "list[int]": lambda v: isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v),
    "dict[str, str]": _is_text_map,
    "dict[str, float]": lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and (_is_int(x) or isinstance(x, float)) for k, x in v.items()),
}


def _check_fields(manifest: Manifest) -> None:
    """Each field of the type it is declared with (JSON says nothing of that),
    ids of the store's form, image names that stay in their folder."""
    for field in dataclasses.fields(manifest):
        value = getattr(manifest, field.name)
        declared = field.type
        assert isinstance(declared, str)  # (annotations are postponed here: as written)
        if not _FIELD_TYPES[declared](value):
            raise TypeError(f"{field.name} is {value!r:.60}, not a {declared}")
    for name in ("id", "parent"):
        value = getattr(manifest, name)
        if value is not None and not ID_PATTERN.fullmatch(value):
            raise ValueError(f"{name} {value!r:.60} is not a snapshot id ({ID_FORM})")
    if manifest.cut is not None and not CUT_PATTERN.fullmatch(manifest.cut):
        raise ValueError(f"cut {manifest.cut!r:.60} is not a cut id (c<8 hex digits>-it<N>)")
    if manifest.cut is not None and manifest.rank not in manifest.cut_ranks:
        raise ValueError(f"rank {manifest.rank} is not one of its cut's ranks")
    if manifest.cwd is not None and not manifest.cwd.startswith("/"):
        raise ValueError(f"cwd {manifest.cwd!r:.60} is not an absolute path")
    if manifest.hash not in checksum.ALGORITHMS:
        raise ValueError(f"hash {manifest.hash!r:.60} is not one of "
                         f"{', '.join(checksum.ALGORITHMS)}")
    if manifest.parent == manifest.id:
        raise ValueError(f"snapshot {manifest.id} names itself as its parent")
    for name, digest in manifest.sources.items():
        if not name.startswith("/") or not _DIGEST.fullmatch(digest):
            raise ValueError(f"sources names {name!r:.60} with {digest!r:.70}: not an absolute "
                             "path and its SHA-256")
    for name, digest in manifest.files.items():
        if not _IMAGE_NAME.fullmatch(name) or not _DIGEST.fullmatch(digest):
            raise ValueError(f"files names {name!r:.60} with checksum {digest!r:.70}: not an "
                             f"image of the snapshot's folder and its {manifest.hash}")


def new_id(rank: int, iteration: int) -> str:
    return f"r{rank}-it{iteration}-{secrets.token_hex(3)}"
