"""The snapshot store: one directory per snapshot, CRIU images + manifest.json.

A snapshot is written into a hidden temporary directory and renamed into
place only once its images and manifest are complete, so a failed or
interrupted dump (a CRIU error, a full disk) never leaves a partial snapshot
behind.  The manifest carries a SHA-256 of every image file; they are checked
before any restore, and a damaged snapshot is refused with the file named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from prism_debug.errors import SnapshotError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_TMP_PREFIX = ".tmp-"


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
    version: int = MANIFEST_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: Path) -> "Manifest":
        try:
            data = json.loads(text)
            if data.get("version") != MANIFEST_VERSION:
                raise SnapshotError(f"{where}: manifest version {data.get('version')}; this "
                                    f"prism-debug reads version {MANIFEST_VERSION}")
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise SnapshotError(f"{where}: the manifest is damaged ({exc})") from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def new_id(rank: int, iteration: int) -> str:
    return f"r{rank}-it{iteration}-{secrets.token_hex(3)}"


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root

    def staging(self, snapshot_id: str) -> Path:
        """A fresh directory to dump into; :meth:`commit` or :meth:`discard` it."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{_TMP_PREFIX}{snapshot_id}"
        path.mkdir()
        return path

    def commit(self, staging: Path, manifest: Manifest) -> Path:
        """Checksum the images, write the manifest, and move the snapshot into place."""
        files = {p.name: sha256_file(p) for p in sorted(staging.iterdir())
                 if p.suffix == ".img"}
        manifest = dataclasses.replace(manifest, files=files, image_bytes=sum(
            (staging / name).stat().st_size for name in files))
        with open(staging / MANIFEST, "w") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
        final = self.root / manifest.id
        os.rename(staging, final)
        return final

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def path(self, snapshot_id: str) -> Path:
        return self.root / snapshot_id

    def get(self, snapshot_id: str) -> Manifest:
        path = self.root / snapshot_id
        if snapshot_id.startswith(_TMP_PREFIX) or not (path / MANIFEST).is_file():
            raise SnapshotError(f"no snapshot {snapshot_id!r} in {self.root} (list them with "
                                f"prism-debug snapshot ls --store {self.root})",
                                snapshot_id=snapshot_id)
        return Manifest.from_json((path / MANIFEST).read_text(), path / MANIFEST)

    def list(self) -> list[Manifest]:
        if not self.root.is_dir():
            return []
        manifests = [self.get(p.name) for p in self.root.iterdir()
                     if not p.name.startswith(_TMP_PREFIX) and (p / MANIFEST).is_file()]
        return sorted(manifests, key=lambda m: (m.created, m.id))

    def verify(self, snapshot_id: str) -> Manifest:
        """The manifest, once every image is present with its recorded checksum
        (and the parent chain of an incremental snapshot too)."""
        manifest = self.get(snapshot_id)
        path = self.root / snapshot_id
        if not manifest.files:
            raise SnapshotError(f"snapshot {snapshot_id} has no images",
                                snapshot_id=snapshot_id)
        for name, digest in manifest.files.items():
            image = path / name
            if not image.is_file():
                raise SnapshotError(f"snapshot {snapshot_id} is damaged: image {name} is "
                                    "missing", snapshot_id=snapshot_id)
            if sha256_file(image) != digest:
                raise SnapshotError(f"snapshot {snapshot_id} is damaged: image {name} does not "
                                    "match its checksum", snapshot_id=snapshot_id)
        if manifest.parent is not None:
            self.verify(manifest.parent)
        return manifest

    def children(self, snapshot_id: str) -> list[str]:
        return [m.id for m in self.list() if m.parent == snapshot_id]

    def remove(self, snapshot_id: str, force: bool = False) -> list[str]:
        """Remove a snapshot; with ``force``, also the incremental ones built on
        it (which could not be restored without it).  Returns the ids removed."""
        self.get(snapshot_id)
        children = self.children(snapshot_id)
        if children and not force:
            raise SnapshotError(f"snapshot {snapshot_id} is the parent of incremental "
                                f"snapshot(s) {', '.join(children)}; remove those first or "
                                "pass --force to remove them all", snapshot_id=snapshot_id)
        removed = []
        for child in children:
            removed += self.remove(child, force=True)
        shutil.rmtree(self.root / snapshot_id)
        return removed + [snapshot_id]


def now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
