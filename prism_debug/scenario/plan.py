"""From what a scenario's run showed to verdicts, and what the replay engine
predicts of its faults.

Pure core: the adapter that launches the rank (``workflows/scenario_run.py``)
hands in what it observed as an :class:`Observed`; everything that decides
PASS or FAIL is here, so it is tested without running anything.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import cast

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.compute import ComputeModel
from prism_debug.engine.injection import apply_fault
from prism_debug.engine.replay import CostFn, ReplayEngine
from prism_debug.faults import DesyncKind, Fault, resolve
from prism_debug.graph import ExecutionGraph
from prism_debug.scenario.model import (
    Expectation,
    ExpectDigests,
    ExpectException,
    ExpectExitCode,
    ExpectFlightRecord,
    ExpectIterationTime,
    ExpectNanAt,
    Scenario,
)

# fr_trace's error types, by the desync kind that causes them
MISMATCH_ERRORS = {
    "SIZE_OR_SYNTAX_MISMATCH": DesyncKind.SIZE,
    "COLLECTIVE_DTYPE_MISMATCH": DesyncKind.DTYPE,
    "COLLECTIVE_TYPE_MISMATCH": DesyncKind.OP,
    "COLLECTIVE_OPERATION_MISMATCH": DesyncKind.OP,
}


# -- what a run showed ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FlightFindings:
    """What torch's analyzer said of the flight-record dump, and only that."""

    missing_ranks: frozenset[int]
    mismatches: frozenset[str]  # DesyncKind values
    text: str  # the analyzer's output, for reports
    # why the analyzer's word cannot be taken (it crashed, timed out, said
    # nothing it could be judged by); None: it ran and reported
    failure: str | None = None
    culprits: frozenset[int] = frozenset()  # the ranks it names "Culprit rank R"


@dataclasses.dataclass(frozen=True)
class Observed:
    exit_code: int
    exception: tuple[str, str] | None  # (type as printed, message)
    iteration_times: dict[int, float]
    digests: dict[int, str]
    nonfinite_iteration: int | None = None
    flight: FlightFindings | None = None
    # a run of several real ranks: each rank's own, lowest first (the fields
    # above are then the lowest rank's, with the run's exit code), as a
    # RunResult's ``ranks``
    ranks: dict[int, Observed] = dataclasses.field(default_factory=dict)


def exception_from_output(lines: Iterable[str]) -> tuple[str, str] | None:
    """The exception that ended the rank, from its output: the last Python
    traceback's last line, or the C++ ``terminate`` lines the watchdog prints."""
    found = None
    in_traceback = False
    lines = [re.sub(r"^\[rank\d+\]:", "", line.rstrip("\n")) for line in lines]
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if in_traceback and line and not line.startswith((" ", "\t")):
            match = re.match(r"([A-Za-z_][\w.]*)(?::\s?(.*))?$", line)
            if match:
                found = (match.group(1), match.group(2) or "")
            in_traceback = False
        terminate = re.match(r"terminate called after throwing an instance of '([^']+)'", line)
        if terminate:
            what = lines[i + 1] if i + 1 < len(lines) else ""
            found = (terminate.group(1), what.strip().removeprefix("what():").strip())
    return found


# fr_trace's lines that judge a collective (utils.py's error_analysis): a
# missing rank, a dump it lacked, an error type, or nothing wrong found
_MISSING = re.compile(r"^missing ranks: \{([\d, ]*)\}$", re.M)
_NO_DUMP = re.compile(r"we missed FR dumps from ranks \(\{([\d, ]*)\}\)")
_ERROR_TYPE = re.compile(r"Error type: (\w+)")
_CULPRIT = re.compile(r"Culprit rank (\d+)")
_NO_ERRORS = "No errors found for this collective entry"


