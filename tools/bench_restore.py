"""Restore to running: time from a restore to the restored rank's first
completed collective, of a training rank holding about 0.2, 1 and 4 GiB,
restored eagerly (every page loaded before it runs) and lazily (CRIU's lazy
pages: it runs at once and faults its pages in).

Each size runs ``tools/restore_workload.py`` as rank 1 of 8 under
``prism-debug run --snapshot-at 2`` (a full snapshot: lazy pages serve only
snapshots without a parent), then restores it ``--repeat`` times each way,
eager and lazy interleaved (the order alternates), through ``api.restore``
in this process, one iteration each.  The rank prints the wall clock as its
collectives complete, so each restore is timed in four spans:

* ``options→coll``: from ``api.restore(RestoreOptions)`` to the first
  collective — what a user waits for (it includes ``store.verify``, timed on
  its own once per repeat: a stat() of every image once it has been hashed);
* ``criu→coll``: from the CRIU restore call to the first collective;
* ``criu→running``: prism-debug's own "restored pid … in X s" line (CRIU's
  restore until the copy said it resumed);
* ``criu→step``: to the end of the first optimizer step after the restore,
  which reads and writes the whole state (lazily, the pages' faults land here).

Memory is touched once before measuring (``--pretouch-gib``): in a VM the
first touch of guest memory costs ~1.8 s/GiB and would go to whichever
restore came first.

Last line: ``restore: eager_s_per_gib=X lazy_s_per_gib=Y`` (criu→coll of the
largest size, medians, per GiB of images).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tools" / "restore_workload.py"
sys.path.insert(0, str(ROOT))

from prism_debug import api  # noqa: E402
from prism_debug.process.paths import PRIVATE_UMASK, open_store  # noqa: E402

_SNAPSHOT = re.compile(r"^snapshot (\S+): iteration \d+, ([\d.]+) MiB in ([\d.]+) s", re.M)
_RESTORED = re.compile(r"^restored pid \d+ in ([\d.]+) s \(.*?, (eager|lazi)ly\b")
_STAMP = re.compile(r"^(collective|step) \d+ ([\d.]+)$", re.M)


def now() -> float:
    return time.time()


def record(gib: float, work: Path) -> tuple[Path, str, float]:
    """A full snapshot of the workload after iteration 2: (store, id, image MiB)."""
    store = work / "store"
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size", "8",
         "--rank", "1", "--hardware", "zero", "--no-digest", "--snapshot-at", "2",
         "--store", str(store), "--run-dir", str(work / "run"), "--",
         sys.executable, str(WORKLOAD), "--gib", str(gib), "--iterations", "4"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL)
    taken = _SNAPSHOT.findall(proc.stdout)
    if proc.returncode != 0 or len(taken) != 1:
        sys.exit(f"bench_restore: the run failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    snapshot_id, mib, _ = taken[0]
    return store, snapshot_id, float(mib)


def restore_once(store: Path, snapshot_id: str, run_dir: Path, lazy: bool) -> dict:
    """One restore, one iteration; its spans in seconds and the way it went."""
    lines: list[tuple[float, str]] = []
    started = now()
    result = api.restore(api.RestoreOptions(
        snapshot_id=snapshot_id, store=store, iterations=1, run_dir=run_dir, bind=None,
        lazy=lazy), lambda line: lines.append((now(), line)))
    if result.exit_code != 0:
        sys.exit(f"bench_restore: the restored rank exited {result.exit_code}: "
                 f"{result.log_path.read_text()[-2000:]}")
    said = [(t, m) for t, line in lines if (m := _RESTORED.match(line))]
    if not said:
        sys.exit(f"bench_restore: no 'restored' line in {[line for _, line in lines]}")
    at, match = said[0]
    to_running, way = float(match.group(1)), "lazy" if match.group(2) == "lazi" else "eager"
    criu_started = at - to_running
    stamps = _STAMP.findall(result.log_path.read_text())
    collective = next(float(t) for kind, t in stamps if kind == "collective")
    step = next(float(t) for kind, t in stamps if kind == "step" and float(t) > collective)
    return {"way": way, "options→coll": collective - started,
            "criu→coll": collective - criu_started, "criu→running": to_running,
            "criu→step": step - criu_started}


def prefault(gib: float) -> None:
    """Touch ``gib`` of memory once and give it back (the VM's first touch)."""
    if gib > 0:
        subprocess.run([sys.executable, "-c", f"import numpy; numpy.ones(int({gib} * 2**27))"],
                       check=True)


def spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.3f} "
            f"[{min(values):.3f}–{max(values):.3f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, nargs="*", default=[0.2, 1.0, 4.0])
    parser.add_argument("--repeat", type=int, default=3,
                        help="restores per size and way (median)")
    parser.add_argument("--pretouch-gib", type=float, default=None,
                        help="memory to touch once first [default: twice the largest size]")
    args = parser.parse_args()
    os.umask(PRIVATE_UMASK)  # as the CLI: the store and run folders are the user's alone
    prefault(2 * max(args.gib) if args.pretouch_gib is None else args.pretouch_gib)
    spans = ["options→coll", "criu→coll", "criu→running", "criu→step"]
    rows = []
    for gib in args.gib:
        work = Path(tempfile.mkdtemp(prefix="prism-bench-restore-"))
        try:
            print(f"{gib} GiB: prism-debug run --snapshot-at 2 …", flush=True)
            store, snapshot_id, mib = record(gib, work)
            times: dict[str, dict[str, list[float]]] = {"eager": {}, "lazy": {}}
            verify_s = []
            for repeat in range(args.repeat):
                started = now()
                open_store(store).verify(snapshot_id)  # what every restore does first
                verify_s.append(now() - started)
                order = ["eager", "lazy"] if repeat % 2 == 0 else ["lazy", "eager"]
                for way in order:
                    got = restore_once(store, snapshot_id, work / f"r{repeat}-{way}",
                                       way == "lazy")
                    if got["way"] != way:
                        sys.exit(f"bench_restore: asked {way}, restored {got['way']}")
                    print(f"  {way:>5} #{repeat + 1}: " + " ".join(
                        f"{span} {got[span]:.3f}" for span in spans), flush=True)
                    for span in spans:
                        times[way].setdefault(span, []).append(got[span])
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"  store.verify: {spread(verify_s)} s", flush=True)
        rows.append((gib, mib, times))
    print(f"\nmedian [min–max] of {args.repeat} restores, seconds")
    print(f"{'GiB':>5} {'image MiB':>10} {'way':>6} " + " ".join(f"{s:>21}" for s in spans)
          + f" {'criu→coll s/GiB':>16}")
    for gib, mib, times in rows:
        for way in ("eager", "lazy"):
            coll = statistics.median(times[way]["criu→coll"])
            print(f"{gib:>5} {mib:>10.1f} {way:>6} "
                  + " ".join(f"{spread(times[way][s]):>21}" for s in spans)
                  + f" {coll / (mib / 1024):>16.3f}")
    gib, mib, times = rows[-1]
    per = {way: statistics.median(times[way]["criu→coll"]) / (mib / 1024)
           for way in ("eager", "lazy")}
    print(f"restore: eager_s_per_gib={per['eager']:.3f} lazy_s_per_gib={per['lazy']:.3f}")


if __name__ == "__main__":
    main()
