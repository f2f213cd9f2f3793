"""What real incidents leave behind: torch's own flight-recorder dumps of
torchrun jobs in which one rank hung, died, or all-reduced the wrong size
(conftest.py), read with plain pickle and judged by torch's own analyzer.
These are the facts prism-debug's incident import is validated against."""

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.incident_jobs import (
    DUMP_PREFIX,
    WORKLOAD,
    IncidentJobError,
    dumped_ranks,
    run_real_incident,
)

BUCKETS = 2  # the jobs' --buckets: dp all-reduces per iteration
GRAD_NUMEL = 64 * 256  # --grad-kib 64 of float32
FR_TRACE = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]


def load(incident, rank):
    return pickle.loads(incident.dump(rank).read_bytes())


def last_dp_entry(incident, rank):
    return [e for e in load(incident, rank)["entries"] if e["process_group"][1] == "dp"][-1]


def layout_groups(nproc, pp, tp):
    """The job's groups by family, from the layout its docstring states
    (rank = tp_rank + tp * (dp_rank + dp * pp_rank)), not from its code."""
    dp = nproc // (pp * tp)

    def at(t, d, p):
        return t + tp * (d + dp * p)

    return {"default_pg": [frozenset(range(nproc))],
            "tp": [frozenset(at(t, d, p) for t in range(tp))
                   for p in range(pp) for d in range(dp)],
            "dp": [frozenset(at(t, d, p) for d in range(dp))
                   for p in range(pp) for t in range(tp)]}


def dp_group_of(incident, rank):
    [group] = [g for g in layout_groups(incident.nproc, incident.pp, incident.tp)["dp"]
               if rank in g]
    return group


def observed_groups(incident):
    """(pg name, desc) -> the dumped ranks whose entries name that group."""
    seen = {}
    for rank in incident.dumped_ranks:
        for entry in load(incident, rank)["entries"]:
            seen.setdefault(tuple(entry["process_group"]), set()).add(rank)
    return seen


