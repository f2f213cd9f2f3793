"""The run report: assembled from the agent's event log, written as JSON,
printed as a table, and turned into a Chrome trace that Perfetto opens."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from prism_debug.variability import Variability

REPORT_VERSION = 1

_TABLE_HEADER = (f"{'iter':>5} {'time ms':>10} {'compute ms':>11} {'comm wait ms':>13} "
                 f"{'colls':>6}  digest")


def read_events(path: Path) -> list[dict]:
    """The complete lines of an event log (a line being written is skipped)."""
    events: list[dict] = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # (a line cut short, or damaged)
            continue
        if isinstance(event, dict) and isinstance(event.get("kind"), str):
            events.append(event)
    return events


def no_gpu_line(event: dict, cwd: Path) -> tuple[str, str, int] | None:
    """The one line for the agent's ``no_gpu`` event (agent/no_gpu.py): the
    script's line that called CUDA, and why this machine cannot serve it;
    with that line's file and number.  None for an event not of that form
    (the rank writes it: checked, and cut to a size to read)."""
    path, line, source, reason = (event.get("file"), event.get("line"), event.get("source"),
                                  event.get("reason"))
    call = event.get("call")
    if not (isinstance(path, str) and type(line) is int and isinstance(source, str)
            and isinstance(reason, str) and (call is None or isinstance(call, str))):
        return None
    shown = Path(path)
    if shown.is_absolute() and shown.is_relative_to(cwd):
        shown = shown.relative_to(cwd)
    where = f"{_one_line(str(shown), 300)}:{line}"
    what = (f"calls {_one_line(call, 100)}, which needs" if call else
            f"(`{_one_line(source, 200)}`) needs")
    return (f"{where} {what} a GPU, and this machine has none ({_one_line(reason, 200)}): "
            "run the rank on a machine with a GPU, or keep it on the CPU when "
            "torch.cuda.is_available() is False (prism-debug emulates the other ranks, not a "
            "GPU)", path, line)


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def build_report(*, events: list[dict], world_size: int, rank: int, command: list[str],
                 exit_code: int | None, hardware: str, child_peak_rss: int) -> dict:
    iterations: list[dict] = []
    for event in events:
        if event["kind"] == "iteration":
            iterations.append(event)
        elif event["kind"] == "resumed":
            # a copy restored into this run (from the console) goes on from
            # its snapshot: what the replaced rank did after that is undone
            iterations = [it for it in iterations if it["iteration"] <= event["iteration"]]
    families: list[dict] = []
    peak_rss = child_peak_rss
    backend = variability = None
    for event in events:
        if "families" in event:
            families = event["families"]
        if event["kind"] in ("init", "resumed"):
            backend = event["backend"]
            variability = event.get("variability")
        peak_rss = max(peak_rss, event.get("peak_rss_bytes", 0))
    return {
        "version": REPORT_VERSION,
        "world_size": world_size,
        "rank": rank,
        "command": command,
        "exit_code": exit_code,
        "hardware": hardware,
        "backend": backend,
        "families": [{k: f[k] for k in ("name", "num_groups", "group_size")} for f in families],
        "iterations": [
            {k: it[k] for k in ("iteration", "time_s", "compute_s", "comm_wait_s",
                                "num_collectives", "digest", "last_arrival") if k in it}
            for it in iterations
        ],
        "peak_rss_bytes": peak_rss,
        "variability": None if variability is None else {
            "describe": Variability.from_dict(variability).describe(), "statement": variability},
        # iteration 1 is the warm-up (a restored run resumes after it)
        "waits": waits_distribution([it for it in iterations if it["iteration"] > 1]
                                    or iterations),
    }


WAIT_PERCENTILES = (50, 95, 99)


def waits_distribution(iterations: list[dict]) -> dict:
    """The real rank's waits in its collectives over ``iterations``: each op
    from the rank's arrival to its completion on the emulated clock (the
    wait for the last member, plus the transfer), by op kind and over all
    ops — count, p50, p95, p99 (numpy's linear interpolation) and max, in
    seconds."""
    by_op: dict[str, list[float]] = {}
    for it in iterations:
        for op, waits in it.get("op_waits", {}).items():
            by_op.setdefault(op, []).extend(waits)
    every = [w for waits in by_op.values() for w in waits]
    ops = {op: _spread(by_op[op]) for op in sorted(by_op)}
    return {"iterations": [it["iteration"] for it in iterations],
            "ops": ops, "all": _spread(every) if every else None}


def _spread(waits: list[float]) -> dict:
    values = np.asarray(waits, dtype=float)
    p50, p95, p99 = (float(v) for v in np.percentile(values, WAIT_PERCENTILES))
    return {"count": int(values.size), "p50_s": p50, "p95_s": p95, "p99_s": p99,
            "max_s": float(values.max())}


def waits_lines(waits: dict | None) -> list[str]:
    """The waits distribution as the run prints it: a row per op kind, then all."""
    if not waits or waits.get("all") is None:
        return []
    shown = waits["iterations"]
    span = f"iteration {shown[0]}" if len(shown) == 1 else f"iterations {shown[0]}-{shown[-1]}"
    lines = [f"waits in collectives, arrival to completion ({span}):",
             f"  {'op':<20} {'count':>7} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'max ms':>9}"]
    for op, row in [*waits["ops"].items(), ("all", waits["all"])]:
        lines.append(f"  {op:<20} {row['count']:>7} " + " ".join(
            f"{row[k] * 1e3:>9.3f}" for k in ("p50_s", "p95_s", "p99_s", "max_s")))
    return lines


def table_header() -> str:
    return _TABLE_HEADER


def table_row(it: dict) -> str:
    row = (f"{it['iteration']:>5} {it['time_s'] * 1e3:>10.2f} {it['compute_s'] * 1e3:>11.2f} "
           f"{it['comm_wait_s'] * 1e3:>13.2f} {it['num_collectives']:>6}  {it['digest'][:16]}")
    last = it.get("last_arrival")
    if last:  # with a graph: who the longest wait was for
        row += (f"  longest wait {last['wait_s'] * 1e3:.2f} ms: {last['op']} on "
                f"{last['family']}, last in: rank {last['rank']}")
    return row


def describe_families(families: list[dict]) -> str:
    return " · ".join(f"{f['name']} {f['num_groups']}×{f['group_size']}" for f in families)


def summary_lines(report: dict) -> list[str]:
    its = report["iterations"]
    lines = []
    if report["families"]:
        lines.append(f"families: {describe_families(report['families'])}")
    if report.get("variability"):
        lines.append(f"variability: {report['variability']['describe']}")
    # the waits before the summary: the summary stays the report's last line
    lines += waits_lines(report.get("waits"))
    if its:
        times = [it["time_s"] for it in its]
        restored = report.get("restored_from")
        # a restored run starts warm: its first iteration is a steady one
        steady = times if restored else times[1:] or times
        wait = sum(it["comm_wait_s"] for it in (its if restored else its[1:] or its))
        start = (f"from snapshot {restored}" if restored
                 else f"after warm-up (first {times[0] * 1e3:.2f} ms)")
        lines.append(
            f"summary: {len(its)} iterations · median {statistics.median(steady) * 1e3:.2f} ms "
            f"{start} · comm wait "
            f"{100 * wait / max(sum(steady), 1e-12):.1f}% · peak RSS "
            f"{report['peak_rss_bytes'] / 2**20:.0f} MiB · exit {report['exit_code']}")
    else:
        lines.append(f"summary: no iteration completed · peak RSS "
                     f"{report['peak_rss_bytes'] / 2**20:.0f} MiB · exit {report['exit_code']}")
    return lines


def chrome_trace(events: list[dict], rank: int) -> dict:
    """Chrome trace-event JSON: iterations, each collective on its family's
    lane (arrival to completion), the waits that blocked the rank, and the
    ops of traced virtual ranks (``--trace-ranks``) as processes of their own."""
    iterations = [e for e in events if e["kind"] == "iteration"]
    origin = iterations[0]["start_s"] if iterations else 0.0
    trace: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank} (real)"}},
    ]
    lanes: dict[str, int] = {"iterations": 0, "waits": 1}
    virtual_ranks: set[int] = set()

    def lane(name: str) -> int:
        return lanes.setdefault(name, len(lanes))

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    for it in iterations:
        trace.append({"name": f"iteration {it['iteration']}", "ph": "X", "pid": rank,
                      "tid": lane("iterations"), "ts": us(it["start_s"]),
                      "dur": round(it["time_s"] * 1e6, 3),
                      "args": {"digest": it["digest"], "comm_wait_ms": it["comm_wait_s"] * 1e3}})
        for op, family, index, nbytes, arrival, done in it.get("ops", ()):
            trace.append({"name": op, "ph": "X", "pid": rank, "tid": lane(f"comm {family}"),
                          "ts": us(arrival), "dur": round((done - arrival) * 1e6, 3),
                          "args": {"family": family, "group": index, "bytes": nbytes}})
        for rank_, op, family, arrival, done in it.get("virtual_ops", ()):
            virtual_ranks.add(rank_)
            trace.append({"name": op, "ph": "X", "pid": rank_, "tid": lane(f"comm {family}"),
                          "ts": us(arrival), "dur": round((done - arrival) * 1e6, 3),
                          "args": {"family": family}})
        for start, end in it.get("waits", ()):
            trace.append({"name": "wait", "ph": "X", "pid": rank, "tid": lane("waits"),
                          "ts": us(start), "dur": round((end - start) * 1e6, 3)})
    for pid in (rank, *sorted(virtual_ranks)):
        if pid != rank:
            trace.append({"name": "process_name", "ph": "M", "pid": pid,
                          "args": {"name": f"rank {pid} (virtual)"}})
        for name, tid in lanes.items():
            trace.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                          "args": {"name": name}})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}
