"""Snapshot cost: dump and restore time and image size of a training rank
holding about 0.2, 1 and 4 GiB, against (a) the criu command line dumping the
same workload directly (what prism-debug adds) and (b) torch.save of the
model and optimizer state.

Each size runs ``tools/snapshot_workload.py`` as rank 1 of 8 under
``prism-debug run --snapshot-at 2,3 --incremental`` — a full snapshot after
iteration 2 and an incremental one on top of it after iteration 3 — and
restores each once; then runs the workload standalone and dumps it with
``criu dump --leave-running``.  The workload rewrites all of its state every
step (as training does: parameters, gradients, Adam moments), so its
increments save only what the step leaves alone.  Where the kernel has no
soft-dirty tracking (this project's VMs) the increment is found by comparing
pages with the parent's after a full dump.

Last line: ``snapshot: dump_s_per_gib=X restore_s_per_gib=Y overhead_vs_criu_pct=Z``
(X, Y: the largest size; Z: prism-debug's dump time over the criu command
line's, summed over the sizes).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tools" / "snapshot_workload.py"
sys.path.insert(0, str(ROOT))

from prism_debug.snapshot import criu as criu_api  # noqa: E402

_SNAPSHOT = re.compile(r"^snapshot (\S+): iteration \d+, ([\d.]+) MiB in ([\d.]+) s", re.M)
_RESTORED = re.compile(r"^restored pid \d+ in ([\d.]+) s", re.M)


def prism(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"bench_snapshot: prism-debug {args[0]} failed:\n{proc.stdout[-2000:]}"
                 f"{proc.stderr[-2000:]}")
    return proc.stdout


def prism_dump_and_restore(gib: float, work: Path) -> list[tuple[float, float, float]]:
    """(image MiB, dump s, restore s) through prism-debug, of the full snapshot
    and of the incremental one on top of it."""
    store = work / "store"
    out = prism("run", "--lockstep", "--world-size", "8", "--rank", "1", "--hardware", "zero",
                "--no-digest",
                "--snapshot-at", "2,3", "--incremental", "--store", str(store),
                "--run-dir", str(work / "run"),
                "--", sys.executable, str(WORKLOAD), "--gib", str(gib), "--iterations", "4")
    taken = _SNAPSHOT.findall(out)
    if len(taken) != 2:
        sys.exit(f"bench_snapshot: expected two snapshots:\n{out[-2000:]}")
    rows = []
    for snapshot_id, mib, dump_s in taken:
        restored = prism("snapshot", "restore", snapshot_id, "--store", str(store),
                         "--iterations", "1", "--run-dir", str(work / f"restored-{snapshot_id}"))
        rows.append((float(mib), float(dump_s), float(_RESTORED.search(restored).group(1))))
    return rows


def criu_cli_dump(gib: float, work: Path) -> tuple[float, float, float]:
    """(image MiB, dump s, torch.save s) of the standalone workload."""
    criu = criu_api.locate()
    log = work / "standalone.log"
    with open(log, "ab") as out:
        child = subprocess.Popen([sys.executable, str(WORKLOAD), "--gib", str(gib),
                                  "--standalone"], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        while "ready" not in log.read_text():
            if child.poll() is not None:
                sys.exit(f"bench_snapshot: the standalone workload died:\n{log.read_text()}")
            time.sleep(0.05)
        images = work / "criu-images"
        images.mkdir()
        started = time.perf_counter()
        subprocess.run([str(criu.binary), "dump", "-t", str(child.pid), "-D", str(images),
                        "--leave-running", "-o", "dump.log", "-v4"], check=True)
        dump_s = time.perf_counter() - started
        mib = sum(p.stat().st_size for p in images.glob("*.img")) / 2**20
        save_s = float(re.search(r"torch_save_s ([\d.]+)", log.read_text()).group(1))
        return mib, dump_s, save_s
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, nargs="*", default=[0.2, 1.0, 4.0])
    args = parser.parse_args()
    tracked, _ = criu_api.tracks_memory(criu_api.locate())
    rows = []
    for gib in args.gib:
        work = Path(tempfile.mkdtemp(prefix="prism-bench-snapshot-"))
        try:
            print(f"{gib} GiB: prism-debug run --snapshot-at 2,3 --incremental, restores …",
                  flush=True)
            full, increment = prism_dump_and_restore(gib, work)
            print(f"{gib} GiB: criu dump of the same workload, standalone …", flush=True)
            criu_mib, criu_s, save_s = criu_cli_dump(gib, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows.append((gib, *full, criu_mib, criu_s, save_s, *increment))
    print(f"{'GiB':>5} {'image MiB':>10} {'dump s':>7} {'restore s':>10} {'criu MiB':>9} "
          f"{'criu dump s':>12} {'torch.save s':>13} {'dump s/GiB':>11} {'incr MiB':>9} "
          f"{'incr dump s':>12} {'incr restore s':>15}")
    for gib, mib, dump_s, restore_s, criu_mib, criu_s, save_s, inc_mib, inc_s, inc_r in rows:
        print(f"{gib:>5} {mib:>10.1f} {dump_s:>7.2f} {restore_s:>10.2f} {criu_mib:>9.1f} "
              f"{criu_s:>12.2f} {save_s:>13.2f} {dump_s / (mib / 1024):>11.2f} {inc_mib:>9.1f} "
              f"{inc_s:>12.2f} {inc_r:>15.2f}")
    print("incremental: " + ("CRIU's memory tracking (soft-dirty)" if tracked else
                             "by page content (this kernel has no soft-dirty tracking)"))
    gib, mib, dump_s, restore_s = rows[-1][:4]
    overhead = 100 * (sum(r[2] for r in rows) - sum(r[5] for r in rows)) / sum(r[5] for r in rows)
    print(f"snapshot: dump_s_per_gib={dump_s / (mib / 1024):.3f} "
          f"restore_s_per_gib={restore_s / (mib / 1024):.3f} overhead_vs_criu_pct={overhead:.1f}")


if __name__ == "__main__":
    main()
