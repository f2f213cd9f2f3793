from prism_debug.agent.program import ProgramRecorder, events_from_json
from prism_debug.graph.build import RecordedEnd, RecordedIssue, RecordedWait


def test_a_wait_in_a_later_iteration_is_not_recorded_in_it():
    recorder = ProgramRecorder(start=0.0)
    first = recorder.issue(1.0, "all_reduce", "dp", 64, "float32")
    second = recorder.issue(1.5, "all_reduce", "dp", 64, "float32")
    recorder.wait(2.0, first)
    assert events_from_json(recorder.end(3.0)) == (
        RecordedIssue(1.0, "all_reduce", "dp", 64, "float32"),
        RecordedIssue(0.5, "all_reduce", "dp", 64, "float32"),
        RecordedWait(0.5, 0), RecordedEnd(1.0))
    recorder.wait(3.5, second)  # DDP-style: awaited after the optimizer step
    later = recorder.issue(4.0, "all_reduce", "dp", 64, "float32")
    recorder.wait(4.5, later)
    assert events_from_json(recorder.end(5.0)) == (
        RecordedIssue(1.0, "all_reduce", "dp", 64, "float32"),
        RecordedWait(0.5, 0), RecordedEnd(0.5))