def flight_findings(text: str, exit_code: int | None = 0,
                    failure: str | None = None) -> FlightFindings:
    """Parse fr_trace's output: what it names is all there is.  Ranks it
    names missing from a collective, or whose dumps it lacked (a fail-stopped
    rank writes none), are missing; each error type maps to a desync kind.
    It failed (``failure``) when it did not exit 0 (``exit_code`` None: it never
    finished) or said nothing a verdict can rest on."""
    missing: set[int] = set()
    for pattern in (_MISSING, _NO_DUMP):
        for match in pattern.finditer(text):
            missing.update(int(r) for r in match.group(1).split(",") if r.strip())
    types = [m.group(1) for m in _ERROR_TYPE.finditer(text)]
    mismatches = {str(MISMATCH_ERRORS[t]) for t in types if t in MISMATCH_ERRORS}
    if failure is None:
        if exit_code is None:
            failure = "fr_trace did not finish"
        elif exit_code != 0:
            failure = f"fr_trace exited with code {exit_code}"
        elif not (missing or types or _NO_ERRORS in text):
            failure = ("fr_trace printed no finding" if text.strip()
                       else "fr_trace printed nothing")
    culprits = frozenset(int(m.group(1)) for m in _CULPRIT.finditer(text))
    return FlightFindings(frozenset(missing), frozenset(mismatches), text, failure, culprits)


# where fr_trace starts saying something of one collective
_BLOCK_START = re.compile(r"^(?:Not all ranks joining collective|Collective sequence number:"
                          r"|We cannot decide)", re.M)
_GROUP_INFO = re.compile(r"^group info: ([^:\s]+):", re.M)


def group_findings(findings: FlightFindings, group: str,
                   members: Iterable[int]) -> FlightFindings:
    """What fr_trace said of one group: the collectives it reports under
    ``group info: GROUP:…``, and of the ranks it missed dumps from (it names
    no group there), the group's ``members``.  A job that hangs stops every
    group its culprit is in, and fr_trace reports them all; a reproduction
    that runs one victim shows the group that victim waited in."""
    if findings.failure is not None:
        return findings
    text = findings.text
    starts = [m.start() for m in _BLOCK_START.finditer(text)] + [len(text)]
    kept, members = [], set(members)
    for begin, end in itertools.pairwise(starts):
        block = text[begin:end]
        named = _GROUP_INFO.search(block)
        if named is not None and named.group(1) == group:
            kept.append(block)
        elif named is None:
            for match in _NO_DUMP.finditer(block):
                ranks = {int(r) for r in match.group(1).split(",") if r.strip()} & members
                if ranks:
                    shown = ", ".join(map(str, sorted(ranks)))
                    kept.append("we missed FR dumps from ranks ({" + shown + "})\n")
    if not kept:
        return dataclasses.replace(findings, missing_ranks=frozenset(), mismatches=frozenset(),
                                   culprits=frozenset())
    mine = flight_findings("".join(kept))
    return dataclasses.replace(mine, text=text)


def _trimmed(text: str, lines: int = 12, width: int = 1500) -> str:
    """The analyzer's output for a verdict: its last lines (where a traceback ends)."""
    kept = [line.rstrip() for line in text.strip().splitlines() if line.strip()][-lines:]
    shown = " | ".join(kept)
    return shown if len(shown) <= width else "…" + shown[-width:]


# -- verdicts ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Verdict:
    expectation: Expectation
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.detail}"


def evaluate(scenario: Scenario, observed: Observed, baseline: Observed | None = None,
             predicted_ratio: float | dict[int, float] | None = None,
             predicted_times: NDArray[np.float64] | None = None) -> list[Verdict]:
    """One verdict per expectation, in file order; ``predicted_times``: the
    iteration times prism-debug predict gave (percentiles of a prediction).
    A run of several real ranks (``observed.ranks``) is judged by
    :func:`_several`, with ``predicted_ratio`` per rank."""

    def iteration_time(e, seen, base, ratio):
        if e.is_predicted_percentile:
            return _predicted_percentile(e, predicted_times)
        return _iteration_time(e, seen, base, ratio)

    checks: dict[type, Callable] = {
        ExpectException: _exception, ExpectExitCode: _exit_code,
        ExpectIterationTime: iteration_time, ExpectFlightRecord: _flight_record,
        ExpectNanAt: _nan_at, ExpectDigests: _digests}
    if observed.ranks:
        # several real ranks: the caller gives a predicted ratio per rank
        per_rank = cast("dict[int, float] | None", predicted_ratio)
        return [Verdict(e, *_several(e, checks[type(e)], observed, baseline, per_rank))
                for e in scenario.expect]
    return [Verdict(e, *checks[type(e)](e, observed, baseline, predicted_ratio))
            for e in scenario.expect]


# the ranks a verdict of several real ranks shows by name; the rest are counted
SHOWN_RANKS = 4


