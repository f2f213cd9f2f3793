"""Whom a fault hits: ranks and nodes from the world, family groups and
classes from the graph, fractions from the selector's own seed."""

from __future__ import annotations

import pytest

from prism_debug.errors import ConfigError
from prism_debug.faults import (
    Selector,
    SlowFault,
    Trigger,
    fault_text,
    parse_fault,
    rank_text,
    resolve,
    select,
)
from tests.engine.test_replay import pipeline_graph


def ranks(word, world=4, gpus_per_node=8, graph=None):
    return select(parse_fault(f"fail {word}").select, world, gpus_per_node, graph)


def test_selectors_by_family_group_class_and_seeded_fraction():
    graph = pipeline_graph()  # (pp=2, tp=2): classes are the stages
    assert ranks("family:tp:1", graph=graph) == [2, 3]
    assert ranks("family:pp:0", graph=graph) == [0, 2]
    assert ranks("class:1", graph=graph) == [2, 3]
    with pytest.raises(ConfigError, match="family:tp:2: family tp has groups 0-1, not 2"):
        ranks("family:tp:2", graph=graph)
    with pytest.raises(ConfigError, match="class:5: class 5 does not exist"):
        ranks("class:5", graph=graph)
    drawn = ranks("fraction:0.01:7", 8192)
    assert len(drawn) == 82 and drawn == ranks("fraction:0.01:7", 8192)
    assert drawn != ranks("fraction:0.01:8", 8192)
    assert rank_text([9, 1, 2, 3, 7]) == "1-3,7,9"


@pytest.mark.parametrize("word, message", [
    ("family:dp:0", "family:dp:0: selecting a family's group needs the job's execution graph: "
                    "run without --lockstep, or with --graph (run.graph in a scenario)"),
    ("class:1", "class:1: selecting a class needs the job's execution graph: run without "
                "--lockstep, or with --graph (run.graph in a scenario)"),
    ("9", "rank 9 is outside the world of 4 ranks"),
])
def test_what_cannot_be_resolved_says_why(word, message):
    with pytest.raises(ConfigError) as info:
        ranks(word)
    assert str(info.value) == message


def test_nodes_and_links():
    assert ranks("node:1", 32, 8) == list(range(8, 16))
    link = resolve(parse_fault("link 1-2 0.5"), 32, 8)
    assert link.targets == (1, 2)
    assert link.summary("link 1-2 0.5") == "link 1-2 0.5  (2 nodes: 1,2)"


def test_summary_names_the_ranks():
    injection = resolve(parse_fault("slow 0-5 2"), 64, 8)
    assert injection.summary("slow 0-5 2") == "slow 0-5 2  (6 ranks: 0,1,2,3,…)"
    assert injection.hits(5) and not injection.hits(6)


def test_a_selector_seed_goes_with_a_fraction():
    with pytest.raises(ConfigError, match="seed goes with fraction"):
        Selector(ranks_text="1", seed="3")


def test_a_written_back_fault_hits_the_same_ranks():
    # forms the grammar spells one way: "node 3" in a file, a one-node list
    for chosen in (Selector(ranks_text="node 3"), Selector(nodes="3"), Selector(node=3)):
        fault = SlowFault(select=chosen, factor=2.0)
        again = parse_fault(fault_text(fault))
        assert resolve(again, 64, 8).targets == resolve(fault, 64, 8).targets == \
            tuple(range(24, 32))


def test_compute_and_links_act_on_whole_iterations():
    with pytest.raises(ConfigError, match="at.collective: a slow fault acts on whole "
                                          "iterations: remove collective"):
        SlowFault(select=Selector(ranks_text="1"), factor=2.0,
                  at=Trigger(iteration=2, collective=3))
    with pytest.raises(ConfigError, match="^slow does not take op"):
        parse_fault("slow 1 2 from 2 op 3")
