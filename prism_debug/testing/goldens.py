"""Goldens: a regression test's result against the one stored beside it.

A golden is a JSON file syrupy keeps (one per test, in ``__snapshots__/``
beside the test file, written or refreshed by ``pytest --prism-update``):
how the run ended, the tolerance its times are held to, and per iteration
the digest, the time and the collectives one per line — so a refreshed
golden reviews well in a diff.  Digests and collectives are compared bit for
bit, times within the golden's own ``time_rtol``; a mismatch says where the
first difference is and what the golden had.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from syrupy.extensions.json import JSONSnapshotExtension

NO_GOLDEN = "no golden yet: run pytest --prism-update to write it, then review and commit it"


def first_difference(got: dict, golden: dict) -> str | None:
    """The first way ``got`` differs from ``golden`` (both golden views), as
    one readable line, or None when they agree."""
    for key, what in (("exit_code", "exit code"), ("flight_record", "flight record")):
        if got.get(key) != golden.get(key):
            return f"{what} {_show(got.get(key))}; the golden had {_show(golden.get(key))}"
    if _exception(got.get("exception")) != _exception(golden.get("exception")):
        return (f"exception {_show(got.get('exception'))}; the golden had "
                f"{_show(golden.get('exception'))}")
    ours, theirs = got.get("iterations", []), golden.get("iterations", [])
    for mine, want in zip(ours, theirs, strict=False):  # (a count that differs: said next)
        found = _iteration_difference(mine, want)
        if found:
            return found
    if len(ours) != len(theirs):
        return (f"{len(ours)} iterations ({_numbers(ours)}); the golden had {len(theirs)} "
                f"({_numbers(theirs)})")
    rtol = golden.get("time_rtol", 0.0)
    for mine, want in zip(ours, theirs, strict=True):
        if abs(mine["time_s"] - want["time_s"]) > rtol * abs(want["time_s"]):
            return (f"iteration {mine['iteration']}: time {mine['time_s']:g} s is outside "
                    f"±{rtol:.0%} of the golden's {want['time_s']:g} s")
    return None


def _iteration_difference(mine: dict, want: dict) -> str | None:
    where = f"iteration {mine['iteration']}"
    if mine["iteration"] != want["iteration"]:
        return f"{where} where the golden had iteration {want['iteration']}"
    ops, golden_ops = mine.get("collectives", []), want.get("collectives", [])
    # (a count that differs: said after the first ops' differences)
    for i, (op, golden_op) in enumerate(zip(ops, golden_ops, strict=False)):
        if op != golden_op:
            what = "digest" if op.rsplit(" ", 1)[0] == golden_op.rsplit(" ", 1)[0] else "op"
            return (f"{where}, collective #{i + 1}: {what} differs: {op}; the golden had "
                    f"{golden_op} (iteration digest {_short(mine['digest'])}, golden "
                    f"{_short(want['digest'])})")
    if len(ops) != len(golden_ops):
        longer, shorter = (ops, "the golden has it not") if len(ops) > len(golden_ops) else (
            golden_ops, "this run did not issue it")
        return (f"{where}: {len(ops)} collectives, the golden had {len(golden_ops)}; "
                f"collective #{min(len(ops), len(golden_ops)) + 1} "
                f"{longer[min(len(ops), len(golden_ops))]}: {shorter}")
    if mine["digest"] != want["digest"]:
        return (f"{where}: digest {mine['digest']}; the golden had {want['digest']} "
                "(every collective agrees: the values changed after the last one)")
    return None


def _exception(value: Any) -> Any:
    """An exception as compared: numbers of three digits or more (times,
    pids, addresses in a watchdog's message) are not."""
    if not value:
        return None
    kind, message = value
    return kind, re.sub(r"\d{3,}", "#", message)


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, int) else str(value)


def _short(digest: str | None) -> str:
    return (digest or "none")[:16]


def _numbers(iterations: list[dict]) -> str:
    return ", ".join(str(it["iteration"]) for it in iterations) or "none"


class PrismGoldenExtension(JSONSnapshotExtension):
    """syrupy's single-file JSON snapshots, one ``.prism.json`` per test,
    compared with :func:`first_difference` instead of text equality."""

    file_extension = "prism.json"

    def serialize(self, data: Any, **kwargs: Any) -> str:
        view = data.golden_view() if hasattr(data, "golden_view") else data
        return json.dumps(view, indent=1, ensure_ascii=False) + "\n"

    def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
        if not snapshot_data:  # (None or "" when there is no golden yet)
            return False
        return first_difference(json.loads(serialized_data), json.loads(snapshot_data)) is None

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        if not snapshot_data:
            yield NO_GOLDEN
            return
        yield first_difference(json.loads(serialized_data), json.loads(snapshot_data)) or \
            "the golden differs only in form (rewrite it with --prism-update)"
