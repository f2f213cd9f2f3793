"""The console against a fake client: exact text, JSON lines, errors, completion."""

from __future__ import annotations

import copy
import io
import json

from prism_debug.console import Console
from prism_debug.errors import PrismError

RANK = 4097


class FakeBusError(PrismError):
    """Stands in for prism_debug.bus.protocol.BusError: a PrismError with a .type."""

    def __init__(self, type: str, message: str) -> None:
        super().__init__(message)
        self.type = type


class FakeClient:
    """Records requests; answers from canned results; hands out queued events."""

    def __init__(self, results: dict | None = None, stream: list[dict] = (),
                 pending: list[dict] = ()) -> None:
        self.results = results or {}  # verb -> result, exception, or a list of them in turn
        self.stream = list(stream)  # what next_event() takes from, in order
        self.pending = list(pending)  # what the next events() returns
        self.requests: list[tuple[str, dict]] = []
        self.missed = 0

    def request(self, verb: str, timeout_s: float = 10.0, **args) -> dict:
        self.requests.append((verb, args))
        result = self.results.get(verb, {})
        if isinstance(result, list):
            result = result.pop(0)
        if isinstance(result, Exception):
            raise result
        return copy.deepcopy(result)

    def next_event(self, kinds: set[str], timeout_s: float) -> dict | None:
        while self.stream:
            event = self.stream.pop(0)
            if event["kind"] in kinds:
                return event
        return None

    def events(self, timeout_s: float = 0.0) -> list[dict]:
        events, self.pending = self.pending, []
        return events


def event(seq: int, kind: str, /, **data) -> dict:
    return {"seq": seq, "rank": RANK, "kind": kind, "wall": 1700000000.0 + seq, "data": data}


def paused(seq: int, iteration: int, reason: str, op: str | None = None, family: str | None = None,
           index: int | None = None, coll_seq: int | None = None) -> dict:
    return event(seq, "paused", iteration=iteration, at="collective" if op else "iteration",
                 op=op, family=family, index=index, seq=coll_seq, reason=reason)


def run(client: FakeClient, script: str, json_mode: bool = False) -> tuple[Console, str]:
    stdout = io.StringIO()
    console = Console(client, RANK, stdin=io.StringIO(script), stdout=stdout,
                      json_mode=json_mode, interactive=False)
    console.cmdloop()
    return console, stdout.getvalue()


STATUS = {"state": "paused", "rank": RANK, "world_size": 8192, "iteration": 3,
          "emulated_s": 12.3456, "breakpoints": 1, "session": "s-7f3a", "pid": 4242, "clients": 2,
          "paused_at": paused(9, 3, "break 1")["data"]}

TIMELINE = {"iteration": 3, "ops": [
    {"seq": 12, "op": "all_reduce", "family": "dp", "index": 3, "bytes": 16 << 20,
     "start_ms": 102.5, "duration_ms": 10.25, "wait_ms": 2.125, "last_rank": 4096},
    {"seq": 13, "op": "send", "family": None, "index": None, "bytes": 512,
     "start_ms": 113.0, "duration_ms": 1.0, "wait_ms": 0.0, "last_rank": None},
]}


def test_status_prints_key_value_lines():
    _, out = run(FakeClient({"status": STATUS}), "status\n")
    assert out == (
        "rank: 4097 of 8192\n"
        "state: paused at iteration 3 (break 1)\n"
        "iteration: 3\n"
        "emulated time: 12.346 s\n"
        "breakpoints: 1\n"
        "pid: 4242\n"
        "session: s-7f3a\n"
        "clients: 2\n")


