"""One controller's bus serving the agents of several ranks, with real parts: the
controller's server polled on a thread of this process, each rank a real process
running the agent's own link code (:class:`prism_debug.agent.link.BusLink`), real
ZeroMQ sockets, and the kernel's peer credentials telling the processes apart."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import zmq

from prism_debug.bus import server as bus_server
from prism_debug.bus import sessions
from prism_debug.bus.agents import AgentTable
from prism_debug.bus.client import BusClient
from prism_debug.bus.protocol import (
    BadArguments,
    BadMessage,
    RankUnavailable,
    decode_request,
    encode_request,
)
from prism_debug.bus.sessions import SessionInfo
from prism_debug.errors import ConfigError, SessionNotFound

ROOT = Path(__file__).resolve().parents[2]
RANKS = (4096, 4097)

# A rank: the agent's real link, answering every command with who answered it and
# keeping what it was asked; `pause` also publishes a paused event, as the agent does.
AGENT = textwrap.dedent("""
    import json, os, sys
    from prism_debug.agent.link import BusLink
    endpoint, rank, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    asked = []
    def handle(verb, args):
        asked.append(verb)
        if verb == "pause":
            link.publish("paused", {"by": rank, "pid": os.getpid()})
        return {"answered_by": rank, "pid": os.getpid(), "asked": list(asked)}
    link = BusLink(endpoint, rank, os.getpid(), handle, lambda: None, secret=secret)
    link.start()
    sys.stdin.read()  # until the test closes our stdin
    link.stop()
