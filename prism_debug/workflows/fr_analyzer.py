"""Torch's own flight-recorder analyzer, run on a directory of dumps.

``python -m torch.distributed.flight_recorder.fr_trace`` in a child process:
what it prints is the verdict (``scenario/plan.flight_findings`` reads it),
its crash, silence or timeout a verdict's failure with its output.  Real
gloo dumps stop it at once (their pg_config names no group its entries use:
``KeyError: ('0', 3)`` in ``build_collectives``); :func:`repaired_copies`
writes copies whose pg_config lists the groups the entries name, with the
members the incident's analysis found, and changes nothing else.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from prism_debug.incident.analysis import Incident
from prism_debug.incident.dumps import DumpSet, load_plain
from prism_debug.scenario import plan

FR_TRACE_TIMEOUT_S = 300
PICKLE_PROTOCOL = 2  # torch::jit::Pickler's


def run_fr_trace(directory: Path, prefix: str, *, incomplete: bool,
                 timeout_s: float = FR_TRACE_TIMEOUT_S) -> plan.FlightFindings:
    """fr_trace's verdict on the dumps ``directory/prefix<rank>``; with
    ``incomplete`` it analyses though some ranks left no dump (without it
    fr_trace stops at the first missing one)."""
    args = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(directory),
            "--prefix", prefix]
    if incomplete:
        args.append("--allow-incomplete-ranks")
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        text = "".join(_text(part) for part in (exc.stdout, exc.stderr))
        return plan.flight_findings(text, None, f"fr_trace did not finish in {timeout_s:g} s")
    except OSError as exc:
        return plan.flight_findings("", None, f"fr_trace could not start: {exc}")
    return plan.flight_findings(out.stdout + out.stderr, out.returncode)


def needs_repair(dumps: DumpSet) -> bool:
    """Whether some dump's entries name a group its pg_config does not list
    (by name and description, as fr_trace matches them), or lists with no ranks."""
    for dump in dumps.dumps.values():
        named = {(e.group, e.group_desc) for e in dump.entries}
        if not named <= dump.config_groups or not {n for n, _ in named} <= set(dump.group_ranks):
            return True
    return False


def repaired_copies(dumps: DumpSet, incident: Incident, destination: Path,
                    lead_rank: int | None = None) -> Path:
    """Copies of the dumps, each with pg_config listing every group the
    incident found (name, description, members); written to ``destination``
    (private: a dump holds the job's stacks), which is returned.

    fr_trace takes the first dump it loads as the reference a mismatch is
    judged against, and loads in the order the file system lists them; the
    copy of ``lead_rank`` (a rank that called the collective as the majority
    did) goes first, the others under ``peers/``, as prism-debug's own dumps
    are laid out (backend/flight_recorder.write_group_dumps)."""
    destination.mkdir(mode=0o700, parents=True, exist_ok=True)
    (destination / "peers").mkdir(mode=0o700, exist_ok=True)
    config = {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.members))}
              for g in incident.groups}
    for rank, dump in dumps.dumps.items():
        raw = load_plain(dump.path)
        raw["pg_config"] = config
        folder = destination if lead_rank in (None, rank) else destination / "peers"
        path = folder / f"{dumps.prefix}{rank}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(raw, f, protocol=PICKLE_PROTOCOL)
    return destination


def _text(output: str | bytes | None) -> str:
    # a timed-out run hands back what it had read, as bytes on some platforms
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""
