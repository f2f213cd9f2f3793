"""The scenario dataclasses: their own validation, selector resolution, helpers."""

import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.errors import ConfigError
from prism_debug.faults import select
from prism_debug.scenario import (
    Example,
    ExpectIterationTime,
    FailFault,
    LinkFault,
    Run,
    Scenario,
    Selector,
    SlowFault,
    Trigger,
    World,
    parse_scenario,
)

EXAMPLE_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"


# -- selectors ------------------------------------------------------------------------


def test_rank_strings_resolve_through_select_ranks():
    assert select(Selector(ranks_text="1,5-9,5"), 64, 8) == [1, 5, 6, 7, 8, 9]
    assert select(Selector(ranks_text="node 2"), 64, 8) == list(range(16, 24))
    with pytest.raises(ConfigError, match="^rank 64 is outside the world of 64 ranks$"):
        select(Selector(ranks_text="60-64"), 64, 8)
    with pytest.raises(ConfigError, match=r"^cannot read '²' as ranks: use R, A-B, a list of "
                                          r"them separated by commas, or node N$"):
        select(Selector(ranks_text="²"), 64, 8)  # str.isdigit() says yes, int() says no


def test_nodes_resolve_to_their_ranks_the_last_node_partly_filled():
    assert select(Selector(node=3), 64, 8) == list(range(24, 32))
    assert select(Selector(nodes="3-4"), 64, 8) == list(range(24, 40))
    assert select(Selector(nodes="4, 1"), 64, 8) == [*range(32, 40), *range(8, 16)]
    assert select(Selector(node=2), 20, 8) == [16, 17, 18, 19]
    with pytest.raises(ConfigError, match="^node 3 is outside the world: nodes are 0-2$"):
        select(Selector(node=3), 20, 8)
    with pytest.raises(ConfigError, match="^the range 4-1 runs backwards$"):
        select(Selector(nodes="4-1"), 64, 8)
    with pytest.raises(ConfigError, match="^cannot read 'x' as nodes: use N, A-B, or a list"):
        select(Selector(nodes="1,x"), 64, 8)


def test_fraction_is_drawn_with_the_seed():
    first = select(Selector(fraction=0.01, seed="0"), 8192, 8)
    assert len(first) == 82 and first == sorted(set(first))
    assert all(0 <= rank < 8192 for rank in first)
    assert select(Selector(fraction=0.01, seed="0"), 8192, 8) == first  # same seed, same ranks
    assert select(Selector(fraction=0.01, seed="1"), 8192, 8) != first
    assert select(Selector(fraction=0.001), 64, 8) != []  # at least one rank
    assert len(select(Selector(fraction=0.001), 64, 8)) == 1
    assert select(Selector(fraction=1.0), 64, 8) == list(range(64))


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 5000), fraction=st.floats(0.0001, 1.0), seed=st.integers(0, 2**32))
def test_fraction_draws_are_reproducible_and_in_the_world(size, fraction, seed):
    selector = Selector(fraction=fraction, seed=str(seed))
    ranks = select(selector, size, 8)
    assert ranks == select(selector, size, 8)
    assert ranks == sorted(set(ranks)) and ranks[0] >= 0 and ranks[-1] < size
    assert len(ranks) == max(1, round(fraction * size))


rank_texts = st.lists(st.sampled_from(["0", "3", "7", "9", "12", "63", "64", "-", ",", " ",
                                        "node", "node ", "x", "²", "٣", "\t", "\n"]),
                      min_size=1, max_size=6).map("".join)


@settings(max_examples=1000, deadline=None)
@given(text=rank_texts, size=st.integers(1, 70), gpus_per_node=st.integers(1, 9),
       as_nodes=st.booleans())
def test_problem_says_exactly_what_ranks_would_raise(text, size, gpus_per_node, as_nodes):
    selector = Selector(nodes=text) if as_nodes else Selector(ranks_text=text)
    try:
        select(selector, size, gpus_per_node)
    except ConfigError as exc:
        assert selector.problem(size, gpus_per_node) == str(exc)
    else:
        assert selector.problem(size, gpus_per_node) is None


def test_problem_expands_nothing_in_a_huge_world():
    billion = 10**9
    assert Selector(ranks_text="0-999999999").problem(billion, 8) is None
    assert Selector(ranks_text="node 0").problem(billion, billion) is None
    assert Selector(nodes="0-124999999").problem(billion, 8) is None
    assert Selector(ranks_text="5-1000000000").problem(billion, 8) == (
        "rank 1000000000 is outside the world of 1000000000 ranks")
    assert Selector(fraction=0.5).problem(billion, 8) is None


def test_family_and_class_need_the_graph():
    with pytest.raises(ConfigError, match="^family:dp:3: selecting a family's group needs the "
                                          r"job's execution graph: run without --lockstep, or "
                                          r"with --graph \(run.graph in a scenario\)$"):
        select(Selector(family="dp", group=3), 64, 8)
    with pytest.raises(ConfigError, match="^class:1: selecting a class needs the job's "
                                          "execution graph"):
        select(Selector(class_=1), 64, 8)

    class Graph:
        def family_group(self, family, group):
            return {("dp", 3): [3, 11, 19, 11]}[family, group]

        def class_ranks(self, c):
            return range(c, 64, 4)

    assert select(Selector(family="dp", group=3), 64, 8, Graph()) == [3, 11, 19]
    assert select(Selector(class_=1), 64, 8, Graph())[:3] == [1, 5, 9]