def test_break_info_breaks_and_delete():
    client = FakeClient({
        "break": [{"id": 1, "description": "iteration 3"},
                  {"id": 2, "description": "all_reduce on dp seq 12"}],
        "breaks": {"breakpoints": [
            {"id": 1, "description": "iteration 3", "temporary": False, "hits": 0},
            {"id": 2, "description": "all_reduce on dp seq 12", "temporary": True, "hits": 1}]},
        "delete": [{"deleted": [1]}, {"deleted": [2]}],
    })
    _, out = run(client, "break iter 3\ntbreak coll all_reduce dp seq 12\ninfo breaks\n"
                         "delete 1\ndelete\n")
    assert out == (
        "breakpoint 1: iteration 3\n"
        "temporary breakpoint 2: all_reduce on dp seq 12\n"
        "Num Type Disp Hits Where\n"
        "1   iter keep 0    iteration 3\n"
        "2   coll del  1    all_reduce on dp seq 12\n"
        "deleted breakpoint 1\n"
        "deleted breakpoint 2\n")
    assert client.requests[:2] == [
        ("break", {"kind": "iter", "iteration": 3, "temporary": False}),
        ("break", {"kind": "coll", "op": "all_reduce", "family": "dp", "seq": 12,
                   "temporary": True})]
    assert client.requests[3:] == [("delete", {"id": 1}), ("delete", {}), ("leave", {})]


def test_break_without_argument_lists_and_bad_breaks_print_usage():
    client = FakeClient({"breaks": {"breakpoints": []}})
    console, out = run(client, "b\nbreak iter x\nbreak coll\nbreak coll all_reduce seq\n")
    usage = "*** usage: b(reak) iter N | coll OP [FAMILY] [seq N]\n"
    assert out == "no breakpoints\n" + usage * 3
    assert [verb for verb, _ in client.requests] == ["breaks", "leave"]
    assert console.exit_status == 1


def test_continue_stops_at_a_breakpoint():
    client = FakeClient({"continue": {"state": "running"}},
                        stream=[event(5, "iteration.start", iteration=2), paused(6, 3, "break 1")])
    _, out = run(client, "c\n")
    assert out == "paused at iteration 3 (break 1)\n"
    assert client.requests == [("continue", {}), ("leave", {})]


def test_step_and_next_print_where_they_stopped():
    client = FakeClient({"step": {"state": "running"}, "next": {"state": "running"}},
                        stream=[paused(7, 3, "step", "all_reduce", "dp", 3, 12),
                                paused(8, 4, "next")])
    _, out = run(client, "s\nn\n")
    assert out == ("paused before all_reduce on dp[3] (seq 12) in iteration 3 (step)\n"
                   "paused at iteration 4 (next)\n")


def test_exit_ends_rank_commands_until_a_restore():
    client = FakeClient({"continue": {"state": "running"},
                         "restore": {"id": "s1", "iteration": 2, "pid": 5151},
                         "where": {"frames": []}},
                        stream=[event(9, "exited", exit_code=0)])
    console, out = run(client, "c\nwhere\nc\nrestore s1\nwhere\n")
    gone = "*** the rank exited with code 0; restore a snapshot (snapshots, restore ID) or quit\n"
    assert out == ("the rank exited with code 0\n" + gone + gone
                   + "restored snapshot s1: paused after iteration 2 (pid 5151)\n" + "no frames\n")
    assert [verb for verb, _ in client.requests] == ["continue", "restore", "where", "leave"]


def test_a_late_restore_pause_is_not_the_stop_of_a_run():
    client = FakeClient({"continue": {"state": "running"}},
                        pending=[paused(3, 2, "restore")],
                        stream=[paused(4, 2, "restore"), paused(5, 3, "break 1")])
    _, out = run(client, "c\n")
    assert out == "paused at iteration 3 (break 1)\n"


def test_where_marks_the_innermost_frame():
    frames = [{"file": "train.py", "line": 40, "function": "<module>", "code": "main()"},
              {"file": "train.py", "line": 12, "function": "train", "code": "  loss.backward()"}]
    _, out = run(FakeClient({"where": {"frames": frames}}), "bt\n")
    assert out == ('  File "train.py", line 40, in <module>\n'
                   "    main()\n"
                   '> File "train.py", line 12, in train\n'
                   "    loss.backward()\n")


def test_timeline_table_with_totals():
    _, out = run(FakeClient({"timeline": TIMELINE}), "timeline\n")
    assert out == (
        "iteration 3: 2 collectives\n"
        "  seq  op             group           bytes   start ms  duration ms   wait ms  last rank\n"
        "   12  all_reduce     dp[3]        16.0 MiB    102.500       10.250     2.125       4096\n"
        "   13  send           -               512 B    113.000        1.000     0.000          -\n"
        "total                              16.0 MiB                  11.250     2.125\n")