def _several(e: Expectation, check: Callable, observed: Observed, baseline: Observed | None,
             predicted: dict[int, float] | None) -> tuple[bool, str]:
    """An expectation of a run of several real ranks:

    * ``exit_code``: the run's (the first failing rank's, as torchrun's);
    * ``exception``: some rank's output shows it (the verdict names which);
    * ``iteration_time``: every rank's own iterations satisfy it, each against
      its own baseline and predicted ratio (the verdict names those that fail);
    * ``nan_at``: the first iteration any real rank sends a NaN or inf;
    * ``digests``: its ``rank``'s, the lowest real rank's when none is given.

    (A flight record and predict's distribution are one rank's: the model
    refuses them beside several real ranks.)"""
    ranks = observed.ranks
    if isinstance(e, ExpectExitCode):
        passed, detail = check(e, observed)
        failed = {r: seen.exit_code for r, seen in ranks.items() if seen.exit_code}
        return passed, detail + (" (" + ", ".join(f"rank {r}: {code}" for r, code in
                                                  failed.items()) + ")" if failed else "")
    if isinstance(e, ExpectException):
        found = {r: check(e, seen) for r, seen in ranks.items()}
        holds = [r for r, (passed, _) in found.items() if passed]
        if holds:
            return True, f"rank {holds[0]}: {found[holds[0]][1]}"
        return False, _per_rank({r: detail for r, (_, detail) in found.items()})
    if isinstance(e, ExpectIterationTime) and not e.is_predicted_percentile:
        found = {r: check(e, seen, baseline.ranks.get(r) if baseline else None,
                          (predicted or {}).get(r)) for r, seen in ranks.items()}
        failing = {r: detail for r, (passed, detail) in found.items() if not passed}
        if failing:
            return False, _per_rank(failing)
        return True, _per_rank({r: detail for r, (_, detail) in found.items()})
    if isinstance(e, ExpectNanAt):
        sent = {r: seen.nonfinite_iteration for r, seen in ranks.items()
                if seen.nonfinite_iteration is not None}
        first = min(sent.values(), default=None)
        by = [r for r, it in sent.items() if it == first]
        got = "none" if first is None else (
            f"iteration {first} (rank {by[0]})" if len(by) == 1
            else f"iteration {first} (ranks {', '.join(map(str, by))})")
        return first == e.iteration, (f"first NaN/inf a real rank sends at iteration "
                                      f"{e.iteration}: got {got}")
    if isinstance(e, ExpectDigests):
        rank = min(ranks) if e.rank is None else e.rank
        if rank not in ranks:
            return False, f"digests of rank {rank}: it is not a real rank of the run"
        passed, detail = check(e, ranks[rank])
        return passed, f"rank {rank}: {detail}"
    if isinstance(e, ExpectFlightRecord):
        return False, "a run of several real ranks does not judge a flight record"
    return check(e, observed, baseline, predicted)  # predict's percentile: not a rank's


def _per_rank(details: dict[int, str]) -> str:
    """Each rank's detail, the first :data:`SHOWN_RANKS` by name."""
    shown = [f"rank {r}: {detail}" for r, detail in list(details.items())[:SHOWN_RANKS]]
    more = len(details) - SHOWN_RANKS
    return "; ".join(shown) + (f"; and {more} more rank(s)" if more > 0 else "")


def needs_baseline(scenario: Scenario) -> bool:
    return any(isinstance(e, ExpectIterationTime) and e.is_relative for e in scenario.expect)


def needs_prediction(scenario: Scenario) -> bool:
    return any(isinstance(e, ExpectIterationTime) and e.is_relative and e.predicted
               for e in scenario.expect)


def needs_distribution(scenario: Scenario) -> bool:
    """Whether an expectation bounds a percentile of prism-debug predict's."""
    return any(isinstance(e, ExpectIterationTime) and e.is_predicted_percentile
               for e in scenario.expect)


def _exception(e: ExpectException, seen: Observed, *_) -> tuple[bool, str]:
    want = f"exception {e.type}" + (f" matching {e.match!r}" if e.match else "")
    if seen.exception is None:
        return False, f"{want}: the rank raised none (exit code {seen.exit_code})"
    kind, message = seen.exception
    name = re.split(r"\.|::", kind)[-1]
    wanted = re.split(r"\.|::", e.type)[-1]
    same_type = kind == e.type or (name == wanted and "." not in e.type)
    matches = e.match is None or re.search(e.match, message) is not None
    return same_type and matches, f"{want}: got {kind}: {_short(message)}"


