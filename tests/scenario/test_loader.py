"""Scenario files: what a valid one reads as, and every kind of error, with its position."""

import textwrap

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.errors import ConfigError
from prism_debug.scenario import (
    Action,
    CorruptFault,
    DelayFault,
    DesyncFault,
    DesyncKind,
    Duration,
    Example,
    ExpectDigests,
    ExpectException,
    ExpectExitCode,
    ExpectFlightRecord,
    ExpectIterationTime,
    ExpectNanAt,
    FailFault,
    HangFault,
    InfFault,
    Intermittent,
    LinkFault,
    NanFault,
    Problem,
    Run,
    Scenario,
    ScenarioError,
    Selector,
    SlowFault,
    Trigger,
    World,
    lint,
    load_scenario,
    parse_scenario,
)

VALID = textwrap.dedent("""\
    name: dp-peer-fail-stop
    description: a DP peer dies mid-run
    world: {size: 64, rank: 5, gpus_per_node: 8}
    run:
      example: {tp: 2, pp: 2, iterations: 6}
      graph: profile
      iterations: 6
      hardware: h100-ib400
      timeout_s: 30
      env: {TORCH_NCCL_ASYNC_ERROR_HANDLING: 1, NCCL_DEBUG: INFO}
    seed: 7
    faults:
      - action: fail
        select: {ranks: "4"}
        at: {iteration: 3}
      - action: delay
        select: {family: dp, group: 0}
        at: {iteration: 2, collective: 5}
        for: {iterations: 2}
        seconds: 0.25
        family: dp
      - action: slow
        select: {fraction: 0.01}
        factor: 1.5
      - action: link
        select: {nodes: "3,4"}
        at: {iteration: 2}
        for: {iterations: 3}
        bandwidth_factor: 0.25
        latency_us: 20
        intermittent: {period_s: 2, duty: 0.5}
      - action: hang
        select: {node: 2}
      - action: nan
        select: {class: 1}
      - action: inf
        select: {ranks: "1,5-9"}
        family: tp
      - action: corrupt
        select: {ranks: "10"}
        scale: -1
      - action: desync
        select: {ranks: "11"}
        kind: dtype
    expect:
      - exception: {type: DistBackendError, match: "Watchdog caught collective operation timeout"}
      - exit_code: 134
      - iteration_time: {iteration: 4, max_s: 1.5}
      - iteration_time: {relative: 1.16, tolerance: 0.02}
      - flight_record: {missing_ranks: [4], mismatch: size}
      - nan_at: {iteration: 3}
      - digests: {4: 6d86199fb54262f3, 5: "0123456789abcdef0123456789abcdef"}
    """)


def problems(text: str) -> list[str]:
    return [str(p) for p in lint(text, "s.yaml")]


# A valid head for texts that test one section: faults and expect start on line 4.
HEAD = "name: t\nworld: {size: 64, rank: 5}\nrun: {command: [python, train.py]}\n"


