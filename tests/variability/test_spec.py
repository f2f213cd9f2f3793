"""The --variability language and its files: what each term means, one
VariabilityError naming the term and what to give for every bad input, and
the check against a graph."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from prism_debug.errors import VariabilityError
from prism_debug.variability import (
    Distribution,
    Rule,
    Variability,
    load_variability,
    parse_variability,
)
from tests.engine.test_replay import pipeline_graph

OPS = ("all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, "
       "scatter, barrier, send, recv")


def test_terms_make_rules():
    variability = parse_variability([
        "cv=0.05", "cv=0.1 dist=gamma class=1", "class=0-1 op=allreduce cv=0.02 dist=normal",
        "rank-cv=0.03", "fitted op=end", "op=end cv=0.2",
    ])
    assert variability.rules == (
        Rule(cv=0.05),
        Rule(cv=0.1, dist="gamma", classes=(1, 1)),
        Rule(cv=0.02, dist="normal", classes=(0, 1), op="all_reduce"),  # canonical spelling
        Rule(rank_cv=0.03),
        Rule(fitted=True, op="end"),
        Rule(cv=0.2, op="end"),
    )
    assert variability.rules[0].noise() == Distribution.with_cv("lognormal", 0.05)
    assert variability.rules[3].rank_distribution() == Distribution.with_cv("lognormal", 0.03)


def test_describe_is_one_line_per_variability():
    assert parse_variability(["cv=0.05 rank-cv=0.02"]).describe() == \
        "cv=0.05 lognormal on every class; rank-cv=0.02"
    assert parse_variability(["class=0-2 op=all_reduce cv=0.1 dist=gamma", "fitted class=3",
                              "class=1 rank-cv=0.03"]).describe() == \
        "cv=0.1 gamma on classes 0-2 before all_reduce; fitted distributions on class 3; " \
        "rank-cv=0.03 lognormal on class 1"
    assert Variability().describe() == "none"


def test_rules_cover_their_classes_and_ops():
    rule = Rule(cv=0.1, classes=(1, 2), op="send")
    assert [rule.covers(c, "send") for c in range(4)] == [False, True, True, False]
    assert not rule.covers(1, "recv")
    assert Rule(cv=0.1).covers(7, "end")


def test_dict_round_trip_and_term_spelling():
    variability = parse_variability(["class=0-2 op=all_reduce cv=0.1 dist=gamma",
                                     "fitted class=3", "rank-cv=0.02"])
    assert Variability.from_dict(variability.to_dict()) == variability
    assert variability.to_dict() == {"variability": [
        {"cv": 0.1, "dist": "gamma", "class": "0-2", "op": "all_reduce"},
        {"fitted": True, "class": 3},
        {"dist": "lognormal", "rank_cv": 0.02},
    ]}
    assert parse_variability([r.term() for r in variability.rules]) == variability
    assert len({variability, parse_variability(["fitted class=3"])}) == 2  # hashable


@pytest.mark.parametrize("term, message", [
    ("sigma=0.1", "unknown key 'sigma': use cv, dist, class, op, rank-cv or fitted"),
    ("cv=-0.1", "cv must be a number from 0 to 2 (a coefficient of variation: 0.05 is 5 %), "
                "got '-0.1'"),
    ("cv=2.5", "cv must be a number from 0 to 2 (a coefficient of variation: 0.05 is 5 %), "
               "got '2.5'"),
    ("cv=nan", "cv must be a number from 0 to 2 (a coefficient of variation: 0.05 is 5 %), "
               "got 'nan'"),
    ("rank-cv=x", "rank-cv must be a number from 0 to 2 (a coefficient of variation: 0.05 is "
                  "5 %), got 'x'"),
    ("cv=0.1 dist=weibull", "dist must be one of normal, gamma, lognormal, got 'weibull'"),
    ("class=2-1 cv=0.1", "class must be a class number or a range like 0-2, got '2-1'"),
    ("class=-1 cv=0.1", "class must be a class number or a range like 0-2, got '-1'"),
    ("op=allreduse cv=0.1", f"op must be an op kind ({OPS}) or end, got 'allreduse'"),
    ("op=send rank-cv=0.1", "rank-cv is a rank's factor on all its compute: it takes class= but "
                            "not op= (give the op's noise in a term of its own)"),
    ("cv=0.1 cv=0.2", "cv given twice: give it once"),
    ("fitted cv=0.1", "fitted and cv= both say how the gaps vary: give one per term (a later "
                      "term overrides an earlier one)"),
    ("fitted dist=gamma", "dist= is the family of cv= and rank-cv=: give one of them with it"),
    ("class=3", "states no variability: give cv=, rank-cv= or fitted"),
    ("cv=0.1 gamma", "'gamma' is not key=value: use cv, dist, class, op, rank-cv or fitted"),
    ("   ", "is empty: give cv=0.05, rank-cv=0.02 or fitted"),
    ("no-such-file.yaml", "no such file, and not a term: give cv=0.05, rank-cv=0.02, fitted "
                          "(with class=, op=, dist=), or a YAML file's path"),
])
def test_a_bad_term_is_one_error_naming_it(term, message):
    with pytest.raises(VariabilityError) as caught:
        parse_variability(["cv=0.01", term])
    assert str(caught.value) == f"--variability {term!r}: {message}"


@example("~0")  # ~user of no such user: no home to expand, not a file
@given(st.text(max_size=30))
def test_any_text_parses_or_is_refused_with_a_variability_error(term):
    try:
        variability = parse_variability([term])
    except VariabilityError as exc:
        assert str(exc).startswith(f"--variability {term!r}: ")
    else:
        assert Variability.from_dict(variability.to_dict()) == variability


# -- files ------------------------------------------------------------------------------


def test_a_file_holds_the_same_rules(tmp_path):
    path = tmp_path / "noise.yaml"
    path.write_text("variability:\n"
                    "  - {cv: 0.05, dist: gamma, class: 3, op: all_reduce}\n"
                    "  - rank_cv: 0.03\n"
                    "    class: 0-1\n"
                    "  - fitted\n"
                    "  - cv=0.2 op=end\n")
    expected = (Rule(cv=0.05, dist="gamma", classes=(3, 3), op="all_reduce"),
                Rule(rank_cv=0.03, classes=(0, 1)), Rule(fitted=True), Rule(cv=0.2, op="end"))
    assert load_variability(path).rules == expected
    # a path among terms: its rules where it stands
    assert parse_variability(["cv=0.5", str(path), "cv=0.1"]).rules == \
        (Rule(cv=0.5),) + expected + (Rule(cv=0.1),)
    path.write_text("variability: [{cv: 9}]\n")
    with pytest.raises(VariabilityError) as caught:
        parse_variability([str(path)])
    assert str(caught.value) == (f"--variability {str(path)!r}: {path}:1: variability[0].cv: cv "
                                 "must be a number from 0 to 2 (a coefficient of variation: 0.05 "
                                 "is 5 %), got 9")


@pytest.mark.parametrize("text, message", [
    ("variability:\n  - {cv: 0.05}\n  - {cv: 0.1, sigma: 2}\n",
     ":3: variability[1].sigma: unknown key 'sigma': use cv, dist, class, op, rank-cv or fitted"),
    ("variability:\n  - cv: 3\n", ":2: variability[0].cv: cv must be a number from 0 to 2 (a "
                                  "coefficient of variation: 0.05 is 5 %), got 3"),
    ("variability:\n  - cv: '0.1'\n", ":2: variability[0].cv: cv must be a number from 0 to 2 "
                                      "(a coefficient of variation: 0.05 is 5 %), got '0.1'"),
    ("variability:\n\n  - cv: 0.1\n    dist: beta\n",
     ":4: variability[0].dist: dist must be one of normal, gamma, lognormal, got 'beta'"),
    ("variability:\n  - cv=0.1 dist=beta\n",
     ":2: variability[0]: --variability 'cv=0.1 dist=beta': dist must be one of normal, gamma, "
     "lognormal, got 'beta'"),
    ("variability:\n  - 7\n", ":2: variability[0] must be a mapping of cv, dist, class, op, "
                              "rank_cv, fitted, or a term's text, got 7"),
    ("noise: [{cv: 0.1}]\n", ":1: the file must be a mapping with one key, variability: a list "
                             "of rules (variability: [{cv: 0.05}, fitted])"),
    ("variability: {cv: 0.1}\n", ":1: variability must be a list of at most 1024 rules, got "
                                 "dict"),
    ("variability:\n  - {cv: 0.1\n", ":3: not YAML: expected ',' or '}', but got '<stream end>'; "
                                     "give variability: [{cv: 0.05}]"),
])
def test_a_bad_file_is_one_error_with_its_line(tmp_path, text, message):
    path = tmp_path / "v.yaml"
    path.write_text(text)
    with pytest.raises(VariabilityError) as caught:
        load_variability(path)
    assert str(caught.value) == f"{path}{message}"


def test_a_missing_or_unreadable_file(tmp_path):
    with pytest.raises(VariabilityError) as caught:
        load_variability(tmp_path / "none.yaml")
    assert str(caught.value) == f"no variability file at {tmp_path / 'none.yaml'}: give a YAML " \
                                "file (variability: [{cv: 0.05}]) or terms like cv=0.05"
    with pytest.raises(VariabilityError) as caught:
        load_variability(tmp_path)  # a folder
    assert str(caught.value) == f"cannot read the variability file {tmp_path}: Is a directory"


# -- against a graph -----------------------------------------------------------------


def test_check_accepts_what_the_graph_has():
    parse_variability(["class=0-1 cv=0.1", "op=send cv=0.1", "op=end cv=0.1", "class=1 op=recv "
                       "cv=0.1", "rank-cv=0.1"]).check(pipeline_graph())


@pytest.mark.parametrize("term, message", [
    ("class=2 cv=0.1", "class 2 is not in the graph: it has classes 0-1"),
    ("class=1-3 cv=0.1", "class 1-3 is not in the graph: it has classes 0-1"),
    ("op=all_gather cv=0.1", "the graph's classes issue no all_gather: they issue all_reduce, "
                             "recv, send (op=end: the gap before the iteration's end)"),
    ("class=0 op=recv cv=0.1", "the graph's class 0 issue no recv: they issue all_reduce, send "
                               "(op=end: the gap before the iteration's end)"),
    ("fitted", "the graph (format version 3) has no fitted distributions for its classes: "
               "profile the job again with this prism-debug (graph version 3 fits the steady "
               "iterations' gaps), or state cv="),
])
def test_check_names_what_the_graph_lacks(term, message):
    variability = parse_variability([term])
    with pytest.raises(VariabilityError) as caught:
        variability.check(pipeline_graph())
    assert str(caught.value) == f"--variability {variability.rules[0].term()!r}: {message}"
