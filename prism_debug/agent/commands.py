"""The bus verbs the rank answers itself, on the bus thread: what the
debugger does (breakpoints, stepping) and what only the rank's process knows
(its Python stack, its last iteration's collectives, the engine's view of
its virtual peers)."""

from __future__ import annotations

import dataclasses
import linecache
import sys
import threading

from prism_debug.agent.agreed import Change
from prism_debug.agent.debugger import DebuggerError
from prism_debug.bus.protocol import BadArguments, InvalidState
from prism_debug.errors import ConfigError
from prism_debug.faults import fault_from_dict, fault_text
from prism_debug.graph.selectors import select_ranks

_MAX_PEERS = 64  # rows a peers answer lists


class Commands:
    def __init__(self, agent) -> None:
        self._agent = agent
        self._debugger = agent.debugger

    def handle(self, verb: str, args: dict) -> dict:
        graph = self._agent.graph_engine
        if graph is not None:
            # a console talks to the rank: from now on each iteration keeps who
            # arrived last at each op for the timeline (7 µs a collective at
            # 65,536 ranks, so a run nobody attaches to does not pay it)
            graph.keep_last_arrivals = True
        method = getattr(self, "do_" + verb, None)
        if method is None:
            raise BadArguments(f"the rank does not answer {verb!r}")
        try:
            return method(**args)
        except DebuggerError as exc:
            raise InvalidState(str(exc)) from None
        except ConfigError as exc:
            raise BadArguments(str(exc)) from None

    # -- state --------------------------------------------------------------------

    def do_status(self) -> dict:
        agent, debugger = self._agent, self._debugger
        paused = debugger.paused_at
        return {"state": "paused" if paused else "running", "rank": agent.config.rank,
                "world_size": agent.config.world_size, "iteration": agent.tracker.iteration,
                "emulated_s": agent.emulated_s(), "paused_at": paused,
                "breakpoints": len(debugger.breakpoints())}

    def do_where(self) -> dict:
        """The main thread's stack, outermost first, down to where it entered
        prism-debug (the frames of a paused rank's debugger are not the script's),
        and whether the rank is paused: a running rank's stack is one instant of it."""
        paused = self._debugger.paused_at
        main = threading.main_thread().ident
        assert main is not None  # (the main thread has started: it runs the script)
        frame = sys._current_frames().get(main)
        stack = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        frames = []
        for frame in reversed(stack):
            code = frame.f_code
            if code.co_filename.startswith(_HARNESS):
                break
            frames.append({"file": code.co_filename, "line": frame.f_lineno,
                           "function": code.co_name,
                           "code": linecache.getline(code.co_filename, frame.f_lineno).strip()})
        return {"frames": frames, "state": "paused" if paused else "running",
                "paused_at": paused}

    # -- breakpoints and stepping ----------------------------------------------------

    def do_break(self, kind: str, iteration: int | None = None, op: str | None = None,
                 family: str | None = None, seq: int | None = None,
                 temporary: bool = False) -> dict:
        bp = self._debugger.add_break(kind, iteration=iteration, op=op, family=family, seq=seq,
                                      temporary=temporary)
        return {"id": bp.id, "description": bp.description}

    def do_breaks(self) -> dict:
        return {"breakpoints": [{**dataclasses.asdict(bp), "description": bp.description}
                                for bp in self._debugger.breakpoints()]}

    def do_delete(self, id: int | None = None) -> dict:  # noqa: A002 - the verb's name
        return {"deleted": self._debugger.delete(id)}

    # Each answer carries the number of the last pause: the stop it causes is
    # a later one.
    def do_continue(self) -> dict:
        return self._resume(None)

    def do_step(self) -> dict:
        return self._resume("step")

    def do_next(self) -> dict:
        return self._resume("next")

    def _resume(self, mode: str | None) -> dict:
        return {"state": "running", "after": self._debugger.resume(mode)}

    def do_run_to(self, iteration: int, seq: int | None = None, reason: str = "run to",
                  breakpoints: list | None = None) -> dict:
        """Run to where ``iteration`` starts (or to its collective ``seq``),
        passing breakpoints, and pause there: the controller's replay after
        it restored an earlier snapshot (back, reverse-continue), which hands
        over the breakpoints the rank had before (``breaks``' rows)."""
        if breakpoints is not None:
            try:
                self._debugger.set_breakpoints(breakpoints)
            except (TypeError, ValueError) as exc:
                raise BadArguments(f"argument 'breakpoints' of 'run_to': {exc}") from None
        return {"state": "running", "after": self._debugger.run_to(iteration, seq, reason)}

    def do_pause(self) -> dict:
        after = self._debugger.pause()
        paused = self._debugger.paused_at  # paused already: no new pause event will come
        return {"state": "paused" if paused else "pausing", "after": after, "paused_at": paused}

    def do_events(self, on: bool) -> dict:
        self._debugger.set_events(on)
        return {"events": on}

    def do_detach(self) -> dict:
        """A console detached: the rank runs free (every breakpoint deleted, a
        pause resumed).  A console that only leaves never gets here: the rank
        stays as it is, paused or not, its breakpoints kept."""
        deleted, was_paused = self._debugger.release()
        return {**self.do_status(), "deleted": deleted, "resumed": was_paused}

    # -- perturbations ------------------------------------------------------------------

    def do_perturb(self, fault: dict, text: str | None = None) -> dict:
        """Put a fault in force on the virtual peers (``text``: how it was
        written): now when paused (the engine belongs to the rank's main
        thread), else at the end of the iteration in progress."""
        agent = self._agent
        self._need_graph()
        parsed = fault_from_dict(fault)
        injection = agent.resolve(parsed)  # whom it hits: refused here, not later
        text = text or fault_text(parsed)
        return {"perturbation": text, "cleared": False,
                "when": self._at_boundary(lambda: agent.inject(parsed, text, injection))}

    def do_faults(self) -> dict:
        """The faults in force, as written, and whom they hit."""
        self._need_graph()
        return {"perturbations": [
            {"index": i, "text": entry.text, "summary": entry.injection.summary(entry.text)}
            for i, entry in enumerate(self._agent.faults)]}

    def do_unperturb(self, index: int | None = None) -> dict:
        """Take back fault ``index`` (``faults`` numbers them), or every one."""
        agent = self._agent
        self._need_graph()
        # the entry is chosen now: a clear asked twice before the boundary
        # takes back the fault it named, once
        chosen = self._chosen(index)
        what = "every perturbation" if chosen is None else chosen[0].text
        return {"perturbation": what, "cleared": True,
                "when": self._at_boundary(lambda: agent.withdraw(chosen))}

    def _chosen(self, index: int | None) -> list | None:
        """The fault in force numbered ``index`` (``faults`` numbers them), or
        None for every one."""
        faults = self._agent.faults
        if index is not None and not 0 <= index < len(faults):
            raise BadArguments(f"no perturbation {index}: perturb list shows {len(faults)}")
        return None if index is None else [faults[index]]

    def _need_graph(self) -> None:
        if self._agent.graph_engine is None:
            raise InvalidState("perturbations need virtual peers replayed from a graph: run "
                               "without --lockstep (the job's graph is profiled and cached) "
                               "or with --graph")

    def _at_boundary(self, change) -> str:
        """Run ``change`` on the rank's main thread: now if it is paused, else
        at the end of the iteration in progress; says when."""
        agent, debugger = self._agent, self._debugger
        if debugger.paused_at is not None:
            debugger.run_paused(change)
            return "now"
        agent.faults_due.append(change)
        return f"at the end of iteration {agent.tracker.iteration}"

    # -- changes every real rank makes at one boundary (agreed.py) --------------------

    def do_hold_boundary(self) -> dict:
        """The controller's first step: the boundary this rank reaches next
        (the end of that iteration), held there until the second."""
        return {"iteration": self._agent.agreed.hold()}

    def do_agree_boundary(self, iteration: int, change: str, fault: dict | None = None,
                          text: str | None = None, index: int | None = None) -> dict:
        """The second step: at the end of ``iteration``, ``change`` — "snapshot"
        (this rank's part of a cut), "perturb" or "unperturb" (as their verbs
        take them), or "none" (let the hold go: the agreement failed)."""
        agent = self._agent
        if change == "none":
            agent.agreed.agree(iteration, None)
            return {"iteration": iteration}
        try:
            planned = self._agreed_change(change, fault, text, index)
        except Exception:
            agent.agreed.agree(iteration, None)  # refused: the hold goes all the same
            raise
        agent.agreed.agree(iteration, planned)
        return {"iteration": iteration,
                "state": "paused" if self._debugger.paused_at is not None else "running"}

    def _agreed_change(self, change: str, fault: dict | None, text: str | None,
                       index: int | None) -> Change:
        agent = self._agent
        if change == "snapshot":
            return Change("snapshot")
        self._need_graph()
        if change == "perturb" and fault is not None:
            parsed = fault_from_dict(fault)
            injection = agent.resolve(parsed)  # whom it hits: refused here, not later
            written = text or fault_text(parsed)
            return Change("faults", lambda: agent.inject(parsed, written, injection))
        if change == "unperturb":
            chosen = self._chosen(index)
            return Change("faults", lambda: agent.withdraw(chosen))
        raise BadArguments(f"no change {change!r} at an agreed boundary (snapshot, perturb "
                           "with its fault, unperturb, none)")

    # -- snapshots --------------------------------------------------------------------

    def do_snapshot(self, name: str | None = None) -> dict:
        """Paused where an iteration starts: the snapshot is taken there, now.
        Otherwise it is scheduled for the end of the iteration in progress
        (snapshots are cut at iteration boundaries, where nothing is in
        flight), and the answer says so at once: a rank paused mid-iteration
        gets there only once resumed."""
        agent, debugger = self._agent, self._debugger
        paused = debugger.paused_at
        if paused is not None and paused["at"] == "iteration":
            iteration = paused["iteration"] - 1
            debugger.run_paused(lambda: agent.stop_for_snapshot(iteration))
            return {"iteration": iteration, "when": "now"}
        iteration = agent.tracker.iteration
        agent.ask_snapshot(iteration)
        return {"iteration": iteration, "when": "scheduled",
                "state": "paused" if paused else "running"}

    # -- what the rank saw ------------------------------------------------------------

    def do_timeline(self) -> dict:
        agent = self._agent
        last = agent.tracker.last_ops
        if last is None:
            raise InvalidState("no iteration has finished yet: next runs to the end of one")
        iteration, start, ops = last
        paused = self._debugger.paused_at
        graph = agent.graph_engine
        rows = []
        for seq, record in enumerate(ops, 1):
            # only what the rank itself resolved: asking the replay engine from
            # this thread would race the rank's own use of it and of the clock
            done = record.done_s
            last_rank = None
            if graph is not None and record.deferred is not None:
                arrived = graph.kept_last_arrival(record.deferred)
                last_rank = arrived[0] if arrived else None
            rows.append({"seq": seq, "op": record.op, "family": record.family,
                         "index": record.index, "bytes": record.nbytes,
                         "start_ms": (record.arrival - start) * 1e3,
                         "duration_ms": None if done is None else (done - record.arrival) * 1e3,
                         "wait_ms": record.waited_s * 1e3, "last_rank": last_rank})
        # the last finished iteration; a running rank is already past it
        return {"iteration": iteration, "ops": rows, "state": "paused" if paused else "running",
                "paused_at": paused,
                # an iteration that ended before any console spoke kept no last ranks
                "last_ranks_kept": None if graph is None else any(
                    row["last_rank"] is not None for row in rows)}

    def do_peers(self, selector: str | None = None) -> dict:
        agent = self._agent
        config = agent.config
        ranks = (select_ranks(selector, config.world_size, config.gpus_per_node) if selector
                 else _neighbours(config.rank, config.world_size, config.gpus_per_node))
        shown = ranks[:_MAX_PEERS]
        graph = agent.graph_engine
        if graph is None:
            return {"mode": "lockstep",
                    "note": "no graph (--lockstep): every virtual peer arrives with the "
                            "real rank at every collective",
                    "peers": [{"rank": r, "node": r // config.gpus_per_node, "class": None,
                               "coords": {}, "time_ms": None, "perturbations": []}
                              for r in shown]}
        note = f"{len(ranks)} ranks selected" + (f", first {_MAX_PEERS} shown"
                                                 if len(ranks) > _MAX_PEERS else "")
        return {"mode": "graph", "note": note,
                "peers": [graph.replay.describe(r) for r in shown]}


def _neighbours(rank: int, world_size: int, gpus_per_node: int) -> list[int]:
    """With no selector: the real rank's node."""
    node = rank // gpus_per_node
    return list(range(node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node)))


_HARNESS = __file__.rsplit("/agent/", 1)[0]  # prism_debug's own frames