def test_selector_kind_names_the_key_that_chose():
    assert [Selector(ranks_text="1").kind, Selector(class_=0).kind,
            Selector(family="tp", group=0).kind] == ["ranks", "class", "family"]


def test_scenario_draws_each_fraction_fault_with_its_own_seed():
    text = ("name: t\nworld: {size: 4096, rank: 5}\nrun: {command: [a]}\nseed: 9\nfaults:\n"
            "  - {action: hang, select: {fraction: 0.01}}\n"
            "  - {action: hang, select: {fraction: 0.01}}\n")
    scenario = parse_scenario(text)
    first, second = scenario.fault_ranks(0), scenario.fault_ranks(1)
    assert len(first) == len(second) == 41 and first != second
    assert parse_scenario(text).fault_ranks(0) == first
    assert parse_scenario(text.replace("seed: 9", "seed: 10")).fault_ranks(0) != first


# -- validation on construction ------------------------------------------------------------


def test_dataclasses_validate_themselves():
    with pytest.raises(ConfigError, match=r"^World: rank: rank 4 is outside the world of 4 ranks$"):
        World(size=4, rank=4)
    with pytest.raises(ConfigError, match=r"^World: size: must be >= 1, got 0; "
                                          r"gpus_per_node: must be >= 1, got 0$"):
        World(size=0, rank=0, gpus_per_node=0)
    with pytest.raises(ConfigError, match=r"^Selector: give one of ranks, node, nodes, family, "
                                          r"class, fraction \(a link fault: node or nodes\)$"):
        Selector()
    with pytest.raises(ConfigError, match=r"^Selector: fraction: must be in \(0, 1\], got 0$"):
        Selector(fraction=0)
    with pytest.raises(ConfigError, match="^Trigger: collective: collective counts within an "
                                          "iteration: give iteration too$"):
        Trigger(time_s=1.0, collective=2)
    with pytest.raises(ConfigError, match="^Run: give one of command, example, snapshot$"):
        Run()
    with pytest.raises(ConfigError, match="^SlowFault: factor: must be > 0, got -1$"):
        SlowFault(select=Selector(ranks_text="1"), factor=-1)
    with pytest.raises(ConfigError, match="^LinkFault: select: a link fault selects nodes"):
        LinkFault(select=Selector(ranks_text="1"), latency_us=3.0)
    with pytest.raises(ConfigError, match=r"^Scenario: faults\[0\]\.select\.ranks: rank 9 is "
                                          "outside the world of 8 ranks$"):
        Scenario(name="t", world=World(size=8, rank=0), run=Run(command=("a",)),
                 faults=(FailFault(select=Selector(ranks_text="9")),))


def test_dataclasses_are_frozen():
    world = World(size=8, rank=1)
    with pytest.raises(AttributeError):
        world.rank = 2  # type: ignore[misc]


def test_example_defaults_are_the_scripts():
    text = EXAMPLE_SCRIPT.read_text()
    script = {name.replace("-", "_"): ast.literal_eval(value) for name, value in
              re.findall(r'add_argument\("--([\w-]+)", (?:type=\w+, )?default=([^,)]+)', text)}
    flags = ("timing", "loss_hex")  # store_true: no default to read
    assert script == {name: value for name, value in vars(Example()).items() if name not in flags}
    assert 'add_argument("--timing", action="store_true"' in text
    assert 'add_argument("--loss-hex", action="store_true"' in text


def test_example_argv():
    assert Example(tp=2, pp=2, iterations=6, timing=True).argv() == [
        "--iterations", "6", "--layers", "8", "--hidden", "256", "--heads", "8",
        "--seq-len", "128", "--vocab", "1024", "--micro-batches", "8",
        "--micro-batch-size", "2", "--tp", "2", "--pp", "2", "--backend", "gloo",
        "--lr", "0.0003", "--seed", "0", "--timing"]


def test_iteration_time_bounds():
    assert ExpectIterationTime(max_s=1.5).bounds() == (0.0, 1.5)
    assert ExpectIterationTime(min_s=0.5).bounds() == (0.5, math.inf)
    low, high = ExpectIterationTime(relative=1.16, tolerance=0.02).bounds(2.0)
    assert (low, high) == pytest.approx((2.28, 2.36))
    low, high = ExpectIterationTime(relative=1.5).bounds(1.0)  # the default tolerance: 0.02
    assert (low, high) == pytest.approx((1.48, 1.52))
    with pytest.raises(ConfigError, match="needs the baseline run's iteration time"):
        ExpectIterationTime(relative=1.5).bounds()


def test_run_helpers():
    assert Run(command=("a",), graph="profile").profile_graph
    assert not Run(command=("a",), graph="gpt.prism").profile_graph
    assert Run(example=Example()).last_iteration == 5
    assert Run(example=Example(), iterations=3).last_iteration == 3
    assert Run(command=("a",)).last_iteration is None
    assert Run(snapshot="r5-it2-abcdef", iterations=3).last_iteration is None


def test_the_scenario_package_is_pure():
    """The scenario model is core: no torch, ZeroMQ, CRIU or click."""
    code = ("import json, sys\nimport prism_debug.scenario\n"
            "print(json.dumps(sorted(m for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert loaded & {"torch", "zmq", "pycriu", "click"} == set()
