"""What a consistent cut of two real ranks costs each rank, against a
snapshot of one real rank of the same job.

The bundled example (tp 2, small) runs as rank 0 of 8,192 alone and as
ranks 0-1 together (``--ranks``), each with ``--snapshot-every 1
--incremental`` and once without snapshots, rounds interleaved (the four
configurations in turn, their order rotating).  A rank's clock leaves out
what the harness does at an iteration boundary — its bookkeeping, and at a
snapshot: the handshake, the dump and, for a cut, the wait for the other
rank's end of the iteration, dropping the connections to it and making
them again — and the rank reports the total at its exit
(``harness_excluded_s``).  So the per-snapshot cost of a rank is its
excluded time with snapshots minus without, over the snapshots it took;
each figure is the median over the rounds, with the spread (max − min,
the noise floor) beside it.  The manifests' ``pause`` (announcement to
release) and ``criu`` phases show what of it is the dump itself.

Last line: ``cut: one_rank_s=X cut_rank_s=Y extra_s=Z`` (medians per
snapshot: one rank's, a cut's rank's — the slower of the two — and their
difference).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_gpt.py"
ARGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "128",
        "--micro-batches", "2", "--tp", "2", "--pp", "1"]
CONFIGS = {"one": ["--rank", "0"], "cut": ["--ranks", "0-1"]}


def run(ranks: list[str], snapshots: bool, iterations: int, work: Path) -> dict:
    """One run; per rank its excluded seconds, and its snapshots' phases."""
    store, run_dir = work / "store", work / "run"
    command = [sys.executable, "-m", "prism_debug.cli", "run", "--world-size", "8192", *ranks,
               "--no-bus", "--store", str(store), "--run-dir", str(run_dir)]
    if snapshots:
        command += ["--snapshot-every", "1", "--incremental"]
    proc = subprocess.run([*command, "--", sys.executable, str(EXAMPLE), *ARGS,
                           "--iterations", str(iterations)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"bench_cut: the run failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    excluded = {}
    for events in sorted(run_dir.rglob("events.jsonl")):
        records = [json.loads(line) for line in events.read_text().splitlines()]
        rank = next(e["rank"] for e in records if e["kind"] == "init")
        excluded[rank] = next(e["harness_excluded_s"] for e in records if e["kind"] == "exit")
    manifests = [json.loads(p.read_text()) for p in store.glob("*/manifest.json")]
    return {"excluded": excluded, "phases": [m["phases"] for m in manifests]}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s (±{(max(values) - min(values)) / 2:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cut-") as tmp:
        # each once first: the graph profiled and cached, CRIU and the page cache warm
        for name, ranks in CONFIGS.items():
            run(ranks, True, 2, Path(tmp) / f"warm-{name}")
        per_snapshot: dict[str, list[float]] = {name: [] for name in CONFIGS}
        pauses: dict[str, list[float]] = {name: [] for name in CONFIGS}
        criu: dict[str, list[float]] = {name: [] for name in CONFIGS}
        runs = [(name, snap) for name in CONFIGS for snap in (True, False)]
        for round_ in range(args.rounds):
            got = {}
            for name, snap in runs[round_ % len(runs):] + runs[:round_ % len(runs)]:
                got[name, snap] = run(CONFIGS[name], snap, args.iterations,
                                      Path(tmp) / f"{round_}-{name}-{snap}")
            for name in CONFIGS:
                with_, without = got[name, True]["excluded"], got[name, False]["excluded"]
                # the slower rank of a cut is the cut's cost to the job
                per_snapshot[name].append(max(with_[r] - without[r] for r in with_)
                                          / args.iterations)
                pauses[name] += [p["pause"] for p in got[name, True]["phases"]]
                criu[name] += [p["criu"] for p in got[name, True]["phases"]]
            print(f"round {round_ + 1}: one rank {per_snapshot['one'][-1]:.3f} s, "
                  f"a cut's rank {per_snapshot['cut'][-1]:.3f} s per snapshot", flush=True)
    for name, label in (("one", "one real rank"), ("cut", "a cut of two, slower rank")):
        print(f"{label:<28} per snapshot {spread(per_snapshot[name])}, pause "
              f"{spread(pauses[name])}, criu {spread(criu[name])}")
    one, cut = (statistics.median(per_snapshot[n]) for n in ("one", "cut"))
    print(f"cut: one_rank_s={one:.3f} cut_rank_s={cut:.3f} extra_s={cut - one:.3f}")


if __name__ == "__main__":
    main()
