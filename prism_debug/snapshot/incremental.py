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
iteration but leaves code, libraries, the interpreter's heap and data that
are not touched alone; those are what an incremental snapshot saves.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from prism_debug.snapshot.criu import pycriu
from prism_debug.snapshot.store import PARENT_LINK, SnapshotError

PAGE = 4096
PE_PARENT, PE_LAZY, PE_PRESENT = 1 << 0, 1 << 1, 1 << 2
_CHUNK_PAGES = 16384  # 64 MiB of pages compared at a time


@dataclasses.dataclass(frozen=True)
class Saving:
    pages_total: int  # pages the full dump wrote
    pages_kept: int  # pages that differ from the parent's and stay in this snapshot

    @property
    def bytes_saved(self) -> int:
        return (self.pages_total - self.pages_kept) * PAGE


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
        self.pages_path = images_dir / f"pages-{head['pages_id']}.img"
        self.starts = np.array([e["vaddr"] for e in entries], dtype=np.uint64)
        self.counts = np.array([e["nr_pages"] for e in entries], dtype=np.uint64)
        self.flags = np.array([e.get("flags", PE_PRESENT) for e in entries], dtype=np.int64)
        present = (self.flags & PE_PRESENT) != 0
        # index in the pages image of each entry's first page (present entries only)
        self.first_page = np.concatenate(([0], np.cumsum(self.counts * present)[:-1])) \
            .astype(np.int64)
        size = self.pages_path.stat().st_size if self.pages_path.exists() else 0
        self.data = (np.memmap(self.pages_path, dtype=np.uint8, mode="r").reshape(-1, PAGE)
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
        return _read([self, *self.parents], vaddrs)


def _read(levels: list[_Pages], vaddrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`_Pages.read` through ``levels``, nearest first."""
    found = np.zeros(len(vaddrs), dtype=bool)
    if not len(vaddrs) or not levels:
        return found, np.zeros((len(vaddrs), PAGE), dtype=np.uint8)
    here, deeper, rows = levels[0]._level(vaddrs)
    if here.all() and rows[-1] - rows[0] == len(rows) - 1:
        # the common case: one stretch of the pages image, read in place
        return here, levels[0].data[rows[0]:rows[-1] + 1]
    pages = np.zeros((len(vaddrs), PAGE), dtype=np.uint8)
    pages[here] = levels[0].data[rows]
    found[here] = True
    pending = np.flatnonzero(deeper)  # indices still to look for, a level down
    for level in levels[1:]:
        if not len(pending):
            break
        here, deeper, rows = level._level(vaddrs[pending])
        pages[pending[here]] = level.data[rows]
        found[pending[here]] = True
        pending = pending[deeper]
    return found, pages


def link_to_parent(images_dir: Path, parent_dir: Path) -> Saving:
    """Turn the full dump in ``images_dir`` into an increment on ``parent_dir``.

    Pages equal to the parent's at the same address move out of every
    process's pages image (into ``PE_PARENT`` pagemap entries); the link is
    relative, so the store can be moved or copied whole."""
    link = images_dir / PARENT_LINK
    link.symlink_to(os.path.relpath(parent_dir, images_dir))
    total = kept = 0
    for pagemap in sorted(images_dir.glob("pagemap-*.img")):
        if pagemap.name.startswith("pagemap-shmem") or not (parent_dir / pagemap.name).exists():
            continue  # shared memory, or a process the parent did not have: kept whole
        pages_total, pages_kept = _rewrite(images_dir, pagemap)
        total += pages_total
        kept += pages_kept
    return Saving(total, kept)


def _rewrite(images_dir: Path, pagemap: Path) -> tuple[int, int]:
    child = _Pages(images_dir, pagemap)
    present = np.flatnonzero((child.flags & PE_PRESENT) != 0)
    # every present page's address, in the order of the pages image
    counts = child.counts[present].astype(np.int64)
    total = int(counts.sum())
    same = np.zeros(total, dtype=bool)
    vaddrs = np.repeat(child.starts[present], counts) + PAGE * (
        np.arange(total, dtype=np.uint64) - np.repeat(np.cumsum(counts) - counts, counts)
        .astype(np.uint64))
    for lo in range(0, total, _CHUNK_PAGES):
        hi = min(lo + _CHUNK_PAGES, total)
        found, theirs = _read(child.parents, vaddrs[lo:hi])
        mine = child.data[lo:hi]
        same[lo:hi] = found & (mine.view(np.uint64) == theirs.view(np.uint64)).all(axis=1)
    if not same.any():
        return total, total
    # split each present entry into runs of pages that stay and pages that move
    entries = []
    page = 0
    moved_out = np.zeros(len(child.entries), dtype=bool)
    moved_out[present] = True
    for index, entry in enumerate(child.entries):
        if not moved_out[index]:
            entries.append(entry)
            continue
        n = entry["nr_pages"]
        run_start = 0
        for i in range(1, n + 1):
            if i == n or same[page + i] != same[page + run_start]:
                flags = entry.get("flags", PE_PRESENT)
                if same[page + run_start]:
                    flags = (flags & ~PE_PRESENT) | PE_PARENT
                entries.append({"vaddr": entry["vaddr"] + run_start * PAGE,
                                 "nr_pages": i - run_start, "flags": flags})
                run_start = i
        page += n
    kept_rows = np.flatnonzero(~same)
    staged = child.pages_path.with_suffix(".img.part")
    with open(staged, "wb") as out:
        for lo in range(0, len(kept_rows), _CHUNK_PAGES):
            out.write(child.data[kept_rows[lo:lo + _CHUNK_PAGES]].tobytes())
    child.data = None  # let the map go before the file under it is replaced
    os.replace(staged, child.pages_path)
    staged_map = pagemap.with_suffix(".img.part")
    with open(staged_map, "wb") as f:
        pycriu().images.dump({"magic": "PAGEMAP", "entries": [child.head, *entries]}, f)
    os.replace(staged_map, pagemap)
    return total, len(kept_rows)
