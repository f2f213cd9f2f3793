"""The rank's flight record, dumped for its group at a timeout and read back
by torch's own analyzer."""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import pytest
import torch

from prism_debug.backend.fr_recorder import FlightLog
from prism_debug.faults import parse_fault, resolve
from tests.backend.test_fr_dump_format import fr_trace

GROUP = [5, 13, 21, 29]


class Clock:
    def now(self):
        return 10.0


def pg():
    return SimpleNamespace(pg_id=2, getGroupName=lambda: "2", getGroupDesc=lambda: "dp",
                           global_ranks=GROUP, timeout_s=2.0, rank=lambda: 0)


@pytest.fixture
def stuck_at_third(tmp_path):
    """Rank 5 all-reduced twice (done) and waits in its third all-reduce."""
    log = FlightLog(5, 100, f"{tmp_path}/trace_rank_", Clock())
    group = pg()
    for seq, done in ((1, 1.0), (2, 2.0), (3, math.inf)):
        log.note(group, "all_reduce", [torch.zeros(16)], None, None, done, iteration=seq)
    return log


def dump(log, *texts):
    faults = [resolve(parse_fault(t), 64, 8) for t in texts]
    return log.dump(2, 3, faults)


def test_from_env_needs_a_buffer_size():
    assert FlightLog.from_env(5, Clock(), {}) is None
    assert FlightLog.from_env(5, Clock(), {"TORCH_FR_BUFFER_SIZE": "0"}) is None
    log = FlightLog.from_env(5, Clock(), {"TORCH_NCCL_TRACE_BUFFER_SIZE": "8",
                                          "TORCH_FR_DUMP_TEMP_FILE": "/x/fr_"})
    assert log.prefix == "/x/fr_" and log._ring.maxlen == 8


def test_the_dump_holds_the_group_with_the_stuck_op_scheduled(stuck_at_third, tmp_path):
    path, absent = dump(stuck_at_third)
    assert path == tmp_path / "trace_rank_5" and absent == []
    entries = pickle.loads(path.read_bytes())["entries"]
    assert [(e["collective_seq_id"], e["state"]) for e in entries] == \
        [(1, "completed"), (2, "completed"), (3, "scheduled")]
    assert entries[0]["input_sizes"] == [[16]] and entries[0]["input_dtypes"] == ["Float"]
    assert sorted(p.name for p in (tmp_path / "peers").iterdir()) == \
        ["trace_rank_13", "trace_rank_21", "trace_rank_29"]
    rc, out = fr_trace(tmp_path)
    assert rc == 0 and "Culprit" not in out and "missing ranks" not in out


def test_a_hung_peer_is_named_missing(stuck_at_third, tmp_path):
    dump(stuck_at_third, "hang 21 at 3")
    rc, out = fr_trace(tmp_path)
    assert "missing ranks: {21}" in out.splitlines()


def test_a_failed_peer_leaves_no_dump(stuck_at_third, tmp_path):
    _, absent = dump(stuck_at_third, "fail 13 at 3")
    assert absent == [13] and not (tmp_path / "peers" / "trace_rank_13").exists()
    rc, out = fr_trace(tmp_path, "--allow-incomplete-ranks")
    assert "because we missed FR dumps from ranks ({13})" in out


@pytest.mark.parametrize("kind, error", [
    ("size", "Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: '[[16]]' does not "
             "match found input sizes: '[[32]]'"),
    ("dtype", "Error type: COLLECTIVE_DTYPE_MISMATCH"),
    ("op", "Error type: COLLECTIVE_TYPE_MISMATCH"),
])
def test_a_desynchronised_peer_is_blamed_for_its_mismatch(stuck_at_third, tmp_path, kind, error):
    dump(stuck_at_third, f"desync 29 {kind} at 3")
    rc, out = fr_trace(tmp_path)
    assert "Collective sequence number: 3 has errors" in out
    assert f"Culprit rank 29; {error}" in out


def test_an_unknown_group_or_op_dumps_nothing(stuck_at_third):
    assert stuck_at_third.dump(7, 3, []) is None
    assert stuck_at_third.dump(2, 9, []) is None
