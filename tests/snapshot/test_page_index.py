"""Snapshots read once: the page index against a byte-for-byte comparison,
increments that give up when they would save too little, the in-place
compaction of a pages image, and restores that trust an image's stat facts
only while nothing changed it.

The images are CRIU's own format (pycriu writes the pagemaps), small and made
here, as in test_incremental_chain.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.snapshot import checksum, incremental
from prism_debug.snapshot.criu import pycriu
from prism_debug.snapshot.manifest import MANIFEST, Manifest
from prism_debug.snapshot.store import VERIFIED, SnapshotError, Store

PAGE = incremental.PAGE
VADDR = 0x7F0000000000


def write_dump(folder: Path, pages: list[bytes], entries: list[tuple[int, int]]) -> None:
    """A process's dump: pagemap entries (first page number, pages), all present."""
    folder.mkdir()
    with open(folder / "pagemap-7.img", "wb") as f:
        pycriu().images.dump({"magic": "PAGEMAP", "entries": [{"pages_id": 1}] + [
            {"vaddr": VADDR + PAGE * first, "nr_pages": n, "flags": incremental.PE_PRESENT}
            for first, n in entries]}, f)
    (folder / "pages-1.img").write_bytes(b"".join(pages))


def pages_of(seed: int, n: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, PAGE, dtype=np.uint8).tobytes() for _ in range(n)]


@settings(max_examples=25, deadline=None)
@given(changed=st.lists(st.booleans(), min_size=12, max_size=12),
       cut=st.integers(1, 11))
def test_an_increment_by_index_keeps_exactly_the_pages_whose_bytes_differ(
        tmp_path_factory, changed, cut):
    tmp = tmp_path_factory.mktemp("inc")
    entries = [(0, cut), (cut + 3, 12 - cut)]  # two mappings, a hole between them
    parent = pages_of(1, 12)
    mine = [pages_of(2 + i, 1)[0] if c else parent[i] for i, c in enumerate(changed)]
    write_dump(tmp / "parent", parent, entries)
    write_dump(tmp / "child", mine, entries)
    saving = incremental.link_to_parent(tmp / "child", tmp / "parent", min_saving=0.0)
    # the byte-for-byte answer: the pages that differ, in order
    differ = [m for m, p in zip(mine, parent, strict=True) if m != p]
    assert (saving.pages_total, saving.pages_kept, saving.linked) == (12, len(differ), True)
    assert (tmp / "child" / "pages-1.img").read_bytes() == b"".join(differ)
    # its index: xxh3-128 of each kept page
    assert (tmp / "child" / "pages-1.idx").read_bytes() == b"".join(
        xxhash.xxh3_128_digest(p) for p in differ)
    # every page read back through the chain as dumped, and only the hole missing
    addresses = VADDR + PAGE * np.array([i if i < cut else i + 3 for i in range(12)]
                                        + [cut], dtype=np.uint64)
    found, read = incremental._Pages(tmp / "child", tmp / "child" / "pagemap-7.img").read(
        addresses)
    assert found.tolist() == [True] * 12 + [False]
    assert [bytes(row) for row in read[:12]] == mine


def test_an_increment_that_would_save_too_little_stays_whole(tmp_path):
    parent = pages_of(1, 8)
    mine = pages_of(3, 6) + parent[6:]  # 2 of 8 pages the parent's: 25 % saved
    write_dump(tmp_path / "parent", parent, [(0, 8)])
    write_dump(tmp_path / "child", mine, [(0, 8)])
    pagemap = (tmp_path / "child" / "pagemap-7.img").read_bytes()
    saving = incremental.link_to_parent(tmp_path / "child", tmp_path / "parent",
                                        min_saving=0.26)
    assert (saving.pages_total, saving.pages_kept, saving.linked) == (8, 8, False)
    assert saving.share_saved == 0.0
    # untouched, no link to a parent, and indexed for the commit
    assert not (tmp_path / "child" / "parent").is_symlink()
    assert (tmp_path / "child" / "pages-1.img").read_bytes() == b"".join(mine)
    assert (tmp_path / "child" / "pagemap-7.img").read_bytes() == pagemap
    assert (tmp_path / "child" / "pages-1.idx").read_bytes() == b"".join(
        xxhash.xxh3_128_digest(p) for p in mine)
    # at the default threshold (a quarter) the same pages make an increment
    (tmp_path / "child" / "pages-1.idx").unlink()
    saving = incremental.link_to_parent(tmp_path / "child", tmp_path / "parent")
    assert (saving.pages_kept, saving.linked) == (6, True)


@settings(max_examples=60, deadline=None)
@given(kept=st.lists(st.booleans(), min_size=1, max_size=64),
       move_pages=st.sampled_from([1, 2, 3, 64]))
def test_compaction_in_place_keeps_the_kept_pages_in_order(tmp_path_factory, kept, move_pages):
    """Runs move forward within the file, overlapping their old place when the
    gap is shorter than the run: by copy_file_range in pieces no longer than
    the gap (a gap of ``move_pages`` or more), else through a buffer."""
    path = tmp_path_factory.mktemp("compact") / "pages-1.img"
    pages = [bytes([i]) * PAGE for i in range(len(kept))]
    path.write_bytes(b"".join(pages))
    incremental._compact(path, np.array(kept), move=move_pages * PAGE)
    assert path.read_bytes() == b"".join(p for p, k in zip(pages, kept, strict=True) if k)