def test_a_timeline_from_before_any_console_says_why_it_names_nobody():
    ops = [{**op, "last_rank": None} for op in TIMELINE["ops"]]
    _, out = run(FakeClient({"timeline": {**TIMELINE, "ops": ops, "last_ranks_kept": False}}),
                 "timeline\n")
    assert out.splitlines()[-1] == (
        "last rank: kept from the first console command on, and this iteration ended "
        "before it; the next one will have them")


def test_peers_table():
    peers = {"mode": "graph", "note": "members of dp[3]", "peers": [
        {"rank": 4096, "node": 512, "class": 0, "coords": {"pp": 0, "dp": 3, "tp": 0},
         "time_ms": 123.4567, "perturbations": []},
        {"rank": 4098, "node": 512, "class": 1, "coords": {"pp": 1, "dp": 3, "tp": 0},
         "time_ms": None, "perturbations": ["delay 5ms", "straggler"]}]}
    client = FakeClient({"peers": peers})
    _, out = run(client, "peers dp=3\n")
    assert out == (
        "mode: graph\n"
        "members of dp[3]\n"
        "  rank   node  class    time ms  coords          perturbations\n"
        "  4096    512      0    123.457  pp=0 dp=3 tp=0  -\n"
        "  4098    512      1          -  pp=1 dp=3 tp=0  delay 5ms, straggler\n")
    assert client.requests[0] == ("peers", {"selector": "dp=3"})


def test_events_on_prints_events_between_commands_and_while_running():
    client = FakeClient({"events": [{"events": True}, {"events": False}],
                         "continue": {"state": "running"}, "status": STATUS},
                        stream=[event(4, "iteration.end", iteration=2, time_s=0.5, compute_s=0.4,
                                      comm_wait_s=0.1, num_collectives=24, digest="ab"),
                                event(5, "output", line="loss 0.25"),
                                paused(6, 3, "break 1")])
    console = Console(client, RANK, stdin=io.StringIO(), stdout=io.StringIO(), interactive=False)
    console.onecmd("events")
    console.onecmd("events on")
    client.pending = [event(3, "snapshot", id="s1", iteration=2, bytes=3 << 30, dump_s=1.5,
                            path="/snap/s1")]
    client.missed = 2
    console.postcmd(False, "")
    console.onecmd("c")
    console.onecmd("events off")
    client.pending = [event(7, "resumed")]
    console.postcmd(False, "")
    assert console.stdout.getvalue() == (
        "events are off\n"
        "events on\n"
        "[3] snapshot s1 taken after iteration 2 (3.0 GiB in 1.50 s)\n"
        "(missed 2 events)\n"
        "[4] iteration 2 ended: 500.000 ms (compute 400.000 ms, comm wait 100.000 ms,"
        " 24 collectives)\n"
        "[5] output: loss 0.25\n"
        "paused at iteration 3 (break 1)\n"
        "events off\n")
    assert client.requests == [("events", {"on": True}), ("continue", {}),
                               ("events", {"on": False})]


def test_snapshot_snapshots_restore():
    client = FakeClient({
        "snapshot": {"id": "s2", "iteration": 3, "bytes": 1536 << 20, "dump_s": 2.104,
                     "path": "/snap/s2"},
        "snapshots": {"snapshots": [
            {"id": "s1", "iteration": 2, "image_bytes": 1 << 30, "created": "2025-01-02 10:11:12",
             "parent": None},
            {"id": "s2", "iteration": 3, "image_bytes": 1536 << 20,
             "created": "2025-01-02 10:12:00", "parent": "s1"}]},
        "restore": {"id": "s1", "iteration": 2, "pid": 5151},
    })
    _, out = run(client, "snapshot before-nan\nsnapshots\nrestore s1\n")
    assert out == (
        "snapshot s2: after iteration 3, 1.5 GiB in 2.10 s (/snap/s2)\n"
        "id  iteration        size  created              kind     parent\n"
        "s1          2     1.0 GiB  2025-01-02 10:11:12  user     -\n"
        "s2          3     1.5 GiB  2025-01-02 10:12:00  user     s1\n"
        "restored snapshot s1: paused after iteration 2 (pid 5151)\n")
    assert client.requests[0] == ("snapshot", {"name": "before-nan"})
    assert client.requests[2] == ("restore", {"id": "s1"})


