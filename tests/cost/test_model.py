import dataclasses
import math
from pathlib import Path

import pytest

from prism_debug.cost import CostModel, Placement, bus_factor, load_profile
from prism_debug.errors import HardwareProfileError

GiB = 1 << 30


@pytest.fixture(scope="module")
def h100():
    return CostModel(load_profile("h100-ib400"))


def test_single_node_all_reduce_uses_nvls_and_matches_published_busbw(h100):
    # nccl-tests on 8x H100 SXM: ~466 GB/s at 1 GiB, ~479 GB/s at 8 GiB (Azure ND H100 v5).
    one = h100.estimate("all_reduce", GiB, Placement(8, 1, 8))
    eight = h100.estimate("all_reduce", 8 * GiB, Placement(8, 1, 8))
    assert one.algorithm == "nvls"
    assert one.busbw_gbs == pytest.approx(477.0, abs=0.5)
    assert eight.busbw_gbs == pytest.approx(479.6, abs=0.5)


def test_ring_collectives_inside_a_node_reach_the_nvlink_ring_bandwidth(h100):
    estimate = h100.estimate("all_gather", GiB, Placement(8, 1, 8))
    assert (estimate.algorithm, estimate.protocol) == ("ring", "Simple")
    expected_s = 8.4e-6 + 7 * 3.4e-6 + GiB * 7 / 8 / 370e9
    assert estimate.time_s == pytest.approx(expected_s, rel=1e-12)


def test_small_all_reduce_takes_ring_ll_latency(h100):
    # tuning.cc: baseLat 6.6 us + 14 steps x 0.6 us for ring/LL on 8 GPUs.
    estimate = h100.estimate("all_reduce", 8, Placement(8, 1, 8))
    assert (estimate.algorithm, estimate.protocol) == ("ring", "LL")
    # LL delivers half the link bandwidth, capped at tuning.cc's 141 GB/s on one node
    assert estimate.time_s == pytest.approx(15.0e-6 + 8 * 1.75 / 141e9, rel=1e-9)


def test_tree_wins_small_messages_at_scale(h100):
    estimate = h100.estimate("all_reduce", 8, Placement(8192, 1024, 8))
    assert estimate.algorithm == "tree"
    # 6.8 + 2 * (7 * 0.6 + log2(1024) * 5.0) us
    assert estimate.time_s * 1e6 == pytest.approx(6.8 + 2 * (7 * 0.6 + 10 * 5.0), abs=0.01)


def test_one_rank_per_node_is_limited_by_one_nic(h100):
    estimate = h100.estimate("all_reduce", GiB, Placement(256, 256, 1))
    assert estimate.busbw_gbs < 47.0
    assert estimate.busbw_gbs > 40.0


def test_point_to_point_inside_a_node_is_faster_than_across(h100):
    inside = h100.time_s("send", 1 << 20, Placement.pair(0, 1, 8))
    across = h100.time_s("send", 1 << 20, Placement.pair(0, 8, 8))
    assert inside < across


def test_single_rank_groups_and_zero_profile_cost_nothing(h100):
    assert h100.time_s("all_reduce", GiB, Placement(1, 1, 1)) == 0.0
    free = CostModel(load_profile("zero"))
    assert free.is_free
    assert free.time_s("all_reduce", GiB, Placement(65536, 8192, 8)) == 0.0


def test_placement_counts_nodes_and_the_fullest_node():
    assert Placement.of(range(16), 8) == Placement(16, 2, 8)
    assert Placement.of([0, 8, 16, 17], 8) == Placement(4, 3, 2, 1)
    assert Placement(8, 1, 8).fewest_per_node == 8


def test_a_ring_across_uneven_nodes_runs_at_the_thinnest_node(h100):
    even = h100.estimate("all_gather", GiB, Placement(16, 2, 8))
    uneven = h100.estimate("all_gather", GiB, Placement(9, 2, 8, 1))
    assert even.busbw_gbs == pytest.approx(360.7, abs=0.5)
    assert uneven.busbw_gbs < 47.0


