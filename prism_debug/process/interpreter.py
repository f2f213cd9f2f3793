"""Which Python runs the rank: one rule for every command prism-debug
launches (``run``, ``profile``, a scenario's ``command``, the graph cache's
profiling), and a check that the Python chosen can load the agent.

The rule: a bare ``python`` or ``python3`` (or ``python3.N`` naming this
Python's version) as the command's first word is the Python prism-debug
itself runs in, so the rank's torch is the one prism-debug was installed
with and the agent's imports resolve — whatever ``python`` the shell's PATH
would have found (a deactivated venv, the system's).  Any other first word —
a path to another Python, ``torchrun``, ``bash -c …`` — runs as given; a
Python named by path must import torch, numpy and pyzmq itself (the agent is
put on its PYTHONPATH, not its dependencies).  Such a Python is asked before
the rank starts (a ``find_spec`` of each, no import: tens of milliseconds),
so a missing torch is one line naming both Pythons, not the rank's traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from prism_debug.errors import LaunchError

BARE_PYTHONS = ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")
# what the agent imports in the rank's process besides prism_debug itself
AGENT_NEEDS = ("torch", "numpy", "zmq")
AGENT_PYTHON = "3.11 or later"
_PACKAGE_OF = {"zmq": "pyzmq"}
_PROBE = (
    "import json, sys\n"
    "from importlib.util import find_spec\n"
    "print(json.dumps({'version': list(sys.version_info[:2]),\n"
    "                  'missing': [m for m in sys.argv[1:] if find_spec(m) is None]}))\n")
PROBE_TIMEOUT_S = 60.0


def with_interpreter(command: list[str]) -> list[str]:
    """``command`` with a bare ``python`` first word made this Python (the rule above)."""
    if command and command[0] in BARE_PYTHONS:
        return [sys.executable, *command[1:]]
    return list(command)


def is_python(program: str) -> bool:
    return Path(program).name.startswith("python")


def check_interpreter(command: list[str], pythonpath: str) -> None:
    """:class:`LaunchError` when ``command`` starts with a Python, other than
    this one, that cannot load the agent; ``pythonpath``: the rank's."""
    program = command[0]
    if not is_python(program):
        return
    resolved = str(Path(shutil.which(program) or program).absolute())
    # (not the real path: venvs of one base Python share it, not their packages)
    if resolved == str(Path(sys.executable).absolute()):
        return
    if (resolved, pythonpath) in _ABLE:
        return
    problem = _probe(resolved, pythonpath)
    if problem is not None:
        raise LaunchError(f"the rank's Python {resolved} {problem}: {_remedy(command)}")
    _ABLE.add((resolved, pythonpath))


# Pythons found able, asked once (a profile launches the same one per slice);
# one found wanting is asked again, as its user may have installed torch since
_ABLE: set[tuple[str, str]] = set()


def _probe(python: str, pythonpath: str) -> str | None:
    """What keeps ``python`` from loading the agent, as the end of a sentence; None: nothing."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    env.pop("PYTHONHOME", None)  # (this Python's, were it set, not that one's)
    try:
        proc = subprocess.run([python, "-c", _PROBE, *AGENT_NEEDS], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot be asked what it imports ({exc})"
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        version, missing = tuple(answer["version"]), list(answer["missing"])
    except (IndexError, ValueError, KeyError, TypeError):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return f"cannot be asked what it imports (exit code {proc.returncode}: {last})"
    if version < (3, 11):
        return f"is Python {version[0]}.{version[1]}; the prism-debug agent needs {AGENT_PYTHON}"
    if missing:
        names = ", ".join(_PACKAGE_OF.get(m, m) for m in missing)
        return f"cannot import {names}, which the prism-debug agent needs in the rank"
    return None


def _remedy(command: list[str]) -> str:
    shown = " ".join(["python", *command[1:2], *(["…"] if len(command) > 2 else [])])
    return (f"write the command as `{shown}` (a bare `python` is prism-debug's own Python, "
            f"{sys.executable}), or give a Python {AGENT_PYTHON} with torch, numpy and pyzmq")


def never_loaded(command: list[str], exit_code: int, log: Path) -> LaunchError:
    """The error when the rank ran and the agent never loaded in it."""
    program = command[0]
    tried = shutil.which(program) or program
    own = Path(tried).absolute() == Path(sys.executable).absolute()
    which = ("prism-debug's own Python" if own else
             f"{Path(tried).absolute()}" if is_python(program) else f"started by {program}")
    return LaunchError(
        f"the prism-debug agent never loaded in the rank's process ({which}, exit code "
        f"{exit_code}): it loads when a Python that honours PYTHONPATH (not python -I or -E) "
        f"imports torch — a bare `python` first word runs prism-debug's own, "
        f"{sys.executable}; the rank's output is in {log}", log=log)
