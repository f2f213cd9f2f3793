"""The snapshot store: one directory per snapshot, CRIU images + manifest.json
(``manifest.py``).

A snapshot is written into a hidden staging directory and renamed into
place only once its images and manifest are complete and on disk (each file,
the staging directory, then the store after the rename are fsynced), so a
failed or interrupted dump (a CRIU error, a full disk, a power cut) never
leaves a partial snapshot behind.  The manifest carries a checksum of every
image file (BLAKE3; SHA-256 in snapshots of older prism-debugs) and of each
pages image's page index (``checksum.py``).  Images are hashed once, when
recorded: a restore checks each image's stat facts against those recorded
then (a private ``.verified`` sidecar) and re-hashes only the images that
changed; ``verify(..., rehash=True)`` (``prism-debug snapshot verify``)
re-hashes every one.  A damaged snapshot is refused with the file named.

Images hold the rank's whole memory (its data, tokens, keys), so the store
is private: directories 0700, files 0600, whatever the umask.  Every path
made from a snapshot id goes through :meth:`Store.path`, which accepts only
ids of :func:`new_id`'s form and refuses symbolic links, so an id can never
name anything outside the store; a store other users could write (and so
fill with images of their making) is refused.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from prism_debug.errors import SnapshotError
from prism_debug.snapshot import checksum
from prism_debug.snapshot.manifest import (
    CUT_PATTERN,
    MANIFEST,
    MANIFEST_VERSION,
    Manifest,
    check_id,
)

VERIFIED = ".verified"  # the stat facts of the images as last hashed
PARENT_LINK = "parent"  # CRIU's link from an incremental snapshot to its parent's images
_TMP_PREFIX = ".tmp-"
_PAGES_IMAGE = re.compile(r"pages-[0-9]+\.img")
_MAX_MANIFEST_BYTES = 4 << 20
# A staging directory nobody holds the lock of is a dead writer's; the age
# only covers the instant between a writer's mkdir and its lock, and a writer
# of an older prism-debug that took no lock.
STALE_STAGING_S = 600.0


def _open_nofollow(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of the regular file at ``path``, never through a link."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SnapshotError(f"{path} is a symbolic link; a snapshot's files must be its "
                                "own (remove the link)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SnapshotError(f"{path} is not a regular file")
    return fd


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return checksum.digest_fd(f.fileno(), "sha256", buffer=bytearray(1 << 20))[0]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_dir(path: Path) -> None:
    """Make ``path`` (and missing parents) mode 0700 whatever the umask; a
    folder that already exists keeps its mode."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists() or folder.is_symlink():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs to have set
        os.chmod(folder, 0o700)


