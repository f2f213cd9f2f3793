"""Test snapshots, recorded on first use and kept under a key of everything
they depend on, shared by every test session and xdist worker.

The key hashes the command (its script's path canonical, as the graph
cache's key), the contents of the script, the world, the rank, the
iteration, the hardware, the seed, the versions of torch and prism-debug
and the digest of prism-debug's own source — a snapshot holds the agent's
code as it was in memory, so a changed prism-debug records afresh too.  A
changed key records afresh, and so does a snapshot one of whose modules (the
user's files its rank imported: the manifest's sources) changed since; old
entries stay until the cache is removed.

Workers share a cache safely: each key has a lock file, held (``flock``,
which the kernel lets go when a worker dies) while the snapshot is looked up
and, if need be, recorded — the second worker waits, then finds the first
one's snapshot: one dump per key.  Test snapshots are recorded with the rank
isolated in a pid namespace of its own, so restored copies of one snapshot
run beside each other (each worker restores into its own run folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import prism_debug
from prism_debug import api
from prism_debug.errors import ConfigError, SnapshotError
from prism_debug.process.paths import PACKAGE_ROOT, open_store, user_cache_dir
from prism_debug.snapshot.manifest import Manifest
from prism_debug.snapshot.store import exclusive_lock, make_private_dir, sha256_file
from prism_debug.workflows.graph_cache import PROFILE_ITERATIONS, cache_key, package_version

CACHE_ENV = "PRISM_DEBUG_TEST_CACHE"
DEFAULT_HARDWARE = "h100-ib400"
Message = Callable[[str], None]


def cache_dir() -> Path:
    """``$PRISM_DEBUG_TEST_CACHE``, else ``$XDG_CACHE_HOME/prism-debug/test-snapshots``."""
    return user_cache_dir(CACHE_ENV, "test-snapshots")


@dataclasses.dataclass(frozen=True)
class Job:
    """The rank a test snapshot holds: ``command`` as ``rank`` of
    ``world_size``, after ``iteration``.  ``profile_command``: what its graph
    is profiled from, when not ``command`` (the example, told the slices'
    iteration count, so every length shares one graph)."""

    command: tuple[str, ...]
    world_size: int
    rank: int
    iteration: int
    hardware: str = DEFAULT_HARDWARE
    gpus_per_node: int | None = None
    seed: int = 0
    profile_command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    collective_timeout_s: float | None = None  # the groups' timeout, in the snapshot

    def key(self, by_contents: bool = True) -> str:
        """``by_contents`` False: the script's contents left out (a snapshot
        that a reloading restore runs the script's edited code in)."""
        profile = api.load_profile(self.hardware)
        layout = self.gpus_per_node or profile.gpus_per_node
        facts = {
            # command, script contents, world, layout, torch and prism-debug versions
            "job": cache_key(list(self.command), self.world_size, layout, PROFILE_ITERATIONS)
            if by_contents else {"command": list(self.command), "world_size": self.world_size,
                                 "layout": layout, "torch": package_version("torch")},
            "profile_job": self.profile_command and cache_key(
                list(self.profile_command), self.world_size, layout, PROFILE_ITERATIONS),
            "rank": self.rank, "iteration": self.iteration, "hardware": profile.to_dict(),
            "seed": self.seed, "env": sorted(self.env),
            "collective_timeout_s": self.collective_timeout_s,
            "prism_debug": prism_debug.__version__,
            "prism_debug_source": source_digest(),
        }
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


_source_digest: str | None = None


def source_digest() -> str:
    """prism-debug's own Python source, hashed (once per process: a few ms)."""
    global _source_digest
    if _source_digest is None:
        h = hashlib.sha256()
        for path in sorted(PACKAGE_ROOT.rglob("*.py")):
            h.update(str(path.relative_to(PACKAGE_ROOT)).encode() + b"\0")
            h.update(path.read_bytes())
        _source_digest = h.hexdigest()
    return _source_digest


@dataclasses.dataclass
class SnapshotCache:
    root: Path

    @property
    def store(self) -> Path:
        return self.root / "store"

    def snapshot_for(self, job: Job, message: Message = lambda line: None,
                     by_contents: bool = True) -> Manifest:
        """The snapshot of ``job``: the cached one, or recorded now (once, whichever
        worker asks first); ``by_contents``: :meth:`Job.key`'s."""
        key = job.key(by_contents)
        with self._locked(key):
            found = self._lookup(key)
            if found is not None and by_contents and _sources_changed(found):
                message(f"prism: snapshot {found.id}'s modules changed since: recording afresh")
                found = None
            if found is not None:
                message(f"prism: snapshot {found.id} (cached, key {key})")
                return found
            manifest = self._record(job, key, message)
            entry = self.root / f"{key}.json"
            partial = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
            partial.write_text(json.dumps({"snapshot": manifest.id, "job": _job_dict(job)},
                                          indent=1) + "\n")
            os.replace(partial, entry)
            return manifest

    def entries(self) -> list[str]:
        """The snapshot ids the cache holds, one per key."""
        return sorted(json.loads(p.read_text())["snapshot"] for p in self.root.glob("*.json"))

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        make_private_dir(self.root)
        with exclusive_lock(self.root / f"{key}.lock"):  # let go if this worker dies
            yield

    def _lookup(self, key: str) -> Manifest | None:
        entry = self.root / f"{key}.json"
        if not entry.is_file():
            return None
        try:
            snapshot_id = json.loads(entry.read_text())["snapshot"]
            return open_store(self.store).get(snapshot_id)
        except (ValueError, KeyError, TypeError, SnapshotError):
            return None  # damaged, or its snapshot removed: record afresh

    def _record(self, job: Job, key: str, message: Message) -> Manifest:
        profile = api.load_profile(job.hardware)
        if job.gpus_per_node is not None:
            profile = dataclasses.replace(profile, gpus_per_node=job.gpus_per_node)
        run_dir = self.root / "runs" / key
        message(f"prism: recording a snapshot of rank {job.rank} of {job.world_size} after "
                f"iteration {job.iteration} (key {key}, once)")
        result = api.run(api.RunOptions(
            command=list(job.command), rank=job.rank, world_size=job.world_size,
            profile=profile, iterations=job.iteration, seed=job.seed,
            profile_command=list(job.profile_command) if job.profile_command else None,
            snapshot_at=(job.iteration,), isolate=True, store=self.store, bind=None,
            run_dir=run_dir, env=job.env, collective_timeout_s=job.collective_timeout_s),
            message)
        if not result.snapshots:
            log = result.log_path
            raise SnapshotError(
                f"no snapshot of rank {job.rank} after iteration {job.iteration}: the run ended "
                f"with exit code {result.exit_code} after "
                f"{len(result.report['iterations'])} iterations (its output: {log})")
        if result.exit_code != 0:
            raise ConfigError(f"the run that recorded snapshot {result.snapshots[0]} exited "
                              f"with {result.exit_code}; its output: {result.log_path}")
        return open_store(self.store).get(result.snapshots[0])


def _sources_changed(manifest: Manifest) -> bool:
    """Whether a module the snapshot's rank imported from the user's files
    (its manifest's sources: the script's contents are in the key) changed."""
    for path, digest in manifest.sources.items():
        try:
            if sha256_file(Path(path)) != digest:
                return True
        except OSError:
            return True
    return False


def _job_dict(job: Job) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(job).items()}
