from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.graph import FamilyRecorder, GroupRef


def megatron_groups(world, tp, pp):
    """Group definitions in the order the bundled example makes them."""
    dp = world // (tp * pp)
    for start in range(0, world, tp):
        yield list(range(start, start + tp)), "tp"
    for p in range(pp):
        for t in range(tp):
            yield [t + tp * (d + dp * p) for d in range(dp)], "dp"
    for t in range(tp * dp):
        yield [t + tp * dp * p for p in range(pp)], "pp"


def test_megatron_layout_at_8192_forms_three_complete_families():
    recorder = FamilyRecorder(8192)
    for ranks, desc in megatron_groups(8192, tp=8, pp=4):
        recorder.add(ranks, desc)
    summary = {f.name: (f.num_groups, f.group_size, f.stride, f.complete)
               for f in recorder.summaries()}
    assert summary == {
        "world": (1, 8192, 1, True),
        "tp": (1024, 8, 1, True),
        "dp": (32, 256, 8, True),
        "pp": (2048, 4, 2048, True),
    }


def test_group_refs_index_groups_within_their_family():
    recorder = FamilyRecorder(16)
    refs = [recorder.add(range(i, i + 4), "tp") for i in range(0, 16, 4)]
    assert refs == [GroupRef("tp", i) for i in range(4)]


def test_undescribed_families_are_numbered_and_device_mesh_prefix_is_dropped():
    recorder = FamilyRecorder(4)
    recorder.add([0, 1])
    recorder.add([2, 3])
    recorder.add([0, 2], "mesh_dp")
    recorder.add([1, 3], "mesh_dp")
    assert [(f.name, f.num_groups) for f in recorder.summaries()] == [
        ("world", 1), ("family1", 2), ("dp", 2)]


def test_a_second_layout_with_the_same_description_gets_its_own_name():
    recorder = FamilyRecorder(4)
    for ranks in ([0, 1], [2, 3], [0, 1], [2, 3]):
        recorder.add(ranks, "tp")
    assert [f.name for f in recorder.summaries()] == ["world", "tp", "tp#2"]


def test_a_subset_group_stays_an_incomplete_family():
    recorder = FamilyRecorder(8)
    recorder.add([0, 3], "pair")
    (pair,) = [f for f in recorder.summaries() if f.name == "pair"]
    assert (pair.num_groups, pair.complete, pair.stride) == (1, False, 3)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.integers(1, 8))
def test_any_megatron_layout_partitions_the_world_once_per_family(tp, pp, dp):
    world = tp * pp * dp
    recorder = FamilyRecorder(world)
    for ranks, desc in megatron_groups(world, tp, pp):
        recorder.add(ranks, desc)
    families = {f.name: f for f in recorder.summaries()}
    assert all(f.complete for f in families.values())
    assert families["tp"].num_groups * tp == world
    assert families["dp"].num_groups * dp == world
    assert families["pp"].num_groups * pp == world


def test_groups_of_another_stride_start_a_family_of_their_own():
    # (0,4) (1,5) then (2,3) (6,7): together they cover the world, but no mesh
    # axis lays groups out like that, so neither half is complete
    recorder = FamilyRecorder(8)
    for ranks in ([0, 4], [1, 5], [2, 3], [6, 7]):
        recorder.add(ranks, "dp")
    assert [(f.name, f.num_groups, f.stride, f.complete) for f in recorder.summaries()] == [
        ("world", 1, 1, True), ("dp", 2, 4, False), ("dp#2", 2, 1, False)]