""")


class Controller:
    """The bus server of a controller running ``ranks``, polled on its own thread
    (as the controller's loop does); the test thread only drives clients."""

    def __init__(self, ranks, directory: Path) -> None:
        self.server = bus_server.BusServer(ranks, directory=directory)
        self.server.handle("hello", lambda client, args: {"session": "s", "rank": -1})
        self.pids: dict[int, int] = {}
        self.server.agents.pid_of = self.pids.get
        self.hellos: list[tuple[int, int]] = []
        self.server.on_rank_agent_hello = lambda rank, pid: self.hellos.append((rank, pid))
        self.paused: list[tuple[int, dict]] = []
        self.server.on_rank_paused_at = lambda rank, where: self.paused.append((rank, where))
        self._calls: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.server.poll(0.01)
            while not self._calls.empty():
                call, done = self._calls.get()
                call()
                done.set()

    def run(self, call) -> None:
        """Do ``call`` on the server's thread, between polls (sockets are not
        thread-safe), and wait for it."""
        done = threading.Event()
        self._calls.put((call, done))
        assert done.wait(10)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.server.close()


@pytest.fixture
def controller(short_dir):
    made = Controller(RANKS, short_dir / "bus")
    yield made
    made.close()


def start_agent(controller: Controller, rank: int, as_rank: int | None = None):
    """A process running rank ``as_rank``'s agent link (default: ``rank``'s), known
    to the controller as rank ``rank``'s process."""
    process = subprocess.Popen(
        [sys.executable, "-c", AGENT, controller.server.commands,
         str(rank if as_rank is None else as_rank), controller.server.secret],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    controller.pids[rank] = process.pid
    return process


def stop_agent(process) -> str:
    """End the rank; what it wrote on stderr."""
    try:
        _, err = process.communicate("", timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return err


@pytest.fixture
def agents(controller):
    started = {rank: start_agent(controller, rank) for rank in RANKS}
    wait_until(lambda: all(controller.server.agents[r].connected for r in RANKS))
    yield started
    for process in started.values():
        stop_agent(process)


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- commands go to the bound rank -------------------------------------------------------------

def test_commands_reach_the_bound_rank_only_and_a_client_naming_none_drives_the_lowest(
        controller, agents):
    server = controller.server
    # (a link says hello again each second until answered: a slow loop may see two)
    assert sorted(set(controller.hellos)) == [(r, agents[r].pid) for r in RANKS]
    assert [server.agents[r].pid for r in RANKS] == [agents[r].pid for r in RANKS]
    with BusClient(server.commands, server.events) as high, \
            BusClient(server.commands, server.events) as low:
        # the hello's reply names the rank the client now drives
        assert high.request("hello", client="high", rank=4097) == {"session": "s", "rank": 4097}
        assert low.request("hello", client="low") == {"session": "s", "rank": 4096}
        for _ in range(3):
            answer = high.request("where")
            assert (answer["answered_by"], answer["pid"]) == (4097, agents[4097].pid)
        answer = low.request("status")
        assert (answer["answered_by"], answer["pid"]) == (4096, agents[4096].pid)
        # each rank was asked what its own clients asked, nothing else; a reply that
        # does not name its rank is given the name (several ranks: say whose it is)
        assert high.request("breaks") == {"answered_by": 4097, "pid": agents[4097].pid,
                                          "asked": ["where"] * 3 + ["breaks"], "rank": 4097}
        assert low.request("breaks")["asked"] == ["status", "breaks"]
        # a client that never said hello drives the lowest rank as well
    with BusClient(server.commands, server.events) as silent:
        assert silent.request("where")["answered_by"] == 4096
        # a hello again rebinds the client
        silent.request("hello", client="x", rank=4097)
        assert silent.request("where")["answered_by"] == 4097


def test_a_hello_naming_a_rank_the_session_does_not_hold_is_one_clear_error(
        controller, agents):
    server = controller.server
    with BusClient(server.commands, server.events) as client:
        with pytest.raises(BadArguments) as refused:
            client.request("hello", client="c", rank=5)
        assert str(refused.value) == ("this session does not hold rank 5: it holds ranks "
                                      "4096-4097 (prism-debug ps lists the sessions)")
        # nothing was bound: it still drives the lowest rank
        assert client.request("where")["answered_by"] == 4096


def test_a_rank_that_is_away_holds_its_own_requests_only(controller, agents):
    server = controller.server
    with BusClient(server.commands, server.events) as high, \
            BusClient(server.commands, server.events) as low:
        high.request("hello", client="high", rank=4097)
        controller.run(lambda: server.agent_gone(4097))  # 4097 exited: its requests fail
        with pytest.raises(RankUnavailable) as refused:
            high.request("where")
        assert str(refused.value) == ("rank 4097 is not connected to the bus (it has not "
                                      "started yet, or it exited): status tells which")
        assert low.request("where")["answered_by"] == 4096
        assert (server.agent_connected, server.agents[4097].connected) == (True, False)


# -- who may speak for a rank ------------------------------------------------------------------

def test_rank_4097s_hello_from_rank_4096s_process_is_refused(controller):
    server = controller.server
    # the process the controller runs as rank 4096 says it is rank 4097's agent
    impostor = start_agent(controller, 4096, as_rank=4097)
    real = start_agent(controller, 4097)
    try:
        wait_until(lambda: server.agents[4097].connected)
        wait_until(lambda: server.refused_hellos >= 2)  # it says hello again, every second
        assert (server.agents[4096].connected, server.agents[4097].pid) == (False, real.pid)
        with BusClient(server.commands, server.events) as client:
            client.request("hello", client="c", rank=4097)
            assert client.request("where")["pid"] == real.pid
            assert client.request("breaks")["asked"] == ["where", "breaks"]
    finally:
        said = stop_agent(impostor)
        stop_agent(real)
    # the link was told why, in the words the controller used
    assert (f"the controller refused the rank's bus link: agent.hello refused: pid "
            f"{impostor.pid} is not rank 4097 (pid {real.pid})") in said
    assert set(controller.hellos) == {(4097, real.pid)}


def test_a_hello_for_a_rank_the_controller_does_not_run_is_refused(controller):
    context = zmq.Context()
    try:
        # this test process is rank 4096's: it may speak for 4096, for no other rank
        controller.pids[4096] = os.getpid()
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(controller.server.commands)

        def hello(rank: int) -> dict:
            dealer.send(encode_request("agent.hello", {"rank": rank, "pid": os.getpid(),
                                                       "secret": controller.server.secret}))
            assert dealer.poll(10_000)
            return json.loads(dealer.recv())

        assert hello(5)["error"] == {"type": "Unauthorized", "message": (
            "agent.hello refused: rank 5 is not a rank this controller runs (it runs 4096, "
            "4097)")}
        assert hello(4097)["error"]["message"] == (
            f"agent.hello refused: pid {os.getpid()} is not rank 4097 (pid None)")
        assert hello(4096)["ok"] is True
        # the connection speaks for 4096 now: it cannot turn into 4097's agent
        controller.pids[4097] = os.getpid()
        assert hello(4097)["error"]["message"] == (
            "agent.hello refused: this connection speaks for rank 4096 already, not rank 4097")
        assert controller.server.refused_hellos == 3
        assert not controller.server.agents[4097].connected
    finally:
        context.destroy(0)


def test_an_agents_reply_to_another_ranks_request_is_not_relayed(controller):
    """A rank's agent answers only the ids sent to it: rank 4096's agent, having
    seen (or guessed) the id of a request forwarded to 4097, answers nothing."""
    server = controller.server
    context = zmq.Context()
    try:
        def connect() -> zmq.Socket:
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(server.commands)
            return socket

        def receive(socket: zmq.Socket) -> dict:
            assert socket.poll(10_000)
            return json.loads(socket.recv())

        # this test process runs both ranks' agents, on two connections
        controller.pids.update({4096: os.getpid(), 4097: os.getpid()})
        agent = {rank: connect() for rank in RANKS}
        for rank in RANKS:
            agent[rank].send(encode_request("agent.hello", {
                "rank": rank, "pid": os.getpid(), "secret": server.secret}))
            assert receive(agent[rank])["ok"] is True
        client = connect()
        client.send(encode_request("hello", {"client": "c", "rank": 4097}, id="h"))
        assert receive(client)["result"]["rank"] == 4097
        client.send(encode_request("where", {}, id="w"))
        forwarded = receive(agent[4097])
        assert not agent[4096].poll(200)  # sent to 4097 alone
        agent[4096].send(json.dumps({"v": 2, "id": forwarded["id"], "ok": True,
                                     "result": {"answered_by": 4096}}).encode())
        assert not client.poll(500)  # not relayed: it was 4097's to answer
        agent[4097].send(json.dumps({"v": 2, "id": forwarded["id"], "ok": True,
                                     "result": {"answered_by": 4097}}).encode())
        assert receive(client) == {"v": 2, "id": "w", "ok": True,
                                   "result": {"answered_by": 4097, "rank": 4097}}
    finally:
        context.destroy(0)


# -- events ------------------------------------------------------------------------------------

def test_each_ranks_events_keep_to_its_topic_and_its_own_numbering(controller, agents):
    server = controller.server
    with BusClient(server.commands, server.events, rank=4097) as high, \
            BusClient(server.commands, server.events) as everyone, \
            BusClient(server.commands, server.events) as low:
        time.sleep(0.3)  # the subscriptions land
        low.request("hello", client="low")
        high.request("hello", client="high", rank=4097)
        for _ in range(2):
            low.request("pause")
        # the agent's events travel apart from its replies: the server has
        # published both pauses once it has noted them, and only then the output
        wait_until(lambda: len(controller.paused) == 2)
        controller.run(lambda: server.publish("output", {"line": "from 4096"}, 4096))
        high.request("pause")
        seen = high.next_event("paused", timeout_s=10)
        assert (seen["rank"], seen["seq"], seen["data"]["by"]) == (4097, 1, 4097)
        wait_until(lambda: len(controller.paused) == 3)
        time.sleep(0.2)
        assert high.events() == [] and high.missed == 0  # 4096's three events are not 4097's
        everything = []
        while len(everything) < 4:
            more = everyone.events(10)
            assert more, f"only {everything}"
            everything += more
        assert [(e["rank"], e["seq"], e["kind"]) for e in everything] == [
            (4096, 1, "paused"), (4096, 2, "paused"), (4096, 3, "output"), (4097, 1, "paused")]
        assert everyone.missed == 0
    assert [(rank, where["by"]) for rank, where in controller.paused] == [
        (4096, 4096), (4096, 4096), (4097, 4097)]


def test_a_console_of_a_session_of_several_ranks_hears_the_lowest_unless_it_names_one(
        controller, agents):
    server = controller.server
    info = SessionInfo(session="s", pid=os.getpid(), commands=server.commands,
                       events=server.events, world_size=8192, ranks=RANKS,
                       started="2026-11-25T08:00:00+00:00", curve_public=None)
    with BusClient.for_session(info) as default, \
            BusClient.for_session(info, rank=4097) as named:
        time.sleep(0.3)
        for rank in RANKS:
            controller.run(lambda rank=rank: server.publish("output", {"line": str(rank)},
                                                            rank))
        assert [e["rank"] for e in default.events(5)] == [4096]
        assert [e["rank"] for e in named.events(5)] == [4097]


# -- another user -----------------------------------------------------------------------------

INTRUDER = textwrap.dedent("""
    import json, sys, zmq
    commands, events = sys.argv[1:3]
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(events)
    dealer = context.socket(zmq.DEALER)
    dealer.connect(commands)
    replies = []
    for rank in (4096, 4097):
        dealer.send(json.dumps({"v": 3, "id": f"h{rank}", "verb": "hello",
                                "args": {"client": "x", "rank": rank}}).encode())
        dealer.send(json.dumps({"v": 2, "id": f"c{rank}", "verb": "continue",
                                "args": {}}).encode())
    while dealer.poll(3000):
        replies.append(dealer.recv().decode())
    seen = 0
    while sub.poll(1000):
        sub.recv_multipart()
        seen += 1
    print(json.dumps({"replies": replies, "events": seen}))
    context.destroy(0)
""")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to act as another user")
def test_another_user_drives_neither_rank_nor_reads_their_events(controller, agents):
    server = controller.server
    intruder = subprocess.Popen(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
         "-c", INTRUDER, server.commands, server.events],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    # the ranks keep publishing meanwhile: none of it may reach the intruder
    with BusClient(server.commands, server.events) as mine:
        for rank in RANKS:
            mine.request("hello", client="me", rank=rank)
            mine.request("pause")
        out, err = intruder.communicate(timeout=60)
        assert intruder.returncode == 0, err
        assert json.loads(out) == {"replies": [], "events": 0}
        for rank in RANKS:  # what each rank was asked: mine, never the intruder's continue
            mine.request("hello", client="me", rank=rank)
            assert mine.request("breaks")["asked"] == ["pause", "breaks"]
    assert len(server.clients) == 1


# -- the table and the wire -------------------------------------------------------------------

def test_the_agent_table_orders_its_ranks_and_names_them_as_a_session_of_one_did():
    table = AgentTable([4097, 4096, 4097])
    assert (table.ranks, table.lowest.rank, table.several) == ((4096, 4097), 4096, True)
    assert table.name(4097) == "rank 4097"
    one = AgentTable([5])
    assert (one.name(5), one.several) == ("the rank", False)
    with pytest.raises(ConfigError, match="one or more ranks >= 0"):
        AgentTable([])


def test_only_a_hello_naming_a_rank_needs_protocol_3():
    named = json.loads(encode_request("hello", {"client": "c", "rank": 1}, id="a"))
    plain = json.loads(encode_request("hello", {"client": "c"}, id="a"))
    assert (named["v"], plain["v"]) == (3, 2)
    assert json.loads(encode_request("status", {}, id="a"))["v"] == 2
    assert decode_request(encode_request("hello", {"client": "c", "rank": 1})).args == {
        "client": "c", "rank": 1}
    # a frame carries the version it needs, no other: a single-rank session's frames
    # are what they were, and a version-3 status is no request of this prism-debug
    for message, text in [
            ({"v": 2, "verb": "hello", "args": {"client": "c", "rank": 1}},
             "request has protocol version 2, but a 'hello' request naming a rank is "
             "version 3 (run the same prism-debug on both ends)"),
            ({"v": 3, "verb": "status"}, "request has protocol version 3, but a 'status' "
             "request is version 2 (run the same prism-debug on both ends)")]:
        with pytest.raises(BadMessage) as refused:
            decode_request(json.dumps({**message, "id": "a"}).encode())
        assert (str(refused.value), refused.value.request_id) == (text, "a")


def test_a_single_rank_server_is_the_one_it_always_was(short_dir):
    server = bus_server.BusServer(5, directory=short_dir / "bus")
    try:
        assert (server.rank, server.ranks, server.agent_connected, server.agent_pid,
                server.agent_expected) == (5, (5,), False, None, True)
        server.rank_pid = os.getpid  # the single-rank spelling still decides
        assert server.agents.pid_of(5) == os.getpid() and server.agents.pid_of(6) is None
    finally:
        server.close()


# -- sessions ---------------------------------------------------------------------------------

def multi(session="m", ranks=(0, 1), **fields) -> SessionInfo:
    return SessionInfo(session=session, pid=os.getpid(), commands="ipc:///x.c",
                       events="ipc:///x.e", world_size=8192, ranks=ranks,
                       started="2026-11-25T08:00:00+00:00", curve_public=None, **fields)


def test_a_session_of_several_ranks_round_trips_and_says_where_it_stands(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv(sessions.ENV_VAR, str(tmp_path / "sessions"))
    host0 = multi("h0", (0, 1), all_ranks=(0, 1, 2, 3), node_rank=0, nnodes=2)
    path = sessions.publish(host0)
    data = json.loads(path.read_text())
    assert (data["all_ranks"], data["node_rank"], data["nnodes"]) == ([0, 1, 2, 3], 0, 2)
    assert sessions.live_sessions() == [host0]
    assert sessions.session_ranks_text(host0) == "ranks 0-1 (node 0 of 2; job ranks 0-3)"
    assert sessions.session_ranks_text(multi(ranks=(0, 1))) == "ranks 0-1"
    assert sessions.session_ranks_text(multi(ranks=(4097,))) == "rank 4097"
    # one host's run of two ranks, all of the job's
    assert sessions.session_ranks_text(multi(all_ranks=(0, 1))) == "ranks 0-1"
    # the ranks of the job on another host: said so
    assert sessions.find(rank=1) == host0
    with pytest.raises(SessionNotFound) as missing:
        sessions.find(rank=3)
    assert str(missing.value) == (
        "no running session holds rank 3: session h0 holds ranks 0-1 (node 0 of 2; job ranks "
        "0-3) (rank 3 belongs to session h0's job: its controller on another host holds it; "
        "attach there)")
    # a file of a single rank names none of the new fields (it reads as it always did)
    assert "all_ranks" not in multi(ranks=(5,)).to_json()


@pytest.mark.parametrize("fields, message", [
    ({"all_ranks": (2, 3)}, "all_ranks [2, 3] must hold its ranks [0, 1]"),
    ({"all_ranks": (0, 1, 9000)}, "lie inside the world of 8192"),
    ({"node_rank": 0}, "both or neither"),
    ({"node_rank": 2, "nnodes": 2}, "0 <= node_rank < nnodes"),
])
def test_a_session_of_several_ranks_that_contradicts_itself_is_refused(fields, message):
    with pytest.raises(ConfigError, match=message.replace("[", "\\[").replace("]", "\\]")):
        multi(**fields)


@pytest.mark.parametrize("field, value", [("all_ranks", [0, "1"]), ("all_ranks", 3),
                                          ("node_rank", "0"), ("nnodes", 2.0)])
def test_a_file_with_mistyped_multi_rank_fields_is_unreadable(field, value):
    data = json.loads(multi(all_ranks=(0, 1), node_rank=0, nnodes=1).to_json())
    data[field] = value
    with pytest.raises(ValueError):
        SessionInfo.from_dict(data)
