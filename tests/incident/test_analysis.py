"""What the dumps say happened, on gloo-shaped dumps of every case a job can
leave (the three real incidents are in test_reproduce.py)."""

import pytest

from prism_debug.graph.selectors import ranks_text
from prism_debug.incident.analysis import analyse
from prism_debug.incident.dumps import read_dumps
from prism_debug.incident.reproduce import victim_of
from prism_debug.scenario.plan import flight_findings, group_findings
from tests.incident.shapes import dump, entry, world_job, write


def incident(tmp_path, world, reached, **kw):
    return analyse(read_dumps(world_job(tmp_path, world, reached, **kw)))


def test_a_rank_that_never_arrived_but_dumped_hangs(tmp_path):
    seen = incident(tmp_path, 4, {0: 5, 1: 5, 2: 4, 3: 5})
    stop = seen.stop
    assert (stop.seq, stop.arrived, stop.missing, stop.no_dump, stop.kind, stop.culprits) == \
        (5, (0, 1, 3), (2,), (), "hang", (2,))
    assert seen.last_completed["0"][0] == 4 and seen.timeout_ms == 5000
    assert victim_of(stop) == 0


def test_a_rank_that_left_no_dump_failed(tmp_path):
    seen = incident(tmp_path, 4, {0: 5, 2: 5, 3: 5})
    assert seen.no_dump == (1,)
    assert (seen.stop.seq, seen.stop.no_dump, seen.stop.kind, seen.stop.culprits) == \
        (5, (1,), "fail", (1,))


@pytest.mark.parametrize("field, value, kind, got", [
    ("numel", 2048, "size", "all_reduce of 2048 Float"),
    ("dtype", "Half", "dtype", "all_reduce of 1024 Half"),
    ("op", "broadcast", "op", "broadcast of 1024 Float"),
])
def test_a_mismatched_call_names_its_kind_against_the_majority(tmp_path, field, value, kind,
                                                               got):
    for rank in range(4):
        last = {"numel": 1024, "dtype": "Float", "op": "all_reduce"}
        if rank == 3:
            last[field] = value
        entries = [entry("0", "default_pg", 1), entry("0", "default_pg", 2, last["numel"],
                                                      dtype=last["dtype"], op=last["op"])]
        write(tmp_path, rank, dump(entries, 4))
    stop = analyse(read_dumps(tmp_path)).stop
    assert [(m.rank, m.kind, m.got, m.expected) for m in stop.mismatched] == \
        [(3, kind, got, "all_reduce of 1024 Float")]
    assert (stop.seq, stop.kind, stop.culprits, stop.arrived) == (2, "mismatch", (3,), (0, 1, 2))


def test_with_a_mismatch_a_rank_without_a_dump_is_no_culprit(tmp_path):
    # gloo aborts the peer that receives the larger buffer: it leaves no dump
    seen = incident(tmp_path, 4, {0: 5, 2: 5, 3: 5}, numel={2: 2048})
    assert (seen.stop.kind, seen.stop.culprits, seen.stop.no_dump) == ("mismatch", (2,), (1,))


def test_the_first_stop_is_where_the_job_went_wrong(tmp_path):
    # rank 3 hangs in dp group 10 = {1, 3} at its collective 2; its tp peer 2
    # then waits for it in tp group 2 = {2, 3} at collective 3, later
    layout = {"tp": {"1": (0, 1), "2": (2, 3)}, "dp": {"9": (0, 2), "10": (1, 3)}}
    reached = {("1", 0): 3, ("1", 1): 3, ("2", 2): 3, ("2", 3): 2,
               ("9", 0): 2, ("9", 2): 2, ("10", 1): 2, ("10", 3): 1}
    for rank in range(4):
        entries = []
        for desc, groups in layout.items():
            for name, members in groups.items():
                if rank in members:
                    start = 10 if desc == "tp" else 0  # tp's last one comes after dp's
                    entries += [entry(name, desc, s, created_ns=(start + s) * 10**6)
                                for s in range(1, reached[(name, rank)] + 1)]
        write(tmp_path, rank, dump(sorted(entries, key=lambda e: e["time_created_ns"])))
    seen = analyse(read_dumps(tmp_path))
    assert [(s.group.name, s.seq, s.culprits) for s in seen.stops] == [("10", 2, (3,)),
                                                                        ("2", 3, (3,))]
    assert {g.name: g.members for g in seen.groups} == {"1": (0, 1), "2": (2, 3), "9": (0, 2),
                                                       "10": (1, 3)}


def test_a_dead_ranks_groups_are_filled_in_by_their_familys_stride(tmp_path):
    # dp groups {0, 2, 4, 6} and {1, 3, 5, 7}; rank 5 died, so only its dp
    # peers' entries name group "b", and none of them names 5
    for rank in (0, 1, 2, 3, 4, 6, 7):
        name = "a" if rank % 2 == 0 else "b"
        last = 3 if name == "a" else 2
        write(tmp_path, rank, dump([entry(name, "dp", s) for s in range(1, last + 1)]))
    seen = analyse(read_dumps(tmp_path))
    groups = {g.name: (g.members, g.inferred) for g in seen.groups}
    assert groups == {"a": ((0, 2, 4, 6), ()), "b": ((1, 3, 5, 7), (5,))}
    assert (seen.stop.group.name, seen.stop.culprits) == ("b", (5,))


def test_fr_traces_verdict_is_read_per_group():
    text = ("Not all ranks joining collective, sequence number: 5\ninternal record id: 4\n"
            "group info: 6:dp\ncollective: gloo:all_reduce\nmissing ranks: {3}\n"
            "Not all ranks joining collective, sequence number: 25\ninternal record id: 24\n"
            "group info: 1:tp\ncollective: gloo:all_reduce\nmissing ranks: {1}\n"
            "We cannot decide what's wrong with this collective entry because we missed FR "
            "dumps from ranks ({3, 7}) so we don't have enough information.\n")
    everything = flight_findings(text)
    assert everything.missing_ranks == {1, 3, 7}
    dp = group_findings(everything, "6", (1, 3, 5, 7))
    assert (dp.missing_ranks, dp.failure) == ({3, 7}, None)
    assert group_findings(everything, "1", (0, 1)).missing_ranks == {1}
    assert group_findings(everything, "9", (0, 2)).missing_ranks == set()


def test_ranks_read_as_ranges():
    assert ranks_text([5, 0, 1, 2, 3, 8, 9]) == "0-3, 5, 8-9"
