"""prism-debug calibrate, with real gloo processes on this host."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prism_debug.cost import CostModel, Placement, load_profile
from prism_debug.errors import LaunchError
from prism_debug.workflows.local_bench import measure

# rank 0 fails at once; the others would wait for it forever
FAILING_WORKER = (sys.executable, "-c", "import os, sys, time\n"
                  "if os.environ['RANK'] == '0': sys.exit('RuntimeError: no route to host')\n"
                  "time.sleep(60)")


OPS = ("all_reduce", "send", "all_gather", "reduce_scatter", "broadcast")
DATA = Path(__file__).resolve().parents[1] / "cost" / "data"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_local_calibration_fits_every_measured_size(tmp_path):
    load = os.getloadavg()[0] / os.cpu_count()
    if load > 4:
        # gloo's loopback times then follow the scheduler (an 8-byte ping-pong
        # took 0.9-1.2 ms on this 2-core host at load 8, 36 us on a quiet
        # 16-core one), not anything a latency and a bandwidth can fit
        pytest.skip(f"this host runs {load:.0f}x its cores' worth of work")
    out = tmp_path / "local.toml"
    started = time.monotonic()
    proc = cli("calibrate", "--local", "--out", str(out))
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(proc.stdout, f"calibrate --local took {elapsed:.1f} s")
    profile = load_profile(str(out))
    assert (profile.name, profile.gpus_per_node) == ("local", 2)
    assert {fit.op for fit in profile.op_fits} == set(OPS)
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1]
            and line.split()[0] in OPS]
    assert len(rows) == 5 * 8  # every op at every size, 8 B to 16 MiB
    model = CostModel(profile)
    for op, ranks, _, nbytes, _, model_us, _, _ in rows:
        assert model.time_s(op, int(nbytes), Placement(int(ranks), 1, int(ranks))) * 1e6 == (
            pytest.approx(float(model_us), abs=0.051))
    # The fit's median error over the 40 sizes it was fitted to stays within
    # 20 % (3-11 % in four runs alone here): a model of the wrong form (a
    # latency or bandwidth off by a factor) fails this however the machine
    # behaves.  Each size within 10 % is the
    # goal on a quiet host (40 of 40 in each of 3 runs, worst 7.8 %), but on
    # this shared 2-core machine single sizes missed by 25-45 % even with the
    # suite alone (loopback gloo follows the scheduler): that per-size figure
    # is a benchmark's, printed here, not asserted.
    errors = sorted(abs(float(row[6].rstrip("%"))) for row in rows)
    median = (errors[19] + errors[20]) / 2
    within = sum(error <= 10.0 for error in errors)
    print(f"fit error: median {median:.1f} %, {within} of 40 sizes within 10 %")
    assert median <= 20.0, "\n".join(" ".join(row) for row in rows)
    assert model.estimate("all_reduce", 8, Placement(2, 1, 2)).algorithm == "ring"
    # an op whose printed error passes 50 % at some size is warned of, once, on
    # stderr; the others are not; and every fit's quality is in the profile
    missed = {row[0] for row in rows if abs(float(row[6].rstrip("%"))) > 50.0}
    warned = [line.split()[3] for line in proc.stderr.splitlines()
              if line.startswith("calibrate: warning: the ")]
    assert sorted(warned) == sorted(missed), proc.stderr
    assert out.read_text().count("median_error_pct = ") == 5
    cost = cli("cost", "--hardware", str(out), "--op", "all_gather", "--bytes", "1M",
               "--ranks", "2")
    assert cost.returncode == 0 and "on local:" in cost.stdout, cost.stdout + cost.stderr


def test_calibrated_on_a_clusters_smallest_runs_it_prices_its_larger_ones(tmp_path):
    # AWS p4dn (8x A100, EFA), published nccl-tests runs (tests/cost/data):
    # fitted on 1 and 2 nodes, asked about 3 and 4 nodes at 1 GiB
    out = tmp_path / "p4dn.toml"
    proc = cli("calibrate", "--no-nvls", "--out", str(out),
               "--nccl-tests", str(DATA / "aws_p4dn_1node_all_reduce_perf.txt"),
               "--nccl-tests", str(DATA / "aws_p4dn_2node_all_reduce_perf.txt"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for ranks, published_us in ((24, 64782.0), (32, 70253.0)):
        cost = cli("cost", "--hardware", str(out), "--op", "all_reduce", "--bytes", "1G",
                   "--ranks", str(ranks), "--json")
        predicted_us = json.loads(cost.stdout)["time_us"]
        assert abs(predicted_us - published_us) / published_us < 0.10


def test_calibrate_needs_exactly_one_source(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "prism_debug.cli", "calibrate", "--out",
                           str(tmp_path / "x.toml")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == ("prism-debug: error: give --nccl-tests FILE (repeatable) or --local, "
                           "one of the two\n")


def test_a_failing_process_ends_the_measurement_with_its_last_error_line():
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        measure(3, worker_command=FAILING_WORKER)
    assert str(info.value) == ("local gloo measurement failed: process 0 exited with code 1: "
                               "RuntimeError: no route to host")
    assert time.monotonic() - started < 10


def test_a_measurement_that_hangs_is_ended_at_its_timeout():
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        measure(2, worker_command=(sys.executable, "-c", "import time; time.sleep(60)"),
                timeout_s=1)
    assert str(info.value) == ("local gloo measurement did not finish in 1 s; check that "
                               "processes here can connect to each other on 127.0.0.1")
    assert time.monotonic() - started < 10
