"""A snapshot's handshake between the controller and the rank, with a real
control file and real signals: what lets an idling rank go, and what never
does (a file left from an earlier wait, a restore already followed)."""

from __future__ import annotations

import os
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.agent.handshake import RELEASE_SIGNAL, Handshake
from prism_debug.capture.snapshots import Release, release_rank, write_control
from prism_debug.snapshot.control import Go, RestoreControl, encode

contents = st.one_of(
    st.builds(Go, stop_at=st.integers(0, 10**6), ticket=st.none() | st.text(max_size=40)),
    st.builds(RestoreControl, snapshot=st.text(max_size=40), stop_at=st.integers(0, 10**6),
              iterations=st.none() | st.integers(0, 10**6),
              faults=st.lists(st.fixed_dictionaries({"action": st.text(max_size=10)}),
                              max_size=20).map(tuple)))


@settings(max_examples=200, deadline=None)
@given(st.lists(contents, min_size=1, max_size=8))
def test_the_control_file_is_rewritten_in_place_and_reads_back(tmp_path_factory, writes):
    path = tmp_path_factory.mktemp("control") / "control.json"
    path.write_text("{}")
    handshake = Handshake(str(path))  # holds it open, as the rank does
    inode, size = path.stat().st_ino, path.stat().st_size
    for content in writes:
        write_control(path, content)
        assert handshake.read() == content
        # the same file, never shorter: it keeps the blocks it has
        assert path.stat().st_ino == inode and path.stat().st_size >= size
        size = path.stat().st_size


def test_a_half_written_or_foreign_control_file_reads_as_nothing(tmp_path):
    path = tmp_path / "control.json"
    for raw in (b"", b'{"stop_at": 3, "pha', b"[1, 2]", b"\xff\xfe", b"null",
                b'{"stop_at": 3, "phase": "go", "ticket": "t"}'):  # (no version: not ours)
        path.write_bytes(raw)
        assert Handshake(str(path)).read() is None


def waiting(handshake: Handshake, iteration: int):
    """Run a wait on this (the main) thread; the announcement comes back through
    ``announced`` to the thread that plays the controller."""
    announced: list[dict] = []
    ready = threading.Event()

    def announce(fields):
        announced.append(fields)
        ready.set()
    return announced, ready, lambda: handshake.wait(iteration, announce)


def controller(ready: threading.Event, act) -> threading.Thread:
    def run():
        ready.wait(10)
        time.sleep(0.05)
        act()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_only_a_go_naming_this_wait_lets_the_rank_go(tmp_path):
    path = tmp_path / "control.json"
    path.write_text(encode(Go(stop_at=4, ticket="from-before")))
    handshake = Handshake(str(path))
    announced, ready, wait = waiting(handshake, 4)
    started = time.monotonic()

    def go():
        time.sleep(0.2)  # the stale go is in the file all along meanwhile
        ticket = announced[0]["ticket"]
        release_rank(os.getpid(), path, Release(4, ticket), lambda line: None)
    thread = controller(ready, go)
    assert wait() is None
    thread.join()
    assert time.monotonic() - started >= 0.2
    assert announced[0]["release_signal"] == int(RELEASE_SIGNAL)


def test_the_release_signal_lets_the_rank_go_when_the_file_cannot_be_written(tmp_path):
    path = tmp_path / "control.json"
    path.write_text("{}")
    handshake = Handshake(str(path))
    announced, ready, wait = waiting(handshake, 2)
    path.unlink()  # the controller's write fails (ENOENT); the rank's descriptor stays
    lines: list[str] = []

    def go():
        release = Release.of({"iteration": 2, **announced[0]})
        release_rank(os.getpid(), path, release, lines.append)
    thread = controller(ready, go)
    assert wait() is None
    thread.join()
    assert lines == [f"prism-debug: warning: cannot write the rank's control file {path} "
                     f"([Errno 2] No such file or directory: '{path}'); letting it go by its "
                     "release signal"]


def test_a_restore_is_followed_once(tmp_path):
    path = tmp_path / "control.json"
    restore = RestoreControl(snapshot="r3-it2-abcdef", stop_at=2, bus=None)
    path.write_text(encode(restore))
    handshake = Handshake(str(path))
    # a copy restored from a snapshot of iteration 2 wakes to its instructions
    assert handshake.wait(2, lambda fields: None) == restore
    # a later snapshot at the same iteration (paused where the copy resumed)
    # does not take them for its go
    announced, ready, wait = waiting(handshake, 2)
    thread = controller(ready, lambda: write_control(
        path, Go(stop_at=2, ticket=announced[0]["ticket"])))
    assert wait() is None
    thread.join()
