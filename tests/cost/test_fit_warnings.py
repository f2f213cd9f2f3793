"""calibrate says when its profile misses what it was fitted to, and records
how well each fit met its measurements in the profile it writes."""



from prism_debug.cost import CostModel, load_profile
from prism_debug.cost.calibrate import (
    FIT_ERROR_WARN,
    Measurements,
    fit_quality,
    fit_warnings,
    local_profile,
    to_toml,
)

SIZES = tuple(2**k for k in range(3, 25, 3))  # 8 B … 16 MiB, as local_bench measures
# calibrate --local on this 2-core host at load 6.4 (2026-11-24), microseconds per size:
# send/recv's loopback is flat to 256 KiB, faster at 2 MiB and 7x slower at 16 MiB
MEASURED_US = {
    "all_reduce": (368.0, 509.9, 430.6, 540.9, 649.6, 1259.8, 1860.7, 17978.5),
    "send": (1312.0, 1243.9, 1336.0, 1286.4, 1543.5, 1188.8, 802.6, 9020.3),
}


def runs(measured_us=MEASURED_US) -> list[Measurements]:
    return [Measurements(op, 2, 1, tuple((b, t * 1e-6) for b, t in zip(SIZES, times, strict=True)),
                         "gloo, 2 processes")
            for op, times in measured_us.items()]


def test_a_fit_that_misses_its_sizes_by_more_than_half_is_named_with_what_to_do():
    measured = runs()
    quality = fit_quality(CostModel(local_profile(measured, "local")), measured)
    assert FIT_ERROR_WARN == 0.5
    assert fit_warnings(quality, local=True, cpus=2, load=6.4) == [
        "calibrate: warning: the send fit misses 2 of its sizes (2 MiB-16 MiB) by more than "
        "50 %, worst -77 % at 16 MiB: gloo over this host's loopback (2 cores, load 6.4) does "
        "not follow a latency and a bandwidth there; run calibrate --local again on an idle "
        "machine, or fit real cluster runs with --nccl-tests"]
    send = next(q for q in quality if q.op == "send")
    assert [b for b, _ in send.missed] == [2 << 20, 16 << 20]
    assert (send.worst_bytes, round(100 * send.worst_error)) == (16 << 20, -77)


def test_a_fit_within_the_threshold_draws_no_warning():
    def affine(latency_us, gbs):
        return tuple(latency_us + b / gbs / 1e3 for b in SIZES)

    measured = runs({"all_reduce": affine(300, 1.2), "send": affine(100, 2.5)})
    quality = fit_quality(CostModel(local_profile(measured, "local")), measured)
    assert fit_warnings(quality, local=True, cpus=2, load=0.1) == []
    assert max(abs(q.worst_error) for q in quality) < 1e-6


def test_the_written_profile_records_each_fits_quality_and_loads_back(tmp_path):
    measured = runs()
    profile = local_profile(measured, "local")
    quality = fit_quality(CostModel(profile), measured)
    path = tmp_path / "local.toml"
    path.write_text(to_toml(profile, quality))
    text = path.read_text()
    send = text[text.index("[fit.send]"):]
    assert "median_error_pct = 14.9\nworst_error_pct = -76.9\nworst_error_bytes = 16777216\n" \
        in send
    plain = tmp_path / "plain.toml"
    plain.write_text(to_toml(profile))
    # the quality is read past: the model prices as from the profile without it
    assert load_profile(str(path)).op_fits == load_profile(str(plain)).op_fits


def test_nccl_tests_fits_record_their_quality_as_comments(tmp_path):
    from prism_debug.cost import load_profile as load
    from prism_debug.cost.calibrate import fit
    base = load("h100-ib400")
    measured = [Measurements("all_reduce", 8, 1, ((1 << 20, 50e-6), (1 << 30, 5e-3)), "x")]
    profile = fit(base, measured, "fitted")
    quality = fit_quality(CostModel(profile), measured)
    text = to_toml(profile, quality)
    assert "\n# fit quality: median and worst error against the measurements\n" \
           "# all_reduce on 8 ranks, 1 node(s): median" in text
    (tmp_path / "f.toml").write_text(text)
    assert load(str(tmp_path / "f.toml")).name == "fitted"
