"""The control file between the controller and a rank idling for a snapshot:
what is written is read back whole, and what cannot be read whole (half
written, another version, another form) is read as nothing."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism_debug.snapshot.control import (
    CONTROL_VERSION,
    Go,
    RestoreControl,
    decode,
    encode,
)

RESTORE = RestoreControl(
    snapshot="20261128-1200-ab12", stop_at=2, iterations=4, record_ops=True,
    bus="ipc:///run/x.c", bus_curve={"server": "k", "public": "p", "secret": "s"},
    bus_secret="f00d", pause=True, history=False,
    faults=({"action": "delay", "select": {"kind": "ranks", "ranks": [3]}},),
    watch_nonfinite=True, side_store={"host": "127.0.0.1", "port": 5, "prefix": "p/"},
    reload=[{"path": "train.py", "functions": ["step"]}])


def test_a_restore_round_trips_whole():
    assert decode(encode(RESTORE).encode()) == RESTORE


@given(stop_at=st.integers(0, 2**40), ticket=st.none() | st.text(max_size=20))
def test_a_release_round_trips(stop_at, ticket):
    release = Go(stop_at=stop_at, ticket=ticket)
    assert decode(encode(release).encode()) == release


def test_the_file_names_its_version_and_kind():
    content = json.loads(encode(Go(stop_at=1, ticket="t")))
    assert content == {"version": CONTROL_VERSION, "kind": "release", "phase": "go",
                       "stop_at": 1, "ticket": "t"}


@pytest.mark.parametrize("raw", [
    b"", b"{}", b"   ", b'{"version": 1, "kind": "release", "phase": "go", "stop_at"',  # half
    b"[]", b"null", b'"go"',
    json.dumps({"version": 99, "kind": "release", "phase": "go", "stop_at": 1}).encode(),
    json.dumps({"version": 1, "kind": "other", "phase": "go", "stop_at": 1}).encode(),
    json.dumps({"version": 1, "kind": "release", "phase": "wait", "stop_at": 1}).encode(),
    json.dumps({"version": 1, "kind": "release", "phase": "go", "stop_at": "1"}).encode(),
    json.dumps({"version": 1, "kind": "release", "phase": "go", "stop_at": True}).encode(),
    json.dumps({"version": 1, "kind": "release", "phase": "go"}).encode(),
    json.dumps({"version": 1, "kind": "restore", "phase": "go", "stop_at": 1}).encode(),
    json.dumps({"version": 1, "kind": "restore", "phase": "go", "stop_at": 1,
                "snapshot": "s", "faults": "delay"}).encode(),
    json.dumps({"version": 1, "kind": "restore", "phase": "go", "stop_at": 1,
                "snapshot": "s", "bus_secret": 5}).encode(),
    b"[" * 100_000,  # deeper than the parser goes
], ids=["empty", "empty-object", "blanks", "half-written", "a-list", "null", "a-string",
        "another-version", "another-kind", "not-go", "stop-at-text", "stop-at-bool",
        "no-stop-at", "restore-without-snapshot", "faults-not-a-list", "secret-not-text",
        "too-deep"])
def test_what_cannot_be_read_whole_is_nothing(raw):
    assert decode(raw) is None


def test_blank_padding_is_read_as_json_ignores_it():
    # the controller pads a rewrite to the file's old length with blanks
    assert decode(encode(Go(stop_at=3)).encode().ljust(4096)) == Go(stop_at=3)
