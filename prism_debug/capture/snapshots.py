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
* **Recording** (an increment's comparison with its parent, checksums,
  manifest, the move out of the staging folder) comes last, while the rank
  already runs, on the recorder's thread (``capture/recorder.py``), in the
  order of the dumps: the loop is free for the rank's next snapshot at
  once.  A full disk there costs the snapshot, never the run, and a
  controller killed there leaves only a ``.tmp-`` staging folder, which no
  listing shows.

A restore starts the process again from the images as the controller's child
(``rst_sibling``), with its log, event log and control file replaced —
through CRIU's inherited descriptors — by the new run's; the control file
the copy reads is a fresh one, put in place only once the copy is up, so a
rank still running beside a failed restore never reads its instructions.
Where the kernel lets CRIU use userfaultfd and the snapshot has no parent,
the copy's memory comes back lazily (``snapshot/lazy.py``): it runs at once
and faults its pages in.  A restore is over when the copy says it resumed
(its ``resumed`` event), and that is the time it reports; a lazy one that
fails on the way is undone and done again eagerly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from prism_debug.capture.recorder import Recorder
from prism_debug.faults import Fault
from prism_debug.process.children import continue_rank, die_with_controller
from prism_debug.process.options import RunOptions, script_of
from prism_debug.reload import plan as plan_reload
from prism_debug.reload import sources as kept_sources
from prism_debug.snapshot import criu as criu_api
from prism_debug.snapshot import incremental
from prism_debug.snapshot import lazy as lazy_pages
from prism_debug.snapshot.control import Control, Go, RestoreControl
from prism_debug.snapshot.control import encode as encode_control
from prism_debug.snapshot.manifest import Manifest, cut_id, new_id
from prism_debug.snapshot.store import SnapshotError, Store, now_text, sha256_file


def _environment_digest(options: RunOptions, rank: int | None = None) -> str:
    """What else a restored run's behaviour rests on besides the script and
    graph (``rank``: one of its several real ranks, else its rank)."""
    facts = {"hardware": options.profile.to_dict(), "seed": options.seed,
             "values": options.values, "digests": options.digests,
             "world_size": options.world_size,
             "rank": options.rank if rank is None else rank}
    if options.variability is not None:
        # the peers a restored rank meets are drawn from it (a run without one
        # keeps the digest it always had)
        facts["variability"] = options.variability.to_dict()
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


# dumps staged and not yet recorded before the next dump waits for room: the
# one being recorded and one more (a snapshot at every boundary, --history,
# keeps up whenever an iteration lasts longer than a record)
MAX_RECORDS_BEHIND = 2


