"""A suggestion never names a key the loader then refuses there.

For a misspelt key anywhere in a valid file — the misspelling of any key the
place declares, refused ones included (``time_s`` in a fault's ``at``) — every
key lint offers ("did you mean X?", "expected one of X, Y") is accepted in
that place: writing X there with a valid value brings no new problem.
"""

from __future__ import annotations

import copy
import re
from collections import Counter

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.checked import declared_fields
from prism_debug.example import Example
from prism_debug.faults import (
    Action,
    CorruptFault,
    DelayFault,
    DesyncFault,
    Duration,
    FailFault,
    HangFault,
    Intermittent,
    LinkFault,
    NanFault,
    Selector,
    SlowFault,
    Trigger,
)
from prism_debug.scenario import lint
from prism_debug.scenario.keys import known_keys
from prism_debug.scenario.model import (
    EXPECTATION_TYPES,
    ExpectException,
    ExpectFlightRecord,
    ExpectIterationTime,
    ExpectNanAt,
    Run,
    Scenario,
    World,
)

FAULTS = [
    {"action": "delay", "select": {"ranks": "1"}, "seconds": 1,
     "at": {"iteration": 2, "collective": 1}, "for": {"iterations": 1}},
    {"action": "hang", "select": {"family": "dp", "group": 0}, "for": {"time_s": 1}},
    {"action": "slow", "select": {"fraction": 0.1, "seed": "x"}, "factor": 2,
     "at": {"iteration": 1}},
    {"action": "link", "select": {"node": 1}, "bandwidth_factor": 0.5,
     "intermittent": {"period_s": 1, "duty": 0.5}},
    {"action": "fail", "select": {"class": 0}, "at": {"iteration": 1}},
    {"action": "desync", "select": {"nodes": "1-2"}, "kind": "size", "family": "dp"},
    {"action": "corrupt", "select": {"ranks": "2"}, "scale": 2},
    {"action": "nan", "select": {"ranks": "2"}},
]
EXPECT = [
    {"iteration_time": {"iteration": 2, "max_s": 1}},
    {"iteration_time": {"relative": 1.1, "tolerance": 0.1}},
    {"iteration_time": {"percentile": 99, "max_s": 1}},
    {"exception": {"type": "E", "match": "x"}},
    {"flight_record": {"missing_ranks": [1]}},
    {"nan_at": {"iteration": 1}},
]
RUNS = {"command": {"command": ["prog"], "graph": "g", "timeout_s": 5},
        "snapshot": {"snapshot": "s1", "graph": "g", "iterations": 2},
        "example": {"example": {"tp": 8, "iterations": 5}, "graph": "g"}}
FAULT_CLASSES = {Action.DELAY: DelayFault, Action.HANG: HangFault, Action.SLOW: SlowFault,
                 Action.LINK: LinkFault, Action.FAIL: FailFault, Action.DESYNC: DesyncFault,
                 Action.CORRUPT: CorruptFault, Action.NAN: NanFault}


def base(run: str) -> dict:
    return {"name": "t", "world": {"size": 64, "rank": 5}, "run": copy.deepcopy(RUNS[run]),
            "faults": copy.deepcopy(FAULTS), "expect": copy.deepcopy(EXPECT)}


# (run kind, path to a mapping, the class it is read as, the fault's action)
PLACES = [("command", (), Scenario, None), ("command", ("world",), World, None)]
PLACES += [(kind, ("run",), Run, None) for kind in RUNS]
PLACES += [("example", ("run", "example"), Example, None)]
for i, fault in enumerate(FAULTS):
    action = Action(fault["action"])
    PLACES += [("command", ("faults", i), FAULT_CLASSES[action], action),
               ("command", ("faults", i, "select"), Selector, action)]
    PLACES += [("command", ("faults", i, key), cls, action)
               for key, cls in (("at", Trigger), ("for", Duration),
                                ("intermittent", Intermittent)) if key in fault]
PLACES += [("command", ("expect", i), "kind", None) for i in range(len(EXPECT))]
PLACES += [("command", ("expect", i, kind), EXPECTATION_TYPES[kind], None)
           for i, item in enumerate(EXPECT) for kind in item]