@contextlib.contextmanager
def exclusive_lock(lock: Path) -> Iterator[None]:
    """Hold the lock file ``lock`` (made 0600 if need be) for the block: one
    process (or thread) at a time makes what it guards.  ``flock``, so the
    kernel lets it go if its holder dies."""
    fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[Path, int] = {}  # staging directory -> its locked descriptor

    # -- the store's own directory --------------------------------------------------------

    def problems(self) -> tuple[str | None, str | None]:
        """(refusal, warning) about who else can reach the store: one that
        others can write, or that another user owns, is refused (its images
        could be theirs, and a restore runs them as you); one that others can
        read gets a warning naming the chmod that fixes it."""
        try:
            info = os.stat(self.root)
        except FileNotFoundError:
            return None, None
        if not stat.S_ISDIR(info.st_mode):
            return f"snapshot store {self.root} is not a directory", None
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (os.geteuid(), 0):
            return (f"snapshot store {self.root} belongs to uid {info.st_uid}, not to you: its "
                    "images could be anyone's; use a store of your own (--store DIR)"), None
        if mode & 0o022:
            return (f"snapshot store {self.root} is writable by other users (mode {mode:04o}), "
                    "so its images could be theirs: check it, then chmod 700 "
                    f"{self.root}"), None
        if mode & 0o077:
            return None, (f"snapshot store {self.root} is open to other users (mode "
                          f"{mode:04o}), and snapshots hold the rank's whole memory: chmod 700 "
                          f"{self.root}")
        return None, None

    def _check_root(self) -> None:
        refusal, _ = self.problems()
        if refusal is not None:
            raise SnapshotError(refusal)

    # -- writing ------------------------------------------------------------------------

    def staging(self, snapshot_id: str) -> Path:
        """A fresh private directory to dump into, locked while this process
        writes it; :meth:`commit` or :meth:`discard` it."""
        check_id(snapshot_id)
        make_private_dir(self.root)
        self._check_root()
        self.sweep()
        path = self.root / f"{_TMP_PREFIX}{snapshot_id}"
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
        self._locks[path] = fd
        return path

    def commit(self, staging: Path, manifest: Manifest) -> Path:
        """Checksum the images (and index each pages image, unless an
        incremental dump left its index already), write the manifest, make
        them private and durable, and move the snapshot into place."""
        check_id(manifest.id)
        started = time.perf_counter()
        files: dict[str, str] = {}
        seen: dict[str, list[int]] = {}  # name -> stat facts as hashed
        image_bytes, hash_s = 0, 0.0
        fds: list[int] = []
        buffer = bytearray(checksum.BLOCK)
        # each file is written back to disk by a second thread while this one
        # reads it for its checksum (from the page cache): the snapshot's
        # durability costs the longer of the two, not their sum
        with ThreadPoolExecutor(max_workers=1) as flusher:
            try:
                flushed = []
                for entry in sorted(staging.iterdir()):
                    if entry.is_symlink():
                        continue  # CRIU's link to the parent's images
                    fds.append(fd := _open_nofollow(entry))
                    os.fchmod(fd, 0o600)  # CRIU writes its images 0644 (and a chmod is a ctime)
                    flushed.append(flusher.submit(os.fsync, fd))
                    if entry.suffix not in (".img", checksum.INDEX_SUFFIX):
                        continue
                    index_path = entry.with_suffix(checksum.INDEX_SUFFIX)
                    wants_index = bool(_PAGES_IMAGE.fullmatch(entry.name)) and \
                        not index_path.exists()
                    hashed = time.perf_counter()
                    files[entry.name], index = checksum.digest_fd(fd, index=wants_index,
                                                                  buffer=buffer)
                    hash_s += time.perf_counter() - hashed
                    seen[entry.name] = checksum.facts(os.fstat(fd))
                    if entry.suffix == ".img":
                        image_bytes += os.fstat(fd).st_size
                    if index is not None:
                        fds.append(fd := checksum.write_new(index_path, index))
                        flushed.append(flusher.submit(os.fsync, fd))
                        files[index_path.name] = checksum.digest_bytes(index)
                        seen[index_path.name] = checksum.facts(os.fstat(fd))
                waited = time.perf_counter()
                for done in flushed:
                    done.result()  # a write error (EIO, ENOSPC) fails the commit
                fsync_wait_s = time.perf_counter() - waited
            finally:
                for done in flushed:
                    done.cancel()
                wait(flushed)
                for fd in fds:
                    os.close(fd)
        phases = {**manifest.phases, "hash": round(hash_s, 4),
                  "fsync_wait": round(fsync_wait_s, 4),
                  "commit": round(time.perf_counter() - started, 4)}
        manifest = dataclasses.replace(manifest, files=dict(sorted(files.items())),
                                       image_bytes=image_bytes, hash=checksum.DEFAULT,
                                       version=MANIFEST_VERSION, phases=phases)
        fd = checksum.write_new(staging / MANIFEST, manifest.to_json().encode(), durable=True)
        try:
            manifest_facts = checksum.facts(os.fstat(fd))
        finally:
            os.close(fd)
        # hashed just now: a restore need not read them again while they stay as they are
        _write_verified(staging, manifest_facts, files, seen)
        os.chmod(staging, 0o700)
        _fsync_dir(staging)
        final = self.root / manifest.id
        os.rename(staging, final)
        _fsync_dir(self.root)
        self._unlock(staging)
        return final

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)
        self._unlock(staging)

    def _unlock(self, staging: Path) -> None:
        fd = self._locks.pop(staging, None)
        if fd is not None:
            os.close(fd)

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove staging left by writers that died mid-dump (nobody holds its
        lock, and it is older than :data:`STALE_STAGING_S`); their names."""
        now = time.time() if now is None else now
        swept = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.name.startswith(_TMP_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                             | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if now - os.fstat(fd).st_mtime < STALE_STAGING_S:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live dump
                shutil.rmtree(entry.path, ignore_errors=True)
                swept.append(entry.name)
            finally:
                os.close(fd)
        return swept

    # -- reading ------------------------------------------------------------------------

    def path(self, snapshot_id: str) -> Path:
        """The folder of snapshot ``snapshot_id``: the one way from an id to a
        path.  Refuses anything but an id of :func:`new_id`'s form, a folder
        that is a symbolic link, and (after resolving) one outside the store."""
        check_id(snapshot_id)
        self._check_root()
        path = self.root / snapshot_id
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return path
        if stat.S_ISLNK(info.st_mode):
            raise SnapshotError(f"snapshot {snapshot_id} in {self.root} is a symbolic link to "
                                f"{os.readlink(path)}; a store holds its snapshots itself "
                                "(remove the link)", snapshot_id=snapshot_id)
        if path.resolve().parent != self.root.resolve():
            raise SnapshotError(f"snapshot {snapshot_id} resolves outside the store "
                                f"{self.root}", snapshot_id=snapshot_id)
        return path

    def get(self, snapshot_id: str) -> Manifest:
        path = self.path(snapshot_id)
        if not path.is_dir():
            raise SnapshotError(f"no snapshot {snapshot_id!r} in {self.root} (list them with "
                                f"prism-debug snapshot ls --store {self.root})",
                                snapshot_id=snapshot_id)
        try:
            fd = _open_nofollow(path / MANIFEST)
        except FileNotFoundError:
            raise SnapshotError(f"snapshot {snapshot_id} in {self.root} has no {MANIFEST} "
                                "(an interrupted copy?): remove it with prism-debug snapshot "
                                "rm", snapshot_id=snapshot_id) from None
        with open(fd, "rb") as f:
            data = f.read(_MAX_MANIFEST_BYTES + 1)
        if len(data) > _MAX_MANIFEST_BYTES:
            raise SnapshotError(f"{path / MANIFEST}: the manifest is damaged (over "
                                f"{_MAX_MANIFEST_BYTES >> 20} MiB)", snapshot_id=snapshot_id)
        manifest = Manifest.from_json(data.decode("utf-8", "replace"), path / MANIFEST)
        if manifest.id != snapshot_id:
            raise SnapshotError(f"{path / MANIFEST}: the manifest is of snapshot {manifest.id}, "
                                f"not of its folder {snapshot_id} (renamed or damaged)",
                                snapshot_id=snapshot_id)
        return manifest

    def scan(self) -> tuple[list[Manifest], list[str]]:
        """Every snapshot's manifest (oldest first), and a line for each
        folder that is not a readable snapshot (skipped)."""
        self._check_root()
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return [], []
        manifests, problems = [], []
        for name in names:
            if name.startswith("."):
                continue  # staging, and the checkout's .gitkeep
            try:
                manifests.append(self.get(name))
            except SnapshotError as exc:
                problems.append(f"skipped {self.root / name}: {exc}")
        return sorted(manifests, key=lambda m: (m.created, m.id)), problems

    def list(self) -> list[Manifest]:
        return self.scan()[0]

    # (``builtins.list`` below: in the class, ``list`` is the method above)
    def cut(self, cut_id: str) -> builtins.list[Manifest]:
        """The snapshots of the cut ``cut_id`` in this store, one per rank, by
        rank (a cut of several hosts' ranks: those this host's store holds);
        :class:`SnapshotError` when it holds none."""
        if not CUT_PATTERN.fullmatch(cut_id):
            raise SnapshotError(f"{cut_id!r:.60} is not a cut id: cuts look like c<8 hex "
                                "digits>-it<iteration>, e.g. c1a2b3c4d-it2")
        members = sorted((m for m in self.list() if m.cut == cut_id), key=lambda m: m.rank)
        if not members:
            raise SnapshotError(f"no snapshot of cut {cut_id} in {self.root} (prism-debug "
                                "snapshot ls lists each snapshot's cut)")
        return members

    def chain(self, snapshot_id: str) -> builtins.list[Manifest]:
        """The snapshot's manifest and its parents', nearest first, walked
        without recursion; a parent chain that loops is refused."""
        chain = [self.get(snapshot_id)]
        seen = {snapshot_id}
        while (parent := chain[-1].parent) is not None:
            if parent in seen:
                loop = " → ".join([m.id for m in chain] + [parent])
                raise SnapshotError(f"snapshot {snapshot_id}'s parent chain loops ({loop}): the "
                                    "manifests are damaged; restore none of them",
                                    snapshot_id=snapshot_id)
            seen.add(parent)
            chain.append(self.get(parent))
        return chain

    def verify(self, snapshot_id: str, *, rehash: bool = False) -> Manifest:
        """The manifest, once every image is present with its recorded checksum
        (and the parent chain of an incremental snapshot too).  Images whose
        stat facts are still those recorded when they were last hashed are not
        read again, unless ``rehash`` (``snapshot verify``)."""
        chain = self.chain(snapshot_id)
        for manifest in chain:
            self._verify_images(manifest, rehash)
        return chain[0]

    def _verify_images(self, manifest: Manifest, rehash: bool) -> None:
        snapshot_id = manifest.id
        path = self.path(snapshot_id)
        if not manifest.files:
            raise SnapshotError(f"snapshot {snapshot_id} has no images",
                                snapshot_id=snapshot_id)
        # CRIU reads the pages an increment lacks through this link: it must
        # lead to the parent the manifest names, and nowhere else
        try:
            target = os.readlink(path / PARENT_LINK)
        except FileNotFoundError:
            target = None
        except OSError:
            target = "something that is not a link"
        expected = None if manifest.parent is None else f"../{manifest.parent}"
        if target != expected:
            raise SnapshotError(f"snapshot {snapshot_id} is damaged: its {PARENT_LINK} link "
                                f"points at {target!r}, not at its parent {expected!r}",
                                snapshot_id=snapshot_id)
        known = {} if rehash else _read_verified(path, manifest)
        seen = {}
        buffer = None
        for name, digest in manifest.files.items():
            try:
                fd = _open_nofollow(path / name)
            except FileNotFoundError:
                raise SnapshotError(f"snapshot {snapshot_id} is damaged: image {name} is "
                                    "missing", snapshot_id=snapshot_id) from None
            try:
                seen[name] = checksum.facts(os.fstat(fd))
                if known.get(name) == seen[name]:
                    continue  # hashed before, and untouched since
                buffer = buffer if buffer is not None else bytearray(checksum.BLOCK)
                actual, _ = checksum.digest_fd(fd, manifest.hash, buffer=buffer)
            finally:
                os.close(fd)
            if actual != digest:
                raise SnapshotError(f"snapshot {snapshot_id} is damaged: image {name} does not "
                                    "match its checksum", snapshot_id=snapshot_id)
        if buffer is not None or rehash:
            try:
                manifest_facts = checksum.facts(os.lstat(path / MANIFEST))
                _write_verified(path, manifest_facts, manifest.files, seen)
            except OSError:
                pass  # a cache: the next restore hashes again

    def children(self, snapshot_id: str) -> builtins.list[str]:
        return [m.id for m in self.list() if m.parent == snapshot_id]

    def remove(self, snapshot_id: str, force: bool = False) -> builtins.list[str]:
        """Remove a snapshot; with ``force``, also the incremental ones built on
        it (which could not be restored without it), descendants first.
        Returns the ids removed."""
        path = self.path(snapshot_id)
        if not path.is_dir():
            self.get(snapshot_id)  # says there is none
        by_parent: dict[str, list[str]] = {}
        for m in self.list():
            if m.parent is not None:
                by_parent.setdefault(m.parent, []).append(m.id)
        children = by_parent.get(snapshot_id, [])
        if children and not force:
            raise SnapshotError(f"snapshot {snapshot_id} is the parent of incremental "
                                f"snapshot(s) {', '.join(children)}; remove those first or "
                                "pass --force to remove them all", snapshot_id=snapshot_id)
        order, seen = [snapshot_id], {snapshot_id}
        for current in order:  # breadth first, so a loop of parents ends
            for child in by_parent.get(current, []):
                if child not in seen:
                    seen.add(child)
                    order.append(child)
        for removed in reversed(order):
            shutil.rmtree(self.path(removed))
        return order[::-1]


def _write_verified(folder: Path, manifest_facts: list[int], files: dict[str, str],
                    seen: dict[str, list[int]]) -> None:
    """Record that ``files`` had these digests while their stat facts were
    ``seen`` (and the manifest's ``manifest_facts``), replacing the record
    whole: a reader sees the old one or the new one."""
    record = {"manifest": manifest_facts,
              "files": {name: [files[name], *seen[name]] for name in files if name in seen}}
    staged = folder / f"{VERIFIED}.{secrets.token_hex(4)}"
    try:
        os.close(checksum.write_new(staged, json.dumps(record).encode()))
        os.replace(staged, folder / VERIFIED)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def _read_verified(folder: Path, manifest: Manifest) -> dict[str, list[int]]:
    """image name -> its stat facts when it was last hashed and matched the
    manifest's digest; empty when there is no record, or it is not of this
    manifest as it is now (rewritten since), or unreadable."""
    try:
        fd = _open_nofollow(folder / VERIFIED)
        with open(fd, "rb") as f:
            record = json.loads(f.read(_MAX_MANIFEST_BYTES))
        if record["manifest"] != checksum.facts(os.lstat(folder / MANIFEST)):
            return {}
        return {name: entry[1:] for name, entry in record["files"].items()
                if manifest.files.get(name) == entry[0]}
    except (OSError, ValueError, KeyError, TypeError, IndexError, SnapshotError,
            AttributeError):
        return {}


def now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
