"""Scenarios of several real ranks (``world: {size, ranks: "0-1"}``): what the
file reads as, what it refuses with line and column, and how each
expectation is judged over the ranks' own observations."""

from __future__ import annotations

import pytest

from prism_debug.errors import ConfigError
from prism_debug.faults import parse_fault
from prism_debug.scenario import World, lint, parse_scenario
from prism_debug.scenario.keys import accepted_keys
from prism_debug.scenario.plan import Observed, evaluate, predicted_ratio, predicted_ratios
from prism_debug.workflows.scenario_lint import ThisMachine
from prism_debug.workflows.scenario_run import run_scenario
from tests.engine.test_replay import constant_cost, pipeline_graph
from tests.scenario.test_lint_surroundings import two_stage_graph

RUN = "run: {command: [prog], graph: profile}\n"


def problems(world: str, body: str = "") -> list[str]:
    text = f"name: t\nworld: {world}\n{RUN}{body}"
    return [str(p) for p in lint(text, "s.yaml")]


# -- the world ---------------------------------------------------------------------------


def test_ranks_name_the_real_ranks_lowest_first():
    def world(text: str) -> World:
        return parse_scenario(f"name: t\nworld: {text}\n{RUN}").world

    pair = world('{size: 8192, ranks: "4096,0"}')
    assert (pair.rank, pair.ranks_text, pair.real_ranks) == (None, "4096,0", (0, 4096))
    assert pair.several_real_ranks
    assert world('{size: 64, ranks: "node 1"}').real_ranks == tuple(range(8, 16))
    # one rank written as ranks is one real rank, as rank is
    assert world('{size: 64, ranks: "5"}').real_ranks == (5,) == world("{size: 64, rank: 5}") \
        .real_ranks
    assert not world('{size: 64, ranks: "5"}').several_real_ranks
    assert World(size=8, ranks_text="0-1").real_ranks == (0, 1)


def test_a_world_takes_rank_or_ranks_within_it_and_at_most_64():
    assert problems('{size: 8, rank: 1, ranks: "0-1"}') == [
        "s.yaml:2:34: world.ranks: give one of rank, ranks, not both rank and ranks"]
    assert problems("{size: 8}") == ["s.yaml:2:1: world: give one of rank, ranks"]
    assert problems('{size: 8, ranks: "0-8"}') == [
        "s.yaml:2:25: world.ranks: rank 8 is outside the world of 8 ranks"]
    assert problems('{size: 8, ranks: "0-x"}') == [
        "s.yaml:2:25: world.ranks: cannot read '0-x' as ranks: use R, A-B, a list of them "
        "separated by commas, or node N"]
    assert problems('{size: 8192, ranks: "0-64"}') == [
        "s.yaml:2:28: world.ranks: '0-64' names more than 64 ranks: a scenario runs at most 64 "
        "real ranks (each is a process of its own)"]
    assert problems('{size: 8192, ranks: "0-63"}') == []
    # counted before anything is expanded
    assert problems('{size: 2147483647, ranks: "0-2147483646"}') == [
        "s.yaml:2:34: world.ranks: '0-2147483646' names more than 64 ranks: a scenario runs "
        "at most 64 real ranks (each is a process of its own)"]
    with pytest.raises(ConfigError, match=r"^World: give one of rank, ranks$"):
        World(size=8)


def test_rank_and_ranks_exclude_each_other_in_suggestions():
    assert "ranks" not in accepted_keys(World, {"size", "rank"})
    assert "rank" not in accepted_keys(World, {"size", "ranks"})
    assert {"rank", "ranks"} <= set(accepted_keys(World, {"size"}))
    assert problems('{size: 8, rank: 1, rnks: "0-1"}') == [
        "s.yaml:2:27: world: unknown key 'rnks': expected one of size, rank, gpus_per_node"]


# -- what several real ranks refuse --------------------------------------------------------


def test_several_real_ranks_may_start_from_a_cut():
    # (the runner checks the cut against the store: tests/runner/test_cuts.py)
    text = 'name: t\nworld: {size: 64, ranks: "0-1"}\nrun: {snapshot: c1a2b3c4d-it2}\n'
    assert lint(text, "s.yaml") == []