def manifest(snapshot_id: str) -> Manifest:
    return Manifest(id=snapshot_id, parent=None, iteration=2, world_size=8, rank=1,
                    graph_digest=None, script_digest=None, command=["python", "train.py"],
                    environment_digest="cd" * 32, hardware="zero",
                    open_files={"log": "/tmp/run/rank.log"}, image_bytes=0, dump_s=0.2,
                    created="2026-11-22T08:00:00+0000")


def committed(store: Store, snapshot_id: str, pages: bytes) -> Path:
    staging = store.staging(snapshot_id)
    (staging / "pages-1.img").write_bytes(pages)
    (staging / "core-7.img").write_bytes(b"core")
    return store.commit(staging, manifest(snapshot_id))


def test_the_commit_hashes_with_blake3_and_indexes_in_the_same_pass(tmp_path):
    store = Store(tmp_path / "store")
    pages = b"".join(pages_of(5, 3)) + b"tail"  # a partial last page is indexed too
    path = committed(store, "r1-it2-aaaaaa", pages)
    saved = store.get("r1-it2-aaaaaa")
    index = b"".join(xxhash.xxh3_128_digest(pages[i:i + PAGE]) for i in range(0, len(pages),
                                                                                PAGE))
    assert (path / "pages-1.idx").read_bytes() == index
    import blake3
    assert saved.hash == "blake3" and saved.files == {
        "core-7.img": blake3.blake3(b"core").hexdigest(),
        "pages-1.idx": blake3.blake3(index).hexdigest(),
        "pages-1.img": blake3.blake3(pages).hexdigest()}
    assert saved.image_bytes == len(pages) + 4
    assert {"hash", "fsync_wait", "commit"} <= set(saved.phases)


def test_a_restore_trusts_stat_facts_only_while_nothing_changed_the_image(tmp_path):
    store = Store(tmp_path / "store")
    path = committed(store, "r1-it2-bbbbbb", b"p" * PAGE)
    image = path / "pages-1.img"
    assert store.verify("r1-it2-bbbbbb").id == "r1-it2-bbbbbb"
    # damaged in place, same size, its mtime put back: the ctime still moved
    before = os.stat(image)
    with open(image, "r+b") as f:
        f.write(b"q")
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(image).st_mtime_ns == before.st_mtime_ns
    assert os.stat(image).st_ctime_ns != before.st_ctime_ns
    for rehash in (False, True):
        with pytest.raises(SnapshotError, match="image pages-1.img does not match its checksum"):
            store.verify("r1-it2-bbbbbb", rehash=rehash)


def test_verify_once_reads_nothing_that_its_record_vouches_for_unless_asked(tmp_path):
    """The record is what a restore goes by: one claiming a damaged image's
    facts (as only a change below the file system could leave it) passes a
    restore's check, and re-hashing (``snapshot verify``) still finds it."""
    store = Store(tmp_path / "store")
    path = committed(store, "r1-it2-cccccc", b"p" * PAGE)
    (path / "pages-1.img").write_bytes(b"q" * PAGE)
    record = json.loads((path / VERIFIED).read_text())
    record["files"]["pages-1.img"][1:] = checksum.facts(os.stat(path / "pages-1.img"))
    (path / VERIFIED).write_text(json.dumps(record))
    assert store.verify("r1-it2-cccccc").id == "r1-it2-cccccc"
    with pytest.raises(SnapshotError, match="image pages-1.img does not match its checksum"):
        store.verify("r1-it2-cccccc", rehash=True)
    # a rewritten manifest voids the record whole
    (path / "pages-1.img").write_bytes(b"p" * PAGE)
    store.verify("r1-it2-cccccc", rehash=True)
    (path / "pages-1.img").write_bytes(b"q" * PAGE)
    record = json.loads((path / VERIFIED).read_text())
    record["files"]["pages-1.img"][1:] = checksum.facts(os.stat(path / "pages-1.img"))
    (path / VERIFIED).write_text(json.dumps(record))
    (path / MANIFEST).write_text((path / MANIFEST).read_text())
    with pytest.raises(SnapshotError, match="does not match its checksum"):
        store.verify("r1-it2-cccccc")


def test_a_sha256_manifest_of_an_older_prism_debug_still_verifies(tmp_path):
    import hashlib
    store = Store(tmp_path / "store")
    path = committed(store, "r1-it2-dddddd", b"p" * PAGE)
    # as version 2 wrote it: SHA-256 of the images, no algorithm named, no index
    (path / "pages-1.idx").unlink()
    (path / VERIFIED).unlink()
    old = dataclasses.asdict(manifest("r1-it2-dddddd")) | {
        "version": 2, "cwd": None, "image_bytes": PAGE + 4,
        "files": {name: hashlib.sha256((path / name).read_bytes()).hexdigest()
                  for name in ("core-7.img", "pages-1.img")}}
    del old["hash"], old["phases"]
    (path / MANIFEST).write_text(json.dumps(old))
    assert store.get("r1-it2-dddddd").hash == "sha256"
    assert store.verify("r1-it2-dddddd", rehash=True).version == 2
    assert store.verify("r1-it2-dddddd").files == old["files"]  # now by its record
    (path / "pages-1.img").write_bytes(b"q" * PAGE)
    with pytest.raises(SnapshotError, match="image pages-1.img does not match its checksum"):
        store.verify("r1-it2-dddddd")
