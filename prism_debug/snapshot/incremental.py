"""Incremental snapshots by page content, for kernels without memory tracking.

CRIU's own incremental dumps (``track_mem`` + ``parent_img``) need the
kernel's soft-dirty bits (``CONFIG_MEM_SOFT_DIRTY``); many VM kernels lack
them, and CRIU then refuses a dump on a parent ("Pid-reuse detection
failed").  The same chain can be built after a full dump: every dumped page
whose bytes equal the parent snapshot's page at the same address is marked
``PE_PARENT`` in the pagemap and dropped from the pages image, and a
``parent`` link points at the parent's directory — exactly the layout CRIU
itself writes for a tracked dump, so ``criu restore`` reads those pages from
the parent (and its parents) unchanged.

A training rank rewrites its parameters, gradients and optimizer state every
iteration but leaves code, libraries, the interpreter's heap, frozen weights
and data that are not touched alone; those are what an incremental snapshot
saves.

Pages are compared by their page-index digests (``checksum.py``: every
committed pages image has one), so no page of the parent is read; a parent
recorded before indexes existed is indexed on the spot.  When the increment
would save less than :data:`MIN_SAVING` of the pages, the dump stays whole
(a new chain root): a chain costs every later restore a walk through its
levels for little.  Otherwise the kept pages move forward within the pages
image itself (``copy_file_range``), which is then cut short: no second file,
no second copy in memory.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from prism_debug.snapshot import checksum
from prism_debug.snapshot.criu import pycriu
from prism_debug.snapshot.store import PARENT_LINK, SnapshotError

PAGE = checksum.PAGE
PE_PARENT, PE_LAZY, PE_PRESENT = 1 << 0, 1 << 1, 1 << 2
# an increment must leave out at least this share of the dump's pages, else
# the dump is kept whole
MIN_SAVING = 0.25
_MOVE = 8 << 20  # bytes moved by read and write at a time, where the gap is short


@dataclasses.dataclass(frozen=True)
class Saving:
    pages_total: int  # pages the full dump wrote (of the processes the parent had)
    pages_kept: int  # pages that differ from the parent's and stay in this snapshot
    linked: bool = True  # False: it would have saved too little, and stays a full dump

    @property
    def bytes_saved(self) -> int:
        return (self.pages_total - self.pages_kept) * PAGE

    @property
    def share_saved(self) -> float:
        return 1 - self.pages_kept / self.pages_total if self.pages_total else 0.0


class _Pages:
    """One process's memory as a snapshot holds it: its pagemap entries and
    where each present page lies in the pages image (pages marked as in the
    parent are looked up there, and in its parents, a level at a time)."""

    def __init__(self, images_dir: Path, pagemap: Path) -> None:
        self._load(images_dir, pagemap)
        # the parents' levels, nearest first, followed without recursion (a
        # chain of thousands of increments) and refused if the links loop
        self.parents: list[_Pages] = []
        seen = {images_dir.resolve()}
        parent_dir = images_dir / PARENT_LINK
        while (parent_dir / pagemap.name).exists():
            resolved = parent_dir.resolve()
            if resolved in seen:
                raise SnapshotError(f"the parent links of {images_dir} loop back to {resolved}: "
                                    "the store is damaged")
            seen.add(resolved)
            level = _Pages.__new__(_Pages)
            level._load(resolved, parent_dir / pagemap.name)
            self.parents.append(level)
            parent_dir = resolved / PARENT_LINK

    def _load(self, images_dir: Path, pagemap: Path) -> None:
        with open(pagemap, "rb") as f:
            image = pycriu().images.load(f)
        head, *entries = image["entries"]
        self.head = head
        self.entries = entries
        self.pagemap_path = pagemap
        self.pages_path = images_dir / f"pages-{head['pages_id']}.img"
        self.starts = np.array([e["vaddr"] for e in entries], dtype=np.uint64)
        self.counts = np.array([e["nr_pages"] for e in entries], dtype=np.uint64)
        self.flags = np.array([e.get("flags", PE_PRESENT) for e in entries], dtype=np.int64)
        present = (self.flags & PE_PRESENT) != 0
        # index in the pages image of each entry's first page (present entries only)
        self.first_page = np.concatenate(([0], np.cumsum(self.counts * present)[:-1])) \
            .astype(np.int64)
        self._index: np.ndarray | None = None

    @property
    def index(self) -> np.ndarray:
        """The page index as (pages, 2) uint64: the one recorded beside the
        pages image when it covers it, else made now by reading the image."""
        if self._index is None:
            size = self.pages_path.stat().st_size if self.pages_path.exists() else 0
            recorded = self.pages_path.with_suffix(checksum.INDEX_SUFFIX)
            data = recorded.read_bytes() if recorded.exists() else b""
            if len(data) != size // PAGE * checksum.INDEX_DIGEST:
                data = checksum.index_of(self.pages_path) if size else b""
            self._index = np.frombuffer(data, dtype=np.uint64).reshape(-1, 2)
        return self._index

    @property
    def data(self) -> np.ndarray:
        size = self.pages_path.stat().st_size if self.pages_path.exists() else 0
        return (np.memmap(self.pages_path, dtype=np.uint8, mode="r").reshape(-1, PAGE)
                if size else np.empty((0, PAGE), dtype=np.uint8))

    def _level(self, vaddrs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(here, deeper, rows) of this level alone: which addresses its pages
        image holds (at rows), and which it marks as in its parent."""
        if not len(self.starts):
            none = np.zeros(len(vaddrs), dtype=bool)
            return none, none, np.zeros(0, dtype=np.int64)
        entry = np.searchsorted(self.starts, vaddrs, side="right") - 1
        inside = entry >= 0
        entry = np.where(inside, entry, 0)
        offset = (vaddrs - self.starts[entry]) // PAGE
        inside &= offset < self.counts[entry]
        flags = self.flags[entry]
        here = inside & ((flags & PE_PRESENT) != 0)
        rows = self.first_page[entry[here]] + offset[here].astype(np.int64)
        return here, inside & ((flags & PE_PARENT) != 0), rows

    def read(self, vaddrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, pages): for each page address, whether this snapshot (or its
        parents) holds it, and its bytes (zeros where not found)."""
        return _lookup([self, *self.parents], vaddrs, lambda level: level.data,
                       np.zeros((len(vaddrs), PAGE), dtype=np.uint8))

    def digests(self, vaddrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, index digests) of these pages in the parents' chain."""
        return _lookup(self.parents, vaddrs, lambda level: level.index,
                       np.zeros((len(vaddrs), 2), dtype=np.uint64))


