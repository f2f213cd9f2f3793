"""What a regression test's run showed: a :class:`PrismResult`, built from a
restore's :class:`RunResult` by the same reading the scenario runner's
verdicts take (``scenario_run.observe``), plus the collective sequence the
rank recorded (op, group, size, and the digest of the iteration's values up to
that op).  Its :meth:`PrismResult.golden_view` is what a golden file holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prism_debug.process.options import RunResult
from prism_debug.scenario.plan import FlightFindings
from prism_debug.workflows.scenario_run import observe

#: iteration times in a golden: 4 significant digits, so a refreshed golden
#: diffs only where a time really moved
TIME_DIGITS = 4
#: the times a golden accepts by default: within ±100 % of the golden's (an
#: iteration's time is emulated, but includes the rank's own compute, which a
#: busy machine stretches; digests and ops are compared bit for bit)
DEFAULT_TIME_RTOL = 1.0


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective the rank issued, in order."""

    op: str
    family: str  # the group's family (tp, dp, pp, ...)
    group: int  # which group of the family
    nbytes: int
    digest: str | None  # the iteration's values up to and including this op

    def line(self) -> str:
        text = f"{self.op} {self.family}[{self.group}] {self.nbytes} B"
        return text + (f" {self.digest}" if self.digest else "")


@dataclasses.dataclass(frozen=True)
class IterationResult:
    iteration: int
    digest: str | None
    time_s: float
    collectives: tuple[Collective, ...]


@dataclasses.dataclass(frozen=True)
class PrismResult:
    """A restored rank's K iterations: how it ended and what it did."""

    exit_code: int
    exception: tuple[str, str] | None  # (type as printed, message), from the rank's output
    iterations: tuple[IterationResult, ...]
    flight: FlightFindings | None  # torch's analyzer on the flight record, if one was dumped
    reloaded: tuple[str, ...] | None  # the functions reload=True patched (None: not asked)
    snapshot_id: str
    run_dir: Path
    events: tuple[dict, ...] = dataclasses.field(repr=False, compare=False, default=())
    time_rtol: float = DEFAULT_TIME_RTOL

    @classmethod
    def from_run(cls, run: RunResult, snapshot_id: str, *, reload: bool = False,
                 time_rtol: float = DEFAULT_TIME_RTOL) -> PrismResult:
        observed = observe(run)
        records = {e["iteration"]: e for e in run.events if e["kind"] == "iteration"}
        iterations = []
        for it in run.report["iterations"]:  # the report's: a restore's own iterations
            record = records.get(it["iteration"], {})
            digests = record.get("op_digests") or [None] * len(record.get("ops", ()))
            iterations.append(IterationResult(
                it["iteration"], it.get("digest"), it["time_s"], tuple(
                    Collective(op[0], op[1], op[2], op[3], digest)
                    for op, digest in zip(record.get("ops", ()), digests, strict=True))))
        reloaded = None
        if reload:
            event = next((e for e in run.events if e["kind"] == "reloaded"), None)
            # the functions patched in, by qualified name (the event has their files and lines)
            reloaded = tuple(p["qualname"] if isinstance(p, dict) else p
                             for p in event.get("patched", ())) if event else ()
        return cls(observed.exit_code, observed.exception, tuple(iterations), observed.flight,
                   reloaded, snapshot_id, run.run_dir, tuple(run.events), time_rtol)

    @property
    def digests(self) -> dict[int, str | None]:
        return {it.iteration: it.digest for it in self.iterations}

    @property
    def times(self) -> dict[int, float]:
        return {it.iteration: it.time_s for it in self.iterations}

    @property
    def collectives(self) -> list[Collective]:
        """Every iteration's collectives, in order."""
        return [op for it in self.iterations for op in it.collectives]

    @property
    def log(self) -> str:
        """The rank's output during the restore."""
        return (self.run_dir / "rank.log").read_text(encoding="utf-8", errors="replace")

    def golden_view(self) -> dict:
        """What a golden file holds, keys in reading order: how the run ended,
        the tolerance its times are held to, then one entry per iteration."""
        flight = None
        if self.flight is not None:
            flight = {"missing_ranks": sorted(self.flight.missing_ranks),
                      "mismatches": sorted(self.flight.mismatches)}
        return {
            "exit_code": self.exit_code,
            "exception": list(self.exception) if self.exception else None,
            "flight_record": flight,
            "time_rtol": self.time_rtol,
            "iterations": [
                {"iteration": it.iteration, "digest": it.digest,
                 "time_s": float(f"{it.time_s:.{TIME_DIGITS}g}"),
                 "collectives": [op.line() for op in it.collectives]}
                for it in self.iterations],
        }
