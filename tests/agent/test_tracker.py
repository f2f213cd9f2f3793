import hashlib

from prism_debug.agent.tracker import IterationTracker
from prism_debug.graph import GroupRef


class _Done:
    def __init__(self, done):
        self.done = done


def test_boundary_closes_one_record_and_starts_the_next():
    emitted = []
    tracker = IterationTracker(start=1.0, sink=emitted.append, record_ops=True)
    tracker.hasher.update(b"abc")
    tracker.collective("all_reduce", GroupRef("dp", 3), 64, arrival=1.5, work=_Done(1.75))
    tracker.waited(1.5, 0.25)
    record = tracker.boundary(3.0, {"peak_rss_bytes": 7})
    assert record == emitted[0]
    assert record["iteration"] == 1
    assert record["time_s"] == 2.0
    assert record["comm_wait_s"] == 0.25
    assert record["compute_s"] == 1.75
    assert record["num_collectives"] == 1
    assert record["digest"] == hashlib.sha256(b"abc").hexdigest()[:32]
    assert record["ops"] == [("all_reduce", "dp", 3, 64, 1.5, 1.75)]
    assert record["waits"] == [(1.5, 1.75)]
    assert record["peak_rss_bytes"] == 7
    assert (tracker.iteration, tracker.start, tracker.num_collectives) == (2, 3.0, 0)


def test_ops_are_not_kept_unless_asked():
    tracker = IterationTracker(start=0.0, sink=lambda r: None, record_ops=False)
    tracker.collective("send", GroupRef("pp", 0), 8, 0.0, _Done(1.0))
    assert "ops" not in tracker.boundary(1.0, {})
