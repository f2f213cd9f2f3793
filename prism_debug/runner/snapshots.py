"""Snapshots from the controller's side (the CRIU mechanics): dump the rank
at an iteration boundary, and restore a snapshot's rank as a child.

The rank idles at a boundary after flushing its event log and announcing the
snapshot (``agent/handshake.py``).  The controller dumps it with CRIU leaving
it running, lets it go, and only then records the snapshot — three steps,
each on its own, so that nothing that befalls one skips another:

* **The dump.**  CRIU freezes the process tree itself (ptrace) for as long
  as the dump takes and resumes it after, so the controller sends no
  SIGSTOP: a controller killed mid-dump cannot leave the rank stopped
  forever (ptrace's tracees are let go when the tracer dies, and the rank
  dies with its controller anyway — its parent-death signal).  A guard
  with a deadline was the other way; it needs a watcher outside the
  stopped process, which the kernel already is here.
* **Letting the rank go** comes straight after the dump, whatever its fate:
  the control file is rewritten in place, never truncated first (it keeps
  its blocks, so a full disk cannot fail the write), and where even that
  fails the release signal the rank named ends its wait.
* **Recording** (checksums, manifest, the move out of the staging folder)
  comes last, while the rank already runs: a full disk there costs the
  snapshot, never the run, and a controller killed there leaves only a
  ``.tmp-`` staging folder, which no listing shows.

A restore starts the process again from the images as the controller's child
(``rst_sibling``), with its log, event log and control file replaced —
through CRIU's inherited descriptors — by the new run's; the control file
the copy reads is a fresh one, put in place only once the copy is up, so a
rank still running beside a failed restore never reads its instructions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import errno
import json
import os
import time
from pathlib import Path
from typing import Callable

from prism_debug.faults import Fault
from prism_debug.reload import plan as plan_reload
from prism_debug.reload import sources as kept_sources
from prism_debug.runner.children import continue_rank
from prism_debug.runner.options import RunOptions, script_of
from prism_debug.snapshot import criu as criu_api
from prism_debug.snapshot import incremental
from prism_debug.snapshot.store import (
    Manifest,
    SnapshotError,
    Store,
    new_id,
    now_text,
    sha256_file,
)

def _environment_digest(options: RunOptions) -> str:
    """What else a restored run's behaviour rests on besides the script and graph."""
    facts = {"hardware": options.profile.to_dict(), "seed": options.seed,
             "values": options.values, "digests": options.digests,
             "world_size": options.world_size, "rank": options.rank}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass
class Snapshotter:
    store: Store
    criu: criu_api.Criu
    base: dict  # manifest fields fixed for the run
    message: Callable[[str], None]
    open_files: dict[str, Path] = dataclasses.field(default_factory=dict)
    taken: list[str] = dataclasses.field(default_factory=list)
    # each dump after the first holds only the pages that changed since the
    # last, on top of its parent
    incremental: bool = False
    # how: CRIU's memory tracking where the kernel has soft-dirty bits, else
    # a full dump whose pages equal to the parent's move out afterwards
    tracked: bool = False

    @classmethod
    def for_run(cls, options: RunOptions, store: Store,
                message: Callable[[str], None]) -> "Snapshotter":
        criu = criu_api.locate()
        criu_api.pycriu()
        tracked = options.incremental and criu_api.tracks_memory(criu)[0]
        script = script_of(options.command)
        base = {
            "world_size": options.world_size, "rank": options.rank,
            "command": list(options.command),
            "graph_digest": sha256_file(options.graph_path) if options.graph_path else None,
            "script_digest": sha256_file(script) if script and script.is_file() else None,
            "environment_digest": _environment_digest(options),
            "hardware": options.profile.name,
            "cwd": os.getcwd(),  # the rank's (it inherits it): its command's paths point there
        }
        return cls(store, criu, base, message,
                   incremental=options.incremental, tracked=tracked)

    @classmethod
    def continuing(cls, manifest: Manifest, store: Store,
                   message: Callable[[str], None]) -> "Snapshotter":
        """For snapshots of a rank restored from ``manifest``: the same run's facts."""
        base = {k: getattr(manifest, k) for k in (
            "world_size", "rank", "command", "graph_digest", "script_digest",
            "environment_digest", "hardware", "cwd")}
        return cls(store, criu_api.locate(), base, message)

    def take(self, pid: int, iteration: int, cuda: bool = False,
             release: "Release | None" = None) -> tuple[Manifest | None, str]:
        """Dump the rank idling at an iteration boundary, let it go, then
        record the snapshot; the rank goes on whatever the dump's fate.

        A CUDA rank's state is locked and checkpointed to host memory first
        (cuda-checkpoint hangs on a frozen process), then the process is
        dumped, let go, and its CUDA state goes back to the GPU and is
        unlocked (CRIU's CUDA plugin's order).  ``release``: how the rank asked
        to be let go (its snapshot event).  Returns the snapshot's manifest,
        or None and why there is none.
        """
        release = release or Release(iteration)
        snapshot_id = new_id(self.base["rank"], iteration)
        staging = parent = None
        dump_s = 0.0
        cuda_locked: Path | None = None
        error = ""
        try:
            if cuda:
                tool = criu_api.cuda_checkpoint()
                criu_api.cuda_action(tool, "lock", pid)
                cuda_locked = tool
                criu_api.cuda_action(tool, "checkpoint", pid)
            staging = self.store.staging(snapshot_id)
            parent = self.taken[-1] if self.incremental and self.taken else None
            started = time.perf_counter()
            criu_api.dump(self.criu, pid, staging, leave_running=True,
                          track_mem=self.tracked,
                          parent=self.store.path(parent) if parent and self.tracked else None)
            if parent and not self.tracked:
                # While the rank still idles: comparing pages takes CPU time
                # the rank's emulated iterations must not lose.
                incremental.link_to_parent(staging, self.store.path(parent))
            dump_s = time.perf_counter() - started
        except (criu_api.CriuError, SnapshotError, OSError) as exc:
            error = str(exc)
        release_rank(pid, self.open_files["control"], release, self.message)
        if cuda_locked is not None:
            _resume_cuda(cuda_locked, pid, self.message)
        if not error:
            try:
                return self._record(staging, snapshot_id, parent, iteration, dump_s, cuda,
                                    release.sources), ""
            except (SnapshotError, OSError) as exc:
                error = str(exc)
        if staging is not None:
            self.store.discard(staging)
        # the run goes on: a failed snapshot costs the snapshot, not the run
        self.message(f"prism-debug: warning: no snapshot at iteration {iteration}: {error}")
        return None, error

    def _record(self, staging: Path, snapshot_id: str, parent: str | None, iteration: int,
                dump_s: float, cuda: bool, sources: dict) -> Manifest:
        manifest = Manifest(
            id=snapshot_id, parent=parent, iteration=iteration, **self.base,
            open_files={role: str(path.resolve()) for role, path in self.open_files.items()},
            image_bytes=0, dump_s=dump_s, created=now_text(), cuda=cuda,
            sources=kept_sources.keep(staging, sources))
        path = self.store.commit(staging, manifest)
        self.taken.append(snapshot_id)
        manifest = self.store.get(snapshot_id)
        self.message(f"snapshot {snapshot_id}: iteration {iteration}, "
                     f"{manifest.image_bytes / 2**20:.1f} MiB in {dump_s:.2f} s → {path}")
        return manifest


@dataclasses.dataclass(frozen=True)
class Release:
    """How a rank idling for a snapshot asked to be let go (its snapshot
    event): the iteration and ticket the control file must name, and the
    signal that does it when the file cannot be written (None: an agent
    that reads the file only)."""

    iteration: int
    ticket: str | None = None
    signal: int | None = None
    # and the user's sources it runs (path -> SHA-256 at import), which the
    # snapshot keeps for a restore with reload
    sources: dict = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, event: dict) -> "Release":
        signum = event.get("release_signal")
        sources = event.get("sources")
        return cls(event["iteration"], event.get("ticket"),
                   signum if type(signum) is int and signum > 0 else None,
                   sources if isinstance(sources, dict) else {})