def test_broadcast_latency_is_one_hop_not_one_per_rank(h100):
    # tuning.cc: a pipelined chain charges baseLat + one hop (LL: 6.6 + 5.0 us across nodes)
    small = h100.estimate("broadcast", 8, Placement(8192, 1024, 8))
    assert small.time_s * 1e6 == pytest.approx(6.6 + 2.7, abs=0.01)


@pytest.mark.parametrize("op,n,factor", [
    ("all_reduce", 8, 1.75), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75),
    ("all_to_all", 2, 0.5), ("broadcast", 8, 1.0), ("send", 2, 1.0),
])
def test_bus_factors_follow_nccl_tests(op, n, factor):
    assert bus_factor(op, n) == factor


def test_unknown_op_and_negative_size_are_rejected(h100):
    # (issue 15: "allreduce" is all_reduce's other spelling now, so a typo stands in)
    with pytest.raises(ValueError, match="unknown collective 'alreduc'"):
        h100.estimate("alreduc", 8, Placement(8, 1, 8))
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        h100.estimate("all_reduce", -1, Placement(8, 1, 8))


def test_unknown_profile_names_the_bundled_ones():
    with pytest.raises(HardwareProfileError) as info:
        load_profile("a100-roce")
    assert str(info.value) == (
        "unknown hardware profile 'a100-roce': give a TOML file or one of h100-ib400, zero")


