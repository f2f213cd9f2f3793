"""Snapshot cost: dump and restore time, phase by phase, of a training rank
holding about 0.2, 1 and 4 GiB, against the criu command line dumping and
restoring the same workload directly (what prism-debug adds) and torch.save
of the model and optimizer state.

Each round runs ``tools/snapshot_workload.py`` as rank 1 of 8 under
``prism-debug run --snapshot-at 2,3 --incremental`` — a full snapshot after
iteration 2 and an incremental one on top of it after iteration 3 — and
restores each once; and runs the workload standalone, dumps it with ``criu
dump --leave-running`` — twice, the second beside the first, as an increment
is written beside its parent — and restores the first with ``criu
restore``.  Rounds
alternate which of the two goes first, and every figure is the median of
``--repeat`` rounds with its spread (max − min: the noise floor).

The workload rewrites its trained state every step (parameters, gradients,
Adam moments) and leaves ``--frozen`` of it alone (frozen weights), which is
what an increment leaves out.  Where the kernel has no soft-dirty tracking
(this project's VMs) the increment is found by comparing each page's index
digest with the parent's after a full dump.

What is timed.  *dump*: from the rank announcing the snapshot at its
boundary to its release (the rank is held that long: the handshake, CRIU's
dump) — what ``criu dump`` does for the CLI.  *recorded*: from the same
moment to the snapshot on disk: dump + an increment's comparison with its
parent + the commit (checksums, page index, fsync, manifest), which run
while the rank already goes on; the CLI neither compares, hashes nor
fsyncs.  Records run on the controller's recorder thread in the order of
the dumps, so a snapshot taken while the previous one is still being
recorded is dumped at once, and its record starts once the previous one's
is over: that wait is *queued*, shown apart (the rank does not wait for it).
*restore*: the restore's check of the images (stat facts) + CRIU's eager
restore (``--eager``: every page loaded before the rank runs, as ``criu
restore -d`` does for the CLI; lazy restores are ``tools/bench_restore.py``'s).
Memory is touched once first: a VM's first touch of a page costs more than
the dump itself (≈ 1.8 s/GiB) — and a second dump's images are new page
cache again, which is why the increment is set beside the CLI's second dump.

Last line: ``snapshot: dump_s_per_gib=X restore_s_per_gib=Y overhead_vs_criu_pct=Z``
(X, Y: the largest size's full snapshot; Z: prism-debug's full dump time over
the criu command line's, medians summed over the sizes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tools" / "snapshot_workload.py"
sys.path.insert(0, str(ROOT))

from prism_debug.snapshot import criu as criu_api  # noqa: E402
from prism_debug.snapshot.store import Store  # noqa: E402

_SNAPSHOT = re.compile(r"^snapshot (\S+): iteration \d+, ([\d.]+) MiB in ([\d.]+) s", re.M)
_RESTORED = re.compile(r"^restored pid \d+ in ([\d.]+) s", re.M)
_RESTORED_LINE = re.compile(r"^restored pid .*$", re.M)


def prism(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"bench_snapshot: prism-debug {args[0]} failed:\n{proc.stdout[-2000:]}"
                 f"{proc.stderr[-2000:]}")
    return proc.stdout


_LOGGED = re.compile(r"^\((\d+\.\d+)\) (.*)$")


def criu_log(path: Path, total_s: float) -> dict[str, float]:
    """Where CRIU's own dump went, from its log's timestamps: until the task
    was seized (frozen), frozen while its memory was written, and what the
    log does not cover (starting criu, the RPC) out of ``total_s``."""
    seized = unfrozen = last = 0.0
    for line in path.read_text(errors="replace").splitlines():
        if match := _LOGGED.match(line):
            last = float(match.group(1))
            if not seized and match.group(2).startswith("Seized task"):
                seized = last
            elif match.group(2).startswith("Unfreezing tasks"):
                unfrozen = last
    return {"until seized": seized, "frozen": unfrozen - seized,
            "outside its log": total_s - last}


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def prism_round(gib: float, frozen: float, work: Path) -> dict[str, float]:
    """Figures of one prism-debug run: its full snapshot (``full …``) and the
    increment on it (``incr …``), each dumped, checked and restored."""
    store_dir = work / "store"
    out = prism("run", "--lockstep", "--world-size", "8", "--rank", "1", "--hardware", "zero",
                "--no-digest",
                "--snapshot-at", "2,3", "--incremental", "--store", str(store_dir),
                "--run-dir", str(work / "run"),
                "--", sys.executable, str(WORKLOAD), "--gib", str(gib), "--iterations", "4",
                "--frozen", str(frozen))
    taken = _SNAPSHOT.findall(out)
    if len(taken) != 2:
        sys.exit(f"bench_snapshot: expected two snapshots:\n{out[-2000:]}")
    store, row = Store(store_dir), {}
    for kind, (snapshot_id, mib, _) in zip(("full", "incr"), taken, strict=True):
        manifest = store.get(snapshot_id)
        phases = manifest.phases
        row[f"{kind} MiB"] = float(mib)
        row[f"{kind} dump"] = phases["pause"]
        for name in ("handshake", "criu", "queued", "compare", "hash", "fsync_wait", "commit"):
            row[f"{kind} · {name}"] = phases.get(name, 0.0)
        for name, value in criu_log(store_dir / snapshot_id / "dump.log",
                                    phases["criu"]).items():
            row[f"{kind} · criu: {name}"] = value
        row[f"{kind} recorded"] = phases["pause"] + phases.get("compare", 0.0) + phases["commit"]
        row[f"{kind} · verify, stat facts"] = timed(partial(store.verify, snapshot_id))
        row[f"{kind} · verify, re-hash"] = timed(partial(store.verify, snapshot_id, rehash=True))
        # eager, like for like with `criu restore` (a full snapshot restores
        # lazily by default where the kernel can)
        restored = prism("snapshot", "restore", snapshot_id, "--store", str(store_dir),
                         "--iterations", "1", "--eager", "--no-bus",
                         "--run-dir", str(work / f"restored-{kind}"))
        if "eagerly" not in _RESTORED_LINE.search(restored).group(0):
            sys.exit(f"bench_snapshot: the restore was not eager:\n{restored[-2000:]}")
        row[f"{kind} · criu restore"] = float(_RESTORED.search(restored).group(1))
        row[f"{kind} restore"] = row[f"{kind} · criu restore"] + row[
            f"{kind} · verify, stat facts"]
    row["incr kept %"] = 100 * row["incr MiB"] / row["full MiB"]
    row["incr linked"] = float(store.get(taken[1][0]).parent is not None)
    return row


def criu_round(gib: float, frozen: float, work: Path) -> dict[str, float]:
    """Figures of the criu command line on the standalone workload: dump
    (leaving it running), then restore (the original killed first: the
    restored process takes its pid)."""
    criu = criu_api.locate()
    log = work / "standalone.log"
    with open(log, "ab") as out:
        child = subprocess.Popen([sys.executable, str(WORKLOAD), "--gib", str(gib),
                                  "--frozen", str(frozen), "--standalone"],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    pid, restored = child.pid, False
    try:
        while "ready" not in log.read_text():
            if child.poll() is not None:
                sys.exit(f"bench_snapshot: the standalone workload died:\n{log.read_text()}")
            time.sleep(0.05)
        images = work / "criu-images"
        images.mkdir()
        dump_s = timed(lambda: subprocess.run(
            [str(criu.binary), "dump", "-t", str(pid), "-D", str(images), "--leave-running",
             "-o", "dump.log", "-v4"], check=True))
        mib = sum(p.stat().st_size for p in images.glob("*.img")) / 2**20
        logged = {f"criu · criu: {k}": v for k, v in criu_log(images / "dump.log",
                                                                dump_s).items()}
        # a second dump beside the first, as an increment is written beside its
        # parent: in a VM its page cache is memory never touched before
        again = work / "criu-images-again"
        again.mkdir()
        again_s = timed(lambda: subprocess.run(
            [str(criu.binary), "dump", "-t", str(pid), "-D", str(again), "--leave-running",
             "-o", "dump.log", "-v4"], check=True))
        save_s = float(re.search(r"torch_save_s ([\d.]+)", log.read_text()).group(1))
        os.killpg(pid, signal.SIGKILL)
        child.wait()
        restore_s = timed(lambda: subprocess.run(
            [str(criu.binary), "restore", "-D", str(images), "-d", "-o", "restore.log", "-v4"],
            check=True))
        restored = True
        return {"criu MiB": mib, "criu dump": dump_s, "criu dump again": again_s,
                "criu restore": restore_s,
                "torch.save": save_s, **logged}
    finally:
        if child.poll() is None:
            os.killpg(pid, signal.SIGKILL)
            child.wait()
        if restored:  # the copy criu restore started, with the same pid and session
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def pretouch(gib: float) -> None:
    """Touch ``gib`` GiB once and free it: in a VM whose memory the host backs
    lazily, whichever measurement first lands in untouched memory pays for it."""
    if gib <= 0:
        return
    print(f"touching {gib:.1f} GiB of memory first …", flush=True)
    subprocess.run([sys.executable, "-c", "import numpy, sys; "
                    "numpy.ones(int(float(sys.argv[1]) * 2**30), dtype=numpy.uint8)", str(gib)],
                   check=True)


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def show(figures: list[dict[str, float]], key: str) -> str:
    values = [f[key] for f in figures]
    return f"{statistics.median(values):7.3f} ±{(max(values) - min(values)) / 2:.3f}"


def report(gib: float, prism_rows: list[dict], criu_rows: list[dict]) -> tuple[float, ...]:
    median = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    print(f"\n{gib} GiB, {len(prism_rows)} rounds: median ± half the spread (s)")
    print(f"  {'':34} {'prism-debug':>15} {'criu CLI':>15} {'ratio':>6}")

    def line(label, key, cli_key=None):
        ratio = raw = ""
        if cli_key:
            ratio = f"{median(prism_rows, key) / median(criu_rows, cli_key):6.2f}"
            raw = "   [" + " ".join(f"{r[key]:.2f}" for r in prism_rows) + " | " + " ".join(
                f"{r[cli_key]:.2f}" for r in criu_rows) + "]"  # each round's, in order
        cli = show(criu_rows, cli_key) if cli_key else ""
        print(f"  {label:34} {show(prism_rows, key):>15} {cli:>15} {ratio:>6}{raw}")
    for kind, title in (("full", "full snapshot"), ("incr", "incremental snapshot")):
        print(f"  {title}: {median(prism_rows, f'{kind} MiB'):.1f} MiB "
              f"(criu CLI {median(criu_rows, 'criu MiB'):.1f} MiB, a full dump"
              + (", the second beside the first)" if kind == "incr" else ")")
              + (f", {median(prism_rows, 'incr kept %'):.0f} % of the full one kept"
                 if kind == "incr" else ""))
        # the increment is the run's second dump: beside the CLI's second one
        cli_dump = "criu dump again" if kind == "incr" else "criu dump"
        line("dump (rank held)", f"{kind} dump", cli_dump)
        for name in ("handshake", "criu"):
            line(f"  · {name}", f"{kind} · {name}")
        for name in ("until seized", "frozen", "outside its log"):
            line(f"    · {name}", f"{kind} · criu: {name}", f"criu · criu: {name}")
        line("recorded (+ compare + commit)", f"{kind} recorded", cli_dump)
        for name in ("compare", "hash", "fsync_wait", "commit"):
            line(f"  · {name}", f"{kind} · {name}")
        line("queued behind the previous record", f"{kind} · queued")
        line("restore", f"{kind} restore", "criu restore")
        for name in ("verify, stat facts", "criu restore", "verify, re-hash"):
            line(f"  · {name}", f"{kind} · {name}")
    print(f"  torch.save of the state: {show(criu_rows, 'torch.save')}")
    for what in ("dump", "recorded", "restore"):
        ratios = [r[f"incr {what}"] / r[f"full {what}"] for r in prism_rows]
        print(f"  incremental / full, {what:8}: {statistics.median(ratios):5.2f} "
              f"±{(max(ratios) - min(ratios)) / 2:.2f}   ["
              + " ".join(f"{x:.2f}" for x in ratios) + "]")
    return (median(prism_rows, "full MiB"), median(prism_rows, "full dump"),
            median(prism_rows, "full restore"), median(criu_rows, "criu dump"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, nargs="*", default=[0.2, 1.0, 4.0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds per size (median)")
    parser.add_argument("--frozen", type=float, default=0.5,
                        help="share of the workload's state never written after the start")
    parser.add_argument("--pretouch-gib", type=float, default=None,
                        help="memory to touch once before measuring (default: twice the "
                             "largest size's rank and images, within what is available)")
    args = parser.parse_args()
    tracked, _ = criu_api.tracks_memory(criu_api.locate())
    biggest = max(args.gib)
    pretouch(args.pretouch_gib if args.pretouch_gib is not None else
             min(2 * (2.3 * biggest + 0.5), 0.6 * available_gib()))
    summary = []
    for gib in args.gib:
        prism_rows, criu_rows = [], []
        for round_ in range(args.repeat):
            order = [("prism", prism_round, prism_rows), ("criu", criu_round, criu_rows)]
            for name, measure, rows in order[::-1] if round_ % 2 else order:
                work = Path(tempfile.mkdtemp(prefix="prism-bench-snapshot-"))
                try:
                    print(f"{gib} GiB, round {round_ + 1}/{args.repeat}: {name} …", flush=True)
                    rows.append(measure(gib, args.frozen, work))
                finally:
                    shutil.rmtree(work, ignore_errors=True)
        summary.append(report(gib, prism_rows, criu_rows))
    print("\nincremental: " + ("CRIU's memory tracking (soft-dirty)" if tracked else
                               "by page index (this kernel has no soft-dirty tracking)"))
    mib, dump_s, restore_s, _ = summary[-1]
    overhead = 100 * (sum(s[1] for s in summary) - sum(s[3] for s in summary)) / sum(
        s[3] for s in summary)
    print(f"snapshot: dump_s_per_gib={dump_s / (mib / 1024):.3f} "
          f"restore_s_per_gib={restore_s / (mib / 1024):.3f} overhead_vs_criu_pct={overhead:.1f}")


if __name__ == "__main__":
    main()