def test_a_fault_that_would_hit_only_real_ranks_is_refused_naming_them():
    body = ("faults:\n"
            "  - {action: delay, select: {ranks: '1'}, seconds: 0.1}\n"
            "  - {action: slow, select: {node: 0}, factor: 2}\n"
            "  - {action: fail, select: {ranks: '0-2'}}\n"
            "  - {action: hang, select: {fraction: 0.01, seed: k}}\n")
    assert problems('{size: 64, ranks: "0-7"}', body) == [
        "s.yaml:5:37: faults[0].select.ranks: rank 1 is a real rank (world.ranks 0-7): a fault "
        "acts on virtual peers only, so this one would hit nobody; select a virtual rank",
        "s.yaml:6:35: faults[1].select.node: ranks 0-7 are real ranks (world.ranks 0-7): a "
        "fault acts on virtual peers only, so this one would hit nobody; select a virtual rank",
        "s.yaml:7:36: faults[2].select.ranks: ranks 0-2 are real ranks (world.ranks 0-7): a "
        "fault acts on virtual peers only, so this one would hit nobody; select a virtual rank",
        # one rank of 64 drawn with seed k: random.Random("k").sample(range(64), 1) == [4]
        "s.yaml:8:39: faults[3].select.fraction: rank 4 is a real rank (world.ranks 0-7): a "
        "fault acts on virtual peers only, so this one would hit nobody; select a virtual rank",
    ]
    # faults that hit virtual peers beside real ranks are taken (the run says
    # which real ranks they spare), and seed s draws rank 61; one real rank
    # keeps today's rules
    assert problems('{size: 64, ranks: "0-7"}', body.replace("'1'", "'1,9'").replace(
        "node: 0", "nodes: '0-1'").replace("'0-2'", "'0-9'").replace("seed: k", "seed: s")) \
        == []
    assert parse_scenario(f'name: t\nworld: {{size: 64, rank: 1}}\n{RUN}{body}') \
        .fault_ranks(3) == [4]
    assert problems("{size: 64, rank: 1}", body) == []


def test_a_group_of_real_ranks_is_refused_once_the_graph_is_known(tmp_path):
    two_stage_graph().save(tmp_path / "g.prism")  # pp 2 x tp 2: tp groups {0,1}, {2,3}
    text = ('name: t\nworld: {size: 4, ranks: "0-1", gpus_per_node: 2}\n'
            "run: {command: [python, train.py], graph: g.prism}\n"
            "faults:\n"
            "  - {action: delay, select: {family: tp, group: 0}, seconds: 0.1}\n"
            "  - {action: delay, select: {family: tp, group: 1}, seconds: 0.1}\n"
            "  - {action: slow, select: {class: 0}, factor: 2}\n")
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert [str(p) for p in lint(text, str(path), ThisMachine())] == [
        f"{path}:5:38: faults[0].select.family: ranks 0-1 are real ranks (world.ranks 0-1): a "
        "fault acts on virtual peers only, so this one would hit nobody; select a virtual rank",
        f"{path}:7:36: faults[2].select.class: ranks 0-1 are real ranks (world.ranks 0-1): a "
        "fault acts on virtual peers only, so this one would hit nobody; select a virtual rank",
    ]


def test_a_fraction_the_scenarios_seed_draws_onto_real_ranks_is_refused_before_any_run(
        tmp_path):
    # seeded_faults draws fault 0's one rank of 4 with seed "6/0":
    # random.Random("6/0").sample(range(4), 1) == [1], a real rank; "0/0" draws 2
    two_stage_graph().save(tmp_path / "g.prism")
    (tmp_path / "train.py").write_text("raise SystemExit('never started')\n")
    text = ('name: t\nworld: {size: 4, ranks: "0-1", gpus_per_node: 2}\nseed: 6\n'
            "run: {command: [python, train.py], graph: g.prism}\n"
            "faults:\n  - {action: delay, select: {fraction: 0.25}, seconds: 0.1}\n")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    scenario = parse_scenario(text, str(path))
    assert scenario.fault_ranks(0) == [1]
    assert parse_scenario(text.replace("seed: 6", "seed: 0")).fault_ranks(0) == [2]
    with pytest.raises(ConfigError) as refused:
        run_scenario(scenario, run_dir=tmp_path / "runs")
    assert str(refused.value) == (
        f"{path}:6: faults[0].select: rank 1 is a real rank (world.ranks 0-1): a fault acts "
        "on virtual peers only, so this one would hit nobody; select a virtual rank")
    assert not any((tmp_path / "runs").rglob("rank-*"))  # no rank started