@dataclasses.dataclass
class Snapshotter:
    store: Store
    criu: criu_api.Criu
    base: dict  # manifest fields fixed for the run
    message: Callable[[str], None]
    open_files: dict[str, Path] = dataclasses.field(default_factory=dict)
    taken: list[str] = dataclasses.field(default_factory=list)  # recorded, in order
    # records in the order of the dumps, off the controller's loop (shared
    # by the copies the history's ring makes)
    recorder: Recorder = dataclasses.field(default_factory=Recorder)
    # each dump after the first holds only the pages that changed since the
    # last, on top of its parent
    incremental: bool = False
    # how: CRIU's memory tracking where the kernel has soft-dirty bits, else
    # a full dump whose pages equal to the parent's move out afterwards
    tracked: bool = False
    # a rank of several real ones: its snapshots are its part of the cut
    # c<cut_run>-it<iteration> (cut_run: cut_run_of the run's store prefix)
    cut_run: str | None = None

    @classmethod
    def for_run(cls, options: RunOptions, store: Store, message: Callable[[str], None],
                rank: int | None = None, cut_run: str | None = None) -> Snapshotter:
        """For the run's rank (``rank``: one of its several real ranks, whose
        snapshots are cuts of ``cut_run``)."""
        criu = criu_api.locate()
        criu_api.pycriu()
        tracked = options.incremental and criu_api.tracks_memory(criu)[0]
        script = script_of(options.command)
        rank = options.rank if rank is None else rank
        base = {
            "world_size": options.world_size, "rank": rank,
            "command": list(options.command),
            "graph_digest": sha256_file(options.graph_path) if options.graph_path else None,
            "script_digest": sha256_file(script) if script and script.is_file() else None,
            "environment_digest": _environment_digest(options, rank),
            "hardware": options.profile.name,
            "cwd": os.getcwd(),  # the rank's (it inherits it): its command's paths point there
            "cut_ranks": list(options.real_ranks) if cut_run else [],
        }
        return cls(store, criu, base, message,
                   incremental=options.incremental, tracked=tracked, cut_run=cut_run)

    @classmethod
    def continuing(cls, manifest: Manifest, store: Store,
                   message: Callable[[str], None]) -> Snapshotter:
        """For snapshots of a rank restored from ``manifest``: the same run's facts."""
        base = {k: getattr(manifest, k) for k in (
            "world_size", "rank", "command", "graph_digest", "script_digest",
            "environment_digest", "hardware", "cwd")}
        return cls(store, criu_api.locate(), base, message)

    def recorded(self) -> list[str]:
        """The ids taken, in order, once every record submitted so far is over."""
        self.recorder.wait()
        return list(self.taken)

    def recorded_so_far(self) -> list[str]:
        """The ids recorded by now, in order, without waiting for a record in
        progress (the controller's loop asks: a record takes seconds a GiB)."""
        return list(self.taken)

    def take(self, pid: int, iteration: int, cuda: bool = False,
             release: Release | None = None, *,
             parent: Callable[[], str | None] | None = None,
             recorded: Callable[[Manifest], None] | None = None
             ) -> concurrent.futures.Future:
        """Dump the rank idling at an iteration boundary and let it go; the
        rank goes on whatever the dump's fate.  The snapshot is recorded
        after every snapshot dumped before it, by the recorder's thread: the
        future of its manifest, or of None and why there is none.

        A CUDA rank's state is locked and checkpointed to host memory first
        (cuda-checkpoint hangs on a frozen process), then the process is
        dumped, let go, and its CUDA state goes back to the GPU and is
        unlocked (CRIU's CUDA plugin's order).  ``release``: how the rank asked
        to be let go (its snapshot event).  ``parent``: what an increment is
        on, asked as it is recorded (default: this snapshotter's last
        snapshot recorded, where it is incremental); ``recorded``: told of
        the manifest on the recorder's thread, before the next record starts.
        """
        release = release or Release(iteration)
        snapshot_id = new_id(self.base["rank"], iteration)
        staging = tracked_parent = None
        dump_s = 0.0
        # seconds per step, from the rank's announcement (the event log's
        # last write) to its release; the record adds its own
        phases = {"handshake": _since_announced(self.open_files.get("events"))}
        cuda_locked: Path | None = None
        error = ""
        started = time.perf_counter()
        try:
            if cuda:
                tool = criu_api.cuda_checkpoint()
                criu_api.cuda_action(tool, "lock", pid)
                cuda_locked = tool
                criu_api.cuda_action(tool, "checkpoint", pid)
            waited = time.perf_counter()
            self.recorder.make_room(MAX_RECORDS_BEHIND)  # (the rank is held meanwhile)
            phases["room"] = time.perf_counter() - waited
            staging = self.store.staging(snapshot_id)
            if self.tracked and self.incremental:
                # CRIU reads the parent's images as it dumps: they must be in place
                self.recorder.wait()
                tracked_parent = self.taken[-1] if self.taken else None
            step = time.perf_counter()
            criu_api.dump(self.criu, pid, staging, leave_running=True,
                          track_mem=self.tracked,
                          parent=self.store.path(tracked_parent) if tracked_parent else None)
            phases["criu"] = time.perf_counter() - step
            dump_s = time.perf_counter() - started
        except (criu_api.CriuError, SnapshotError, OSError) as exc:
            error = str(exc)
        release_rank(pid, self.open_files["control"], release, self.message)
        phases["pause"] = phases["handshake"] + time.perf_counter() - started
        if cuda_locked is not None:
            _resume_cuda(cuda_locked, pid, self.message)
        released = time.perf_counter()

        def record() -> tuple[Manifest | None, str]:
            phases["queued"] = time.perf_counter() - released  # behind earlier records
            why = error
            if not why:
                try:
                    assert staging is not None  # no error: the dump was staged
                    on = tracked_parent if self.tracked else (
                        parent() if parent is not None else
                        self.taken[-1] if self.incremental and self.taken else None)
                    manifest = self._record(staging, snapshot_id, on, iteration, dump_s,
                                            cuda, release.sources, phases)
                except (SnapshotError, OSError) as exc:
                    why = str(exc)
                except Exception as exc:  # a bug costs the snapshot, not the run
                    why = f"{type(exc).__name__}: {exc}"
                else:
                    if recorded is not None:
                        recorded(manifest)  # (the ring's: it says what fails itself)
                    return manifest, ""
            if staging is not None:
                self.store.discard(staging)
            # the run goes on: a failed snapshot costs the snapshot, not the run
            self.message(f"prism-debug: warning: no snapshot at iteration {iteration}: {why}")
            return None, why

        return self.recorder.submit(record)

    def _increment(self, staging: Path, snapshot_id: str, parent: str,
                   phases: dict[str, float]) -> str | None:
        """Leave out of the dump the pages its parent holds; the parent, or
        None where that would save too little and the dump stays whole."""
        step = time.perf_counter()
        self.store.verify(parent)  # its page index is trusted: checked (stat facts)
        saving = incremental.link_to_parent(staging, self.store.path(parent))
        phases["compare"] = time.perf_counter() - step
        if saving.linked:
            return parent
        self.message(f"prism-debug: an increment on {parent} would leave out "
                     f"{100 * saving.share_saved:.0f} % of the pages: snapshot {snapshot_id} "
                     "is stored whole")
        return None

    def _record(self, staging: Path, snapshot_id: str, parent: str | None, iteration: int,
                dump_s: float, cuda: bool, sources: dict, phases: dict[str, float]
                ) -> Manifest:
        """Compare an increment with its parent (on the images alone, while
        the rank already runs, as the commit's checksums are), then commit."""
        if parent and not self.tracked:
            parent = self._increment(staging, snapshot_id, parent, phases)
        manifest = Manifest(
            id=snapshot_id, parent=parent, iteration=iteration, **self.base,
            cut=None if self.cut_run is None else cut_id(self.cut_run, iteration),
            open_files={role: str(path.resolve()) for role, path in self.open_files.items()},
            image_bytes=0, dump_s=dump_s, created=now_text(), cuda=cuda,
            sources=kept_sources.keep(staging, sources),
            phases={k: round(v, 4) for k, v in phases.items()})
        path = self.store.commit(staging, manifest)
        self.taken.append(snapshot_id)
        manifest = self.store.get(snapshot_id)
        self.message(f"snapshot {snapshot_id}: iteration {iteration}, "
                     f"{manifest.image_bytes / 2**20:.1f} MiB in {dump_s:.2f} s → {path}")
        return manifest


