"""The console's text: replies and events of the bus in words, for a person
(``--json`` prints the replies themselves).  Pure functions of the reply."""

from __future__ import annotations

import datetime
import json

from prism_debug.bus.words import describe_collective, describe_pause, format_group, how_to_resume
from prism_debug.graph.selectors import ranks_text


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


def format_event_line(event: dict) -> str:
    """An event as ``events on`` prints it: ``[SEQ] what happened``."""
    return f"[{event['seq']}] {format_event_text(event)}"


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
    if kind == "snapshot" and data.get("error"):
        return f"no snapshot after iteration {data['iteration']}: {data['error']}"
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


def format_where(result: dict) -> str:
    frames = result["frames"]
    lines = [] if result.get("state", "paused") == "paused" else [
        "(running: the stack at the instant asked; pause holds the rank still)"]
    if not frames:
        lines.append("no frames")
    for number, frame in enumerate(frames, start=1):
        marker = ">" if number == len(frames) else " "
        lines.append(f'{marker} File "{frame["file"]}", line {frame["line"]}, '
                     f'in {frame["function"]}')
        if frame.get("code"):
            lines.append(f"    {frame['code'].strip()}")
    return "\n".join(lines)


_TIMELINE_ROW = "{:>5}  {:<14} {:<10} {:>10} {:>10} {:>12} {:>9} {:>10}"


def format_timeline(timeline: dict) -> str:
    ops = timeline["ops"]
    # the last finished iteration; a running rank is already past it
    running = (" (running: the last finished iteration; the rank is past it)"
               if timeline.get("state", "paused") != "paused" else "")
    if not ops:
        return f"iteration {timeline['iteration']}: no collectives{running}"
    lines = [f"iteration {timeline['iteration']}: {len(ops)} collectives{running}",
             _TIMELINE_ROW.format("seq", "op", "group", "bytes", "start ms", "duration ms",
                                  "wait ms", "last rank")]
    for op in ops:
        last = "-" if op.get("last_rank") is None else op["last_rank"]
        lines.append(_TIMELINE_ROW.format(
            op["seq"], op["op"], format_group(op["family"], op["index"]), format_bytes(op["bytes"]),
            f"{op['start_ms']:.3f}", _ms(op["duration_ms"]), f"{op['wait_ms']:.3f}", last))
    lines.append(_TIMELINE_ROW.format(
        "total", "", "", format_bytes(sum(op["bytes"] for op in ops)), "",
        _ms(sum(op["duration_ms"] or 0.0 for op in ops)),
        f"{sum(op['wait_ms'] for op in ops):.3f}", ""))
    if timeline.get("last_ranks_kept") is False:
        lines.append("last rank: kept from the first console command on, and this iteration "
                     "ended before it; the next one will have them")
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
    row = "{:>6} {:>6} {:>6} {:>10}  {}  {}"  # (the coords padded to the widest)
    lines.append(row.format("rank", "node", "class", "time ms", "coords".ljust(width),
                            "perturbations"))
    for peer, coord in zip(peers["peers"], coords, strict=True):
        time_ms = "-" if peer.get("time_ms") is None else f"{peer['time_ms']:.3f}"
        klass = "-" if peer.get("class") is None else peer["class"]
        lines.append(row.format(peer["rank"], peer["node"], klass, time_ms, coord.ljust(width),
                                ", ".join(peer["perturbations"]) or "-"))
    return "\n".join(line.rstrip() for line in lines)


def format_new_break(result: dict, temporary: bool) -> str:
    label = "temporary breakpoint" if temporary else "breakpoint"
    return f"{label} {result['id']}: {result['description']}"


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
    if snapshot.get("when") == "scheduled" and snapshot.get("cut"):
        return (f"cut {snapshot['cut']} of ranks {ranks_text(snapshot['ranks'])} scheduled for "
                f"the end of iteration {snapshot['iteration']}: taken as every rank gets there; "
                "announced when taken, and snapshots lists its parts")
    if snapshot.get("when") == "scheduled":
        then = ("once continued (continue, next or step), as the rank is paused mid-iteration"
                if snapshot.get("state") == "paused" else "as the rank gets there")
        return (f"snapshot scheduled for the end of iteration {snapshot['iteration']}: taken "
                f"{then}; announced when taken, and snapshots lists it")
    return (f"snapshot {snapshot['id']}: after iteration {snapshot['iteration']}, "
            f"{format_bytes(snapshot['bytes'])} in {snapshot['dump_s']:.2f} s ({snapshot['path']})")


