"""A confined, private store: an id names a snapshot of the store and nothing
else, whatever the id, the links or the manifests say; what the store holds
is its user's alone; staging a dead dump left is swept, a live one is not.

Real processes throughout (the CLI, writers killed with SIGKILL); the images
are small stand-ins, since what is checked is where the store reads and
deletes, not what CRIU makes of them (tests/runner/test_private_runs.py
does the same with real CRIU dumps).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.snapshot.manifest import MANIFEST, Manifest
from prism_debug.snapshot.store import SnapshotError, Store

# the form new_id gives, written out here as the specification (this file
# imports nothing the old store lacked, so it can be run against it)
ID_PATTERN = re.compile(r"r[0-9]{1,10}-it[0-9]{1,12}-[0-9a-f]{6}")
STALE_STAGING_S = 600  # staging nobody holds is swept once this old

A, B, C = "r1-it1-aaaaaa", "r1-it2-bbbbbb", "r1-it3-cccccc"
ID_HELP = "ids look like r<rank>-it<iteration>-<6 hex digits>, e.g. r4097-it2-a1b2c3"
ATTACKS = {"counted": 0}  # crafted ids and files tried against the store, for the report
# the last test reads the count the others made: all of them in one process
# (make test's serial phase; pytest-xdist's loadgroup does not group them under
# pytest 9.2 with xdist 3.8)
pytestmark = pytest.mark.serial


def manifest(snapshot_id, parent=None):
    return Manifest(id=snapshot_id, parent=parent, iteration=2, world_size=16, rank=1,
                    graph_digest=None, script_digest=None, command=["python", "train.py"],
                    environment_digest="cd" * 32, hardware="zero",
                    open_files={"log": "/tmp/run/rank.log"}, image_bytes=0, dump_s=0.2,
                    created="2026-11-22T08:00:00+0000")


def committed(store: Store, snapshot_id: str, parent: str | None = None) -> Path:
    staging = store.staging(snapshot_id)
    (staging / "pages-1.img").write_bytes(b"the rank's memory: " + snapshot_id.encode())
    (staging / "dump.log").write_text("criu's log")
    if parent is not None:
        (staging / "parent").symlink_to(f"../{parent}")
    return store.commit(staging, manifest(snapshot_id, parent))


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.fixture
def victim(tmp_path):
    """A store with one snapshot, and beside it another with a snapshot of the
    same form nobody may reach through the first."""
    store = Store(tmp_path / "store")
    committed(store, A)
    outside = Store(tmp_path / "outside")
    committed(outside, B)
    return store, outside.root / B


# -- ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "rm", "show", "restore"])
def test_a_crafted_id_is_refused_by_the_cli_and_nothing_outside_is_touched(victim, command):
    store, target = victim
    store.root.joinpath(C).symlink_to(target)  # a link in the store to a snapshot outside it
    before = tree(target.parent)
    crafted = {f"../outside/{B}": "not a snapshot id", str(target): "not a snapshot id",
               f"{A}/../../outside/{B}": "not a snapshot id", "": "not a snapshot id",
               C: f"snapshot {C} in {store.root} is a symbolic link to {target}"}
    for snapshot_id, says in crafted.items():
        ATTACKS["counted"] += 1
        args = ["snapshot", command, snapshot_id, "--store", str(store.root)]
        proc = cli(*args, *(["--no-bus", "--run-dir", str(store.root.parent / "run")]
                            if command == "restore" else []))
        assert proc.returncode == 2, (snapshot_id, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and says in proc.stderr, (snapshot_id, proc.stderr)
        if says == "not a snapshot id":
            assert proc.stderr == (f"prism-debug: error: {snapshot_id!r} is not a snapshot id: "
                                   f"{ID_HELP} (prism-debug snapshot ls lists them)\n")
        assert tree(target.parent) == before  # nothing outside read into a run, or removed
        assert not (store.root.parent / "run").exists()  # no restore started
    assert sorted(os.listdir(store.root)) == [A, C]


def test_links_and_manifests_cannot_lead_out_of_a_snapshot(victim):
    store, target = victim
    a = store.path(A)
    # a manifest that is a link to another snapshot's
    (store.root / C).mkdir(mode=0o700)
    (store.root / C / MANIFEST).symlink_to(target / MANIFEST)
    # an image that is a link to a file outside, with the right checksum
    committed(store, "r1-it4-dddddd")
    image = store.path("r1-it4-dddddd") / "pages-1.img"
    outside_image = target.parent / "copy.img"
    outside_image.write_bytes(image.read_bytes())
    image.unlink()
    image.symlink_to(outside_image)
    # a manifest whose image names climb out of the folder
    data = json.loads((a / MANIFEST).read_text())
    escaping = dict(data, id="r1-it5-eeeeee",
                    files={f"../../outside/{B}/pages-1.img": data["files"]["pages-1.img"]})
    (store.root / "r1-it5-eeeeee").mkdir(mode=0o700)
    (store.root / "r1-it5-eeeeee" / MANIFEST).write_text(json.dumps(escaping))
    # a folder renamed (or a manifest copied) under another id
    (store.root / "r1-it6-ffffff").mkdir(mode=0o700)
    (store.root / "r1-it6-ffffff" / MANIFEST).write_bytes((a / MANIFEST).read_bytes())
    (store.root / "r1-it6-ffffff" / "pages-1.img").write_bytes((a / "pages-1.img").read_bytes())
    # a parent link that leads elsewhere than the manifest's parent
    (a / "parent").symlink_to(f"../../outside/{B}")
    refusals = {
        C: f"{store.root / C / MANIFEST} is a symbolic link; a snapshot's files must be its own",
        "r1-it4-dddddd": f"{image} is a symbolic link",
        "r1-it5-eeeeee": "the manifest is damaged (files names '../../outside/",
        "r1-it6-ffffff": f"the manifest is of snapshot {A}, not of its folder r1-it6-ffffff",
        A: f"snapshot {A} is damaged: its parent link points at '../../outside/{B}', not at "
           "its parent None",
    }
    for snapshot_id, says in refusals.items():
        ATTACKS["counted"] += 1
        with pytest.raises(SnapshotError) as info:
            store.verify(snapshot_id)
        assert says in str(info.value)
        proc = cli("snapshot", "verify", snapshot_id, "--store", str(store.root))
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1


# every string Hypothesis makes, and strings built from the pieces of path attacks
_PIECES = ["..", ".", "/", "\\", "\x00", "\n", "~", "%2e%2e", A, ".tmp-", "r1", "-it2-", "abcdef",
           "ABCDEF", "\u0661", "r\u0661-it2-abcdef", " ", "//", "./", "../"]
FUZZED = {"ids": 0, "accepted": 0}


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.text(), st.from_regex(ID_PATTERN, fullmatch=True),
                 st.lists(st.sampled_from(_PIECES), max_size=6).map("".join),
                 st.binary().map(lambda b: b.decode("latin-1"))))
def test_fuzzed_ids_resolve_inside_the_store_or_are_refused(tmp_path_factory, snapshot_id):
    root = _fuzz_store(tmp_path_factory)
    store = Store(root)
    FUZZED["ids"] += 1
    try:
        path = store.path(snapshot_id)
    except SnapshotError as exc:
        assert ID_PATTERN.fullmatch(snapshot_id) is None
        assert str(exc).count("\n") == 0 and "not a snapshot id" in str(exc)
        return
    FUZZED["accepted"] += 1
    # accepted: the form exactly (ASCII digits, lower-case hex), a child of the store
    assert ID_PATTERN.fullmatch(snapshot_id) and snapshot_id.isascii()
    assert path.parent == root and path.resolve().parent == root.resolve()


_FUZZ_ROOT: list[Path] = []


def _fuzz_store(tmp_path_factory) -> Path:
    if not _FUZZ_ROOT:
        root = tmp_path_factory.mktemp("fuzz") / "store"
        committed(Store(root), A)
        _FUZZ_ROOT.append(root)
    return _FUZZ_ROOT[0]


def test_fuzzing_tried_enough_ids():
    # runs after the fuzz test (file order); its figure goes into the note
    if not FUZZED["ids"]:
        pytest.skip("counts the fuzz test's ids: run the whole file")
    print(f"\nfuzzed {FUZZED['ids']} ids against Store.path, {FUZZED['accepted']} accepted")
    assert FUZZED["ids"] >= 3000 and FUZZED["accepted"] > 0


# -- manifests and parent chains ------------------------------------------------------------


def test_ls_lists_the_readable_snapshots_and_warns_of_a_bad_one(tmp_path):
    store = Store(tmp_path / "store")
    for snapshot_id in (A, B, C):
        committed(store, snapshot_id)
    (store.root / B / MANIFEST).write_text("{not json")
    proc = cli("snapshot", "ls", "--store", str(store.root))
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines()[1:]]
    assert listed == [A, C]
    assert proc.stderr.startswith(f"prism-debug: warning: skipped {store.root / B}: "
                                  f"{store.root / B / MANIFEST}: the manifest is damaged (")
    assert proc.stderr.count("\n") == 1
    verified = cli("snapshot", "verify", B, "--store", str(store.root))
    assert verified.returncode == 2 and "the manifest is damaged" in verified.stderr
    removed = cli("snapshot", "rm", B, "--store", str(store.root))  # a damaged one can go
    assert removed.returncode == 0 and removed.stdout == f"removed {B}\n"


def test_a_parent_cycle_is_refused_and_rm_force_ends(tmp_path):
    store = Store(tmp_path / "store")
    committed(store, A)
    committed(store, B, parent=A)
    committed(store, C, parent=B)
    # A's manifest and link say its parent is C: C → B → A → C
    data = json.loads((store.root / A / MANIFEST).read_text()) | {"parent": C}
    (store.root / A / MANIFEST).write_text(json.dumps(data))
    (store.root / A / "parent").symlink_to(f"../{C}")
    ATTACKS["counted"] += 1
    loop = f"snapshot {C}'s parent chain loops ({C} → {B} → {A} → {C})"
    for command in ("verify", "restore"):
        proc = cli("snapshot", command, C, "--store", str(store.root),
                   *(["--no-bus", "--run-dir", str(tmp_path / "run")]
                     if command == "restore" else []))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (f"prism-debug: error: {loop}: the manifests are damaged; "
                               "restore none of them\n")
    proc = cli("snapshot", "rm", A, "--force", "--store", str(store.root))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()[1::2]) == [A, B, C] and os.listdir(store.root) == []


# -- staging --------------------------------------------------------------------------------

_WRITER = """
import os, sys
from pathlib import Path
from prism_debug.snapshot.store import Store
staging = Store(Path(sys.argv[1])).staging(sys.argv[2])
(staging / "pages-1.img").write_bytes(b"half a dump")
print("staged", flush=True)
if sys.argv[3] == "die":
    os.kill(os.getpid(), 9)