def _since_announced(events: Path | None) -> float:
    """Seconds since the rank announced its snapshot: its event log's last
    write (the announcement, flushed) is the moment it reached the boundary."""
    if events is None:  # (a snapshotter told no run files)
        return 0.0
    try:
        return max(0.0, (time.time_ns() - os.stat(events).st_mtime_ns) / 1e9)
    except OSError:
        return 0.0


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
    def of(cls, event: dict) -> Release:
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
    try:
        write_control(control, Go(stop_at=release.iteration, ticket=release.ticket))
    except OSError as exc:
        how = "its release signal" if release.signal else "nothing else: it may wait for ever"
        message(f"prism-debug: warning: cannot write the rank's control file {control} "
                f"({exc}); letting it go by {how}")
    if release.signal is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, release.signal)
    continue_rank(pid)  # a copy of an older snapshot stops itself: harmless otherwise


def write_control(path: Path, control: Control) -> None:
    """Rewrite the control file in place (the rank holds it open): overwritten,
    never truncated first, and padded with blanks (JSON ignores them) to its
    old length, so the file keeps the blocks it has and a full disk cannot
    fail the write.  A reader may see a half-written file: it parses as
    nothing and is read again."""
    data = encode_control(control).encode()
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
    entries = []
    for f in plan.files:
        if f.patched or f.added or f.relined:
            now = changes[f.path][1]
            assert now is not None  # a file gone now is refused (plan_file)
            entries.append(f.to_dict(now))
    return entries


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