def _exit_code(e: ExpectExitCode, seen: Observed, *_) -> tuple[bool, str]:
    return seen.exit_code == e.code, f"exit code {e.code}: got {seen.exit_code}"


def _iteration_time(e: ExpectIterationTime, seen: Observed, baseline: Observed | None,
                    predicted: float | None) -> tuple[bool, str]:
    if e.percentile is not None:
        return _iteration_percentile(e, seen)
    if e.iteration is not None:
        label = f"iteration {e.iteration} time"
        value = seen.iteration_times.get(e.iteration)
        base = baseline.iteration_times.get(e.iteration) if baseline else None
    else:
        # without an iteration: the medians after the first (warm-up) iteration
        label = "median iteration time"
        value = _median_after_first(seen.iteration_times)
        base = _median_after_first(baseline.iteration_times) if baseline else None
    if value is None:
        return False, f"{label}: the run never finished that iteration"
    if e.is_relative:
        if base is None:
            return False, f"{label}: the baseline run never finished that iteration"
        low, high = e.bounds(base, predicted)
        ratio = value / base
        target = (f"x{e.relative:g}" if e.relative is not None
                  else f"x{predicted:.3f} (predicted)")
        tolerance = e.tolerance if e.tolerance is not None else 0.02
        return low <= value <= high, (f"{label} {target} ±{tolerance:g} of the baseline's: got "
                                      f"x{ratio:.3f} ({value * 1e3:.1f} vs {base * 1e3:.1f} ms)")
    low, high = e.bounds()
    if e.iteration is None:
        # every iteration after the first must be within the bounds
        times = {k: v for k, v in seen.iteration_times.items() if k > 1}
        bad = {k: v for k, v in times.items() if not low <= v <= high}
        shown = ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in sorted(bad.items())[:3])
        return not bad and bool(times), (f"iteration times in [{_ms(low)}, {_ms(high)}]: "
                                         + (f"outside: {shown}" if bad else "all within"))
    return low <= value <= high, (f"{label} in [{_ms(low)}, {_ms(high)}]: got "
                                  f"{value * 1e3:.1f} ms")


def _iteration_percentile(e: ExpectIterationTime, seen: Observed) -> tuple[bool, str]:
    """The percentile of the iteration times after iteration 1 (the warm-up:
    a restored run's iterations all count), numpy's linear interpolation
    between the closest ranks, within [min_s, max_s]."""
    assert e.percentile is not None  # (what _iteration_time calls this for)
    low, high = e.bounds()
    times = [t for k, t in sorted(seen.iteration_times.items()) if k > 1]
    label = f"p{e.percentile:g} of iteration times"
    bound = " and ".join(part for part in (
        f">= {_ms(low)}" if e.min_s is not None else "",
        f"<= {_ms(high)}" if e.max_s is not None else "") if part)
    if not times:
        return False, f"{label} {bound}: the run finished no iteration after the first"
    value = float(np.percentile(times, e.percentile))
    return low <= value <= high, (f"{label} {bound}: got {value * 1e3:.1f} ms over "
                                  f"{len(times)} iterations")


def _predicted_percentile(e: ExpectIterationTime,
                          times: NDArray[np.float64] | None) -> tuple[bool, str]:
    """The percentile of the predicted iteration times (every sample's), by
    the linear interpolation the run's percentile uses, within [min_s, max_s]."""
    assert e.percentile is not None  # (a predicted percentile's)
    low, high = e.bounds()
    label = f"p{e.percentile:g} of predicted iteration times"
    bound = " and ".join(part for part in (
        f">= {_ms(low)}" if e.min_s is not None else "",
        f"<= {_ms(high)}" if e.max_s is not None else "") if part)
    if times is None or not np.size(times):
        return False, f"{label} {bound}: no prediction was made"
    value = float(np.percentile(times, e.percentile))
    return low <= value <= high, (f"{label} {bound}: got {value * 1e3:.1f} ms over "
                                  f"{np.size(times)} predicted iterations")


