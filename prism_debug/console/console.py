"""The console of ``prism-debug attach``: pdb-style commands for one real rank.

:class:`Console` is the UI and nothing else: it turns command lines into bus
requests on a client object (``prism_debug.bus.client.BusClient`` in
production, a fake in tests) and turns results and events into text — or into
one JSON line per command with ``--json``.  Like pdb over bdb, it never
touches a socket.
"""

from __future__ import annotations

import cmd
import datetime
import inspect
import io
import json
import logging
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TextIO

from prism_debug.errors import ConfigError, PrismError, ScenarioError
from prism_debug.faults import USAGE_TEXT, fault_text, parse_fault
from prism_debug.scenario import load_scenario

logger = logging.getLogger(__name__)

#: Seconds a plain request may take before the client gives up.
REQUEST_TIMEOUT_S = 10.0
#: A snapshot or a restore is replied to only once CRIU is done.
SNAPSHOT_TIMEOUT_S = 600.0
#: continue/step/next wait for as long as the rank runs; Ctrl-C pauses it.
STOP_TIMEOUT_S = 7 * 24 * 3600.0
HISTORY_LENGTH = 1000

STOP_KINDS = frozenset({"paused", "exited"})
EVENT_KINDS = frozenset({
    "iteration.start", "iteration.end", "coll.enter", "coll.exit", "paused", "resumed",
    "snapshot", "restored", "output", "agent.lost", "agent.back", "exited",
})
#: Collective and p2p names offered by ``break coll <TAB>`` (torch.distributed's).
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv",
                  "barrier", "all_to_all", "reduce", "gather", "scatter")


class Client(Protocol):
    """What the console needs from a bus client (``BusClient`` is one)."""

    missed: int  # events the client knows it lost (sequence gaps, full queues)

    def request(self, verb: str, timeout_s: float = REQUEST_TIMEOUT_S, **args: Any) -> dict:
        """Send one request and return its result; raise a PrismError with ``.type``."""

    def next_event(self, kinds: set[str], timeout_s: float) -> dict | None:
        """The next event of one of ``kinds`` (others are skipped), or None on timeout."""

    def events(self, timeout_s: float = 0.0) -> list[dict]:
        """Every event that has arrived and was not yet taken."""


def default_history_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(state).expanduser() / "prism-debug" / "console_history"