def format_left(result: dict, rank: int, released: bool) -> str:
    """What leaving did to the rank, in one line (``result`` is its status)."""
    state = result.get("state")
    if released:
        done = []
        if result.get("resumed"):
            done.append("resumed")
        if result.get("deleted"):
            noun = "breakpoint" if result["deleted"] == 1 else "breakpoints"
            done.append(f"{result['deleted']} {noun} deleted")
        detail = f" ({', '.join(done)})" if done else ""
        if state in ("running", "paused"):  # paused: a pause was resumed just now
            return f"detached; rank {rank} runs free to its end{detail}"
        return f"detached; rank {rank} is {_off_bus(result)}; it runs free once back"
    if state == "paused" and result.get("paused_at"):
        return (f"left; rank {rank} stays {describe_pause(result['paused_at'])} — "
                f"{how_to_resume(rank)}")
    if state == "running":
        armed = result.get("breakpoints") or 0
        if armed:
            noun = "breakpoint stays" if armed == 1 else "breakpoints stay"
            return (f"left; rank {rank} keeps running, and its {armed} {noun} armed — "
                    f"{how_to_resume(rank)} where it pauses")
        return f"left; rank {rank} keeps running"
    return f"left; rank {rank} is {_off_bus(result)}"


def _off_bus(status: dict) -> str:
    state = str(status.get("state"))  # (as the message prints it: None where none is said)
    if state == "exited":
        return f"gone (exited with code {status.get('exit_code')})"
    return {"starting": "still starting", "snapshotting": "being snapshotted"}.get(state, state)


def format_snapshots(snapshots: list[dict]) -> str:
    if not snapshots:
        return "no snapshots"
    width = max(len("id"), *(len(s["id"]) for s in snapshots))
    row = "{}  {:>9}  {:>10}  {:<19}  {:<7}  {}"  # (the ids padded to the longest)
    lines = [row.format("id".ljust(width), "iteration", "size", "created", "kind", "parent")]
    for s in snapshots:
        lines.append(row.format(s["id"].ljust(width), s["iteration"],
                                format_bytes(s["image_bytes"]), format_time(s["created"]),
                                "history" if s.get("history") else "user",
                                s.get("parent") or "-"))
    return "\n".join(line.rstrip() for line in lines)


def format_pausing(rank: int, timeout_s: float) -> str:
    return (f"rank {rank} is pausing: it stops at its next collective or iteration boundary, "
            f"not reached in {timeout_s:g} s (status shows where it is); the pause is announced "
            "when it comes")


def format_scenario(result: dict) -> str:
    return "\n".join(result["applied"]) + (
        f"\n{result['scenario']}: {len(result['applied'])} fault(s) in force; its expectations "
        "are judged by prism-debug scenario run")


def format_back(result: dict) -> str:
    """What back or reverse-continue restored, and how far it runs again."""
    replayed = result["replayed"]
    again = (f", running {replayed} iteration{'s' if replayed != 1 else ''} again"
             if replayed > 0 else "")
    return (f"{result['reason']}: restored {_restored_what(result)} (after iteration "
            f"{result['iteration']}){again}")


def _restored_what(result: dict) -> str:
    """A rank's snapshot, or a cut of several ranks (its reply names them)."""
    if "ranks" in result:
        return f"cut {result['id']} of ranks {ranks_text(result['ranks'])}"
    return f"snapshot {result['id']}"


def format_restored(result: dict) -> str:
    return (f"restored snapshot {result['id']}: paused after iteration {result['iteration']} "
            f"(pid {result['pid']})")

def format_time(created: float | str) -> str:
    """A manifest's creation time (unix seconds) in local time; strings pass through."""
    if isinstance(created, str):
        return created
    return datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M:%S")
