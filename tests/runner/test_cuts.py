"""Consistent cuts: a snapshot of every real rank at one iteration boundary,
restored together.

Two real ranks of an 8,192-rank job (the bundled example, tp 2, its data
parallelism mirrored) are snapshotted after iteration 2 and run on; the cut
restored runs iterations 3 and 4 again.  Each restored rank's value digests
(its collectives' data, real and virtual) must equal the original's, and
they differ between ranks and iterations, so the comparison can fail.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.cli import cli
from tests.runner.hosts import run_on_two_hosts
from tests.runner.test_multi_rank import EXAMPLE, losses

pytestmark = pytest.mark.slow

ARGS = ["--iterations", "4", "--layers", "2", "--hidden", "64", "--heads", "4",
        "--seq-len", "32", "--vocab", "128", "--micro-batches", "2", "--pp", "1", "--loss-hex"]
CUT = re.compile(r"c[0-9a-f]{8}-it2")


def events(run_dir: Path, rank: int) -> list[dict]:
    """Rank ``rank``'s events (its folder is in one run folder or a host's)."""
    [path] = run_dir.rglob(f"rank-{rank}/events.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def digests(run_dir: Path, rank: int) -> dict[int, str]:
    return {e["iteration"]: e["digest"] for e in events(run_dir, rank) if e["kind"] == "iteration"}


def times(run_dir: Path, rank: int) -> dict[int, float]:
    return {e["iteration"]: e["time_s"] for e in events(run_dir, rank)
            if e["kind"] == "iteration"}


def timelines(run_dir: Path, rank: int) -> dict[int, dict]:
    return {e["real_ops"]["iteration"]: e["real_ops"]["done"] for e in events(run_dir, rank)
            if e["kind"] == "iteration" and "real_ops" in e}


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    """The original run with its cut after iteration 2; its folder, store,
    output and the cut's id."""
    tmp = tmp_path_factory.mktemp("cut")
    run = cli("run", "--world-size", "8192", "--ranks", "0-1", "--no-bus", "--snapshot-at", "2",
              "--store", str(tmp / "store"), "--run-dir", str(tmp / "run"), "--",
              sys.executable, str(EXAMPLE), *ARGS, "--tp", "2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    cut_id = re.search(r"^replay every real rank from the cut: prism-debug snapshot restore "
                       rf"({CUT.pattern}) --store ", run.stdout, re.MULTILINE).group(1)
    return tmp, tmp / "store", run.stdout, cut_id


def test_every_rank_is_snapshotted_as_its_part_of_one_cut(cut):
    tmp, store, _, cut_id = cut
    listing = cli("snapshot", "ls", "--store", str(store)).stdout.splitlines()
    rows = [row.split() for row in listing[1:]]
    assert sorted((int(row[1]), int(row[2])) for row in rows) == [(2, 0), (2, 1)]
    assert all(row[6:8] == ["cut", cut_id] for row in rows)
    for row in rows:
        manifest = json.loads(cli("snapshot", "show", row[0], "--store", str(store)).stdout)
        assert (manifest["cut"], manifest["cut_ranks"], manifest["version"]) == \
            (cut_id, [0, 1], 4)


def test_a_cut_restores_and_replays_with_the_original_digests_on_both_ranks(cut):
    tmp, store, original_output, cut_id = cut
    original = {rank: digests(tmp / "run", rank) for rank in (0, 1)}
    # the check can fail: every rank and iteration has digests of its own
    assert len({d for rank in (0, 1) for d in original[rank].values()}) == 8
    restore = cli("snapshot", "restore", cut_id, "--no-bus", "--store", str(store),
                  "--run-dir", str(tmp / "restored"))
    assert restore.returncode == 0, restore.stdout[-3000:] + restore.stderr[-3000:]
    assert f"prism-debug: restoring cut {cut_id} (ranks 0-1 of 8192, after iteration 2)" \
        in restore.stdout
    for rank in (0, 1):
        assert digests(tmp / "restored", rank) == {3: original[rank][3], 4: original[rank][4]}
        report = json.loads((tmp / "restored" / f"rank-{rank}" / "report.json").read_text())
        assert re.fullmatch(rf"r{rank}-it2-[0-9a-f]{{6}}", report["restored_from"])
    # the losses the script prints after its boundary 2 (iterations 2-4, 0-based 1-3)
    assert losses(restore.stdout.replace("[rank 0] ", "")) == \
        losses(original_output.replace("[rank 0] ", ""))[1:]
    # the restored replicas still agree on every real rank's completions, to
    # the last bit; those of iteration 2 (reported at the end of iteration 3)
    # come from the engines as dumped: the original's
    restored = [timelines(tmp / "restored", rank) for rank in (0, 1)]
    assert sorted(restored[0]) == [2, 3] and restored[0] == restored[1]
    assert restored[0][2] == timelines(tmp / "run", 0)[2]
    assert "inf" not in str(restored[0])