def test_profile_with_a_missing_key_says_which(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "broken"\ngpus_per_node = 8\n[bandwidth_gbs]\nnvlink = 1.0\n')
    with pytest.raises(HardwareProfileError, match=r"broken.toml: missing \[bandwidth_gbs\] nvls"):
        load_profile(str(path))


def test_profile_round_trips_through_a_dict():
    from prism_debug.cost import HardwareProfile

    profile = load_profile("h100-ib400")
    assert HardwareProfile.from_dict(profile.to_dict()) == profile
    assert math.isinf(load_profile("zero").nic_bw)


def test_a_profile_value_that_is_not_a_number_is_named(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "prism_debug/cost/profiles/h100-ib400.toml"
            ).read_text().replace("nvlink = 370.0", 'nvlink = "fast"')
    path = tmp_path / "typo.toml"
    path.write_text(text)
    with pytest.raises(HardwareProfileError,
                       match=r"typo.toml: \[bandwidth_gbs\] nvlink must be a number, got 'fast'"):
        load_profile(str(path))


def test_calibrating_from_nccl_tests_fits_every_size_by_least_squares(tmp_path):
    from prism_debug.cost.calibrate import fit, fit_table, parse_nccl_tests, to_toml

    log = Path(__file__).with_name("data") / "all_reduce_perf_8xh100.txt"
    measured = parse_nccl_tests(log.read_text(), str(log))
    assert (measured.op, measured.num_ranks, measured.num_nodes) == ("all_reduce", 8, 1)
    assert measured.samples[0] == (8, pytest.approx(20e-6))
    profile = fit(load_profile("h100-ib400"), [measured], "fitted")
    (tmp_path / "fitted.toml").write_text(to_toml(profile))
    model = CostModel(load_profile(str(tmp_path / "fitted.toml")))
    errors = [100 * (model.time_s("all_reduce", size, Placement(8, 1, 8)) - t) / t
              for size, t in measured.samples]
    # the fit weighs every size alike (relative error); the 1 MiB message sits
    # on NCCL's ramp from LL to NVLS, which the model's min over protocols
    # does not follow (before the least-squares fit: 20 us and 8 GiB exact,
    # 1 MiB -23 %)
    assert errors == pytest.approx([8.9, 3.8, -17.2, -7.4, 3.9, 3.5], abs=0.1)
    table = fit_table(model, [measured])
    assert len(table) == 1 + len(measured.samples)  # every size, not only the ends
    assert table[3].split() == ["all_reduce", "8", "1", "1048576", "42.0", "34.8", "-17.2%",
                                "-"]


def test_old_profile_files_without_the_newer_tables_still_load(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "prism_debug/cost/profiles/h100-ib400.toml"
            ).read_text()
    assert "[scale]" not in text and "[fit." not in text
    profile = load_profile("h100-ib400")
    assert (profile.net_scale_loss, profile.op_fits) == (0.0, ())


def test_two_nodes_let_a_tree_reach_twice_the_nics():
    # NCCL: "on two nodes, NCCL uses the tree (or nvlstree) algorithm which can
    # indeed go beyond the network bottleneck" (nccl-tests#196); not from 3 nodes
    h100 = CostModel(load_profile("h100-ib400"))
    two = h100.estimate("all_reduce", 8 * GiB, Placement(16, 2, 8))
    three = h100.estimate("all_reduce", 8 * GiB, Placement(24, 3, 8))
    assert (two.algorithm, round(two.busbw_gbs, 1)) == ("nvls_tree", 479.2)  # AWS p5: 479.28
    assert (three.algorithm, round(three.busbw_gbs, 1)) == ("nvls_tree", 375.4)
    # two GPUs per node: a ring gets two NICs (94 GB/s), the tree twice that
    pair = h100.estimate("all_reduce", 8 * GiB, Placement(4, 2, 2))
    assert (pair.algorithm, round(pair.busbw_gbs, 1)) == ("tree", 169.1)


def test_a_profile_without_nvlink_sharp_uses_rings_and_trees():
    a100 = CostModel(dataclasses.replace(load_profile("h100-ib400"), nvls_bw=0.0))
    assert a100.estimate("all_reduce", GiB, Placement(8, 1, 8)).algorithm == "ring"
    assert a100.estimate("all_reduce", GiB, Placement(64, 8, 8)).algorithm == "ring"


def test_network_loss_per_doubling_of_nodes_derates_across_nodes_only():
    base = dataclasses.replace(load_profile("h100-ib400"), nic_bw=20e9)  # NIC-bound rings
    lossy = CostModel(dataclasses.replace(base, net_scale_loss=0.1))
    plain = CostModel(base)
    for ranks, ratio in ((8, 1.0), (16, 1.0), (64, 0.9 ** 2), (256, 0.9 ** 4)):
        placement = Placement.of(range(ranks), 8)
        large = 64 * GiB  # bandwidth-bound: the busbw ratio is the derating
        assert (lossy.estimate("all_gather", large, placement).busbw_gbs
                / plain.estimate("all_gather", large, placement).busbw_gbs
                == pytest.approx(ratio if ranks > 16 else 1.0, rel=2e-3))


def test_an_nccl_tests_file_without_rank_lines_says_what_is_missing():
    from prism_debug.cost.calibrate import parse_nccl_tests
    from prism_debug.errors import ConfigError

    text = ("#       size         count      type   redop    root     time   algbw   busbw\n"
            "           8             2     float     sum      -1    20.00    0.00    0.00\n")
    with pytest.raises(ConfigError, match="no '# Rank … on HOST' lines"):
        parse_nccl_tests(text, "all_gather_perf.log")


def test_an_op_is_priced_by_its_kind_and_size(h100):
    @dataclasses.dataclass(frozen=True)
    class Op:
        kind: str
        nbytes: int

    placement = Placement.of(range(64), 8)
    assert h100.op_time_s(Op("all_reduce", GiB), placement) == h100.time_s("all_reduce", GiB,
                                                                           placement)


def test_an_estimate_reads_as_prism_debug_cost_prints_it(h100):
    estimate = h100.estimate("all_reduce", GiB, Placement.of(range(64), 8))
    assert estimate.describe("h100-ib400") == (
        "all_reduce of 1073741824 bytes on 64 ranks (8 node(s) x 8) on h100-ib400: 5731.2 us, "
        "busbw 368.8 GB/s (nvls_tree/Simple)")
