"""A CUDA call on a machine without a GPU (issue 15, point 4): one line naming
the script's line and the call, exit code 3, and no snapshot hint after a
run that failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.agent.no_gpu import no_gpu_event
from prism_debug.process.report import no_gpu_line

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
ADVICE = ("run the rank on a machine with a GPU, or keep it on the CPU when "
          "torch.cuda.is_available() is False (prism-debug emulates the other ranks, not a GPU)")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def prism(tmp_path: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size", "16",
         "--rank", "11", "--gpus-per-node", "8", "--no-bus", "--run-dir", str(tmp_path / "run"),
         "--", *command],
        cwd=SCRIPTS, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)


def test_the_event_names_the_callers_line_and_the_public_call():
    try:
        torch.cuda.set_device(3)
    except AttributeError as exc:
        event = no_gpu_event(exc)
    line = test_the_event_names_the_callers_line_and_the_public_call.__code__.co_firstlineno + 2
    assert event == {
        "kind": "no_gpu", "file": __file__, "line": line,
        "source": "torch.cuda.set_device(3)", "call": "torch.cuda.set_device",
        "reason": f"torch {torch.__version__} is built without CUDA",
        "error": "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"}
    assert no_gpu_event(AttributeError("module 'os' has no attribute 'x'")) is None
    assert no_gpu_event(RuntimeError("CUDA out of memory")) is None


@pytest.mark.slow
def test_set_device_on_a_cpu_only_rank_is_one_line(tmp_path):
    proc = prism(tmp_path, sys.executable, "cuda_on_cpu.py", "--call", "set_device")
    assert proc.returncode == 3
    assert proc.stderr == (
        "prism-debug: error: cuda_on_cpu.py:16 calls torch.cuda.set_device, which needs a GPU, "
        f"and this machine has none (torch {torch.__version__} is built without CUDA): "
        f"{ADVICE}\n")
    # torch's own words stay in the rank's output; the hint to snapshot does not follow
    assert "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'" in proc.stdout
    assert "summary: no iteration completed" in proc.stdout
    assert "hint:" not in proc.stdout


@pytest.mark.slow
def test_a_tensor_on_cuda_names_the_line_that_made_it(tmp_path):
    proc = prism(tmp_path, sys.executable, "cuda_on_cpu.py", "--call", "tensor")
    assert proc.returncode == 3
    assert proc.stderr == (
        "prism-debug: error: cuda_on_cpu.py:18 (`x = torch.ones(4, device=\"cuda\")`) needs a "
        f"GPU, and this machine has none (torch {torch.__version__} is built without CUDA): "
        f"{ADVICE}\n")


@pytest.mark.slow
def test_no_snapshot_hint_after_a_run_that_failed(tmp_path):
    proc = prism(tmp_path, sys.executable, "crash.py")
    assert proc.returncode == 7
    assert "summary: 1 iterations · " in proc.stdout
    assert proc.stdout.splitlines()[-1].endswith(" · exit 7")  # the summary ends the output


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["file", "line", "source", "call", "reason", "kind"]),
                       st.one_of(st.text(), st.integers(), st.none(), st.booleans()), max_size=6))
def test_a_rank_written_event_gives_one_bounded_line_or_none(event):
    found = no_gpu_line(event, Path("/work"))
    assert found is None or ("\n" not in found[0] and len(found[0]) < 1200)
    well_formed = (isinstance(event.get("file"), str) and type(event.get("line")) is int
                   and isinstance(event.get("source"), str)
                   and isinstance(event.get("reason"), str)
                   and (event.get("call") is None or isinstance(event.get("call"), str)))
    assert (found is not None) == well_formed