def test_one_rank_of_a_cut_is_not_restored_alone(cut):
    _, store, _, cut_id = cut
    member = next(m.group(0) for m in re.finditer(
        r"r0-it2-[0-9a-f]{6}", cli("snapshot", "ls", "--store", str(store)).stdout))
    alone = cli("snapshot", "restore", member, "--no-bus", "--store", str(store))
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines()[-1] == (
        f"prism-debug: error: snapshot {member} is rank 0's part of the cut {cut_id} of ranks "
        "0-1, which meet each other: restore them together, prism-debug snapshot restore "
        f"{cut_id}")


def test_a_cut_missing_a_rank_says_which_and_restores_nothing(cut, tmp_path):
    _, store, _, cut_id = cut
    partial = tmp_path / "store"
    shutil.copytree(store, partial)
    [rank_1] = partial.glob("r1-it2-*")
    shutil.rmtree(rank_1)
    restore = cli("snapshot", "restore", cut_id, "--no-bus", "--store", str(partial),
                  "--run-dir", str(tmp_path / "run"))
    assert restore.returncode == 2
    assert (f"cut {cut_id} is of ranks 0-1; this store ({partial}) holds ranks 0 only, the "
            "others were snapshotted on other hosts") in restore.stderr
    assert not (tmp_path / "run").exists()
    unknown = cli("snapshot", "restore", "c00000000-it2", "--no-bus", "--store", str(partial))
    assert unknown.returncode == 2
    assert f"no snapshot of cut c00000000-it2 in {partial}" in unknown.stderr


def test_two_hosts_snapshot_their_own_ranks_into_one_cut_restored_together(tmp_path):
    # tp 4 across the hosts (ranks 0-1 on one, 2-3 on the other); one store for both
    store = tmp_path / "store"
    hosts = run_on_two_hosts(["--world-size", "8192", "--ranks", "0-3", "--lockstep",
                              "--no-bus", "--snapshot-at", "2", "--store", str(store),
                              "--run-dir", str(tmp_path / "run"), "--", sys.executable,
                              str(EXAMPLE), *ARGS, "--tp", "4"])
    assert [host.returncode for host in hosts] == [0, 0], \
        "\n".join(host.stdout for host in hosts)[-4000:]
    cuts = {CUT.search(host.stdout).group(0) for host in hosts}
    assert len(cuts) == 1  # each host's controller names the same cut
    [cut_id] = cuts
    manifests = [json.loads(path.read_text()) for path in store.glob("r*/manifest.json")]
    assert sorted(m["rank"] for m in manifests) == [0, 1, 2, 3]
    assert all((m["cut"], m["cut_ranks"]) == (cut_id, [0, 1, 2, 3]) for m in manifests)
    restore = cli("snapshot", "restore", cut_id, "--no-bus", "--store", str(store),
                  "--run-dir", str(tmp_path / "restored"))
    assert restore.returncode == 0, restore.stdout[-3000:] + restore.stderr[-3000:]
    for rank in range(4):
        original = digests(tmp_path / "run", rank)
        assert digests(tmp_path / "restored", rank) == {3: original[3], 4: original[4]}


@pytest.mark.serial  # the undisturbed iterations under 0.2 s of wall time
def test_a_scenario_of_both_ranks_starts_from_the_cut_with_its_faults(cut, tmp_path):
    # virtual rank 3, rank 1's data-parallel peer, 0.3 s late at each dp
    # all-reduce of iteration 3: rank 1 waits for it there, rank 0 for rank 1
    # at their first tp all-reduce of iteration 4; every replica puts the
    # fault in force at the cut, before any arrival of iteration 3
    tmp, store, _, cut_id = cut
    graph = json.loads((tmp / "run" / "rank-0" / "agent.json").read_text())["graph_path"]
    scenario = tmp_path / "late.yaml"
    scenario.write_text(f"""name: late-peer-after-a-cut
world: {{size: 8192, ranks: "0-1"}}
run: {{snapshot: {cut_id}, graph: {graph}}}
faults:
  - {{action: delay, select: {{ranks: "3"}}, seconds: 0.3, family: dp, at: {{iteration: 3}},
     for: {{iterations: 1}}}}
expect:
  - exit_code: 0
  - iteration_time: {{percentile: 100, min_s: 0.25}}
  - iteration_time: {{percentile: 0, max_s: 0.2}}
""")
    run = cli("scenario", "run", str(scenario), "--store", str(store),
              "--run-dir", str(tmp_path / "runs"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "PASSED: late-peer-after-a-cut (3/3 expectations" in run.stdout
    original = {rank: digests(tmp / "run", rank) for rank in (0, 1)}
    for rank in (0, 1):  # a late peer changes the time, not the values
        assert sorted(times(tmp_path / "runs", rank)) == [3, 4]
        assert digests(tmp_path / "runs", rank) == {3: original[rank][3], 4: original[rank][4]}
    # undisturbed, the same iterations took a tenth of that
    assert all(max(t for i, t in times(tmp / "run", rank).items() if i >= 3) < 0.2
               for rank in (0, 1))
