"""Per-op least-squares fits of a profile measured on one node (calibrate --local)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.cost import CostModel, Placement, load_profile
from prism_debug.cost.calibrate import Measurements, fit_op, local_profile, to_toml
from prism_debug.cost.model import bus_factor
from prism_debug.errors import ConfigError

SIZES = tuple(2**k for k in range(3, 25, 3))  # 8 B … 16 MiB, as local_bench measures


def measured(op: str, ranks: int, time_of) -> Measurements:
    return Measurements(op, ranks, 1, tuple((size, time_of(size)) for size in SIZES), "made")


@settings(max_examples=40, deadline=None)
@given(latency=st.floats(1e-6, 1e-3), busbw=st.floats(1e7, 1e11),
       op=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send"]),
       ranks=st.integers(2, 16))
def test_a_latency_and_a_bandwidth_are_recovered(latency, busbw, op, ranks):
    ranks = 2 if op == "send" else ranks
    factor = bus_factor(op, ranks)
    fit = fit_op(measured(op, ranks, lambda size: latency + size * factor / busbw))
    assert fit.latency == pytest.approx(latency, rel=1e-6, abs=1e-12)
    assert fit.busbw == pytest.approx(busbw, rel=1e-6)
    assert fit.knee_bytes == 0


def test_a_bandwidth_that_falls_out_of_cache_is_fitted_with_its_knee():
    # 2 GB/s up to 256 KiB, then 1 GB/s: the knee is found at a measured size
    def time_of(size):
        return 50e-6 + min(size, 262144) / 2e9 + max(size - 262144, 0) / 1e9

    fit = fit_op(measured("broadcast", 2, time_of))
    assert (fit.knee_bytes, fit.latency) == (262144, pytest.approx(50e-6))
    assert (fit.busbw, fit.large_busbw) == (pytest.approx(2e9), pytest.approx(1e9))


def test_noise_does_not_buy_a_knee_where_bandwidth_would_rise():
    # bandwidth rising past a size is not a cache effect: the fit stays affine
    def time_of(size):
        return 50e-6 + min(size, 262144) / 1e9 + max(size - 262144, 0) / 2e9

    assert fit_op(measured("broadcast", 2, time_of)).knee_bytes == 0


def test_the_written_profile_prices_each_measured_op_from_its_fit(tmp_path):
    ops = {"all_reduce": (300e-6, 1.2e9), "send": (100e-6, 2.5e9),
           "all_gather": (280e-6, 0.7e9), "reduce_scatter": (500e-6, 0.45e9),
           "broadcast": (150e-6, 2.4e9)}
    runs = [measured(op, 2, lambda size, op=op, lat_bw=lat_bw: lat_bw[0] + size
                     * bus_factor(op, 2) / lat_bw[1]) for op, lat_bw in ops.items()]
    (tmp_path / "local.toml").write_text(to_toml(local_profile(runs, "local")))
    profile = load_profile(str(tmp_path / "local.toml"))
    assert (profile.name, profile.gpus_per_node, len(profile.op_fits)) == ("local", 2, 5)
    model = CostModel(profile)
    for m in runs:
        for size, seconds in m.samples:
            assert model.time_s(m.op, size, Placement(2, 1, 2)) == pytest.approx(seconds,
                                                                                rel=1e-6)
    assert model.time_s("recv", 4096, Placement(2, 1, 2)) == pytest.approx(
        100e-6 + 4096 / 2.5e9, rel=1e-6)
    # on more ranks the latency grows with the ring's steps: 2(n-1) for all-reduce
    assert model.time_s("all_reduce", 8, Placement(4, 1, 4)) == pytest.approx(
        3 * 300e-6 + 8 * 1.5 / 1.2e9, rel=1e-6)
    # ops not measured fall back to the ring fitted from all-reduce and send/recv
    assert model.estimate("all_to_all", 1 << 20, Placement(2, 1, 2)).time_s > 0


def test_a_local_profile_needs_all_reduce_and_send():
    with pytest.raises(ConfigError, match="missing send"):
        local_profile([measured("all_reduce", 2, lambda size: 1e-4 + size / 1e9)], "local")


def test_a_fast_path_for_the_smallest_messages_is_fitted():
    # gloo all-reduces 8 bytes in ~130 us against ~200 us from 64 bytes up
    # (measured on a quiet 16-core host): a latency of its own below 64 bytes
    def time_of(size):
        return (130e-6 if size <= 8 else 200e-6) + size / 2.5e9

    fit = fit_op(measured("all_reduce", 2, time_of))
    assert (fit.small_bytes, fit.small_latency, fit.latency) == (
        8, pytest.approx(130e-6), pytest.approx(200e-6))
    assert fit.busbw == pytest.approx(2.5e9)


def test_noise_of_a_few_percent_does_not_buy_a_fast_path():
    def time_of(size):
        return (190e-6 if size <= 8 else 200e-6) + size / 2.5e9

    assert fit_op(measured("all_reduce", 2, time_of)).small_bytes == 0


def test_a_profile_with_knees_and_fast_paths_round_trips(tmp_path):
    from prism_debug.cost import HardwareProfile

    def knee_and_fast_path(size):
        return (130e-6 if size <= 8 else 200e-6) + min(size, 262144) / 2e9 + max(
            size - 262144, 0) / 1e9

    runs = [measured("all_reduce", 2, knee_and_fast_path),
            measured("send", 2, lambda size: 40e-6 + size / 4e9)]
    profile = local_profile(runs, "local")
    fit = profile.op_fit("all_reduce")
    assert (fit.knee_bytes, fit.small_bytes) == (262144, 8)
    (tmp_path / "local.toml").write_text(to_toml(profile))
    loaded = load_profile(str(tmp_path / "local.toml"))
    assert HardwareProfile.from_dict(loaded.to_dict()) == loaded
    model = CostModel(loaded)
    for size, seconds in runs[0].samples:
        assert model.time_s("all_reduce", size, Placement(2, 1, 2)) == pytest.approx(seconds,
                                                                                    rel=1e-6)