# a valid value for each key, in each class that reads it (beside the base's)
VALUES = {
    Scenario: {"name": "t", "description": "d", "world": {"size": 64, "rank": 5},
               "run": {"command": ["prog"]}, "seed": 0, "faults": [], "expect": [],
               "variability": [{"cv": 0.05}]},
    World: {"size": 64, "rank": 5, "ranks": "5", "gpus_per_node": 8},
    Run: {"command": ["prog"], "example": {}, "snapshot": "s1", "graph": "g", "iterations": 2,
          "hardware": "h100-ib400", "timeout_s": 5, "env": {"A": "1"}},
    # (the example's optional keys, None by default, given a value)
    Example: {**{key: getattr(Example(), f.name) for key, f in declared_fields(Example)},
              "data_parallel_size": 2, "data_parallel_rank": 0},
    Selector: {"ranks": "1", "node": 1, "nodes": "1", "family": "dp", "group": 0, "class": 0,
               "fraction": 0.1, "seed": "x"},
    Trigger: {"iteration": 1, "collective": 1, "time_s": 1},
    Duration: {"iterations": 1, "time_s": 1},
    Intermittent: {"period_s": 1, "duty": 0.5},
    ExpectIterationTime: {"iteration": 2, "min_s": 0.1, "max_s": 1, "relative": 1.1,
                          "predicted": True, "tolerance": 0.1, "percentile": 99},
    ExpectException: {"type": "E", "match": "x"},
    ExpectFlightRecord: {"missing_ranks": [1], "mismatch": "size", "culprits": [1]},
    ExpectNanAt: {"iteration": 1},
    "kind": {"exit_code": 0, "nan_at": {"iteration": 1}, "digests": {1: "6d86199f"},
             "exception": {"type": "E"}, "iteration_time": {"max_s": 1},
             "flight_record": {"mismatch": "size"}},
}
FAULT_VALUES = {"select": {"ranks": "1"}, "at": {"iteration": 1}, "for": {"iterations": 1},
                "seconds": 1, "factor": 2, "family": "dp", "bandwidth_factor": 0.5,
                "latency_us": 1, "intermittent": {"period_s": 1, "duty": 0.5}, "scale": 2,
                "kind": "size"}
# what a key needs beside it to be complete (a family's group is its index)
COMPANIONS = {(Selector, "family"): {"group": 0},
              (Example, "data_parallel_rank"): {"data_parallel_size": 2}}


def keys_of(cls) -> list[str]:
    return list(EXPECTATION_TYPES) if cls == "kind" else known_keys(cls)


def value_of(cls, key: str):
    if cls in VALUES:
        return copy.deepcopy(VALUES[cls][key])
    return copy.deepcopy(FAULT_VALUES[key])


def at(doc: dict, path: tuple):
    for part in path:
        doc = doc[part]
    return doc


def replaced(mapping: dict, old: str, new: str | None, value=None) -> dict:
    """``mapping`` with key ``old`` replaced by ``new`` (None: removed), in place."""
    out = {}
    for key, v in mapping.items():
        if key != old:
            out[key] = v
        elif new is not None:
            out[new] = value
    return out


def with_mapping(doc: dict, path: tuple, mapping: dict) -> dict:
    doc = copy.deepcopy(doc)
    if not path:
        return mapping
    at(doc, path[:-1])[path[-1]] = mapping
    return doc


def messages(doc: dict) -> Counter:
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return Counter(p.message for p in lint(text, "s.yaml"))


@st.composite
def misspellings(draw):
    run, path, cls, action = draw(st.sampled_from(PLACES))
    doc = base(run)
    mapping = at(doc, path)
    known = set(keys_of(cls)) | ({"action"} if action else set())
    key = draw(st.sampled_from(sorted(set(keys_of(cls)) & set(mapping) if cls == "kind"
                                      else keys_of(cls))))
    letters = st.sampled_from("abcdefghijklmnopqrstuvwxyz_")
    edit = draw(st.sampled_from(["delete", "insert", "replace", "swap"]))
    i = draw(st.integers(0, len(key) - 1))
    if edit == "delete":
        typo = key[:i] + key[i + 1:]
    elif edit == "insert":
        typo = key[:i] + draw(letters) + key[i:]
    elif edit == "replace":
        typo = key[:i] + draw(letters) + key[i + 1:]
    else:
        typo = key[:i] + key[i + 1:i + 2] + key[i:i + 1] + key[i + 2:]
    if not typo or typo in known or typo == key:
        typo = key + "x"  # still a misspelling, never a known key (none ends in x)
    return doc, path, cls, key, typo


