"""The graph cache's files are read back as untrusted: a damaged or planted
``.unprofilable`` file gives one bounded GraphError line, never a traceback;
runs of one job started together profile it once."""

import threading
import time

import pytest

from prism_debug.errors import GraphError
from prism_debug.workflows import graph_cache
from prism_debug.workflows.graph_cache import CACHE_ENV, cache_key, cached_graph


def test_a_damaged_unprofilable_file_is_one_bounded_line(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    command = ["python", "never_written.py"]
    refused = tmp_path / f"{cache_key(command, 8, 8)}.unprofilable"
    refused.write_bytes(b"\xff\xfe not UTF-8\n" + b"x" * (10 << 20))  # 10 MiB, not text
    with pytest.raises(GraphError) as caught:
        cached_graph(command, 8, 8, run_dir=tmp_path / "run", message=lambda line: None)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 2200
    assert message.startswith("\ufffd\ufffd not UTF-8 xxx")
    assert message.endswith(f"… (profiled before; remove {refused} to profile again)")


def test_the_reason_a_job_was_refused_is_read_back_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    command = ["python", "never_written.py"]
    refused = tmp_path / f"{cache_key(command, 8, 8)}.unprofilable"
    refused.write_text("a graph cannot describe this job: it branches on rank\n")
    with pytest.raises(GraphError) as caught:
        cached_graph(command, 8, 8, run_dir=tmp_path / "run", message=lambda line: None)
    assert str(caught.value) == ("a graph cannot describe this job: it branches on rank "
                                 f"(profiled before; remove {refused} to profile again)")


def test_runs_of_one_job_started_together_profile_it_once(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    profiled = []
    started = threading.Barrier(2)

    def slow_profile(options, message):  # as profiling writes its graph, seconds later
        profiled.append(options.out)
        time.sleep(0.3)
        options.out.write_text("graph")

    monkeypatch.setattr(graph_cache, "profile", slow_profile)
    command = ["python", "train.py"]
    lines: list[list[str]] = [[], []]
    paths: list[object] = [None, None]

    def run(i):
        started.wait()
        paths[i] = cached_graph(command, 8, 8, run_dir=tmp_path / f"run{i}",
                                message=lines[i].append)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = tmp_path / f"{cache_key(command, 8, 8)}.prism"
    assert len(profiled) == 1 and paths == [expected, expected]
    assert expected.read_text() == "graph"
    waited = next(i for i in (0, 1) if not any("profiling" in line for line in lines[i]))
    assert lines[waited] == [f"graph: {expected} (cached: profiled before for this command, "
                             "script and layout)"]