def test_errors_print_stars_and_never_end_the_console():
    client = FakeClient({"step": FakeBusError("InvalidState",
                                              "the rank is running; pause it first"),
                         "status": STATUS})
    console, out = run(client, "step\nfrobnicate\nrestore\nstatus\n")
    assert out.splitlines()[:3] == [
        "*** the rank is running; pause it first",
        "*** unknown command 'frobnicate'; type help for the list",
        "*** usage: restore ID"]
    assert out.splitlines()[3] == "rank: 4097 of 8192"
    assert console.exit_status == 1
    assert client.requests[-1] == ("leave", {})


def test_blank_line_repeats_the_last_command():
    client = FakeClient({"next": {"state": "running"}},
                        stream=[paused(1, 1, "next"), paused(2, 2, "next")])
    _, out = run(client, "n\n\n")
    assert out == "paused at iteration 1 (next)\npaused at iteration 2 (next)\n"
    assert [verb for verb, _ in client.requests] == ["next", "next", "leave"]


def test_semicolons_separate_commands():
    client = FakeClient({"break": {"id": 1, "description": "iteration 3"},
                         "continue": {"state": "running"}, "status": STATUS},
                        stream=[paused(1, 3, "break 1")])
    _, out = run(client, "break iter 3; c; status\n")
    assert out.splitlines()[:3] == ["breakpoint 1: iteration 3", "paused at iteration 3 (break 1)",
                                    "rank: 4097 of 8192"]
    assert [verb for verb, _ in client.requests] == ["break", "continue", "status", "leave"]


def test_json_mode_prints_one_json_line_per_command():
    stop = paused(1, 3, "break 1")
    client = FakeClient({"break": {"id": 1, "description": "iteration 3"},
                         "continue": {"state": "running"}, "status": STATUS,
                         "where": FakeBusError("InvalidState", "the rank is running")},
                        stream=[stop])
    _, out = run(client, "break iter 3; c; status; where; break nonsense; detach\n", json_mode=True)
    assert [json.loads(line) for line in out.splitlines()] == [
        {"id": 1, "description": "iteration 3"},
        stop,
        STATUS,
        {"error": {"type": "InvalidState", "message": "the rank is running"}},
        {"error": {"type": "BadArguments",
                   "message": "usage: b(reak) iter N | coll OP [FAMILY] [seq N]"}},
        {},
    ]


def test_run_commands_returns_the_exit_status_and_detaches():
    client = FakeClient({"status": STATUS, "where": FakeBusError("Timeout", "no reply in 10 s")})
    console = Console(client, RANK, stdout=io.StringIO(), interactive=False)
    assert console.run_commands("status; status") == 0
    assert client.requests[-1] == ("leave", {})
    client = FakeClient({"status": STATUS, "where": FakeBusError("Timeout", "no reply in 10 s")})
    console = Console(client, RANK, stdout=io.StringIO(), interactive=False)
    assert console.run_commands("where; status") == 1
    assert [verb for verb, _ in client.requests] == ["where", "status", "leave"]


LEFT_PAUSED = {**STATUS, "clients": 0}
RUNNING = {**STATUS, "state": "running", "paused_at": None, "breakpoints": 0}


def test_leaving_says_what_happens_to_the_rank():
    # end of input and quit leave the rank as it is, and say how it is
    client = FakeClient({"leave": LEFT_PAUSED})
    console, out = run(client, "")
    assert out == ("left; rank 4097 stays paused at iteration 3 (break 1) — `prism-debug attach "
                   "--rank 4097` to resume it (continue) or release it (detach)\n")
    assert (client.requests, console.detached) == ([("leave", {})], True)
    client = FakeClient({"leave": RUNNING})
    _, out = run(client, "q\nstatus\n")
    assert out == "left; rank 4097 keeps running\n"
    assert client.requests == [("leave", {})]
    _, out = run(FakeClient({"leave": {**RUNNING, "breakpoints": 2}}), "quit\n")
    assert out == ("left; rank 4097 keeps running, and its 2 breakpoints stay armed — "
                   "`prism-debug attach --rank 4097` to resume it (continue) or release it "
                   "(detach) where it pauses\n")


