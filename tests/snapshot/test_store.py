"""The snapshot store: atomic commits, checksums, parents (no CRIU needed)."""

import dataclasses
import json

import pytest

from prism_debug.snapshot.manifest import MANIFEST, Manifest
from prism_debug.snapshot.store import SnapshotError, Store


def manifest(snapshot_id, parent=None, iteration=2):
    return Manifest(id=snapshot_id, parent=parent, iteration=iteration, world_size=8192,
                    rank=4097, graph_digest=None, script_digest="ab" * 32,
                    command=["python", "train.py"], environment_digest="cd" * 32,
                    hardware="h100-ib400", open_files={"log": "/tmp/run/rank.log"},
                    image_bytes=0, dump_s=0.2, created="2026-11-22T08:00:00+0000")


BASE, CHILD = "r1-it1-0ba5e0", "r1-it2-c41d00"  # ids of the store's form (any other is refused)


def committed(store, snapshot_id, parent=None, images=(("pages-1.img", b"pages"),)):
    staging = store.staging(snapshot_id)
    for name, data in images:
        (staging / name).write_bytes(data)
    (staging / "dump.log").write_text("criu's log is not an image")
    if parent is not None:  # CRIU's link to the parent's images, as an incremental dump has
        (staging / "parent").symlink_to(f"../{parent}")
    return store.commit(staging, manifest(snapshot_id, parent))


def test_a_commit_checksums_the_images_and_appears_whole(tmp_path):
    store = Store(tmp_path / "store")
    path = committed(store, "r1-it2-aaaaaa", images=(("pages-1.img", b"pages"),
                                                     ("core-7.img", b"core")))
    saved = store.get("r1-it2-aaaaaa")
    # the pages image's page index is recorded (and checksummed) beside it
    assert saved.image_bytes == 9 and sorted(saved.files) == ["core-7.img", "pages-1.idx",
                                                              "pages-1.img"]
    assert [m.id for m in store.list()] == ["r1-it2-aaaaaa"]
    assert sorted(p.name for p in path.iterdir()) == [".verified", "core-7.img", "dump.log",
                                                     MANIFEST, "pages-1.idx", "pages-1.img"]
    assert store.verify("r1-it2-aaaaaa") == saved


def test_a_discarded_dump_leaves_nothing(tmp_path):
    store = Store(tmp_path / "store")
    staging = store.staging("r1-it2-bbbbbb")
    (staging / "pages-1.img").write_bytes(b"half")
    store.discard(staging)
    assert list(store.root.iterdir()) == [] and store.list() == []


def test_a_damaged_image_is_refused_by_name(tmp_path):
    store = Store(tmp_path / "store")
    path = committed(store, "r1-it2-cccccc")
    (path / "pages-1.img").write_bytes(b"pageS")
    with pytest.raises(SnapshotError) as info:
        store.verify("r1-it2-cccccc")
    assert str(info.value) == ("snapshot r1-it2-cccccc is damaged: image pages-1.img does not "
                               "match its checksum")
    (path / "pages-1.img").unlink()
    with pytest.raises(SnapshotError, match="image pages-1.img is missing"):
        store.verify("r1-it2-cccccc")


def test_a_damaged_manifest_and_an_unknown_id_are_refused(tmp_path):
    store = Store(tmp_path / "store")
    path = committed(store, "r1-it2-dddddd")
    with pytest.raises(SnapshotError) as info:
        store.get("r1-it2-000000")
    assert str(info.value) == (f"no snapshot 'r1-it2-000000' in {store.root} (list them with "
                               f"prism-debug snapshot ls --store {store.root})")
    (path / MANIFEST).write_text("{not json")
    with pytest.raises(SnapshotError, match="the manifest is damaged"):
        store.get("r1-it2-dddddd")
    data = json.loads(manifest("r1-it2-dddddd").to_json()) | {"version": 9}
    (path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match="manifest version 9; this prism-debug reads "
                                            "versions 1, 2, 3, 4"):
        store.get("r1-it2-dddddd")
    # version 1 recorded no working directory: read, as None; version 2 names one
    del data["cwd"]
    (path / MANIFEST).write_text(json.dumps(data | {"version": 1}))
    assert (store.get("r1-it2-dddddd").cwd, store.get("r1-it2-dddddd").version) == (None, 1)
    (path / MANIFEST).write_text(json.dumps(data | {"version": 2, "cwd": "work/x"}))
    with pytest.raises(SnapshotError, match="cwd 'work/x' is not an absolute path"):
        store.get("r1-it2-dddddd")


def test_removing_a_parent_needs_force_and_takes_its_children(tmp_path):
    store = Store(tmp_path / "store")
    committed(store, BASE)
    committed(store, CHILD, parent=BASE)
    with pytest.raises(SnapshotError) as info:
        store.remove(BASE)
    assert str(info.value) == (f"snapshot {BASE} is the parent of incremental snapshot(s) "
                               f"{CHILD}; remove those first or pass --force to remove them all")
    assert [m.id for m in store.list()] == [BASE, CHILD]
    assert store.remove(BASE, force=True) == [CHILD, BASE]
    assert store.list() == []


def test_verifying_an_incremental_snapshot_verifies_its_parent(tmp_path):
    store = Store(tmp_path / "store")
    base = committed(store, BASE)
    committed(store, CHILD, parent=BASE)
    (base / "pages-1.img").write_bytes(b"xxxxx")
    with pytest.raises(SnapshotError, match=f"snapshot {BASE} is damaged"):
        store.verify(CHILD)


def test_a_manifest_round_trips():
    original = dataclasses.replace(manifest("r1-it2-eeeeee"), files={"a.img": "0" * 64})
    assert Manifest.from_json(original.to_json(), None) == original