class Console(cmd.Cmd):
    """pdb for one real rank: ``break``, ``continue``, ``step``, ``where``, snapshots."""

    doc_header = "Commands (type help <command>):"

    def __init__(self, client: Client, rank: int, stdin: TextIO | None = None,
                 stdout: TextIO | None = None, json_mode: bool = False,
                 interactive: bool | None = None) -> None:
        super().__init__(stdin=stdin, stdout=stdout)
        self.client = client
        self.rank = rank
        self.json_mode = json_mode
        if interactive is None:
            isatty = getattr(self.stdin, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        # input() (and with it readline's history and completion) only reads sys.stdin.
        self.use_rawinput = interactive and self.stdin is sys.stdin
        # A piped script gets no prompt noise between its outputs.
        self.prompt = f"(prism {rank}) " if interactive else ""
        self.history_path = default_history_path()
        self.events_on = False
        self.exit_code: int | None = None  # set once the rank is known to have exited
        self.detached = False
        self.num_errors = 0
        self._missed_seen = getattr(client, "missed", 0)
        # The agent's breaks listing has no kind; remember the ones made here.
        self._break_kinds: dict[int, str] = {}

    # -- output: every line goes through message() or error() -----------------

    def message(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def error(self, text: str, type: str = "BadArguments") -> None:
        """Report a failed command; it never ends the console."""
        self.num_errors += 1
        if self.json_mode:
            self.message(json.dumps({"error": {"type": type, "message": text}}))
        else:
            self.message(f"*** {text}")

    @property
    def exit_status(self) -> int:
        """0 if every command so far succeeded, 1 if any reported an error."""
        return 0 if self.num_errors == 0 else 1

    def _show(self, result: dict, render: Callable[[dict], str]) -> None:
        self.message(json.dumps(result) if self.json_mode else render(result))

    # -- the command loop -------------------------------------------------------

    def cmdloop(self, intro: str | None = None) -> None:
        history = self._load_history() if self.use_rawinput else False
        try:
            while True:
                try:
                    super().cmdloop(intro)
                    return
                except KeyboardInterrupt:
                    # pdb's habit: Ctrl-C at the prompt abandons the line, not the session.
                    if not self.interactive:
                        raise
                    self.message("--KeyboardInterrupt--")
                    intro = None
        finally:
            if history:
                self._save_history()

    def run_commands(self, text: str, detach: bool = True) -> int:
        """Run ``;``-separated commands (``--command``); 0 if all succeeded, else 1.

        Running out of commands detaches like the end of piped input, unless
        ``detach`` is false (to go on with :meth:`cmdloop`).
        """
        num_errors = self.num_errors
        stop = False
        for line in split_commands(text):
            stop = self.postcmd(self.onecmd(line), line)
            if stop:
                break
        if detach and not stop:
            self._detach(quiet=True)
        return 0 if self.num_errors == num_errors else 1

    def precmd(self, line: str) -> str:
        # `break iter 3; c; status`: run the first, queue the rest (pdb does this for ;;).
        commands = split_commands(line)
        if len(commands) <= 1:
            return commands[0] if commands else line
        self.cmdqueue[0:0] = commands[1:]
        return commands[0]

    def postcmd(self, stop: bool, line: str) -> bool:
        if not stop and self.events_on:
            self._take_events(show=True)
        return stop

    def default(self, line: str) -> None:
        name = line.split()[0]
        self.error(f"unknown command {name!r}; type help for the list", type="UnknownVerb")

    def do_help(self, arg: str) -> None:
        """h(elp) [COMMAND]

        Without argument, list the commands; with one, show its help.
        """
        if arg:
            method = getattr(self, "do_" + arg, None)
            if method is None or not method.__doc__:
                return self.error(f"no help on {arg!r}; type help for the list")
            text = inspect.cleandoc(method.__doc__)
        else:
            buffer, stdout = io.StringIO(), self.stdout
            self.stdout = buffer
            try:
                super().do_help("")
            finally:
                self.stdout = stdout
            text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).rstrip("\n")
        self._show({"help": text}, lambda _: text)

    do_h = do_help

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

        Print the rank's Python stack, innermost frame last (marked >).
        """
        if arg.strip():
            return self._usage("where")
        if self._require_live():
            result = self._request("where")
            if result is not None:
                self._show(result, lambda r: format_where(r["frames"]))

    do_w = do_bt = do_where

    def do_timeline(self, arg: str) -> None:
        """timeline

        List the collectives of the current iteration so far: group, size,
        start, duration, time spent waiting and the rank that arrived last.
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
            args = {"selector": arg.strip()} if arg.strip() else {}
            result = self._request("peers", **args)
            if result is not None:
                self._show(result, format_peers)

    def do_perturb(self, arg: str) -> None:
        if not arg.strip():
            return self._usage("perturb")
        words = arg.split()
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

        Perturb virtual peers (the run needs --graph).  Applied now when
        paused, else at the end of the iteration in progress.

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
        self._show({"scenario": scenario.name, "applied": applied},
                   lambda r: "\n".join(r["applied"]) + (
                       f"\n{r['scenario']}: {len(r['applied'])} fault(s) in force; its "
                       "expectations are judged by prism-debug scenario run"))

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
        except ValueError:
            return self._usage(command)
        if self._require_live():
            result = self._request("break", temporary=temporary, **args)
            if result is not None:
                self._break_kinds[result["id"]] = args["kind"]
                label = "temporary breakpoint" if temporary else "breakpoint"
                self._show(result, lambda r: f"{label} {r['id']}: {r['description']}")

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
        if len(words) > 1 or (words and not _is_int(words[0])):
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
            if result is not None:
                # pauses are numbered: one the rank announced before this
                # request (perhaps still on its way) is not this run's stop
                self._wait_for_stop(result.get("after", 0))

    def _wait_for_stop(self, after: int = 0) -> None:
        kinds = set(EVENT_KINDS if self.events_on else STOP_KINDS)
        interrupted = False
        while True:
            try:
                event = self.client.next_event(kinds, timeout_s=STOP_TIMEOUT_S)
            except KeyboardInterrupt:
                if interrupted:
                    return self.error("stopped waiting; the rank may still be running "
                                      "(status shows it, pause stops it)", type="Timeout")
                interrupted = True
                if not self.json_mode:
                    self.message("--KeyboardInterrupt-- pausing the rank (Ctrl-C again to stop waiting)")
                self._request("pause")
                continue
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
        if show:
            self._note_missed()

    def _show_event(self, event: dict) -> None:
        self._show(event, lambda e: f"[{e['seq']}] {format_event_text(e)}")

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

        Dump the rank with CRIU at the next iteration boundary (named NAME
        if given) and wait until the dump is done.
        """
        if self._require_live():
            args = {"name": arg.strip()} if arg.strip() else {}
            result = self._request("snapshot", timeout_s=SNAPSHOT_TIMEOUT_S, **args)
            if result is not None:
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
        iteration boundary where the snapshot was taken.
        """
        words = arg.split()
        if len(words) != 1:
            return self._usage("restore")
        result = self._request("restore", timeout_s=SNAPSHOT_TIMEOUT_S, id=words[0])
        if result is not None:
            self.exit_code = None
            self._show(result, lambda r: (f"restored snapshot {r['id']}: paused after "
                                          f"iteration {r['iteration']} (pid {r['pid']})"))

    # -- leaving ----------------------------------------------------------------

    def do_detach(self, arg: str) -> bool:
        """detach

        Leave the console; the rank keeps running (or stays paused).
        """
        self._detach(quiet=False)
        return True

    def do_quit(self, arg: str) -> bool:
        """q(uit)

        Like detach: leave the console, the rank keeps running.
        """
        return self.do_detach(arg)

    do_q = do_quit

    def do_EOF(self, arg: str) -> bool:
        """EOF

        The end of the input detaches quietly, as detach does.
        """
        if self.interactive and not self.json_mode:
            self.message("")  # the shell prompt starts on its own line
        self._detach(quiet=True)
        return True

    def _detach(self, quiet: bool) -> None:
        if self.detached:
            return
        self.detached = True
        if self.exit_code is not None:  # the rank is gone, and its controller with it
            return
        result = self._request("detach")
        if result is not None and not quiet:
            self._show(result, lambda _: f"detached; rank {self.rank} keeps running")

    # -- completion -------------------------------------------------------------

    def complete_break(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        words = line[:begidx].split()[1:]
        if not words:
            choices: tuple[str, ...] = ("iter", "coll")
        elif words[0] == "coll" and len(words) == 1:
            choices = COLLECTIVE_OPS
        elif words[0] == "coll" and "seq" not in words:
            choices = ("seq",)
        else:
            choices = ()
        return [choice for choice in choices if choice.startswith(text)]

    complete_b = complete_tbreak = complete_break

    def complete_events(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        return [choice for choice in ("on", "off") if choice.startswith(text)]

    def complete_info(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        return ["breaks"] if "breaks".startswith(text) else []

    def complete_restore(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        try:
            snapshots = self.client.request("snapshots", timeout_s=1.0)["snapshots"]
        except PrismError:
            return []  # completion stays silent; the command itself reports errors
        return [s["id"] for s in snapshots if s["id"].startswith(text)]

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

    def _usage(self, command: str) -> None:
        doc = inspect.cleandoc(getattr(self, "do_" + command).__doc__)
        self.error(f"usage: {doc.splitlines()[0]}")

    def _load_history(self) -> bool:
        try:
            import readline
        except ImportError:  # no readline (some builds): no history, input() still works
            return False
        readline.set_history_length(HISTORY_LENGTH)
        try:
            readline.read_history_file(self.history_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot read the console history %s: %s", self.history_path, exc)
        return True

    def _save_history(self) -> None:
        import readline
        try:
            self.history_path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(self.history_path)
        except OSError as exc:
            logger.warning("cannot write the console history %s: %s", self.history_path, exc)


# -- parsing ---------------------------------------------------------------------

def split_commands(line: str) -> list[str]:
    """``break iter 3; c; status`` -> three commands (``;;``, pdb's separator, works too)."""
    return [part.strip() for part in line.replace("\n", ";").split(";") if part.strip()]


def parse_break(arg: str) -> dict:
    """The ``break`` request's arguments for ``iter N`` or ``coll OP [FAMILY] [seq N]``."""
    words = arg.split()
    if len(words) == 2 and words[0] in ("iter", "iteration"):
        return {"kind": "iter", "iteration": int(words[1])}
    if len(words) >= 2 and words[0] in ("coll", "collective"):
        op, rest = words[1], words[2:]
        family: str | None = None
        seq: int | None = None
        while rest:
            if rest[0] == "seq" and len(rest) >= 2 and seq is None:
                seq, rest = int(rest[1]), rest[2:]
            elif rest[0] != "seq" and family is None and seq is None:
                family, rest = rest[0], rest[1:]
            else:
                raise ValueError(f"unexpected {rest[0]!r}")
        return {"kind": "coll", "op": op, "family": family, "seq": seq}
    raise ValueError(f"not a breakpoint: {arg!r}")


def _is_int(word: str) -> bool:
    try:
        int(word)
    except ValueError:
        return False
    return True


# -- human formats ---------------------------------------------------------------

def format_status(status: dict) -> str:
    state = status["state"]
    if state == "paused" and status.get("paused_at"):
        state = describe_pause(status["paused_at"])
    elif state == "exited" and status.get("exit_code") is not None:
        state = f"exited with code {status['exit_code']}"
    emulated = status.get("emulated_s")  # unknown while the rank is away from the bus
    return "\n".join([
        f"rank: {status['rank']} of {status['world_size']}",
        f"state: {state}",
        f"iteration: {'-' if status['iteration'] is None else status['iteration']}",
        f"emulated time: {'-' if emulated is None else f'{emulated:.3f} s'}",
        f"breakpoints: {status['breakpoints']}",
        f"pid: {status['pid']}",
        f"session: {status['session']}",
        f"clients: {status['clients']}",
    ])


def describe_pause(data: dict) -> str:
    """``paused at iteration 3 (break 1)``, ``paused before all_reduce on dp[3] (seq 12) ...``."""
    if data.get("at") == "collective":
        text = f"paused before {describe_collective(data)} in iteration {data['iteration']}"
    else:
        text = f"paused at iteration {data['iteration']}"
    return f"{text} ({data['reason']})" if data.get("reason") else text


def describe_collective(data: dict) -> str:
    text = str(data.get("op"))
    if data.get("family") is not None:
        text += f" on {format_group(data['family'], data.get('index'))}"
    if data.get("seq") is not None:
        text += f" (seq {data['seq']})"
    return text


def format_group(family: str | None, index: int | None) -> str:
    if family is None:
        return "-"
    return family if index is None else f"{family}[{index}]"


def format_bytes(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} B"
    size = float(num_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def format_event_text(event: dict) -> str:
    """One event in words (without its sequence number)."""
    kind, data = event["kind"], event.get("data") or {}
    try:
        return _describe_event(kind, data)
    except (KeyError, TypeError, ValueError):
        # An event from a newer agent must not end the console: show it raw.
        return f"{kind} {json.dumps(data)}"


def _describe_event(kind: str, data: dict) -> str:
    if kind == "paused":
        return describe_pause(data)
    if kind == "exited":
        return f"the rank exited with code {data.get('exit_code')}"
    if kind == "iteration.start":
        return f"iteration {data.get('iteration')} started"
    if kind == "iteration.end":
        return (f"iteration {data['iteration']} ended: {data['time_s'] * 1e3:.3f} ms "
                f"(compute {data['compute_s'] * 1e3:.3f} ms, comm wait "
                f"{data['comm_wait_s'] * 1e3:.3f} ms, {data['num_collectives']} collectives)")
    if kind in ("coll.enter", "coll.exit"):
        return f"{'enter' if kind == 'coll.enter' else 'exit'} {describe_collective(data)}"
    if kind == "snapshot":
        return (f"snapshot {data['id']} taken after iteration {data['iteration']} "
                f"({format_bytes(data['bytes'])} in {data['dump_s']:.2f} s)")
    if kind == "restored":
        return f"restored snapshot {data['id']}" if data.get("id") else "restored"
    if kind == "output":
        return f"output: {data.get('line', '')}"
    if kind == "resumed":
        return "resumed"
    if kind == "agent.lost":
        return "lost contact with the rank's agent"
    if kind == "agent.back":
        return "the rank's agent is back"
    return f"{kind} {json.dumps(data)}"


def format_where(frames: list[dict]) -> str:
    if not frames:
        return "no frames"
    lines = []
    for number, frame in enumerate(frames, start=1):
        marker = ">" if number == len(frames) else " "
        lines.append(f'{marker} File "{frame["file"]}", line {frame["line"]}, in {frame["function"]}')
        if frame.get("code"):
            lines.append(f"    {frame['code'].strip()}")
    return "\n".join(lines)


_TIMELINE_ROW = "{:>5}  {:<14} {:<10} {:>10} {:>10} {:>12} {:>9} {:>10}"


def format_timeline(timeline: dict) -> str:
    ops = timeline["ops"]
    if not ops:
        return f"iteration {timeline['iteration']}: no collectives yet"
    lines = [f"iteration {timeline['iteration']}: {len(ops)} collectives", _TIMELINE_ROW.format("seq", "op", "group", "bytes", "start ms",
                                         "duration ms", "wait ms", "last rank")]
    for op in ops:
        last = "-" if op.get("last_rank") is None else op["last_rank"]
        lines.append(_TIMELINE_ROW.format(
            op["seq"], op["op"], format_group(op["family"], op["index"]), format_bytes(op["bytes"]),
            f"{op['start_ms']:.3f}", _ms(op["duration_ms"]), f"{op['wait_ms']:.3f}", last))
    lines.append(_TIMELINE_ROW.format(
        "total", "", "", format_bytes(sum(op["bytes"] for op in ops)), "",
        _ms(sum(op["duration_ms"] or 0.0 for op in ops)),
        f"{sum(op['wait_ms'] for op in ops):.3f}", ""))
    return "\n".join(line.rstrip() for line in lines)


def _ms(value: float | None) -> str:
    return "never" if value is None else f"{value:.3f}"  # an op that never completes


def format_perturb(result: dict) -> str:
    if "perturbations" in result:
        return "\n".join(f"{p['index']}: {p['summary']}" for p in result["perturbations"]) \
            or "no perturbations"
    verb = "cleared" if result["cleared"] else "applied"
    return f"{result['perturbation']}: {verb} {result['when']}"


def format_peers(peers: dict) -> str:
    lines = [f"mode: {peers['mode']}"]
    if peers.get("note"):
        lines.append(peers["note"])
    if not peers["peers"]:
        lines.append("no peers")
        return "\n".join(lines)
    coords = [" ".join(f"{axis}={value}" for axis, value in peer["coords"].items()) or "-"
              for peer in peers["peers"]]
    width = max(len("coords"), *(len(text) for text in coords))
    row = "{:>6} {:>6} {:>6} {:>10}  {:<%d}  {}" % width
    lines.append(row.format("rank", "node", "class", "time ms", "coords", "perturbations"))
    for peer, coord in zip(peers["peers"], coords):
        time_ms = "-" if peer.get("time_ms") is None else f"{peer['time_ms']:.3f}"
        klass = "-" if peer.get("class") is None else peer["class"]
        lines.append(row.format(peer["rank"], peer["node"], klass, time_ms, coord,
                                ", ".join(peer["perturbations"]) or "-"))
    return "\n".join(line.rstrip() for line in lines)


def format_breaks(breakpoints: list[dict], kinds: dict[int, str]) -> str:
    """pdb's listing: ``Num Type Disp Hits Where``."""
    if not breakpoints:
        return "no breakpoints"
    lines = ["Num Type Disp Hits Where"]
    for bp in breakpoints:
        kind = bp.get("kind") or kinds.get(bp["id"], "-")
        disp = "del" if bp["temporary"] else "keep"
        lines.append(f"{bp['id']:<3} {kind:<4} {disp:<4} {bp['hits']:<4} {bp['description']}")
    return "\n".join(lines)


def format_deleted(deleted: list[int]) -> str:
    if not deleted:
        return "no breakpoints deleted"
    noun = "breakpoint" if len(deleted) == 1 else "breakpoints"
    return f"deleted {noun} {', '.join(str(number) for number in deleted)}"


def format_snapshot(snapshot: dict) -> str:
    return (f"snapshot {snapshot['id']}: after iteration {snapshot['iteration']}, "
            f"{format_bytes(snapshot['bytes'])} in {snapshot['dump_s']:.2f} s ({snapshot['path']})")


def format_snapshots(snapshots: list[dict]) -> str:
    if not snapshots:
        return "no snapshots"
    width = max(len("id"), *(len(s["id"]) for s in snapshots))
    row = "{:<%d}  {:>9}  {:>10}  {:<19}  {}" % width
    lines = [row.format("id", "iteration", "size", "created", "parent")]
    for s in snapshots:
        lines.append(row.format(s["id"], s["iteration"], format_bytes(s["image_bytes"]),
                                format_time(s["created"]), s.get("parent") or "-"))
    return "\n".join(line.rstrip() for line in lines)


def format_time(created: float | str) -> str:
    """A manifest's creation time (unix seconds) in local time; strings pass through."""
    if isinstance(created, str):
        return created
    return datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M:%S")