def test_one_ranks_views_are_refused_beside_several_real_ranks():
    body = ("expect:\n"
            "  - flight_record: {missing_ranks: [4]}\n"
            "  - iteration_time: {percentile: 99, predicted: true, max_s: 1}\n"
            "  - iteration_time: {predicted: true}\n"
            "  - digests: {rank: 1, 3: 6d86199f}\n"
            "  - digests: {rank: 2, 3: 6d86199f}\n")
    assert problems('{size: 64, ranks: "0-1"}', body) == [
        "s.yaml:5:5: expect[0].flight_record: a scenario of several real ranks does not judge "
        "a flight record: each real rank dumps its own; expect an exception or an exit_code "
        "instead",
        "s.yaml:6:49: expect[1].iteration_time.predicted: prism-debug predict gives one rank's "
        "iteration times; a scenario of several real ranks bounds the run's own percentile "
        "(leave predicted out)",
        "s.yaml:9:21: expect[4].digests.rank: rank 2 is not a real rank: the report has "
        "digests of ranks 0-1 only",
    ]
    assert problems("{size: 64, rank: 1}", body) == [
        "s.yaml:9:21: expect[4].digests.rank: rank 2 is not a real rank: the report has "
        "digests of rank 1 only"]


def test_a_digests_rank_is_read_beside_its_iterations():
    s = parse_scenario('name: t\nworld: {size: 64, ranks: "0-1"}\n' + RUN
                       + "expect:\n  - digests: {3: 6d86199f, rank: 1}\n"
                         "  - digests: {3: 0a0b0c0d}\n")
    assert [(e.rank, e.digests) for e in s.expect] == [(1, ((3, "6d86199f"),)),
                                                       (None, ((3, "0a0b0c0d"),))]
    assert problems('{size: 64, ranks: "0-1"}',
                    "expect:\n  - digests: {rank: 1, rank: 0, 3: 6d86199f}\n"
                    "  - digests: {rank: one, 3: 6d86199f}\n  - digests: {rank: 1}\n") == [
        "s.yaml:5:24: expect[0].digests: duplicate key 'rank' (first on line 5)",
        "s.yaml:6:21: expect[1].digests.rank: expected an integer, got the string 'one'",
        "s.yaml:7:5: expect[2].digests: must not be empty",
    ]


# -- verdicts over several real ranks ------------------------------------------------------

EXPECT = ("expect:\n"
          "  - exit_code: 0\n"
          "  - exception: {type: DistBackendError}\n"
          "  - iteration_time: {iteration: 2, max_s: 0.25}\n"
          "  - iteration_time: {percentile: 100, min_s: 0.5}\n"
          "  - nan_at: {iteration: 3}\n"
          "  - digests: {2: 6d86199f}\n"
          "  - digests: {rank: 1, 2: 0a0b0c0d}\n"
          "  - iteration_time: {relative: 2, tolerance: 0.1}\n"
          "  - iteration_time: {predicted: true, tolerance: 0.1}\n")


def several(**ranks: dict) -> Observed:
    """The run's observation: each rank's, the lowest's on top, the run's exit
    code the first failure's (given as ``exit_code`` of the top)."""
    seen = {int(r[1:]): Observed(**{"exit_code": 0, "exception": None, "digests": {},
                                    **fields}) for r, fields in ranks.items()}
    lowest = seen[min(seen)]
    first_failure = next((o.exit_code for o in seen.values() if o.exit_code), 0)
    return Observed(**{**vars(lowest), "exit_code": first_failure, "ranks": seen})