def test_valid_scenario_reads_into_the_dataclasses_exactly():
    scenario = parse_scenario(VALID, "dp.yaml")
    assert lint(VALID) == []
    assert scenario == Scenario(
        name="dp-peer-fail-stop",
        description="a DP peer dies mid-run",
        world=World(size=64, rank=5, gpus_per_node=8),
        run=Run(example=Example(tp=2, pp=2, iterations=6), graph="profile", iterations=6,
                hardware="h100-ib400", timeout_s=30.0,
                env=(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"), ("NCCL_DEBUG", "INFO"))),
        seed=7,
        faults=(
            FailFault(select=Selector(ranks_text="4"), at=Trigger(iteration=3)),
            DelayFault(select=Selector(family="dp", group=0),
                       at=Trigger(iteration=2, collective=5), duration=Duration(iterations=2),
                       seconds=0.25, family="dp"),
            SlowFault(select=Selector(fraction=0.01), factor=1.5),
            LinkFault(select=Selector(nodes="3,4"), at=Trigger(iteration=2),
                      duration=Duration(iterations=3), bandwidth_factor=0.25, latency_us=20.0,
                      intermittent=Intermittent(period_s=2.0, duty=0.5)),
            HangFault(select=Selector(node=2)),
            NanFault(select=Selector(class_=1)),
            InfFault(select=Selector(ranks_text="1,5-9"), family="tp"),
            CorruptFault(select=Selector(ranks_text="10"), scale=-1.0),
            DesyncFault(select=Selector(ranks_text="11"), kind=DesyncKind.DTYPE),
        ),
        expect=(
            ExpectException(type="DistBackendError",
                            match="Watchdog caught collective operation timeout"),
            ExpectExitCode(code=134),
            ExpectIterationTime(iteration=4, max_s=1.5),
            ExpectIterationTime(relative=1.16, tolerance=0.02),
            ExpectFlightRecord(missing_ranks=(4,), mismatch=DesyncKind.SIZE),
            ExpectNanAt(iteration=3),
            ExpectDigests(digests=((4, "6d86199fb54262f3"),
                                   (5, "0123456789abcdef0123456789abcdef"))),
        ),
    )
    # what the comparison leaves out: where each item came from
    assert scenario.source == "dp.yaml"
    assert [f.line for f in scenario.faults] == [13, 16, 22, 25, 32, 34, 36, 39, 42]
    assert [e.line for e in scenario.expect] == [46, 47, 48, 49, 50, 51, 52]
    assert [f.action for f in scenario.faults] == [
        Action.FAIL, Action.DELAY, Action.SLOW, Action.LINK, Action.HANG, Action.NAN, Action.INF,
        Action.CORRUPT, Action.DESYNC]
    assert scenario.faults[4].at == Trigger(iteration=1)  # no "at": from the first iteration
    assert scenario.faults[0].duration is None  # no "for": to the end
    assert scenario.run.profile_graph and scenario.run.last_iteration == 6


def test_minimal_scenario_takes_the_defaults():
    scenario = parse_scenario(HEAD)
    assert scenario == Scenario(name="t", world=World(size=64, rank=5),
                                run=Run(command=("python", "train.py")))
    assert (scenario.description, scenario.seed) == ("", 0)
    assert scenario.faults == scenario.expect == ()
    assert scenario.world.gpus_per_node == 8


def test_scalars_read_as_text_are_taken_as_written():
    scenario = parse_scenario(
        "name: 0x10\nworld: {size: 8, rank: 0}\n"
        "run: {command: [python, train.py, --lr, 3e-4, --steps, 010], env: {A: 1.50, B: yes}}\n")
    assert scenario.name == "0x10"
    assert scenario.run.command == ("python", "train.py", "--lr", "3e-4", "--steps", "010")
    assert scenario.run.env == (("A", "1.50"), ("B", "yes"))


def test_command_as_one_string_is_split_like_a_shell():
    scenario = parse_scenario(HEAD.replace("[python, train.py]", "\"python 'my train.py' -x\""))
    assert scenario.run.command == ("python", "my train.py", "-x")
    assert problems(HEAD.replace("[python, train.py]", "\"python 'train.py\"")) == [
        "s.yaml:3:16: run.command: cannot split into words: No closing quotation"]


def test_snapshot_run_has_no_known_last_iteration():
    text = HEAD.replace("command: [python, train.py]", "snapshot: r5-it2-abcdef, iterations: 2")
    text += "faults:\n  - action: hang\n    select: {ranks: 4}\n    at: {iteration: 9}\n"
    scenario = parse_scenario(text)
    assert scenario.run.snapshot == "r5-it2-abcdef"
    assert scenario.run.last_iteration is None  # iterations count on from the snapshot's


# -- YAML itself ---------------------------------------------------------------------


def test_yaml_syntax_error_is_one_problem_at_the_parsers_mark():
    assert problems("name: t\nworld: [1, 2\n") == [
        "s.yaml:3:1: invalid YAML: while parsing a flow sequence, expected ',' or ']', "
        "but got '<stream end>'"]
    assert problems("name: t\n  world: 1\n") == [
        "s.yaml:2:8: invalid YAML: mapping values are not allowed here"]


def test_unprintable_characters_and_several_documents_are_syntax_errors():
    assert problems("name: t\nworld: \x01\n") == [
        "s.yaml:2:8: invalid YAML: unacceptable character #x0001: special characters are "
        "not allowed"]
    assert problems("name: t\n---\nname: u\n") == [
        "s.yaml:2:1: invalid YAML: expected a single document in the stream, "
        "but found another document"]


def test_nesting_too_deep_for_the_composer_is_a_problem_not_a_crash():
    assert problems("a: " + "[" * 5000 + "]" * 5000) == [
        "s.yaml:1:1: invalid YAML: nested too deeply"]


def test_empty_file_and_wrong_top_level():
    assert problems("") == ["s.yaml:1:1: the scenario is empty: it needs name, world and run"]
    assert problems("# nothing\n") == [
        "s.yaml:1:1: the scenario is empty: it needs name, world and run"]
    assert problems("- name: t\n") == ["s.yaml:1:1: expected a mapping, got a list"]


# -- keys ------------------------------------------------------------------------------


def test_missing_required_keys_are_all_reported_at_their_mapping():
    assert problems("description: x\n") == [
        "s.yaml:1:1: missing required key 'name'",
        "s.yaml:1:1: missing required key 'world'",
        "s.yaml:1:1: missing required key 'run'",
    ]
    assert problems("name: t\nworld:\n  size: 8\nrun: {command: [a]}\n") == [
        "s.yaml:2:1: world: give one of rank, ranks"]


def test_unknown_keys_suggest_the_closest_one_or_list_them():
    assert problems(HEAD + "sede: 3\nfoo: 1\n") == [
        "s.yaml:4:1: unknown key 'sede': did you mean 'seed'?",
        "s.yaml:5:1: unknown key 'foo': expected one of name, description, world, run, seed, "
        "faults, variability, expect",
    ]
    assert problems(HEAD.replace("rank: 5", "rank: 5, gpu_per_node: 4")) == [
        "s.yaml:2:28: world: unknown key 'gpu_per_node': did you mean 'gpus_per_node'?"]


def test_a_parameter_of_another_action_is_an_unknown_key():
    assert problems(HEAD + "faults:\n  - action: delay\n    select: {ranks: 4}\n"
                           "    seconds: 1\n    factor: 2\n") == [
        "s.yaml:8:5: faults[0]: unknown key 'factor': expected one of action, select, at, "
        "for, seconds, family"]


def test_duplicate_and_merge_keys():
    assert problems(HEAD + "seed: 1\nseed: 2\n") == [
        "s.yaml:5:1: duplicate key 'seed' (first on line 4)"]
    merged = HEAD.replace("world: {size: 64, rank: 5}", "world: {<<: {size: 64}, rank: 5}")
    assert problems(merged) == [
        "s.yaml:2:1: world: missing required key 'size'",
        "s.yaml:2:9: world: merge keys (<<) are not supported: write the keys out",
    ]


# -- types -------------------------------------------------------------------------------


def test_wrong_types_name_what_was_found():
    text = ("name: [t]\nworld: {size: '64', rank: 1.0, gpus_per_node: true}\n"
            "run: {command: {a: 1}, timeout_s: yes, iterations:}\nseed: 0.5\nfaults: {a: 1}\n"
            "expect: x\n")
    assert problems(text) == [
        "s.yaml:1:1: name: expected text, got a list",
        "s.yaml:2:15: world.size: expected an integer, got the string '64'",
        "s.yaml:2:27: world.rank: expected an integer, got the number 1.0",
        "s.yaml:2:47: world.gpus_per_node: expected an integer, got the boolean true",
        "s.yaml:3:7: run.command: expected a list, got a mapping",
        "s.yaml:3:35: run.timeout_s: expected a number, got the boolean yes",
        "s.yaml:3:40: run.iterations: expected an integer, got nothing",
        "s.yaml:4:7: seed: expected an integer, got the number 0.5",
        "s.yaml:5:1: faults: expected a list, got a mapping",
        "s.yaml:6:9: expect: expected a list, got the string 'x'",
    ]


def test_list_items_of_the_wrong_type():
    assert problems(HEAD + "faults:\n  - [fail]\nexpect:\n  - 134\n"
                           "  - flight_record: {missing_ranks: [1, x]}\n") == [
        "s.yaml:5:5: faults[0]: expected a mapping, got a list",
        "s.yaml:7:5: expect[0]: expected a mapping, got the integer 134",
        "s.yaml:8:40: expect[1].flight_record.missing_ranks[1]: expected an integer, "
        "got the string 'x'",
    ]


def test_bad_enum_values():
    assert problems(HEAD + "faults:\n  - action: explode\n    select: {ranks: 4}\n"
                           "  - action: desync\n    select: {ranks: 4}\n    kind: shape\n"
                           "expect:\n  - flight_record: {mismatch: rank}\n") == [
        "s.yaml:5:13: faults[0].action: 'explode' is not one of delay, slow, link, fail, "
        "hang, nan, inf, corrupt, desync",
        "s.yaml:9:11: faults[1].kind: 'shape' is not one of size, dtype, op, skip",
        "s.yaml:11:31: expect[0].flight_record.mismatch: 'rank' is not one of size, dtype, "
        "op, skip",
    ]


# -- values ----------------------------------------------------------------------------


def test_out_of_range_numbers():
    text = ("name: t\nworld: {size: 64, rank: 64}\n"
            "run: {command: [a], timeout_s: 0, iterations: 0}\nseed: -1\nfaults:\n"
            "  - action: slow\n    select: {fraction: 1.5}\n    factor: 0\n"
            "  - action: delay\n    select: {ranks: 70}\n    seconds: -0.5\n"
            "    at: {iteration: 0}\n    for: {iterations: 0}\n"
            "  - action: link\n    select: {node: 8}\n    bandwidth_factor: .inf\n"
            "    intermittent: {period_s: 1, duty: 2}\n"
            "expect:\n  - exit_code: 300\n  - nan_at: {iteration: 0}\n")
    assert problems(text) == [
        "s.yaml:2:25: world.rank: rank 64 is outside the world of 64 ranks",
        "s.yaml:3:32: run.timeout_s: must be > 0, got 0.0",
        "s.yaml:3:47: run.iterations: must be >= 1, got 0",
        "s.yaml:4:7: seed: must be >= 0, got -1",
        "s.yaml:7:24: faults[0].select.fraction: must be in (0, 1], got 1.5",
        "s.yaml:8:13: faults[0].factor: must be > 0, got 0.0",
        "s.yaml:11:14: faults[1].seconds: must be > 0, got -0.5",
        "s.yaml:12:21: faults[1].at.iteration: must be >= 1, got 0",
        "s.yaml:13:23: faults[1].for.iterations: must be >= 1, got 0",
        "s.yaml:16:23: faults[2].bandwidth_factor: must be > 0, got inf",
        "s.yaml:17:39: faults[2].intermittent.duty: must be in (0, 1], got 2.0",
        "s.yaml:19:16: expect[0].exit_code: must be in -255..255, got 300",
        "s.yaml:20:25: expect[1].nan_at.iteration: must be >= 1, got 0",
    ]


def test_selected_ranks_and_nodes_must_be_in_the_world():
    text = HEAD + ("faults:\n"
                   "  - {action: hang, select: {ranks: 70}}\n"
                   "  - {action: hang, select: {ranks: 9-4}}\n"
                   "  - {action: hang, select: {ranks: 'one'}}\n"
                   "  - {action: hang, select: {node: 8}}\n"
                   "  - {action: hang, select: {nodes: '6-9'}}\n"
                   "  - {action: hang, select: {ranks: 'node 9'}}\n")
    assert problems(text) == [
        "s.yaml:5:36: faults[0].select.ranks: rank 70 is outside the world of 64 ranks",
        "s.yaml:6:36: faults[1].select.ranks: the range 9-4 runs backwards",
        "s.yaml:7:36: faults[2].select.ranks: cannot read 'one' as ranks: use R, A-B, a list "
        "of them separated by commas, or node N",
        "s.yaml:8:35: faults[3].select.node: node 8 is outside the world: nodes are 0-7",
        "s.yaml:9:36: faults[4].select.nodes: node 9 is outside the world: nodes are 0-7",
        "s.yaml:10:36: faults[5].select.ranks: node 9 is outside the world: nodes are 0-7",
    ]


def test_lint_resolves_no_selector_in_a_huge_world():
    text = ("name: t\nworld: {size: 1000000000, rank: 0}\nrun: {command: [a]}\nfaults:\n"
            "  - {action: hang, select: {fraction: 0.5}}\n"
            "  - {action: hang, select: {ranks: 0-999999999}}\n"
            "  - {action: hang, select: {nodes: 0-124999999}}\n"
            "  - {action: hang, select: {nodes: 0-125000000}}\n")
    assert problems(text) == [
        "s.yaml:8:36: faults[3].select.nodes: node 125000000 is outside the world: "
        "nodes are 0-124999999"]


def test_text_values_that_must_mean_something():
    text = HEAD.replace("run: {command: [python, train.py]}",
                        "run: {command: [], env: {A-B: 1}}") + (
        "expect:\n  - exception: {type: 'not a name', match: '(unclosed'}\n"
        "  - digests: {3: xyz, 4: 6d86199f}\n  - digests: {}\n")
    assert problems(text) == [
        "s.yaml:3:7: run.command: must not be empty",
        "s.yaml:5:23: expect[0].exception.type: 'not a name' is not an exception class name "
        "(DistBackendError, torch.distributed.DistBackendError)",
        "s.yaml:5:44: expect[0].exception.match: is not a regular expression: missing ), "
        "unterminated subpattern at position 0",
        "s.yaml:6:18: expect[1].digests[3]: 'xyz' is not a digest: give 8 to 32 hex digits "
        "of the report's digest",
        "s.yaml:7:5: expect[2].digests: must not be empty",
    ]
    assert problems(HEAD + "expect:\n  - digests: {4: 6d86199f, 04: 6d86199f, 0: 6d86199f}\n") == [
        "s.yaml:5:28: expect[0].digests[4]: iteration 4 is given twice",
        "s.yaml:5:42: expect[0].digests[0]: iteration 0 is not >= 1",
    ]
    # the command error hides the env one: Run's rules run once its fields read cleanly
    assert problems(HEAD.replace("[python, train.py]}", "[a], env: {A-B: 1}}")) == [
        "s.yaml:3:27: run.env.A-B: 'A-B' is not an environment variable name"]


# -- conflicting choices -------------------------------------------------------------------


def test_run_takes_exactly_one_of_command_example_snapshot():
    assert problems(HEAD.replace("[python, train.py]", "[a], example: {}")) == [
        "s.yaml:3:21: run.example: give one of command, example, snapshot, not both command "
        "and example"]
    assert problems(HEAD.replace("command: [python, train.py]", "graph: g.prism")) == [
        "s.yaml:3:1: run: give one of command, example, snapshot"]
    assert problems(HEAD.replace("command: [python, train.py]", "snapshot: s, env: {A: 1}")) == [
        "s.yaml:3:20: run.env: a restored snapshot keeps the environment it was taken with"]


def test_selector_trigger_duration_conflicts():
    text = HEAD + ("faults:\n"
                   "  - action: hang\n    select: {ranks: 4, node: 0}\n"
                   "    at: {iteration: 2, time_s: 1}\n    for: {iterations: 1, time_s: 1}\n"
                   "  - action: hang\n    select: {family: dp}\n    at: {collective: 3}\n"
                   "  - action: hang\n    select: {group: 1, class: 0}\n    at: {}\n")
    assert problems(text) == [
        "s.yaml:6:30: faults[0].select.node: give one of ranks, node, nodes, family, class, "
        "fraction, not both ranks and node",
        "s.yaml:7:32: faults[0].at.time_s: faults start at an iteration (and a collective in "
        "it); time_s triggers are not supported",
        "s.yaml:8:34: faults[0].for.time_s: give one of iterations, time_s, not both "
        "iterations and time_s",
        "s.yaml:10:5: faults[1].select: family needs group: the group's index in the family",
        "s.yaml:11:5: faults[1].at: give iteration: the iteration it starts at, counting from 1",
        "s.yaml:11:22: faults[1].at.collective: collective counts within an iteration: give "
        "iteration too",
        "s.yaml:13:21: faults[2].select.group: group goes with family",
        "s.yaml:14:5: faults[2].at: give iteration: the iteration it starts at, counting from 1",
    ]
    assert problems(HEAD + "faults:\n  - action: hang\n    select: {ranks: 4}\n"
                           "    at: {time_s: 1, collective: 3}\n") == [
        "s.yaml:7:33: faults[0].at.collective: collective counts within an iteration: give "
        "iteration too"]


def test_action_specific_conflicts():
    text = HEAD + ("faults:\n"
                   "  - action: fail\n    select: {ranks: 4}\n    for: {iterations: 1}\n"
                   "  - action: link\n    select: {ranks: 4}\n    latency_us: 5\n"
                   "  - action: link\n    select: {nodes: 1}\n"
                   "  - action: corrupt\n    select: {ranks: 4}\n    scale: 1\n")
    assert problems(text) == [
        "s.yaml:7:5: faults[0].for: a failed rank does not come back: remove for "
        "(hang with for resumes)",
        "s.yaml:9:5: faults[1].select: a link fault selects nodes (their network links): "
        "use node or nodes",
        "s.yaml:11:5: faults[2]: a link fault needs bandwidth_factor, latency_us or both",
        "s.yaml:15:12: faults[3].scale: must be a finite number other than 1, got 1.0",
    ]


def test_expectation_conflicts():
    text = HEAD + ("expect:\n"
                   "  - iteration_time: {relative: 1.2, max_s: 2}\n"
                   "  - iteration_time: {max_s: 2, tolerance: 0.1}\n"
                   "  - iteration_time: {min_s: 3, max_s: 2}\n"
                   "  - iteration_time: {iteration: 2}\n"
                   "  - flight_record: {}\n")
    assert problems(text) == [
        "s.yaml:5:32: expect[0].iteration_time.relative: give relative or max_s, not both",
        "s.yaml:6:43: expect[1].iteration_time.tolerance: tolerance goes with relative or "
        "predicted",
        "s.yaml:7:39: expect[2].iteration_time.max_s: max_s 2.0 is less than min_s 3.0",
        "s.yaml:8:5: expect[3].iteration_time: give max_s, min_s, relative (to a baseline run) "
        "or predicted: true",
        "s.yaml:9:5: expect[4].flight_record: give missing_ranks, mismatch, culprits or several",
    ]


def test_time_is_a_trigger_only_for_a_hangs_stall():
    text = HEAD + ("faults:\n"
                   "  - {action: slow, factor: 2, select: {ranks: '1'}, at: {time_s: 3}}\n"
                   "  - {action: slow, factor: 2, select: {ranks: '1'}, for: {time_s: 3}}\n"
                   "  - {action: hang, select: {ranks: '1'}, for: {iterations: 2}}\n"
                   "  - {action: hang, select: {ranks: '1'}, for: {time_s: 0.5}}\n"
                   "expect:\n  - iteration_time: {predicted: true, relative: 1.1}\n")
    assert problems(text) == [
        "s.yaml:5:66: faults[0].at.time_s: faults start at an iteration (and a collective in "
        "it); time_s triggers are not supported",
        "s.yaml:6:67: faults[1].for.time_s: a slow fault lasts whole iterations: for: "
        "{iterations: N} (time_s is a hang's stall)",
        "s.yaml:7:60: faults[2].for.iterations: a hang stalls for time_s seconds, or lasts for "
        "good without for",
        "s.yaml:10:33: expect[0].iteration_time.predicted: give relative or predicted, not both",
    ]


def test_expectation_items_hold_exactly_one_known_kind():
    text = HEAD + ("expect:\n  - exit_code: 1\n    nan_at: {iteration: 1}\n"
                   "  - {}\n  - exceptoin: {type: X}\n  - bogus: 1\n")
    assert problems(text) == [
        "s.yaml:6:5: expect[0]: one expectation per item: start a new item (- ) for 'nan_at'",
        "s.yaml:7:5: expect[1]: empty expectation: give one of exception, exit_code, "
        "iteration_time, flight_record, nan_at, digests",
        "s.yaml:8:5: expect[2]: unknown key 'exceptoin': did you mean 'exception'?",
        "s.yaml:9:5: expect[3]: unknown key 'bogus': expected one of exception, exit_code, "
        "iteration_time, flight_record, nan_at, digests",
    ]


def test_rules_across_sections():
    text = ("name: t\nworld: {size: 36, rank: 5}\n"
            "run:\n  example: {tp: 2, pp: 4, iterations: 4}\n  iterations: 6\n"
            "faults:\n  - {action: hang, select: {ranks: 4}, at: {iteration: 7}}\n"
            "expect:\n  - flight_record: {missing_ranks: [4, 36]}\n  - nan_at: {iteration: 9}\n"
            "  - digests: {12: 6d86199f}\n  - iteration_time: {iteration: 8, max_s: 1}\n")
    # run's own rule fails, so the rules needing run wait; the others still run
    assert problems(text) == [
        "s.yaml:5:15: run.iterations: the example runs only 4 iterations (example.iterations), "
        "not 6",
        "s.yaml:9:40: expect[0].flight_record.missing_ranks[1]: rank 36 is outside the world "
        "of 36 ranks",
    ]
    text = text.replace("  iterations: 6\n", "  graph: g.prism\n")  # now the run stops after 4
    assert problems(text) == [
        "s.yaml:4:17: run.example.tp: world size 36 is not divisible by tp*pp = 2*4 = 8",
        "s.yaml:7:56: faults[0].at.iteration: iteration 7: the run stops after iteration 4",
        "s.yaml:9:40: expect[0].flight_record.missing_ranks[1]: rank 36 is outside the world "
        "of 36 ranks",
        "s.yaml:10:25: expect[1].nan_at.iteration: iteration 9: the run stops after iteration 4",
        "s.yaml:11:15: expect[2].digests[12]: iteration 12: the run stops after iteration 4",
        "s.yaml:12:33: expect[3].iteration_time.iteration: iteration 8: the run stops after "
        "iteration 4",
    ]


def test_example_checks_its_own_layout():
    # heads keeps its default (8): its problem points at the example key
    assert problems(HEAD.replace("command: [python, train.py]",
                                 "example: {tp: 3, layers: 6, pp: 4, hidden: 100}")) == [
        "s.yaml:3:7: run.example.heads: hidden 100 is not divisible by heads 8",
        "s.yaml:3:21: run.example.tp: heads 8 is not divisible by tp 3",
        "s.yaml:3:39: run.example.pp: layers 6 is not divisible by pp 4",
    ]


# -- many at once -------------------------------------------------------------------------


def test_every_error_in_a_file_is_reported_in_file_order():
    text = textwrap.dedent("""\
        name: ""
        world: {size: 64, rank: 5}
        run: {command: [python, train.py], timeout_s: -1}
        seed: x
        faults:
          - action: slow
            select: {ranks: "70"}
            factor: 0
          - action: fial
            select: {fraction: 2}
          - action: delay
            select: {ranks: "1-3"}
            seconds: 1
            for: {iteratons: 2}
        expect:
          - exit_code: 999
          - iteration_time: {iteration: 0, relative: 1.1}
        colour: blue
        """)
    expected = [
        "s.yaml:1:7: name: must not be empty",
        "s.yaml:3:47: run.timeout_s: must be > 0, got -1.0",
        "s.yaml:4:7: seed: expected an integer, got the string 'x'",
        "s.yaml:7:21: faults[0].select.ranks: rank 70 is outside the world of 64 ranks",
        "s.yaml:8:13: faults[0].factor: must be > 0, got 0.0",
        "s.yaml:9:13: faults[1].action: 'fial' is not one of delay, slow, link, fail, hang, "
        "nan, inf, corrupt, desync",
        "s.yaml:10:24: faults[1].select.fraction: must be in (0, 1], got 2.0",
        "s.yaml:14:5: faults[2].for: give iterations (how many it lasts) or, for a hang, "
        "time_s (the seconds it stalls)",
        "s.yaml:14:11: faults[2].for: unknown key 'iteratons': did you mean 'iterations'?",
        "s.yaml:16:16: expect[0].exit_code: must be in -255..255, got 999",
        "s.yaml:17:33: expect[1].iteration_time.iteration: must be >= 1, got 0",
        "s.yaml:18:1: unknown key 'colour': expected one of name, description, world, run, "
        "seed, faults, variability, expect",
    ]
    assert problems(text) == expected
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "s.yaml")
    assert [str(p) for p in caught.value.problems] == expected
    assert str(caught.value) == "\n".join(expected)
    assert isinstance(caught.value, ConfigError)
    assert caught.value.problems[0] == Problem(1, 7, "name: must not be empty", "s.yaml")


def test_load_scenario_names_the_file(tmp_path):
    path = tmp_path / "dp.yaml"
    path.write_text(VALID)
    assert load_scenario(path) == parse_scenario(VALID)
    assert load_scenario(str(path)).source == str(path)
    path.write_text(HEAD + "seed: -2\n")
    with pytest.raises(ScenarioError, match=rf"^{path}:4:7: seed: must be >= 0, got -2$"):
        load_scenario(path)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(tmp_path / "missing.yaml")
    assert str(caught.value) == (f"cannot read scenario {tmp_path / 'missing.yaml'}: "
                                 "No such file or directory")
    assert caught.value.problems == []
    (tmp_path / "bin.yaml").write_bytes(b"name: \xff\n")
    with pytest.raises(ScenarioError, match="it is not UTF-8 text"):
        load_scenario(tmp_path / "bin.yaml")


# -- lint never raises ------------------------------------------------------------------


def _assert_sane(text: str) -> None:
    found = lint(text, "f.yaml")
    assert all(isinstance(p, Problem) for p in found)
    assert found == sorted(found, key=lambda p: (p.line, p.column))
    for p in found:
        assert p.line >= 1 and p.column >= 1 and p.message
        assert str(p).startswith(f"f.yaml:{p.line}:{p.column}: ")
    try:
        parse_scenario(text, "f.yaml")
    except ScenarioError as exc:
        assert exc.problems == found and found
    else:
        assert found == []


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_lint_never_raises_on_arbitrary_text(text):
    _assert_sane(text)


KEYS = ["name", "description", "world", "size", "rank", "gpus_per_node", "run", "command",
        "example", "snapshot", "graph", "iterations", "hardware", "timeout_s", "env", "seed",
        "faults", "action", "select", "ranks", "node", "nodes", "family", "group", "class",
        "fraction", "at", "iteration", "collective", "time_s", "for", "seconds", "factor",
        "bandwidth_factor", "latency_us", "intermittent", "period_s", "duty", "kind", "scale",
        "expect", "exception", "type", "match", "exit_code", "iteration_time", "max_s",
        "min_s", "relative", "tolerance", "flight_record", "missing_ranks", "mismatch",
        "nan_at", "digests", "tp", "pp", "<<", "x"] + [a.value for a in Action]
scalars = (st.none() | st.booleans() | st.integers(-3, 100) | st.integers()
           | st.floats(allow_nan=True) | st.sampled_from(KEYS) | st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(KEYS) | st.integers(0, 9), inner,
                                        max_size=5), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=8))
def test_lint_never_raises_on_schema_shaped_yaml(document):
    _assert_sane(yaml.safe_dump(document))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_lint_never_raises_on_a_mangled_valid_file(data):
    lines = VALID.splitlines(keepends=True)
    dropped = data.draw(st.sets(st.integers(0, len(lines) - 1), max_size=6))
    text = "".join(line for i, line in enumerate(lines) if i not in dropped)
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, max(0, len(text) - 1)))
        char = data.draw(st.sampled_from(["0", "-", "x", ":", " ", "\n", "{", "'"]))
        text = text[:at] + char + text[at + 1:]
    _assert_sane(text)