def repaired_copy(incident, out):
    """The dumps with a pg_config that fr_trace can read: gloo writes one
    useless entry (``{'': {..., 'ranks': '[]'}}``) and fr_trace stops on it.
    Each group the entries name gets its members: the dumped ranks that name
    it, completed with the ranks without a dump from the job's layout."""
    families = layout_groups(incident.nproc, incident.pp, incident.tp)
    members = {}
    for (name, desc), observed in observed_groups(incident).items():
        [ranks] = [group for group in families[desc] if observed <= group]
        members[name] = (desc, ranks)
    out.mkdir(parents=True)
    for rank in incident.dumped_ranks:
        dump = load(incident, rank)
        dump["pg_config"] = {name: {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
                             for name, (desc, ranks) in members.items() if rank in ranks}
        (out / f"{incident.prefix}{rank}").write_bytes(pickle.dumps(dump))
    return out


def fr_trace(directory, prefix):
    proc = subprocess.run([*FR_TRACE, str(directory), "--prefix", prefix,
                           "--allow-incomplete-ranks"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout + proc.stderr


def verdicts(report):
    """fr_trace's 'Not all ranks joining' blocks: (group desc, missing ranks)."""
    found = re.findall(r"group info: \d+:(\w+)\n.*?missing ranks: (\{[\d, ]*\})", report,
                       flags=re.S)
    return [(desc, set(eval(ranks))) for desc, ranks in found]


# --- the jobs' own facts ------------------------------------------------------


@pytest.mark.slow
def test_a_hang_every_rank_dumps_and_the_culprit_is_one_dp_collective_short(real_hang):
    incident, culprit = real_hang, real_hang.culprit
    assert incident.returncode != 0
    assert incident.dumped_ranks == tuple(range(8))  # the culprit's from torchrun's SIGTERM
    peers = dp_group_of(incident, culprit) - {culprit}
    first_bucket = (incident.iteration - 1) * BUCKETS + 1
    assert last_dp_entry(incident, culprit)["collective_seq_id"] == first_bucket - 1
    for peer in peers:
        entry = last_dp_entry(incident, peer)
        # the peers' dumps end with the collective the culprit never joined:
        # the iteration's first bucket, issued from the training loop
        assert entry["collective_seq_id"] == first_bucket
        assert entry["input_sizes"] == [[GRAD_NUMEL // BUCKETS]]
        assert entry["profiling_name"] == "gloo:all_reduce"
        assert entry["frames"][2]["name"] == "main"
        assert entry["timeout_ms"] == incident.timeout_s * 1000


@pytest.mark.slow
def test_a_hang_torch_fills_the_entries_as_reference_md_says(real_hang):
    """gloo's flight record: entries never started nor completed, pg_config
    useless — why the importer (and repaired_copy) read the entries."""
    dump = load(real_hang, 0)
    assert dump["version"] == "2.10"
    assert dump["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]"}}
    entries = dump["entries"]
    assert {e["state"] for e in entries} == {"scheduled"}
    assert {e["time_discovered_completed_ns"] for e in entries} == {None}
    assert not any(e["is_p2p"] for e in entries)  # gloo records no send or recv


@pytest.mark.slow
def test_the_entries_groups_are_the_layouts(real_hang):
    """Every group an entry names holds ranks of one group of the stated layout,
    and the dp and tp groups are all seen whole (every rank dumped)."""
    families = layout_groups(8, 2, 2)
    seen = observed_groups(real_hang)
    for (name, desc), ranks in seen.items():
        assert any(ranks <= group for group in families[desc]), (name, desc, ranks)
    for desc in ("tp", "dp"):
        assert sorted(map(sorted, (r for (_, d), r in seen.items() if d == desc))) == \
            sorted(map(sorted, families[desc]))


@pytest.mark.slow
def test_a_death_leaves_no_dump_from_the_culprit_alone(real_die):
    assert real_die.returncode != 0
    assert real_die.missing_ranks == (real_die.culprit,)
    first_bucket = (real_die.iteration - 1) * BUCKETS + 1
    for peer in dp_group_of(real_die, real_die.culprit) - {real_die.culprit}:
        assert last_dp_entry(real_die, peer)["collective_seq_id"] == first_bucket


@pytest.mark.slow
def test_a_wrong_size_the_culprits_bucket_is_twice_its_peers(real_size):
    incident, culprit = real_size, real_size.culprit
    group = dp_group_of(incident, culprit)
    assert len(group) == 4 and culprit in incident.dumped_ranks
    # gloo aborts a peer that receives too many bytes: it leaves no dump
    assert set(incident.missing_ranks) and set(incident.missing_ranks) <= group - {culprit}
    first_bucket = (incident.iteration - 1) * BUCKETS + 1
    theirs = last_dp_entry(incident, culprit)
    assert theirs["collective_seq_id"] == first_bucket
    peers = (group - {culprit}) & set(incident.dumped_ranks)
    assert peers
    for peer in peers:
        ours = last_dp_entry(incident, peer)
        assert ours["collective_seq_id"] == first_bucket
        assert ours["input_sizes"] == [[GRAD_NUMEL // BUCKETS]]
        assert theirs["input_sizes"] == [[2 * ours["input_sizes"][0][0]]]


# --- torch's analyzer on them ----------------------------------------------------


@pytest.mark.slow
def test_torchs_analyzer_cannot_read_the_raw_dumps(real_die):
    proc = subprocess.run([*FR_TRACE, str(real_die.dump_dir), "--prefix", real_die.prefix,
                           "--allow-incomplete-ranks"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "KeyError" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hang", "die", "size"])
def test_torchs_analyzer_names_the_culprit_on_repaired_copies(kind, request, tmp_path):
    incident = request.getfixturevalue(f"real_{kind}")
    culprit = incident.culprit
    report = fr_trace(repaired_copy(incident, tmp_path / "repaired"), incident.prefix)
    if kind == "hang":
        # the dp collective the culprit never joined; and the tp ones that
        # the dp group's ranks, stuck in it, never reached
        found = verdicts(report)
        assert [v for v in found if v[0] == "dp"] == [("dp", {culprit})]
        assert set().union(*(missing for _, missing in found)) <= \
            dp_group_of(incident, culprit)
        assert "missed FR dumps" not in report
    elif kind == "die":
        assert set(re.findall(r"missed FR dumps from ranks \((\{[\d, ]*\})\)", report)) == \
            {f"{{{culprit}}}"}
    else:
        assert re.findall(r"Culprit rank (\d+); Error type: (\w+)", report) == \
            [(str(culprit), "SIZE_OR_SYNTAX_MISMATCH")]


# --- the harness ------------------------------------------------------------------


@pytest.mark.slow
def test_a_job_past_its_wall_limit_leaves_no_process_behind(tmp_path):
    with pytest.raises(IncidentJobError, match="ran past"):
        run_real_incident("hang", tmp_path, nproc=4, tp=1, culprit=1, wall_limit_s=3)
    # every process of the job has the dump directory on its command line
    marker = str(tmp_path / "dumps").encode()
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes():
                alive.append(cmdline.parent.name)
        except OSError:
            continue
    assert alive == []


@pytest.mark.slow
def test_the_one_rank_command_is_the_workload_without_the_incident(real_hang):
    command = real_hang.command
    assert command[1] == str(WORKLOAD)
    assert "--incident" not in command and "--dump-dir" not in command
    assert command[command.index("--timeout-s") + 1] == "5"
    assert (command[command.index("--pp") + 1], command[command.index("--tp") + 1]) == \
        ("2", "2")


def test_dumped_ranks_skips_a_write_cut_short(tmp_path):
    for name in (f"{DUMP_PREFIX}3", f"{DUMP_PREFIX}10", f"{DUMP_PREFIX}4.partial", "other"):
        (tmp_path / name).write_bytes(b"")
    assert dumped_ranks(tmp_path) == (3, 10)
