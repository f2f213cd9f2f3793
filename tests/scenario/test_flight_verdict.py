"""``flight_record`` verdicts come from what torch's fr_trace printed, and only that.

Every case writes the dumps the harness writes at a timeout (the real rank's
FlightLog, its virtual peers beside it), runs the real analyzer on them as a
scenario run does (``python -m torch.distributed.flight_recorder.fr_trace``),
and judges the scenario's expectation.  When fr_trace crashes, prints nothing,
runs out of time or names other ranks than expected, the verdict fails, and
says what the analyzer printed.
"""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import torch

from prism_debug.backend.fr_dump_format import write_group_dumps
from prism_debug.backend.fr_recorder import FlightLog
from prism_debug.faults import parse_fault, resolve
from prism_debug.scenario import parse_scenario
from prism_debug.scenario.plan import Observed, evaluate
from prism_debug.workflows import scenario_run

GROUP = [5, 13, 21, 29]  # the real rank 5's data-parallel group in a world of 64
PREFIX = "trace_rank_"


class Clock:
    def now(self):
        return 10.0


def dump(tmp_path, *faults: str) -> dict:
    """Rank 5 all-reduced twice and waits in its third all-reduce: the dumps
    the harness writes with ``faults`` in force, and the event it emits."""
    log = FlightLog(5, 100, f"{tmp_path}/{PREFIX}", Clock())
    group = SimpleNamespace(pg_id=2, getGroupName=lambda: "2", getGroupDesc=lambda: "dp",
                            global_ranks=GROUP, timeout_s=2.0, rank=lambda: 0)
    for seq, done in ((1, 1.0), (2, 2.0), (3, math.inf)):
        log.note(group, "all_reduce", [torch.zeros(16)], None, None, done, iteration=seq)
    path, absent = log.dump(2, 3, [resolve(parse_fault(f), 64, 8) for f in faults])
    return {"dir": str(path.parent), "prefix": PREFIX, "absent": absent}


def verdict(dumped: dict, expectation: str):
    scenario = parse_scenario("name: t\nworld: {size: 64, rank: 5}\n"
                              "run: {example: {iterations: 4}, graph: g.prism}\n"
                              f"expect:\n  - flight_record: {expectation}\n", "s.yaml")
    seen = Observed(exit_code=134, exception=None, iteration_times={}, digests={},
                    flight=scenario_run._analyse_flight_record(dumped))
    (judged,) = evaluate(scenario, seen)
    return judged


# -- what must pass ------------------------------------------------------------------------

def test_a_fail_stopped_peer_is_named_by_fr_trace_and_passes(tmp_path):
    judged = verdict(dump(tmp_path, "fail 13 at 3"), "{missing_ranks: [13]}")
    assert judged.passed, judged.detail
    assert judged.detail == "flight record shows missing ranks [13]: got missing [13], " \
                            "mismatches none"


def test_a_hung_peer_and_a_desynchronised_one_pass_on_what_fr_trace_names(tmp_path):
    hung = verdict(dump(tmp_path / "h", "hang 21 at 3"), "{missing_ranks: [21]}")
    assert hung.passed, hung.detail
    desync = verdict(dump(tmp_path / "d", "desync 29 size at 3"), "{mismatch: size}")
    assert desync.passed, desync.detail


# -- what must fail ------------------------------------------------------------------------

def test_fr_trace_crashing_on_a_damaged_dump_fails_with_its_output(tmp_path):
    dumped = dump(tmp_path, "fail 13 at 3")
    damaged = tmp_path / "peers" / f"{PREFIX}21"
    damaged.write_bytes(damaged.read_bytes()[:40])  # a dump cut short (a full disk, a kill)
    judged = verdict(dumped, "{missing_ranks: [13]}")
    assert not judged.passed
    assert judged.detail.startswith("flight record shows missing ranks [13]: torch's analyzer "
                                    "gave no verdict (fr_trace exited with code 1); its output: ")
    assert judged.detail.endswith("_pickle.UnpicklingError: pickle data was truncated")


def test_fr_trace_refusing_mixed_dump_versions_fails_with_its_output(tmp_path):
    dumped = dump(tmp_path, "fail 13 at 3")
    other = tmp_path / "peers" / f"{PREFIX}29"
    content = pickle.loads(other.read_bytes())
    other.write_bytes(pickle.dumps(dict(content, version="2.9"), protocol=2))
    judged = verdict(dumped, "{missing_ranks: [13]}")
    assert not judged.passed
    assert "fr_trace exited with code 1" in judged.detail
    assert "Rank 29 has different version 2.9" in judged.detail


def test_fr_trace_printing_nothing_fails(tmp_path):
    # dumps with no entries (a ring that recorded nothing of the group): the
    # analyzer walks them, finds no collective and prints no finding, only
    # its note that tabulate is missing
    config = {"2": {"name": "2", "desc": "dp", "ranks": "[5, 13, 21, 29]"}}
    write_group_dumps(f"{tmp_path}/{PREFIX}", {5: [], 21: [], 29: []}, pg_config=config,
                      pg_name="2", lead_rank=5)
    judged = verdict({"dir": str(tmp_path), "prefix": PREFIX, "absent": [13]},
                     "{missing_ranks: [13]}")
    assert not judged.passed
    assert judged.detail == ("flight record shows missing ranks [13]: torch's analyzer gave no "
                             "verdict (fr_trace printed no finding); its output: tabulate is "
                             "not installed. Proceeding without it.")


def test_fr_trace_running_out_of_time_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(scenario_run, "_FR_TRACE_TIMEOUT_S", 0.05)  # less than torch's import
    judged = verdict(dump(tmp_path, "fail 13 at 3"), "{missing_ranks: [13]}")
    assert not judged.passed
    assert "fr_trace did not finish in 0.05 s" in judged.detail


def test_fr_trace_naming_other_ranks_fails(tmp_path):
    # two peers fail-stop: fr_trace names both, the scenario expected one
    judged = verdict(dump(tmp_path / "two", "fail 13 at 3", "fail 21 at 3"),
                     "{missing_ranks: [13]}")
    assert not judged.passed
    assert judged.detail.endswith("got missing [13, 21], mismatches none")
    # a hung peer where a fail-stopped one was expected
    judged = verdict(dump(tmp_path / "hung", "hang 29 at 3"), "{missing_ranks: [13]}")
    assert not judged.passed
    assert judged.detail.endswith("got missing [29], mismatches none")


def test_a_mismatch_fr_trace_does_not_report_fails(tmp_path):
    judged = verdict(dump(tmp_path, "desync 29 dtype at 3"), "{mismatch: size}")
    assert not judged.passed
    assert judged.detail.endswith("got missing [], mismatches ['dtype']")