sys.stdin.read()  # a live dump: until the test lets it go
"""


def _writer(root: Path, snapshot_id: str, fate: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(root), snapshot_id, fate],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "staged\n"
    return proc


def test_stale_staging_is_swept_and_a_live_dump_is_not(tmp_path):
    store = Store(tmp_path / "store")
    committed(store, A)
    dead = _writer(store.root, B, "die")
    assert dead.wait() == -signal.SIGKILL
    dead_young = _writer(store.root, "r1-it7-777777", "die")
    dead_young.wait()
    live = _writer(store.root, C, "live")
    try:
        old = time.time() - 2 * STALE_STAGING_S
        for name in (B, C):  # the dead one and the live one both look old
            os.utime(store.root / f".tmp-{name}", (old, old))
        proc = cli("snapshot", "ls", "--store", str(store.root))
        assert proc.returncode == 0 and proc.stderr == ""
        assert sorted(os.listdir(store.root)) == [f".tmp-{C}", ".tmp-r1-it7-777777", A]
        assert [line.split()[0] for line in proc.stdout.splitlines()[1:]] == [A]
    finally:
        live.stdin.close()
        live.wait(timeout=60)


# -- who can read it ------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_store_is_private_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        store = Store(tmp_path / "deep" / "store")
        path = committed(store, A)
    finally:
        os.umask(previous)
    assert {p.name: _mode(p) for p in [tmp_path / "deep", store.root, path]} == {
        "deep": 0o700, "store": 0o700, A: 0o700}
    assert {p.name: _mode(p) for p in path.iterdir()} == {
        "pages-1.img": 0o600, "pages-1.idx": 0o600, "dump.log": 0o600, MANIFEST: 0o600,
        ".verified": 0o600}


def test_a_store_others_can_read_is_warned_of_and_one_they_can_write_refused(tmp_path):
    store = Store(tmp_path / "store")
    committed(store, A)
    os.chmod(store.root, 0o755)
    proc = cli("snapshot", "verify", A, "--store", str(store.root))
    assert proc.returncode == 0
    assert proc.stderr == (f"prism-debug: warning: snapshot store {store.root} is open to other "
                           "users (mode 0755), and snapshots hold the rank's whole memory: "
                           f"chmod 700 {store.root}\n")
    os.chmod(store.root, 0o777)
    ATTACKS["counted"] += 1
    proc = cli("snapshot", "verify", A, "--store", str(store.root))
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: snapshot store {store.root} is writable by other "
                           "users (mode 0777), so its images could be theirs: check it, then "
                           f"chmod 700 {store.root}\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_store_another_user_owns_is_refused(tmp_path):
    store = Store(tmp_path / "store")
    committed(store, A)
    os.chown(store.root, 65534, 65534)
    ATTACKS["counted"] += 1
    proc = cli("snapshot", "restore", A, "--store", str(store.root), "--no-bus")
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: snapshot store {store.root} belongs to uid "
                           "65534, not to you: its images could be anyone's; use a store of "
                           "your own (--store DIR)\n")


def test_attacks_were_counted():
    if not ATTACKS["counted"]:
        pytest.skip("counts the attacks of the tests above: run the whole file")
    print(f"\nattacks tried against the store: {ATTACKS['counted']} (+ {FUZZED['ids']} fuzzed "
          "ids)")
    assert ATTACKS["counted"] >= 20