def _flight_record(e: ExpectFlightRecord, seen: Observed, *_) -> tuple[bool, str]:
    parts = []
    if e.missing_ranks:
        parts.append(f"missing ranks {sorted(e.missing_ranks)}")
    if e.mismatch is not None:
        parts.append(f"a {e.mismatch} mismatch")
    if e.culprits:
        parts.append(f"culprits {sorted(e.culprits)}")
    want = "flight record shows " + " and ".join(parts)
    flight = seen.flight
    if flight is None:
        return False, f"{want}: no flight record was dumped (no collective timed out)"
    if flight.failure is not None:
        output = _trimmed(flight.text)
        return False, (f"{want}: torch's analyzer gave no verdict ({flight.failure}); its "
                       f"output: {output or '(none)'}")
    # exactly the ranks fr_trace names: one more or one fewer is another failure
    ok = not e.missing_ranks or set(e.missing_ranks) == flight.missing_ranks
    if e.mismatch is not None:
        # a skipped collective shows as whichever difference the next one has
        ok &= (bool(flight.mismatches) if e.mismatch == DesyncKind.SKIP
               else str(e.mismatch) in flight.mismatches)
    ok &= not e.culprits or set(e.culprits) == flight.culprits
    got = (f"missing {sorted(flight.missing_ranks)}, mismatches "
           f"{sorted(flight.mismatches) or 'none'}"
           + (f", culprits {sorted(flight.culprits)}" if e.culprits else ""))
    return ok, f"{want}: got {got}"


def _nan_at(e: ExpectNanAt, seen: Observed, *_) -> tuple[bool, str]:
    got = seen.nonfinite_iteration
    return got == e.iteration, (f"first NaN/inf the rank sends at iteration {e.iteration}: got "
                                + ("none" if got is None else f"iteration {got}"))


def _digests(e: ExpectDigests, seen: Observed, *_) -> tuple[bool, str]:
    wrong = []
    for iteration, digest in e.digests:
        got = seen.digests.get(iteration)
        if got is None or not got.startswith(digest.lower()):
            wrong.append(f"{iteration}: {got or 'missing'}")
    return not wrong, (f"digests of iterations {', '.join(str(i) for i, _ in e.digests)}: "
                       + (f"differ ({'; '.join(wrong)})" if wrong else "equal"))


def _median_after_first(times: dict[int, float]) -> float | None:
    later = [t for k, t in times.items() if k > 1]
    return statistics.median(later) if later else None


def _ms(seconds: float) -> str:
    return "inf" if math.isinf(seconds) else f"{seconds * 1e3:.1f} ms"


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def predicted_ratio(graph: ExecutionGraph, cost: CostFn, rank: int, faults: Sequence[Fault],
                    iterations: int, *, first_iteration: int = 2, seed: int = 0,
                    compute: ComputeModel | None = None) -> float:
    """How much ``faults`` stretch ``rank``'s iterations, as the replay engine
    predicts from the graph alone: the perturbed replay's median iteration
    time over the unperturbed one's, both over the iterations a run observes
    (``first_iteration`` to ``iterations``: after the first, or after the
    snapshot a restored run resumes from).  ``compute`` (stochastic peers)
    acts on both replays, seeded alike."""
    return predicted_ratios(graph, cost, (rank,), faults, iterations,
                            first_iteration=first_iteration, seed=seed, compute=compute)[rank]


def predicted_ratios(graph: ExecutionGraph, cost: CostFn, ranks: Sequence[int],
                     faults: Sequence[Fault], iterations: int, *, first_iteration: int = 2,
                     seed: int = 0, compute: ComputeModel | None = None) -> dict[int, float]:
    """:func:`predicted_ratio` of each of ``ranks`` (several real ranks), from
    the same two replays: the graph's prediction of a rank does not depend on
    which others run for real."""
    medians: dict[int, list[float]] = {rank: [] for rank in ranks}
    for in_force in ((), faults):
        engine = ReplayEngine(graph, cost, compute=compute, seed=seed)
        for fault in in_force:
            apply_fault(engine, resolve(fault, graph.world_size, graph.gpus_per_node, graph))
        engine.run(iterations)
        for rank in ranks:
            times = engine.iteration_times(rank)[:iterations]
            medians[rank].append(statistics.median(times[first_iteration - 1:] or times))
    return {rank: after / before for rank, (before, after) in medians.items()}