def release_rank(pid: int, control: Path, release: Release,
                 message: Callable[[str], None]) -> None:
    """Let a rank idling for a snapshot go on, whatever else failed: the
    control file says go and, where the rank named one, its release signal
    ends the wait even if the file could not be written.  Each step on its
    own."""
    content = {"stop_at": release.iteration, "phase": "go"}
    if release.ticket is not None:
        content["ticket"] = release.ticket
    try:
        write_control(control, content)
    except OSError as exc:
        how = "its release signal" if release.signal else "nothing else: it may wait for ever"
        message(f"prism-debug: warning: cannot write the rank's control file {control} "
                f"({exc}); letting it go by {how}")
    if release.signal is not None:
        try:
            os.kill(pid, release.signal)
        except ProcessLookupError:
            pass
    continue_rank(pid)  # a copy of an older snapshot stops itself: harmless otherwise


def write_control(path: Path, content: dict) -> None:
    """Rewrite the control file in place (the rank holds it open): overwritten,
    never truncated first, and padded with blanks (JSON ignores them) to its
    old length, so the file keeps the blocks it has and a full disk cannot
    fail the write.  A reader may see a half-written file: it parses as
    nothing and is read again."""
    data = json.dumps(content).encode()
    fd = os.open(path, os.O_WRONLY)
    try:
        data = data.ljust(os.fstat(fd).st_size)
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(errno.ENOSPC, "short write", str(path))
    finally:
        os.close(fd)


def _resume_cuda(tool: Path, pid: int, message: Callable[[str], None]) -> None:
    for action in ("restore", "unlock"):
        try:
            criu_api.cuda_action(tool, action, pid)
        except criu_api.CriuError as exc:
            message(f"prism-debug: warning: {exc}")


# -- restore --------------------------------------------------------------------------


def check_unchanged(manifest: Manifest, store: Store | None = None,
                    reload: bool = False) -> list[dict] | None:
    """Refuse to restore a rank whose script or graph changed since its snapshot,
    unless ``reload`` asks to patch the changed functions in: then what the
    rank must apply (``prism_debug.reload``'s plan, for ``restore_process``),
    or every reason it cannot, refused before anything is restored.

    The script is looked for where the run started (the manifest's ``cwd``),
    whatever directory the restore is run from; a manifest of version 1
    recorded none, so its script is looked for from here."""
    cwd = Path(manifest.cwd) if manifest.cwd is not None else None
    script = script_of(manifest.command, cwd)
    if manifest.script_digest and script is not None:
        if not script.is_file():
            where = (f"the run started in {cwd}" if cwd is not None else
                     f"looked for from {Path.cwd()}: the snapshot predates recording the "
                     "directory its run started in, so restore it from that directory")
            raise SnapshotError(f"snapshot {manifest.id}: its script {script} is gone ({where})",
                                snapshot_id=manifest.id)
        # (a copy restored with reload runs the source it recorded, not the run's)
        recorded = manifest.sources.get(str(script), manifest.script_digest)
        if sha256_file(script) != recorded and not reload:
            raise SnapshotError(f"snapshot {manifest.id}: its script {script} changed since "
                                "the snapshot; restoring would mix old code in memory with new "
                                f"code on disk: prism-debug snapshot restore {manifest.id} "
                                "--reload patches the changed functions in; or take the "
                                "snapshot again",
                                snapshot_id=manifest.id)
    if not reload:
        return None
    rerecord = (f"take the snapshot again from the changed code (prism-debug run … "
                f"--snapshot-at {manifest.iteration})")
    if not manifest.sources:
        raise SnapshotError(f"snapshot {manifest.id} keeps no sources to reload against (taken "
                            f"by a prism-debug without reload): {rerecord}",
                            snapshot_id=manifest.id)
    if store is None:
        raise ValueError("reload needs the snapshot's store")
    changes = kept_sources.changes(store.path(manifest.id), manifest.sources)
    plan = plan_reload(changes)
    if plan.refused:
        raise SnapshotError(f"snapshot {manifest.id}: --reload refused, nothing was restored: "
                            f"{'; '.join(plan.refused)}; {rerecord}", snapshot_id=manifest.id)
    return [f.to_dict(changes[f.path][1]) for f in plan.files
            if f.patched or f.added or f.relined]