def _lookup(levels: list[_Pages], vaddrs: np.ndarray, table, out: np.ndarray):
    """For each page address, whether ``levels`` (nearest first) hold it, and
    its row of ``table(level)`` (its bytes, or its index digest) in ``out``."""
    found = np.zeros(len(vaddrs), dtype=bool)
    pending = np.arange(len(vaddrs))  # indices still to look for, a level down
    for level in levels:
        if not len(pending):
            break
        here, deeper, rows = level._level(vaddrs[pending])
        out[pending[here]] = table(level)[rows]
        found[pending[here]] = True
        pending = pending[deeper]
    return found, out


def link_to_parent(images_dir: Path, parent_dir: Path,
                   min_saving: float = MIN_SAVING) -> Saving:
    """Turn the full dump in ``images_dir`` into an increment on ``parent_dir``,
    or leave it whole (``linked`` False) if it would save less than
    ``min_saving`` of the pages.

    Pages equal to the parent's at the same address move out of every
    process's pages image (into ``PE_PARENT`` pagemap entries); the link is
    relative, so the store can be moved or copied whole.  Either way each
    compared pages image's index is left beside it, for the commit."""
    link = images_dir / PARENT_LINK
    link.symlink_to(os.path.relpath(parent_dir, images_dir))
    compared = []
    for pagemap in sorted(images_dir.glob("pagemap-*.img")):
        if pagemap.name.startswith("pagemap-shmem") or not (parent_dir / pagemap.name).exists():
            continue  # shared memory, or a process the parent did not have: kept whole
        compared.append(_compare(images_dir, pagemap))
    total = sum(len(same) for _, same, _ in compared)
    kept = sum(int(np.count_nonzero(~same)) for _, same, _ in compared)
    if total == 0 or (total - kept) / total < min_saving:
        link.unlink()
        for child, _, index in compared:
            _write_index(child.pages_path, index)
        return Saving(total, total, linked=False)
    for child, same, index in compared:
        _rewrite(child, same, index)
    return Saving(total, kept)