@dataclasses.dataclass(frozen=True)
class RestoreWay:
    """Whether a restore loads the rank's memory lazily, and why not."""

    lazy: bool
    why: str = ""

    def describe(self) -> str:
        if self.lazy:
            return "lazily"
        return f"eagerly: {self.why}" if self.why else "eagerly"


def restore_way(manifest: Manifest, criu: criu_api.Criu, lazy: bool | None) -> RestoreWay:
    """How to restore ``manifest``: ``lazy`` None is lazily wherever it can
    be, True asks for it (eagerly where it cannot be, saying why), False
    eagerly."""
    if lazy is False:
        return RestoreWay(False)
    if manifest.parent is not None:
        return RestoreWay(False, f"it is an increment on {manifest.parent}, and CRIU's lazy "
                                 "pages hang on incremental chains")
    if manifest.cuda:
        return RestoreWay(False, "cuda-checkpoint is not known to work with lazy pages")
    supported, detail = criu_api.lazy_pages(criu)
    if not supported:
        return RestoreWay(False, f"this kernel cannot restore lazily ({detail})")
    return RestoreWay(True)


# a restored copy says it resumed within milliseconds (lazily: the few pages
# its interpreter touches first); past this it is taken as stuck
RUNNING_DEADLINE_S = 20.0


def restore_process(store: Store, manifest: Manifest, files: dict[str, Path],
                    criu: criu_api.Criu, *, iterations: int | None = None,
                    record_ops: bool = False, bus: str | None = None,
                    bus_curve: dict | None = None, bus_secret: str | None = None,
                    pause: bool = False, history: bool = False,
                    faults: tuple[Fault, ...] = (), watch_nonfinite: bool = False,
                    lazy: bool | None = None,
                    message: Callable[[str], None] = lambda line: None,
                    reload: list[dict] | None = None, side_store: dict | None = None) -> int:
    """Restore the rank of a (verified) snapshot as a child of this process,
    writing to ``files`` (log, events, control) instead of the files it had
    open, and continue it; the pid, once the copy said it resumed.
    ``criu``: :func:`restore_tools`'s; ``bus``: the endpoint the copy's agent
    connects to; ``pause``: it stays paused where the snapshot was taken;
    ``history``: it goes on stopping for a snapshot after every iteration (a
    run's --history ring, which a restore from the console continues);
    ``faults``: put in force as it resumes (a scenario that starts from a
    snapshot); ``lazy``: :func:`restore_way`'s — a lazy restore that fails
    (no daemon, CRIU refuses, the copy never resumes) is undone and done
    again eagerly; ``side_store``: where a rank of a cut meets the cut's
    other ranks again (SideStore.to_dict()).  One line says which way it
    went, and how long the copy took to run."""
    limit = manifest.iteration + iterations if iterations else None
    control = encode_control(RestoreControl(
        snapshot=manifest.id, stop_at=manifest.iteration, iterations=limit,
        record_ops=record_ops, bus=bus, bus_curve=bus_curve, bus_secret=bus_secret,
        pause=pause, history=history, faults=tuple(fault.to_dict() for fault in faults),
        watch_nonfinite=watch_nonfinite, side_store=side_store,
        # the changed functions to patch in (check_unchanged's plan), their new
        # texts beside the control file (it is read in 64 KiB)
        reload=None if reload is None else kept_sources.stage(reload,
                                                              files["control"].parent)))
    way = restore_way(manifest, criu, lazy)
    started = time.perf_counter()
    pid = None
    if way.lazy:
        try:
            pid = _restore_lazily(store, manifest, files, criu, control)
        except (criu_api.CriuError, OSError) as exc:
            way = RestoreWay(False, f"the lazy restore failed ({exc})")
    if pid is None:
        offset = _size(files["events"])
        pid = _restore_copy(store.path(manifest.id), manifest.open_files, files, criu, control,
                            lazy=False)
        if manifest.cuda:  # its CUDA state was checkpointed to host memory: back to the GPU
            _resume_cuda(criu_api.cuda_checkpoint(), pid, message)
        state = _wait_resumed(files["events"], offset, pid, RUNNING_DEADLINE_S)
    else:
        state = "resumed"
    # to running: CRIU's restore, and (lazily) the faults until the copy resumed
    took = time.perf_counter() - started
    late = {"resumed": "", "exited": "; it exited before it resumed",
            "stuck": f"; it has not said it resumed within {RUNNING_DEADLINE_S:g} s"}[state]
    message(f"restored pid {pid} in {took:.2f} s ({manifest.image_bytes / 2**20:.1f} MiB of "
            f"images, {way.describe()}{late})")
    return pid