def snapshot_tools() -> None:
    """Check that CRIU and pycriu are there, before a run that snapshots starts
    (:class:`CriuError` naming the fix)."""
    criu_api.locate()
    criu_api.pycriu()


def restore_tools(manifest: Manifest) -> criu_api.Criu:
    """The CRIU a restore of ``manifest`` uses, once what it needs is there
    (cuda-checkpoint too, for a CUDA rank): asked before anything is given up."""
    criu = criu_api.locate()
    if manifest.cuda:
        criu_api.cuda_checkpoint()
    return criu


def restore_process(store: Store, manifest: Manifest, files: dict[str, Path],
                    criu: criu_api.Criu, *, iterations: int | None = None,
                    record_ops: bool = False, bus: str | None = None,
                    bus_curve: dict | None = None, bus_secret: str | None = None,
                    pause: bool = False,
                    faults: tuple[Fault, ...] = (), watch_nonfinite: bool = False,
                    message: Callable[[str], None] = lambda line: None,
                    reload: list[dict] | None = None) -> int:
    """Restore the rank of a (verified) snapshot as a child of this process,
    writing to ``files`` (log, events, control) instead of the files it had
    open, and continue it; the pid.  ``criu``: :func:`restore_tools`'s;
    ``bus``: the endpoint the copy's agent connects to; ``pause``: it stays
    paused where the snapshot was taken; ``faults``: put in force as it
    resumes (a scenario that starts from a snapshot)."""
    limit = manifest.iteration + iterations if iterations else None
    # the copy's own control file, in place of the run's once the copy is up:
    # a rank still holding the run's (a failed restore beside it) never reads it
    fresh = files["control"].with_name(files["control"].name + ".next")
    fresh.unlink(missing_ok=True)  # left by a controller killed mid-restore
    with open(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600),
              "w") as f:
        f.write(json.dumps({
            "restored": True, "snapshot": manifest.id, "iterations": limit,
            "record_ops": record_ops, "bus": bus, "bus_curve": bus_curve,
            "bus_secret": bus_secret, "pause": pause,
            "faults": [fault.to_dict() for fault in faults], "watch_nonfinite": watch_nonfinite,
            "stop_at": manifest.iteration, "phase": "go",
            # the changed functions to patch in (check_unchanged's plan), their new
            # texts beside the control file (it is read in 64 KiB)
            "reload": None if reload is None else kept_sources.stage(reload, fresh.parent)}))
    fds = {
        "log": os.open(files["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
        "events": os.open(files["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
        "control": os.open(fresh, os.O_RDONLY),
    }
    started = time.perf_counter()
    try:
        pid = criu_api.restore(criu, store.path(manifest.id), files["log"].parent, {
            manifest.open_files[role].lstrip("/"): fd for role, fd in fds.items()})
    except BaseException:
        fresh.unlink(missing_ok=True)
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    os.replace(fresh, files["control"])
    message(f"restored pid {pid} in {time.perf_counter() - started:.2f} s "
            f"({manifest.image_bytes / 2**20:.1f} MiB of images)")
    continue_rank(pid)
    if manifest.cuda:  # its CUDA state was checkpointed to host memory: back to the GPU
        _resume_cuda(criu_api.cuda_checkpoint(), pid, message)
    return pid