@settings(max_examples=400, deadline=None)
@given(misspellings())
def test_every_key_lint_suggests_is_accepted_where_it_is_suggested(case):
    doc, path, cls, key, typo = case
    mapping = at(doc, path)
    value = mapping.get(key, value_of(cls, key))
    misspelt = replaced(mapping, key, typo, value) if key in mapping \
        else {**mapping, typo: value}
    found = [m for m in messages(with_mapping(doc, path, misspelt))
             if f"unknown key {typo!r}" in m]
    assert len(found) == 1, (typo, found)
    close = re.search(r"did you mean '(\w+)'\?$", found[0])
    listed = re.search(r"expected one of (.+)$", found[0])
    offered = [close.group(1)] if close else listed.group(1).split(", ") if listed else []
    without = messages(with_mapping(doc, path, replaced(misspelt, typo, None)))
    for name in offered:
        if name in misspelt:
            assert not close, f"{typo!r}: suggested {name!r}, which is there already"
            continue  # listed as part of what the place takes; not an alternative
        fixed = replaced(misspelt, typo, name,
                         value if name == key else value_of(cls, name))
        fixed.update({k: v for k, v in COMPANIONS.get((cls, name), {}).items()
                      if k not in fixed})
        new = messages(with_mapping(doc, path, fixed)) - without
        assert not new, f"{typo!r} at {path}: offered {name!r}, then refused: {dict(new)}"


def test_the_issues_cases_offer_only_what_is_taken():
    head = "name: t\nworld: {size: 64, rank: 5}\nrun: {command: [a], graph: g}\nfaults:\n"

    def problems(fault: str) -> list[str]:
        return [str(p) for p in lint(head + fault, "s.yaml")]

    # a fault's at declares time_s, and every fault refuses it: never offered
    assert problems("  - {action: hang, select: {ranks: '1'}, at: {iteration: 2, tme_s: 1}}\n") \
        == ["s.yaml:5:61: faults[0].at: unknown key 'tme_s': expected one of iteration, "
            "collective"]
    assert problems("  - {action: slow, factor: 2, select: {ranks: '1'}, at: {time: 1}}\n") == [
        "s.yaml:5:53: faults[0].at: give iteration: the iteration it starts at, counting from 1",
        "s.yaml:5:58: faults[0].at: unknown key 'time': expected one of iteration"]
    # a hang stalls for time_s; any other fault lasts whole iterations
    stall = ("give iterations (how many it lasts) or, for a hang, time_s (the seconds it "
             "stalls)")
    assert problems("  - {action: hang, select: {ranks: '1'}, for: {time: 1}}\n") == [
        f"s.yaml:5:42: faults[0].for: {stall}",
        "s.yaml:5:48: faults[0].for: unknown key 'time': did you mean 'time_s'?"]
    assert problems("  - {action: delay, seconds: 1, select: {ranks: '1'}, for: {time: 1}}\n") \
        == [f"s.yaml:5:55: faults[0].for: {stall}",
            "s.yaml:5:61: faults[0].for: unknown key 'time': expected one of iterations"]
    # a slow fault acts on whole iterations: no collective
    assert problems("  - {action: slow, factor: 2, select: {ranks: '1'},"
                    " at: {iteration: 2, colective: 1}}\n") == [
        "s.yaml:5:72: faults[0].at: unknown key 'colective': expected one of iteration"]
    # a failed rank never comes back: no for
    assert problems("  - {action: fail, select: {ranks: '1'}, fr: {iterations: 1}}\n") == [
        "s.yaml:5:42: faults[0]: unknown key 'fr': expected one of action, select, at"]
    # a link fault selects nodes
    assert problems("  - {action: link, bandwidth_factor: 0.5, select: {rank: 1}}\n") == [
        "s.yaml:5:43: faults[0].select: give one of ranks, node, nodes, family, class, fraction "
        "(a link fault: node or nodes)",
        "s.yaml:5:52: faults[0].select: unknown key 'rank': expected one of node, nodes"]
    # a restored snapshot keeps its process groups' timeouts
    assert [str(p) for p in lint("name: t\nworld: {size: 64, rank: 5}\n"
                                 "run: {snapshot: s1, timeout: 3}\n", "s.yaml")] == [
        "s.yaml:3:21: run: unknown key 'timeout': expected one of snapshot, graph, iterations"]