def _restore_lazily(store: Store, manifest: Manifest, files: dict[str, Path],
                    criu: criu_api.Criu, control: str) -> int:
    """The copy, restored with lazy pages and running (it said it resumed), its
    daemon watched; else :class:`CriuError`, nothing left behind."""
    run_dir = files["log"].parent
    images = store.path(manifest.id)
    daemon = lazy_pages.LazyPages.start(criu, images, run_dir, preexec_fn=die_with_controller())
    offset = _size(files["events"])
    try:
        pid = _restore_copy(images, manifest.open_files, files, criu, control, lazy=True)
    except BaseException:
        daemon.stop()
        raise
    if _wait_resumed(files["events"], offset, pid, RUNNING_DEADLINE_S) == "stuck":
        _end_copy(pid)
        daemon.stop()
        raise criu_api.CriuError(f"the lazily restored rank did not resume within "
                                 f"{RUNNING_DEADLINE_S:g} s (log: {daemon.log})")
    # (a copy that exited instead, a refused reload say, is its follower's to report)
    daemon.watch(pid, files["log"], lazy_pages.transfer_deadline(manifest.image_bytes))
    return pid


def _restore_copy(images: Path, open_files: dict[str, str], files: dict[str, Path],
                  criu: criu_api.Criu, control: str, *, lazy: bool) -> int:
    """CRIU's restore of the copy, with the run's files in place of its own,
    then continued."""
    # the copy's own control file, in place of the run's once the copy is up:
    # a rank still holding the run's (a failed restore beside it) never reads it
    fresh = files["control"].with_name(files["control"].name + ".next")
    fresh.unlink(missing_ok=True)  # left by a controller killed mid-restore
    with open(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600),
              "w") as f:
        f.write(control)
    fds = {
        "log": os.open(files["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
        "events": os.open(files["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
        "control": os.open(fresh, os.O_RDONLY),
    }
    try:
        pid = criu_api.restore(criu, images, files["log"].parent, {
            open_files[role].lstrip("/"): fd for role, fd in fds.items()}, lazy=lazy)
    except BaseException:
        fresh.unlink(missing_ok=True)
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    os.replace(fresh, files["control"])
    continue_rank(pid)
    return pid


def _wait_resumed(events: Path, offset: int, pid: int, deadline_s: float) -> str:
    """"resumed" once the copy ``pid`` says so (its ``resumed`` event, past
    ``offset`` of the event log); "exited" when it ends first (left unreaped:
    its exit code is its follower's); "stuck" after ``deadline_s``."""
    ends = time.monotonic() + deadline_s
    pending = b""
    with open(events, "rb") as f:
        f.seek(offset)
        while True:
            pending += f.read()
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    if json.loads(line).get("kind") == "resumed":
                        return "resumed"
                except (ValueError, AttributeError):
                    continue
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return "exited"
            if time.monotonic() > ends:
                return "stuck"
            time.sleep(0.001)


def _end_copy(pid: int) -> None:
    """Kill and reap a copy nobody follows yet (a failed lazy restore)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
