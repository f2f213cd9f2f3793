"""Reading a dump folder as the untrusted input it is: every bad file costs
that file alone, named with why; a folder that makes no incident is one
error that says what to give."""

import os
import pickle

import pytest

from prism_debug.errors import IncidentError
from prism_debug.incident.dumps import read_dumps
from tests.incident.shapes import PREFIX, dump, entry, world_job, write


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/prism-incident-pwned",))


def test_a_gloo_dump_reads_as_torch_wrote_it(tmp_path):
    world_job(tmp_path, 4, {0: 5, 1: 5, 2: 4, 3: 5})
    dumps = read_dumps(tmp_path)
    assert (dumps.prefix, dumps.ranks, dumps.damaged) == (PREFIX, [0, 1, 2, 3], {})
    last = dumps.dumps[2].entries[-1]
    assert (last.group, last.group_desc, last.collective_seq, last.op, last.backend,
            last.input_sizes, last.input_dtypes, last.state, last.timeout_ms) == \
        ("0", "default_pg", 4, "all_reduce", "gloo", ((1024,),), ("Float",), "scheduled", 5000)
    assert last.call() == "all_reduce of 1024 Float"
    assert last.frames == ("all_reduce (train.py:7)",)
    # gloo's default group, keyed "" and named "": its ranks are the default group's
    assert dumps.dumps[0].group_ranks == {"0": (0, 1, 2, 3)}


def test_damaged_and_foreign_files_are_named_and_skipped(tmp_path):
    world_job(tmp_path, 4, {0: 3, 1: 3})
    write(tmp_path, 2, pickle.dumps(dump([entry("0", "default_pg", 1)]), protocol=2)[:40])
    write(tmp_path, 3, pickle.dumps(Evil(), protocol=2))
    write(tmp_path, 4, dump([{**entry("0", "default_pg", 1), "collective_seq_id": "one"}]))
    dumps = read_dumps(tmp_path)
    assert dumps.ranks == [0, 1]
    assert not os.path.exists("/tmp/prism-incident-pwned")
    assert dumps.damaged[f"{PREFIX}3"] == (
        "holds a reference to posix.system, which no flight-recorder dump has (it is not one, "
        "or was tampered with)")
    assert dumps.damaged[f"{PREFIX}2"].startswith("not a pickle (UnpicklingError")
    assert dumps.damaged[f"{PREFIX}2"].endswith("damaged or cut short")
    assert dumps.damaged[f"{PREFIX}4"] == (
        "entries[0].collective_seq_id must be an integer, got 'one'")


def test_a_folder_that_makes_no_incident_is_one_error(tmp_path):
    with pytest.raises(IncidentError, match=r"no such directory: give the folder the job's "):
        read_dumps(tmp_path / "gone")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(IncidentError, match=r"no file name ends in a rank number"):
        read_dumps(tmp_path)
    write(tmp_path, 0, b"junk", prefix="a_")
    write(tmp_path, 1, b"junk", prefix="b_")
    with pytest.raises(IncidentError, match=r"several prefixes \('a_' \(1\), 'b_' \(1\)\): "
                                            r"give --prefix"):
        read_dumps(tmp_path)
    with pytest.raises(IncidentError, match=r"none of the 1 dump files reads \(a_0: not a "):
        read_dumps(tmp_path, "a_")
    with pytest.raises(IncidentError, match=r"no file is named 'c_' followed by a rank"):
        read_dumps(tmp_path, "c_")


def test_subfolders_are_read_as_torch_walks_them_links_are_not(tmp_path):
    world_job(tmp_path, 4, {0: 2})
    world_job(tmp_path / "peers", 4, {1: 2, 2: 2})
    outside = world_job(tmp_path.parent / "elsewhere", 4, {3: 2})
    (tmp_path / "linked").symlink_to(outside)
    assert read_dumps(tmp_path).ranks == [0, 1, 2]
    world_job(tmp_path / "again", 4, {2: 2})
    with pytest.raises(IncidentError, match=r"two dumps of rank 2 .*: give the folder of one "
                                            r"incident"):
        read_dumps(tmp_path)


def test_the_quick_reading_is_the_checked_one_or_defers_to_it():
    from prism_debug.checked import Untrusted
    from prism_debug.incident.dumps import _entry, _FastEntries

    base = entry("3", "tp", 7, 4096, dtype="BFloat16")
    rows = [base, dict(base, profiling_name="nccl:send 0->1", is_p2p=True, p2p_seq_id=2),
            dict(base, profiling_name="nccl:recv 1<-0", is_p2p=True),
            {k: v for k, v in base.items() if k != "frames"},
            dict(base, input_sizes=[[2, 3], []], output_dtypes=[]),
            dict(base, state="completed", time_discovered_started_ns=5,
                 time_discovered_completed_ns=9)]
    deferred = [dict(base, duration_ms=1.5), dict(base, is_p2p=1),
                dict(base, input_sizes=[[-1]]), dict(base, process_group=("3",))]
    fast, checked = _FastEntries(), Untrusted(IncidentError, "dump")
    for row in rows + rows:  # the second time from what the first shared
        assert fast.entry(row) == _entry(checked, row, ("entries", 0))
    assert [fast.entry(row) for row in deferred] == [None] * 4
    assert fast.entry(rows[1]).p2p_ends == (0, 1) and fast.entry(rows[2]).p2p_ends == (0, 1)
