"""Parent chains of incremental snapshots are walked a level at a time: a
chain deeper than Python's recursion limit still finds its pages, and
parent links that loop are refused rather than followed forever.

The images are CRIU's own format (pycriu writes the pagemaps), small and
made here: a process of four pages, of which only the chain's first link
holds the bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from prism_debug.snapshot import incremental
from prism_debug.snapshot.criu import pycriu
from prism_debug.snapshot.store import SnapshotError

PAGE = incremental.PAGE
VADDR = 0x7F0000000000
PE_PARENT, PE_PRESENT = incremental.PE_PARENT, incremental.PE_PRESENT


def write_level(folder: Path, flags: int, pages: bytes = b"", parent: str | None = None) -> None:
    folder.mkdir()
    with open(folder / "pagemap-1.img", "wb") as f:
        pycriu().images.dump({"magic": "PAGEMAP", "entries": [
            {"pages_id": 1}, {"vaddr": VADDR, "nr_pages": 4, "flags": flags}]}, f)
    (folder / "pages-1.img").write_bytes(pages)
    if parent is not None:
        (folder / "parent").symlink_to(f"../{parent}")


def chain(root: Path, depth: int) -> list[bytes]:
    """Levels 0 … depth-1 in ``root``: level 0 holds four pages, every later
    one says they are all in its parent.  The four pages."""
    pages = [bytes([i + 1]) * PAGE for i in range(4)]
    write_level(root / "level-0", PE_PRESENT, b"".join(pages))
    for level in range(1, depth):
        write_level(root / f"level-{level}", PE_PARENT, parent=f"level-{level - 1}")
    return pages


def full_dump(folder: Path, pages: list[bytes]) -> None:
    write_level(folder, PE_PRESENT, b"".join(pages))


def test_an_increment_on_a_chain_deeper_than_the_recursion_limit(tmp_path):
    depth = sys.getrecursionlimit() + 200
    pages = chain(tmp_path, depth)
    # the new dump: pages 0 and 3 as the chain holds them, 1 and 2 rewritten
    mine = [pages[0], b"\xee" * PAGE, b"\xdd" * PAGE, pages[3]]
    full_dump(tmp_path / "new", mine)
    saving = incremental.link_to_parent(tmp_path / "new", tmp_path / f"level-{depth - 1}")
    assert (saving.pages_total, saving.pages_kept) == (4, 2)
    assert (tmp_path / "new" / "pages-1.img").read_bytes() == mine[1] + mine[2]
    # read back through the whole chain: every page as dumped
    found, read = incremental._Pages(tmp_path / "new", tmp_path / "new" / "pagemap-1.img").read(
        VADDR + PAGE * np.arange(4, dtype=np.uint64))
    assert found.all() and [bytes(row) for row in read] == mine


def test_parent_links_that_loop_are_refused(tmp_path):
    pages = chain(tmp_path, 3)
    # level-0 now says its pages are in level-2: 0 → 2 → 1 → 0
    (tmp_path / "level-0").rename(tmp_path / "old-0")
    write_level(tmp_path / "level-0", PE_PARENT, parent="level-2")
    full_dump(tmp_path / "new", pages)
    with pytest.raises(SnapshotError) as info:
        incremental.link_to_parent(tmp_path / "new", tmp_path / "level-2")
    assert str(info.value) == (f"the parent links of {tmp_path / 'new'} loop back to "
                               f"{tmp_path / 'level-2'}: the store is damaged")