def _compare(images_dir: Path, pagemap: Path) -> tuple[_Pages, np.ndarray, np.ndarray]:
    """(the child's pages, which of its present pages equal the parent's, its
    page index)."""
    child = _Pages(images_dir, pagemap)
    present = np.flatnonzero((child.flags & PE_PRESENT) != 0)
    # every present page's address, in the order of the pages image
    counts = child.counts[present].astype(np.int64)
    total = int(counts.sum())
    vaddrs = np.repeat(child.starts[present], counts) + PAGE * (
        np.arange(total, dtype=np.uint64) - np.repeat(np.cumsum(counts) - counts, counts)
        .astype(np.uint64))
    mine = child.index
    if len(mine) != total:
        raise SnapshotError(f"{child.pages_path} holds {len(mine)} pages where its pagemap "
                            f"names {total}: the dump is damaged")
    found, theirs = child.digests(vaddrs)
    same = found & (mine == theirs).all(axis=1)
    return child, same, mine


def _write_index(pages_path: Path, index: np.ndarray) -> None:
    with open(os.open(pages_path.with_suffix(checksum.INDEX_SUFFIX),
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
        f.write(index.tobytes())


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the runs of True in ``mask``."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    return starts, np.flatnonzero(edges == -1) - starts


def _rewrite(child: _Pages, same: np.ndarray, index: np.ndarray) -> None:
    """Mark ``same`` pages as the parent's in the pagemap, and move them out of
    the pages image; its index follows."""
    if same.any():
        _compact(child.pages_path, ~same)
        _rewrite_pagemap(child, same)
    _write_index(child.pages_path, index[~same])


def _compact(pages_path: Path, kept: np.ndarray, move: int = _MOVE) -> None:
    """Keep only the ``kept`` pages of the image, in order: each run moves
    forward within the file, then the file is cut to size.  Within one file
    ``copy_file_range`` refuses overlapping ranges, so a run moves in pieces
    no longer than the distance it travels; where that distance is short,
    it is read and written through a buffer of ``move`` bytes instead (front
    to back, a piece is read before anything is written over it)."""
    starts, lengths = _runs(kept)
    fd = os.open(pages_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    buffer = None
    try:
        dst = 0
        for start, length in zip((starts * PAGE).tolist(), (lengths * PAGE).tolist(),
                                 strict=True):
            gap = start - dst
            done = 0
            while gap and done < length:
                if gap >= move:
                    moved = os.copy_file_range(fd, fd, min(gap, length - done, 1 << 30),
                                               start + done, dst + done)
                else:
                    buffer = buffer if buffer is not None else bytearray(move)
                    piece = memoryview(buffer)[:min(move, length - done)]
                    moved = os.preadv(fd, [piece], start + done)
                    if os.pwrite(fd, piece[:moved], dst + done) != moved:
                        raise OSError(f"short write compacting {pages_path}")
                if moved <= 0:
                    raise OSError(f"{pages_path} ended while compacting it")
                done += moved
            dst += length
        os.ftruncate(fd, dst)
    finally:
        os.close(fd)


def _rewrite_pagemap(child: _Pages, same: np.ndarray) -> None:
    """The pagemap with each present entry split into runs of pages that stay
    (present) and pages that are the parent's, built from arrays rather than
    a page at a time."""
    present = np.flatnonzero((child.flags & PE_PRESENT) != 0)
    counts = child.counts[present].astype(np.int64)
    entry_start = np.cumsum(counts) - counts  # each present entry's first page
    changes = np.flatnonzero(np.diff(same.astype(np.int8))) + 1
    run_start = np.union1d(entry_start, changes)
    run_len = np.diff(np.append(run_start, len(same)))
    owner = np.searchsorted(entry_start, run_start, side="right") - 1  # among present
    run_vaddr = child.starts[present][owner] + PAGE * (run_start - entry_start[owner]) \
        .astype(np.uint64)
    run_flags = child.flags[present][owner]
    run_flags = np.where(same[run_start], (run_flags & ~PE_PRESENT) | PE_PARENT, run_flags)
    runs = iter(zip(owner.tolist(), run_vaddr.tolist(), run_len.tolist(), run_flags.tolist(),
                    strict=True))
    by_entry: dict[int, list[dict]] = {}
    for slot, vaddr, length, flags in runs:
        by_entry.setdefault(int(present[slot]), []).append(
            {"vaddr": vaddr, "nr_pages": length, "flags": flags})
    entries = [part for i, entry in enumerate(child.entries)
               for part in by_entry.get(i, [entry])]
    pagemap = child.pagemap_path
    staged = pagemap.with_suffix(".img.part")
    with open(staged, "wb") as f:
        pycriu().images.dump({"magic": "PAGEMAP", "entries": [child.head, *entries]}, f)
    os.replace(staged, pagemap)