def test_each_expectation_over_several_real_ranks():
    s = parse_scenario('name: t\nworld: {size: 64, ranks: "0-1"}\n' + RUN + EXPECT)
    seen = several(
        r0={"iteration_times": {1: 1.0, 2: 0.1, 3: 0.6}, "digests": {2: "6d86199fb54262f3"}},
        r1={"iteration_times": {1: 1.0, 2: 0.6, 3: 0.1}, "digests": {2: "0a0b0c0d00000000"},
            "nonfinite_iteration": 3})
    base = several(r0={"iteration_times": {1: 1.0, 2: 0.1, 3: 0.3}},
                   r1={"iteration_times": {1: 1.0, 2: 0.3, 3: 0.1}})
    assert [v.line() for v in evaluate(s, seen, base, {0: 1.75, 1: 1.0})] == [
        "PASS  exit code 0: got 0",
        "FAIL  rank 0: exception DistBackendError: the rank raised none (exit code 0); rank 1: "
        "exception DistBackendError: the rank raised none (exit code 0)",
        "FAIL  rank 1: iteration 2 time in [0.0 ms, 250.0 ms]: got 600.0 ms",
        "PASS  rank 0: p100 of iteration times >= 500.0 ms: got 600.0 ms over 2 iterations; "
        "rank 1: p100 of iteration times >= 500.0 ms: got 600.0 ms over 2 iterations",
        "PASS  first NaN/inf a real rank sends at iteration 3: got iteration 3 (rank 1)",
        "PASS  rank 0: digests of iterations 2: equal",
        "PASS  rank 1: digests of iterations 2: equal",
        # the medians after the first: (0.1, 0.6) against (0.1, 0.3), x1.75 on both ranks
        "FAIL  rank 0: median iteration time x2 ±0.1 of the baseline's: got x1.750 (350.0 vs "
        "200.0 ms); rank 1: median iteration time x2 ±0.1 of the baseline's: got x1.750 "
        "(350.0 vs 200.0 ms)",
        "FAIL  rank 1: median iteration time x1.000 (predicted) ±0.1 of the baseline's: got "
        "x1.750 (350.0 vs 200.0 ms)",
    ]


def test_the_runs_exit_code_and_the_rank_whose_output_shows_the_exception():
    s = parse_scenario('name: t\nworld: {size: 64, ranks: "0-2"}\n' + RUN
                       + "expect:\n  - exit_code: 134\n"
                         "  - exception: {type: DistBackendError, match: Watchdog}\n")
    seen = several(r0={"exit_code": 143, "iteration_times": {}},
                   r1={"exit_code": 134, "iteration_times": {},
                       "exception": ("c10::DistBackendError", "Watchdog caught")},
                   r2={"exit_code": 0, "iteration_times": {}})
    seen = Observed(**{**vars(seen), "exit_code": 134})  # rank 1 failed first
    assert [v.line() for v in evaluate(s, seen)] == [
        "PASS  exit code 134: got 134 (rank 0: 143, rank 1: 134)",
        "PASS  rank 1: exception DistBackendError matching 'Watchdog': got "
        "c10::DistBackendError: Watchdog caught",
    ]


def test_a_verdict_names_at_most_four_ranks():
    s = parse_scenario('name: t\nworld: {size: 64, ranks: "0-5"}\n' + RUN
                       + "expect:\n  - iteration_time: {iteration: 2, max_s: 0.1}\n")
    seen = several(**{f"r{r}": {"iteration_times": {2: 0.2}} for r in range(6)})
    (verdict,) = evaluate(s, seen)
    assert verdict.line() == "FAIL  " + "; ".join(
        f"rank {r}: iteration 2 time in [0.0 ms, 100.0 ms]: got 200.0 ms" for r in range(4)) \
        + "; and 2 more rank(s)"


def test_each_real_ranks_predicted_ratio_is_its_own_replays():
    # pipeline_graph: stage 0 (ranks 0-1) 1 s, stage 1 (ranks 2-3) waits on its
    # sends; 1.2 s an iteration.  Stage 0 x1.5: 1.7 s for both stages.
    slow = [parse_fault("slow 0-1 1.5")]
    ratios = predicted_ratios(pipeline_graph(), constant_cost, (0, 2), slow, 3)
    assert ratios == pytest.approx({0: 1.7 / 1.2, 2: 1.7 / 1.2})
    assert ratios == {r: predicted_ratio(pipeline_graph(), constant_cost, r, slow, 3)
                      for r in (0, 2)}
