"""Session discovery: publish, list, stale cleanup, find by rank or id (real files, real pids)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from prism_debug.bus import sessions
from prism_debug.bus.sessions import SessionInfo, SessionNotFound
from prism_debug.errors import ConfigError, PrismError


@pytest.fixture
def directory(tmp_path, monkeypatch):
    path = tmp_path / "sessions"
    monkeypatch.setenv(sessions.ENV_VAR, str(path))
    return path


@pytest.fixture(scope="module")
def dead_pid():
    """A pid that certainly exited and was reaped."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def info(session, ranks=(0,), pid=None, started="2026-11-22T08:00:00+00:00",
         world_size=8192):
    return SessionInfo(session=session, pid=os.getpid() if pid is None else pid,
                       commands="tcp://127.0.0.1:40001", events="tcp://127.0.0.1:40002",
                       world_size=world_size, ranks=ranks, started=started, curve_public=None)


def test_the_directory_follows_the_override_then_xdg_runtime_then_local_state(monkeypatch,
                                                                             tmp_path):
    monkeypatch.setenv(sessions.ENV_VAR, str(tmp_path / "mine"))
    assert sessions.sessions_dir() == tmp_path / "mine"
    monkeypatch.delenv(sessions.ENV_VAR)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert sessions.sessions_dir() == Path("/run/user/1000/prism-debug/sessions")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sessions.sessions_dir() == tmp_path / "home/.local/state/prism-debug/sessions"


def test_a_published_session_is_listed_and_withdrawn(directory):
    mine = info("s1", ranks=[4097])
    path = sessions.publish(mine)
    assert path == directory / "s1.json"
    assert json.loads(path.read_text()) == {
        "session": "s1", "pid": os.getpid(), "commands": "tcp://127.0.0.1:40001",
        "events": "tcp://127.0.0.1:40002", "world_size": 8192, "ranks": [4097],
        "started": "2026-11-22T08:00:00+00:00", "curve_public": None,
        "remote_commands": None}
    assert os.listdir(directory) == ["s1.json"]  # the staging file was renamed away
    assert sessions.live_sessions() == [mine] and mine.ranks == (4097,)
    sessions.withdraw(mine)
    sessions.withdraw(mine)  # already gone: fine
    assert sessions.live_sessions() == [] and os.listdir(directory) == []


def test_sessions_are_listed_oldest_first(directory):
    late = info("b", started="2026-11-22T09:00:00+00:00")
    early = info("a", started="2026-11-22T08:00:00+00:00")
    sessions.publish(late)
    sessions.publish(early)
    assert sessions.live_sessions() == [early, late]


def test_no_directory_means_no_sessions(directory):
    assert sessions.live_sessions() == []


def test_a_session_whose_pid_is_gone_is_stale_and_removed(directory, dead_pid):
    sessions.publish(info("dead", pid=dead_pid))
    sessions.publish(info("alive"))
    assert [s.session for s in sessions.live_sessions(clean=False)] == ["alive"]
    assert sorted(os.listdir(directory)) == ["alive.json", "dead.json"]
    assert [s.session for s in sessions.live_sessions()] == ["alive"]
    assert os.listdir(directory) == ["alive.json"]


@pytest.mark.parametrize("content", [
    "{not json", "[]", json.dumps({"session": "bad", "pid": os.getpid()}),
    json.dumps({**json.loads(info("x").to_json()), "session": "other"}),  # name mismatch
    json.dumps({**json.loads(info("x").to_json()), "pid": True}),
    json.dumps({**json.loads(info("x").to_json()), "ranks": [9000]}),  # outside the world
], ids=["not-json", "a-list", "fields-missing", "name-mismatch", "pid-bool", "rank-outside"])
def test_an_unreadable_session_file_is_stale(directory, content):
    directory.mkdir()
    (directory / "x.json").write_text(content)
    (directory / ".x.json.123").write_text("half written")  # a publish in progress
    (directory / "notes.txt").write_text("not a session")
    assert sessions.live_sessions() == []
    assert sorted(os.listdir(directory)) == [".x.json.123", "notes.txt"]


def test_a_pid_owned_by_someone_else_is_alive():
    assert sessions.pid_alive(1) is True  # init: EPERM for us unless root, alive either way
    assert sessions.pid_alive(0) is False and sessions.pid_alive(-1) is False


def test_unknown_fields_from_a_newer_prism_debug_are_ignored(directory):
    directory.mkdir()
    (directory / "n.json").write_text(json.dumps({**json.loads(info("n").to_json()),
                                                  "gpus": 8}))
    assert sessions.live_sessions() == [info("n")]


@pytest.mark.parametrize("kwargs, message", [
    ({"session": "../x"}, "session id '../x' must be 1..64 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit"),
    ({"pid": 0}, "session s: pid must be positive, got 0"),
    ({"ranks": (3, 8192)}, "session s: ranks [8192] lie outside the world of 8192"),
])
def test_an_impossible_session_is_refused(kwargs, message):
    fields = dict(session="s", pid=1, commands="c", events="e", world_size=8192, ranks=(0,),
                  started="t", curve_public=None)
    with pytest.raises(ConfigError) as raised:
        SessionInfo(**{**fields, **kwargs})
    assert str(raised.value) == message


# --- find -----------------------------------------------------------------------------------

def not_found(**kwargs):
    with pytest.raises(SessionNotFound) as raised:
        sessions.find(**kwargs)
    assert isinstance(raised.value, PrismError)
    return str(raised.value)


def test_find_with_nothing_running_says_how_to_start(directory, dead_pid):
    sessions.publish(info("dead", pid=dead_pid))
    assert not_found(rank=0) == ("no prism-debug session is running: start one with "
                                 "prism-debug run")
    assert not_found() == "no prism-debug session is running: start one with prism-debug run"


def test_find_by_rank(directory):
    sessions.publish(info("a", ranks=(0, 1, 2, 3, 8), started="1"))
    sessions.publish(info("b", ranks=(4097,), started="2"))
    assert sessions.find(rank=4097).session == "b"
    assert sessions.find(rank=8).session == "a"
    assert not_found(rank=5) == ("no running session holds rank 5: session a holds ranks 0-3, "
                                 "8; session b holds rank 4097")


def test_find_when_several_sessions_hold_the_rank_asks_for_one(directory):
    sessions.publish(info("a", ranks=(7,), started="1"))
    sessions.publish(info("b", ranks=(6, 7), started="2"))
    sessions.publish(info("c", ranks=(1,), started="3"))
    assert not_found(rank=7) == "2 sessions hold rank 7: pass --session ID with one of a, b"
    assert sessions.find(rank=7, session="b").session == "b"
    assert not_found() == "3 sessions are running: pass --session ID with one of a, b, c"
    assert not_found(session="z") == ("no running session 'z'; running: a, b, c "
                                      "(prism-debug ps lists them)")
    assert not_found(rank=1, session="a") == "session a does not hold rank 1: it holds rank 7"


def test_find_with_one_session_and_no_rank_takes_it(directory):
    sessions.publish(info("only", ranks=(12,)))
    assert sessions.find() == info("only", ranks=(12,))
