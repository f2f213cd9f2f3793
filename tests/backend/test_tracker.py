import hashlib

from prism_debug.backend.tracker import IterationTracker
from prism_debug.graph import GroupRef


def test_boundary_closes_one_record_and_starts_the_next():
    emitted = []
    tracker = IterationTracker(start=1.0, sink=emitted.append, record_ops=True)
    tracker.hasher.update(b"abc")
    tracker.collective("all_reduce", GroupRef("dp", 3), 64, arrival=1.5, done=1.75)
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
    # the values up to and including each op, so a golden names the first that differs
    assert record["op_digests"] == [hashlib.sha256(b"abc").hexdigest()[:16]]
    assert record["waits"] == [(1.5, 1.75)]
    assert record["peak_rss_bytes"] == 7
    assert (tracker.iteration, tracker.start, tracker.num_collectives) == (2, 3.0, 0)


def test_ops_are_not_kept_unless_asked():
    tracker = IterationTracker(start=0.0, sink=lambda r: None, record_ops=False)
    assert tracker.collective("send", GroupRef("pp", 0), 8, 0.0, 1.0) is None
    assert "ops" not in tracker.boundary(1.0, {})


def test_the_debugger_keeps_the_last_iteration_without_emitting_it():
    tracker = IterationTracker(start=0.0, sink=lambda r: None, record_ops=False)
    tracker.keep_last_ops = True
    record = tracker.collective("recv", GroupRef("pp", 1), 8, 0.5, lambda: 0.75)
    record.waited_s += 0.25  # what the op's Work adds when the script waits
    assert "ops" not in tracker.boundary(1.0, {})
    iteration, start, (kept,) = tracker.last_ops
    assert (iteration, start, kept.op, kept.resolve(), kept.waited_s) == (1, 0.0, "recv", 0.75,
                                                                          0.25)
