"""The console of ``prism-debug attach``: pdb-style commands for one real rank.

:class:`Console` is the UI and nothing else: it turns command lines into bus
requests on a client object (``prism_debug.bus.client.BusClient`` in
production, a fake in tests) and turns results and events into text — or into
one JSON line per command with ``--json``.  Like pdb over bdb, it never
touches a socket.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any, Protocol, TextIO

from prism_debug.bus.protocol import EVENT_KINDS
from prism_debug.console.completion import Completion
from prism_debug.console.formatting import (
    format_back,
    format_breaks,
    format_deleted,
    format_event_line,
    format_event_text,
    format_left,
    format_new_break,
    format_pausing,
    format_peers,
    format_perturb,
    format_restored,
    format_scenario,
    format_snapshot,
    format_snapshots,
    format_status,
    format_timeline,
    format_where,
)
from prism_debug.console.parsing import is_int, parse_break
from prism_debug.console.shell import Shell
from prism_debug.errors import ConfigError, PrismError, ScenarioError
from prism_debug.faults import USAGE_TEXT, fault_text, parse_fault
from prism_debug.scenario import load_scenario

#: Seconds a plain request may take before the client gives up.
REQUEST_TIMEOUT_S = 10.0
#: A snapshot or a restore is replied to only once CRIU is done.
SNAPSHOT_TIMEOUT_S = 600.0
#: continue/step/next wait for as long as the rank runs; Ctrl-C pauses it.
STOP_TIMEOUT_S = 7 * 24 * 3600.0
#: pause waits this long for the rank to get to where it can stop (a collective,
#: an iteration boundary); a rank deep in its own code or a hung collective may
#: take longer: the console is given back, and the pause announced when it comes.
PAUSE_WAIT_S = 5.0

STOP_KINDS = frozenset({"paused", "exited"})


class Client(Protocol):
    """What the console needs from a bus client (``BusClient`` is one)."""

    missed: int  # events the client knows it lost (sequence gaps, full queues)

    def request(self, verb: str, timeout_s: float = REQUEST_TIMEOUT_S, **args: Any) -> dict:
        """Send one request and return its result; raise a PrismError with ``.type``."""

    def next_event(self, kinds: set[str], timeout_s: float) -> dict | None:
        """The next event of one of ``kinds`` (others are skipped), or None on timeout."""

    def events(self, timeout_s: float = 0.0) -> list[dict]:
        """Every event that has arrived and was not yet taken."""


class Console(Completion, Shell):
    """pdb for one real rank: ``break``, ``continue``, ``step``, ``where``, snapshots."""

    doc_header = "Commands (type help <command>):"

    def __init__(self, client: Client, rank: int, stdin: TextIO | None = None,
                 stdout: TextIO | None = None, json_mode: bool = False,
                 interactive: bool | None = None) -> None:
        super().__init__(f"(prism {rank}) ", stdin=stdin, stdout=stdout, json_mode=json_mode,
                         interactive=interactive)
        self.client = client
        self.rank = rank
        self.events_on = False
        self.exit_code: int | None = None  # set once the rank is known to have exited
        self.detached = False
        # snapshots this console has shown as replies: their events are no news
        self._snapshots_shown: set[str] = set()
        # the number of the pause before one that pause gave up waiting for
        self._pause_after: int | None = None
        self._missed_seen = getattr(client, "missed", 0)
        # The agent's breaks listing has no kind; remember the ones made here.
        self._break_kinds: dict[int, str] = {}

    def postcmd(self, stop: bool, line: str) -> bool:
        if not stop:  # (a snapshot taken meanwhile is news even with events off)
            self._take_events(show=self.events_on)
        return stop

    # -- where the rank is ------------------------------------------------------

    def do_status(self, arg: str) -> None:
        """status

        Show the rank's state, iteration, emulated time and session.
        """
        if arg.strip():
            return self._usage("status")
        result = self._request("status")
        if result is not None:
            self._show(result, format_status)

    def do_where(self, arg: str) -> None:
        """w(here)

        Print the rank's Python stack, innermost frame last (marked >).  A
        running rank's stack is one instant of it, and the first line says
        (running); pause holds the rank still.
        """
        if arg.strip():
            return self._usage("where")
        if self._require_live():
            result = self._request("where")
            if result is not None:
                self._show(result, format_where)

    do_w = do_bt = do_where

    def do_timeline(self, arg: str) -> None:
        """timeline

        List the collectives of the last finished iteration: group, size,
        start, duration, time spent waiting and the rank that arrived last.
        A running rank is past it already: the first line says so.
        """
        if arg.strip():
            return self._usage("timeline")
        if self._require_live():
            result = self._request("timeline")
            if result is not None:
                self._show(result, format_timeline)

    def do_peers(self, arg: str) -> None:
        """peers [SELECTOR]

        List the virtual peers that matter now (the current group's members),
        or those SELECTOR picks, with their class, coordinates, time and
        perturbations.
        """
        if self._require_live():
            args: dict[str, Any] = {"selector": arg.strip()} if arg.strip() else {}
            result = self._request("peers", **args)
            if result is not None:
                self._show(result, format_peers)

    def do_perturb(self, arg: str) -> None:
        if not arg.strip():
            return self._usage("perturb")
        words = arg.split()
        args: dict[str, Any]
        try:
            if words[0] == "list":
                verb, args = "faults", {}
                if len(words) > 1:
                    raise ConfigError("perturb list takes nothing more")
            elif words[0] == "clear":
                verb, args = "unperturb", {}
                if len(words) > 2 or (len(words) == 2 and not words[1].isdecimal()):
                    raise ConfigError("perturb clear [N]: N is a number perturb list shows")
                if len(words) == 2:
                    args = {"index": int(words[1])}
            else:  # the grammar is read here, at the edge: the rank gets the typed value
                text = " ".join(words)
                verb, args = "perturb", {"fault": parse_fault(text).to_dict(), "text": text}
        except ConfigError as exc:
            return self.error(str(exc), type="BadArguments")
        if self._require_live():
            result = self._request(verb, **args)
            if result is not None:
                self._show(result, format_perturb)

    do_perturb.__doc__ = f"""perturb ACTION RANKS ... | list | clear [N]

        Perturb virtual peers (not in a --lockstep run).  Applied now when
        paused, else at the end of the iteration in progress; with several
        real ranks, by every rank at the next boundary they all reach.

{textwrap.indent(USAGE_TEXT, " " * 10)}

        RANKS: R, A-B, lists, node:N, family:F:G, class:C, fraction:P[:SEED].
        list shows those in force, numbered; clear N takes one back, clear all.
        """

    def do_scenario(self, arg: str) -> None:
        """scenario FILE

        Load a scenario file and put its faults in force on this rank (the
        rank resolves families and classes against its graph).  Its world
        must be this run's; its expectations are judged by prism-debug
        scenario run, which runs it headless.
        """
        path = arg.strip()
        if not path:
            return self._usage("scenario")
        try:
            scenario = load_scenario(path)
        except ScenarioError as exc:
            return self.error(str(exc), type="BadArguments")
        if not self._require_live():
            return
        status = self._request("status")
        if status is None:
            return
        world = scenario.world
        if world.several_real_ranks:
            return self.error(f"{path} runs real ranks {world.ranks_text}: run it with "
                              "prism-debug scenario run (a console perturbs one rank's "
                              "virtual peers)", type="BadArguments")
        if (world.size, world.rank) != (status["world_size"], status["rank"]):
            return self.error(f"{path} is for rank {world.rank} of {world.size}; this is rank "
                              f"{status['rank']} of {status['world_size']}",
                              type="BadArguments")
        applied = []
        for fault in scenario.seeded_faults():
            text = fault_text(fault)
            result = self._request("perturb", fault=fault.to_dict(), text=text)
            if result is None:
                break
            applied.append(f"{text}: applied {result['when']}")
        self._show({"scenario": scenario.name, "applied": applied}, format_scenario)

    # -- breakpoints ------------------------------------------------------------

    def do_break(self, arg: str, temporary: bool = False) -> None:
        """b(reak) iter N | coll OP [FAMILY] [seq N]

        Without argument, list all breakpoints.  iter N pauses at the
        boundary where iteration N starts; coll OP pauses before every OP
        collective, only on groups of FAMILY (dp, tp, ...) if given, only at
        the collective numbered seq N of an iteration if given.
        """
        command = "tbreak" if temporary else "break"
        if not arg.strip():
            return self._list_breaks()
        try:
            args = parse_break(arg)
        except ConfigError as exc:  # an unknown collective: say which names there are
            return self.error(str(exc))
        except ValueError:
            return self._usage(command)
        if self._require_live():
            result = self._request("break", temporary=temporary, **args)
            if result is not None:
                self._break_kinds[result["id"]] = args["kind"]
                self._show(result, lambda r: format_new_break(r, temporary))

    def do_tbreak(self, arg: str) -> None:
        """tbreak iter N | coll OP [FAMILY] [seq N]

        Like break, but the breakpoint is deleted when it is first hit.
        """
        self.do_break(arg, temporary=True)

    do_b = do_break

    def do_info(self, arg: str) -> None:
        """info breaks

        List the breakpoints: number, type, disposition, hits, where.
        """
        if arg.strip() not in ("breaks", "break", "b"):
            return self._usage("info")
        self._list_breaks()

    def _list_breaks(self) -> None:
        if self._require_live():
            result = self._request("breaks")
            if result is not None:
                self._show(result, lambda r: format_breaks(r["breakpoints"], self._break_kinds))

    def do_delete(self, arg: str) -> None:
        """delete [N]

        Delete breakpoint N, or every breakpoint without argument.
        """
        words = arg.split()
        if len(words) > 1 or (words and not is_int(words[0])):
            return self._usage("delete")
        if self._require_live():
            result = self._request("delete", **({"id": int(words[0])} if words else {}))
            if result is not None:
                for number in result["deleted"]:
                    self._break_kinds.pop(number, None)
                self._show(result, lambda r: format_deleted(r["deleted"]))

    # -- running and stopping ---------------------------------------------------

    def do_continue(self, arg: str) -> None:
        """c(ont(inue))

        Run until a breakpoint is hit or the rank exits.
        """
        self._resume("continue", arg)

    def do_step(self, arg: str) -> None:
        """s(tep)

        Run to the next collective and pause before it.
        """
        self._resume("step", arg)

    def do_next(self, arg: str) -> None:
        """n(ext)

        Run to the next iteration boundary and pause there.
        """
        self._resume("next", arg)

    def do_pause(self, arg: str) -> None:
        """pause

        Pause the running rank at the next collective or iteration boundary.
        Not there within 5 s (deep in its own code, or in a hung collective):
        the console is given back and the pause announced when it comes.
        """
        self._resume("pause", arg)

    do_c = do_cont = do_continue
    do_s = do_step
    do_n = do_next

    def _resume(self, verb: str, arg: str) -> None:
        if arg.strip():
            return self._usage(verb)
        # A stop event left from before (another client's pause, a restore)
        # must not be taken for the stop of this run.
        self._take_events(show=self.events_on)
        if self._require_live():
            result = self._request(verb)
            if result is not None and verb == "pause" and result.get("paused_at"):
                # paused already: that pause is the answer (its event came before)
                return self._show({"kind": "paused", "data": result["paused_at"]},
                                  format_event_text)
            if result is not None:
                # pauses are numbered: one the rank announced before this
                # request (perhaps still on its way) is not this run's stop
                self._wait_for_stop(result.get("after", 0),
                                    PAUSE_WAIT_S if verb == "pause" else STOP_TIMEOUT_S)

    def _wait_for_stop(self, after: int = 0, timeout_s: float = STOP_TIMEOUT_S) -> None:
        kinds = set(EVENT_KINDS if self.events_on else STOP_KINDS | {"snapshot"})
        deadline = time.monotonic() + timeout_s
        interrupted = False
        while True:
            try:
                event = self.client.next_event(
                    kinds, timeout_s=max(0.0, deadline - time.monotonic()))
            except KeyboardInterrupt:
                if interrupted:
                    return self.error("stopped waiting; the rank may still be running "
                                      "(status shows it, pause stops it)", type="Timeout")
                interrupted = True
                if not self.json_mode:
                    self.message("--KeyboardInterrupt-- pausing the rank "
                                 "(Ctrl-C again to stop waiting)")
                self._request("pause")
                continue
            if event is None and timeout_s < STOP_TIMEOUT_S:
                self._pause_after = after  # its pause is news whenever it comes
                return self._show({"state": "pausing", "after": after},
                                  lambda _: format_pausing(self.rank, timeout_s))
            if event is None:
                return self.error("the rank did not stop; status shows where it is, "
                                  "pause stops it", type="Timeout")
            self._note_event(event)
            if (event["kind"] in STOP_KINDS and event["data"].get("reason") != "restore"
                    and event["data"].get("number", after + 1) > after):
                self._show(event, format_event_text)
                self._note_missed()
                return
            # Not this run's stop: an event to print, or a restore's late pause to skip.
            if self.events_on:
                self._show_event(event)
            elif self._is_news(event):
                self._show(event, format_event_text)

    # -- stepping back (a run with --history K) --------------------------------

    def do_back(self, arg: str) -> None:
        """back [N]

        Go back N iterations (default 1) in a run with --history K: the
        nearest earlier snapshot is restored and runs again, bit for bit, to
        where that iteration starts, passing breakpoints; it pauses there.
        """
        words = arg.split()
        if len(words) > 1 or (words and not (words[0].isdecimal() and int(words[0]) >= 1)):
            return self._usage("back")
        self._step_back("back", {"iterations": int(words[0])} if words else {})

    def do_reverse_continue(self, arg: str) -> None:
        """reverse-continue | rc

        Go back to the last breakpoint hit before where the rank is, as back does.
        """
        if arg.strip():
            return self._usage("reverse-continue")
        self._step_back("reverse-continue", {})

    do_rc = do_reverse_continue
    identchars = Shell.identchars + "-"  # gdb's name: reverse-continue

    def _step_back(self, verb: str, args: dict) -> None:
        self._take_events(show=self.events_on)  # a stop from before is not this one's
        if not self._require_live():
            return
        result = self._request(verb, timeout_s=SNAPSHOT_TIMEOUT_S, **args)
        if result is not None:
            if not self.json_mode:  # --json prints the stop alone, as continue does
                self.message(format_back(result))
            self._wait_for_stop(result.get("after", 0))

    # -- events -----------------------------------------------------------------

    def do_events(self, arg: str) -> None:
        """events [on|off]

        on: print the rank's events (iterations, collectives, output, ...) as
        they arrive, between commands and while it runs; off: stay quiet.
        Without argument, show which.
        """
        choice = arg.strip()
        if not choice:
            state = {"events": self.events_on}
            return self._show(state, lambda s: f"events are {'on' if s['events'] else 'off'}")
        if choice not in ("on", "off"):
            return self._usage("events")
        result = self._request("events", on=choice == "on")
        if result is not None:
            self.events_on = bool(result["events"])
            # Only losses from now on are news.
            self._missed_seen = getattr(self.client, "missed", 0)
            self._show(result, lambda r: f"events {'on' if r['events'] else 'off'}")

    def _take_events(self, show: bool) -> None:
        for event in self.client.events(0.0):
            self._note_event(event)
            if show:
                self._show_event(event)
            elif self._is_news(event):
                self._show(event, format_event_text)
        if show:
            self._note_missed()

    def _is_news(self, event: dict) -> bool:
        """A snapshot taken (or failed) that this console has not shown, or the
        pause a pause command gave up waiting for: news even with events off
        (a scheduled snapshot is taken later, perhaps asked by a console that
        has left since)."""
        if (event["kind"] == "paused" and self._pause_after is not None
                and event["data"].get("number", self._pause_after + 1) > self._pause_after):
            self._pause_after = None
            return True
        return event["kind"] == "snapshot" and event["data"].get("id") not in self._snapshots_shown

    def _show_event(self, event: dict) -> None:
        self._show(event, format_event_line)

    def _note_event(self, event: dict) -> None:
        if event["kind"] == "exited":
            self.exit_code = event["data"].get("exit_code")
        elif event["kind"] == "restored":
            self.exit_code = None

    def _note_missed(self) -> None:
        missed = getattr(self.client, "missed", 0)
        if missed > self._missed_seen:
            count = missed - self._missed_seen
            self._show({"missed": count}, lambda _: f"(missed {count} events)")
        self._missed_seen = missed

    # -- snapshots --------------------------------------------------------------

    def do_snapshot(self, arg: str) -> None:
        """snapshot [NAME]

        Dump the rank with CRIU where an iteration ends.  Paused at an
        iteration boundary: now, and the snapshot is shown when done.
        Otherwise it is scheduled for the end of the iteration in progress
        (a paused rank gets there once continued): the answer comes at once,
        and the snapshot is announced when taken (snapshots lists it).  Every
        console prints the snapshots taken while it is attached.  With
        several real ranks it is a cut of them all, at the next boundary
        every rank reaches.
        """
        if self._require_live():
            args = {"name": arg.strip()} if arg.strip() else {}
            result = self._request("snapshot", timeout_s=SNAPSHOT_TIMEOUT_S, **args)
            if result is not None:
                if "id" in result:
                    self._snapshots_shown.add(result["id"])
                self._show(result, format_snapshot)

    def do_snapshots(self, arg: str) -> None:
        """snapshots

        List the snapshots of this session.
        """
        if arg.strip():
            return self._usage("snapshots")
        result = self._request("snapshots")
        if result is not None:
            self._show(result, lambda r: format_snapshots(r["snapshots"]))

    def do_restore(self, arg: str) -> None:
        """restore ID

        Replace the rank's process by snapshot ID; it is then paused at the
        iteration boundary where the snapshot was taken.  With several real
        ranks ID is a cut of this run: every rank is replaced, and this
        console's rank waits paused.
        """
        words = arg.split()
        if len(words) != 1:
            return self._usage("restore")
        result = self._request("restore", timeout_s=SNAPSHOT_TIMEOUT_S, id=words[0])
        if result is not None:
            self.exit_code = None
            self._show(result, format_restored)

    # -- leaving ----------------------------------------------------------------

    def do_detach(self, arg: str) -> bool:
        """detach

        Release the rank and leave: every breakpoint is deleted (other
        consoles' too), a pause is resumed, and the rank runs on to its end.
        To leave it as it is, paused or not, use quit.
        """
        if arg.strip():
            self._usage("detach")
            return False
        self._leave("detach", quiet=False)
        return True

    def do_quit(self, arg: str) -> bool:
        """q(uit)

        Leave the console; the rank stays as it is: a pause holds (a later
        prism-debug attach continues it), breakpoints stay armed.  The end of
        the input (Ctrl-D, a pipe, --command) leaves the same way.
        """
        if arg.strip():
            self._usage("quit")
            return False
        self._leave("leave", quiet=False)
        return True

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str) -> bool:
        """EOF

        The end of the input leaves as quit does: the rank stays as it is.
        """
        if self.interactive and not self.json_mode:
            self.message("")  # the shell prompt starts on its own line
        self._leave("leave", quiet=True)
        return True

    def end_of_input(self) -> None:
        self._leave("leave", quiet=True)

    def _leave(self, verb: str, quiet: bool) -> None:
        """Tell the controller (``leave``, or ``detach`` to release the rank)
        and say in one line what happens to the rank.  ``quiet``: the end of
        the input, which prints that line but no JSON (only commands do)."""
        if self.detached:
            return
        self.detached = True
        self._take_events(show=self.events_on)  # a stop or an exit that is news
        if self.exit_code is not None:  # the rank is gone, and its controller with it
            return
        result = self._request(verb)
        if result is None:
            return
        if self.json_mode:
            if not quiet:
                self._show(result, lambda r: "")
        elif result.get("state"):  # (a reply without one tells nothing to repeat)
            self.message(format_left(result, self.rank, released=verb == "detach"))

    # -- plumbing ---------------------------------------------------------------

    def _request(self, verb: str, timeout_s: float = REQUEST_TIMEOUT_S, **args: Any) -> dict | None:
        """The request's result, or None once its error has been reported."""
        try:
            return self.client.request(verb, timeout_s=timeout_s, **args)
        except PrismError as exc:
            self.error(str(exc), type=getattr(exc, "type", type(exc).__name__))
            return None

    def _require_live(self) -> bool:
        # Without this, a request to an exited rank would wait for a stop that never comes.
        if self.exit_code is None:
            return True
        self.error(f"the rank exited with code {self.exit_code}; restore a snapshot "
                   "(snapshots, restore ID) or quit", type="RankUnavailable")
        return False


setattr(Console, "do_reverse-continue", Console.do_reverse_continue)