def test_detach_releases_the_rank():
    client = FakeClient({"detach": {**STATUS, "deleted": 1, "resumed": True}})
    console, out = run(client, "detach\nstatus\n")
    assert out == "detached; rank 4097 runs free to its end (resumed, 1 breakpoint deleted)\n"
    assert client.requests == [("detach", {})]
    _, out = run(FakeClient({"detach": {**RUNNING, "deleted": 0, "resumed": False}}), "detach\n")
    assert out == "detached; rank 4097 runs free to its end\n"


def test_where_and_timeline_say_when_the_rank_runs():
    frames = [{"file": "train.py", "line": 12, "function": "train", "code": "loss.backward()"}]
    client = FakeClient({"where": {"frames": frames, "state": "running", "paused_at": None},
                         "timeline": {**TIMELINE, "state": "running", "paused_at": None}})
    _, out = run(client, "where\ntimeline\n")
    assert out.splitlines()[:4] == [
        "(running: the stack at the instant asked; pause holds the rank still)",
        '> File "train.py", line 12, in train',
        "    loss.backward()",
        "iteration 3: 2 collectives (running: the last finished iteration; the rank is past it)"]


def test_a_snapshot_mid_iteration_is_scheduled_at_once_and_announced_when_taken():
    taken = event(12, "snapshot", id="r5-it3-aa", iteration=3, bytes=3 << 20, dump_s=0.25,
                  path="/snap/r5-it3-aa")
    next_stop = paused(13, 4, "next")
    next_stop["data"]["number"] = 5  # after the pause (number 4) the snapshot was asked in
    client = FakeClient({"snapshot": {"iteration": 3, "when": "scheduled", "state": "paused"},
                         "next": {"state": "running", "after": 4}},
                        stream=[event(11, "resumed", iteration=3), taken, next_stop])
    _, out = run(client, "snapshot\nn\n")
    assert out.splitlines() == [
        "snapshot scheduled for the end of iteration 3: taken once continued (continue, next or "
        "step), as the rank is paused mid-iteration; announced when taken, and snapshots lists it",
        "snapshot r5-it3-aa taken after iteration 3 (3.0 MiB in 0.25 s)",
        "paused at iteration 4 (next)"]
    # announced between commands too, and a failed one as well
    client = FakeClient({"snapshot": {"iteration": 7, "when": "scheduled", "state": "running"},
                         "breaks": {"breakpoints": []}},
                        pending=[event(20, "snapshot", iteration=7, error="CRIU is missing")])
    _, out = run(client, "snapshot\nbreak\n")
    assert out.splitlines() == [
        "snapshot scheduled for the end of iteration 7: taken as the rank gets there; announced "
        "when taken, and snapshots lists it",
        "no snapshot after iteration 7: CRIU is missing",
        "no breakpoints"]


def test_every_snapshot_taken_is_news_once():
    now = {"id": "s2", "iteration": 3, "bytes": 1 << 20, "dump_s": 0.5, "path": "/snap/s2"}
    client = FakeClient({"snapshot": now, "breaks": {"breakpoints": []}})
    console = Console(client, RANK, stdin=io.StringIO(), stdout=io.StringIO(), interactive=False)
    console.postcmd(console.onecmd("snapshot"), "snapshot")
    # its own event (shown as the reply) and one another console scheduled
    client.pending = [event(4, "snapshot", **now),
                      event(5, "snapshot", id="s3", iteration=4, bytes=1 << 20, dump_s=0.5,
                            path="/snap/s3")]
    console.postcmd(console.onecmd("break"), "break")
    assert console.stdout.getvalue().splitlines() == [
        "snapshot s2: after iteration 3, 1.0 MiB in 0.50 s (/snap/s2)",
        "no breakpoints",
        "snapshot s3 taken after iteration 4 (1.0 MiB in 0.50 s)"]


