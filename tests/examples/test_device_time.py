"""The device-time workload runs for real under torchrun and as one rank under
prism-debug, and each rank's figures land in its own file (never in a shared
stdout, where two ranks' lines can interleave)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "device_time.py"
# 4 ranks: pp=2 x dp=2; short sleeps, so the run is all start-up
SMALL = ["--pp", "2", "--iterations", "2", "--micro-batches", "2", "--forward-ms", "2",
         "--backward-ms", "4", "--optimizer-ms", "1", "--activation-kib", "16",
         "--grad-kib", "64"]
pytestmark = pytest.mark.slow


def env(**extra):
    # the rank under prism-debug imports this checkout's prism_debug
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)


def test_each_real_rank_writes_its_own_figures_and_the_straggler_only_its_own(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "--log-dir", str(tmp_path / "logs"), "--redirects", "3", str(WORKLOAD), *SMALL,
         "--timing-dir", str(tmp_path / "timing")],
        capture_output=True, text=True, env=env(DEVICE_TIME_SLOW_RANK="1"), timeout=120,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = {rank: json.loads((tmp_path / "timing" / f"rank{rank}.json").read_text())
               for rank in range(4)}
    assert [f["rank"] for f in figures.values()] == [0, 1, 2, 3]
    assert [f["compute_factor"] for f in figures.values()] == [1.0, 2.0, 1.0, 1.0]
    for f in figures.values():
        assert len(f["iteration_s"]) == 2
        # a steady iteration is at least the last stage's compute: 2 micro-batches
        # of (2 + 4) ms x 1.5, plus the optimizer's 1 ms
        assert f["iteration_s"][1] > 0.019
        assert f["peak_rss_bytes"] > 50 * 2**20
    assert sorted(p.name for p in (tmp_path / "timing").iterdir()) == [
        f"rank{r}.json" for r in range(4)]  # no half-written files left


def test_one_rank_under_prism_debug_reports_the_workload_iterations(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--world-size", "4",
         "--gpus-per-node", "4", "--rank", "3", "--hardware", "zero", "--no-bus",
         "--report", str(tmp_path / "report.json"), "--run-dir", str(tmp_path / "run"),
         "--", sys.executable, str(WORKLOAD), *SMALL, "--timing-dir", str(tmp_path / "timing")],
        capture_output=True, text=True, env=env(), timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    own = json.loads((tmp_path / "timing" / "rank3.json").read_text())
    assert own["rank"] == 3 and own["compute_factor"] == 1.0
    # the iterations prism-debug counts (optimizer steps) are the workload's
    assert len(report["iterations"]) == len(own["iteration_s"]) == 2
    # rank 3 is the last stage: 2 x (2 + 4) ms x 1.5 + 1 ms of sleeps per step at least
    assert report["iterations"][1]["time_s"] > 0.019


# --- jittered device time ------------------------------------------------------------


def _workload_module():
    """examples/device_time.py as a module (an ordinary script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_time", WORKLOAD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the stated parametrisation (the CONTRACT's Distribution.with_cv), written out
# here with scipy rather than taken from the script: mean 1, coefficient of
# variation cv
def _stated(family, cv):
    import numpy as np
    from scipy import stats

    if family == "normal":
        return stats.norm(loc=1.0, scale=cv)
    if family == "gamma":
        return stats.gamma(a=1 / cv**2, scale=cv**2)
    s = np.sqrt(np.log(1 + cv**2))
    return stats.lognorm(s, scale=np.exp(-s**2 / 2))


@pytest.mark.parametrize("family", ["normal", "gamma", "lognormal"])
@pytest.mark.parametrize("cv", [0.05, 0.3])
def test_jitter_factors_have_the_stated_distribution(family, cv):
    import numpy as np
    from scipy import stats

    dt = _workload_module()
    n = 20_000
    jitter = dt.Jitter(family, cv, 0.0, seed=7, rank=3)
    draws = np.array([jitter.factor() for _ in range(n)])
    stated = _stated(family, cv)
    assert stated.mean() == pytest.approx(1.0) and stated.std() == pytest.approx(cv)
    # normal clipped at 0 moves nothing at these cvs (P(x < 0) < 1e-8)
    assert (draws >= 0).all()
    # the sample mean's standard error is cv / sqrt(n); the sample std's about
    # cv * sqrt((kurtosis - 1) / 4n) (kurtosis from the stated distribution):
    # 5 standard errors either side
    kurtosis = float(stated.stats(moments="k")) + 3
    assert abs(draws.mean() - 1) < 5 * cv / np.sqrt(n)
    assert abs(draws.std(ddof=1) - cv) < 5 * cv * np.sqrt((kurtosis - 1) / (4 * n))
    # and the shape, not only two moments: Kolmogorov-Smirnov against the
    # stated distribution, and it tells the three families apart at cv 0.3
    assert stats.kstest(draws, stated.cdf).pvalue > 1e-3
    if cv == 0.3:
        for other in {"normal", "gamma", "lognormal"} - {family}:
            assert stats.kstest(draws, _stated(other, cv).cdf).pvalue < 1e-3, other


def test_a_seeded_rank_draws_the_same_factors_and_two_ranks_differ():
    dt = _workload_module()

    def draws(seed, rank):
        jitter = dt.Jitter("gamma", 0.1, 0.05, seed, rank)
        return [jitter.rank_factor] + [jitter.factor() for _ in range(50)]

    assert draws(1, 5) == draws(1, 5)
    assert draws(1, 5) != draws(1, 6)
    assert draws(1, 5) != draws(2, 5)
    # (seed, rank) is a pair, not a sum: seed 1 at rank 5 is not seed 2 at rank 4
    assert draws(1, 5) != draws(2, 4)
    assert len(set(draws(1, 5)[1:])) == 50  # fresh draws, none repeated


def test_the_persistent_rank_factor_scales_every_draw_of_the_rank():
    dt = _workload_module()
    # rank-cv alone: every stretch of compute is the rank's factor, drawn once
    only_rank = dt.Jitter("lognormal", 0.0, 0.2, seed=3, rank=9)
    assert only_rank.rank_factor != 1.0
    assert {only_rank.factor() for _ in range(20)} == {only_rank.rank_factor}
    # over many ranks the persistent factors have the stated mean and cv
    import numpy as np

    n = 4000
    factors = np.array([dt.Jitter("lognormal", 0.0, 0.2, 3, r).rank_factor for r in range(n)])
    assert abs(factors.mean() - 1) < 5 * 0.2 / np.sqrt(n)
    assert abs(factors.std(ddof=1) - 0.2) < 0.02


def test_a_stretch_keeps_its_factor_until_a_communication_op_ends_it():
    # one gap of the execution graph is one draw: with one stage, a rank's four
    # micro-batches run back to back (nothing exchanged), and the graph has
    # them in one gap, so they sleep one factor, not four
    dt = _workload_module()
    jitter = dt.Jitter("gamma", 0.2, 0.0, seed=1, rank=0)
    first = [jitter.stretch_factor() for _ in range(4)]
    jitter.communicated()
    second = jitter.stretch_factor()
    assert len(set(first)) == 1 and second != first[0]
    twin = dt.Jitter("gamma", 0.2, 0.0, seed=1, rank=0)
    assert [twin.factor(), twin.factor()] == [first[0], second]  # fresh draws, in order


def test_no_jitter_by_default_draws_nothing():
    dt = _workload_module()
    args = dt.parse_args([])
    assert (args.jitter_cv, args.rank_cv, args.jitter_seed) == (0.0, 0.0, 0)
    jitter = dt.Jitter(args.jitter_dist, args.jitter_cv, args.rank_cv, args.jitter_seed, 4)
    state = jitter.rng.bit_generator.state
    assert [jitter.factor() for _ in range(5)] == [1.0] * 5 and jitter.rank_factor == 1.0
    assert jitter.rng.bit_generator.state == state  # the sleeps are exactly the configured ones


def test_a_jittered_real_job_sleeps_its_ranks_drawn_factors(tmp_path):
    """A 4-rank job with a large per-rank factor: each rank reports the factor
    its seeded generator draws, and the slowest rank sets everyone's pace."""
    dt = _workload_module()
    seed, rank_cv = 11, 0.5
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "--log-dir", str(tmp_path / "logs"), "--redirects", "3", str(WORKLOAD), *SMALL,
         "--iterations", "3", "--rank-cv", str(rank_cv), "--jitter-dist", "gamma",
         "--jitter-seed", str(seed), "--timing-dir", str(tmp_path / "timing")],
        capture_output=True, text=True, env=env(), timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = [json.loads((tmp_path / "timing" / f"rank{r}.json").read_text()) for r in range(4)]
    factors = [f["rank_factor"] for f in figures]
    assert factors == [dt.Jitter("gamma", 0.0, rank_cv, seed, r).rank_factor for r in range(4)]
    assert len(set(factors)) == 4
    # the job's pace is its slowest rank's sleeps: stage 0 (ranks 0, 1)
    # 2 x (2 + 4) ms, stage 1 (ranks 2, 3) x1.5, plus 1 ms of optimizer, each
    # times the rank's factor (within an iteration the pipeline's slack can
    # hide a little of it: 10 %)
    own = [(12 * (1.5 if r >= 2 else 1) + 1) / 1e3 * factors[r] for r in range(4)]
    for f in figures:
        steady = f["iteration_s"][1:]
        assert sum(steady) / len(steady) > 0.9 * max(own)


@pytest.mark.parametrize("family", ["normal", "gamma", "lognormal"])
def test_the_jitter_states_what_predicts_variability_states(family):
    """The job's factors and prism-debug's --variability "cv=C dist=F" are one
    distribution: the same scipy parameters, and the job's draws pass a
    Kolmogorov-Smirnov test against prism-debug's distribution."""
    import numpy as np
    from scipy import stats

    from prism_debug.variability import Distribution

    dt = _workload_module()
    cv = 0.2
    theirs, ours = Distribution.with_cv(family, cv), _stated(family, cv)
    q = np.linspace(0.001, 0.999, 99)
    assert np.allclose(theirs.ppf(q), ours.ppf(q), rtol=1e-9)
    jitter = dt.Jitter(family, cv, 0.0, seed=5, rank=0)
    draws = np.array([jitter.factor() for _ in range(5000)])
    cdf = getattr(stats, {"normal": "norm", "gamma": "gamma", "lognormal": "lognorm"}[family])
    assert stats.kstest(draws, cdf(*theirs.params).cdf).pvalue > 1e-3