def test_a_pause_that_takes_long_gives_the_console_back_and_is_announced_later():
    late = paused(30, 6, "pause", "all_reduce", "dp", 0, 2)
    late["data"]["number"] = 3
    client = FakeClient({"pause": {"state": "pausing", "after": 2, "paused_at": None},
                         "breaks": {"breakpoints": []}})
    console = Console(client, RANK, stdin=io.StringIO(), stdout=io.StringIO(), interactive=False)
    console.onecmd("pause")  # the fake's stream is empty: no pause within the wait
    client.pending = [late]
    console.postcmd(console.onecmd("break"), "break")
    assert console.stdout.getvalue().splitlines() == [
        "rank 4097 is pausing: it stops at its next collective or iteration boundary, not "
        "reached in 5 s (status shows where it is); the pause is announced when it comes",
        "no breakpoints",
        "paused before all_reduce on dp[0] (seq 2) in iteration 6 (pause)"]


def test_pause_on_a_paused_rank_answers_at_once():
    where = paused(9, 3, "break 1")["data"]
    client = FakeClient({"pause": {"state": "paused", "after": 0, "paused_at": where}})
    _, out = run(client, "pause\n")
    assert out == "paused at iteration 3 (break 1)\n"


def test_tab_completion():
    console = Console(FakeClient(), RANK, stdout=io.StringIO(), interactive=False)
    assert console.complete_break("co", "break co", 6, 8) == ["coll"]
    assert console.complete_b("all_", "b coll all_", 7, 11) == ["all_reduce", "all_gather",
                                                                "all_to_all"]
    assert console.complete_break("", "break coll all_reduce dp ", 25, 25) == ["seq"]
    assert console.complete_events("o", "events o", 7, 8) == ["on", "off"]
    assert console.completenames("sta") == ["status"]


def test_help_shows_the_usage_line_first():
    _, out = run(FakeClient(), "help c\n")
    assert out.splitlines()[0] == "c(ont(inue))"


def test_ctrl_c_while_running_pauses_the_rank():
    class InterruptedOnce(FakeClient):
        def next_event(self, kinds, timeout_s):
            if not getattr(self, "interrupted", False):
                self.interrupted = True
                raise KeyboardInterrupt
            return super().next_event(kinds, timeout_s)

    client = InterruptedOnce({"continue": {"state": "running"}, "pause": {"state": "pausing"}},
                             stream=[paused(8, 5, "pause", "all_gather", "tp", 0, 3)])
    _, out = run(client, "c\n")
    assert out == ("--KeyboardInterrupt-- pausing the rank (Ctrl-C again to stop waiting)\n"
                   "paused before all_gather on tp[0] (seq 3) in iteration 5 (pause)\n")
    assert [verb for verb, _ in client.requests] == ["continue", "pause", "leave"]


def test_back_and_reverse_continue_say_what_they_restored_and_where_they_stopped():
    back = {"id": "r1-it2-aaaaaa", "iteration": 2, "pid": 7, "state": "running", "after": 4,
            "target": 4, "target_seq": None, "replayed": 1, "reason": "back"}
    rc = {**back, "iteration": 4, "target": 5, "replayed": 0, "after": 6,
          "reason": "reverse-continue, break 2"}
    client = FakeClient({"back": back, "reverse-continue": rc}, stream=[
        {**paused(20, 3, "restore"), "data": {**paused(20, 3, "restore")["data"], "number": 5}},
        {**paused(21, 4, "back"), "data": {**paused(21, 4, "back")["data"], "number": 5}},
        {**paused(22, 5, "reverse-continue, break 2"),
         "data": {**paused(22, 5, "reverse-continue, break 2")["data"], "number": 7}}])
    _, out = run(client, "back 2\nreverse-continue\nback 0\nback x\nback 1 2\n")
    assert out == (
        "back: restored snapshot r1-it2-aaaaaa (after iteration 2), running 1 iteration again\n"
        "paused at iteration 4 (back)\n"
        "reverse-continue, break 2: restored snapshot r1-it2-aaaaaa (after iteration 4)\n"
        "paused at iteration 5 (reverse-continue, break 2)\n"
        "*** usage: back [N]\n*** usage: back [N]\n*** usage: back [N]\n")
    assert client.requests == [("back", {"iterations": 2}), ("reverse-continue", {}), ("leave", {})]
    _, out = run(FakeClient({"back": back}), "back\nrc x\nhelp reverse-continue\n")
    assert out.splitlines()[0].startswith("back: restored")
    assert out.splitlines()[2:4] == ["*** usage: reverse-continue | rc", "reverse-continue | rc"]
