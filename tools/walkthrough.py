"""Run the documentation's walk-through ("Walk-through: your own script",
``docs/getting-started/walkthrough.md``) as written, and compare what every
command prints with what the page shows.

The section is read from that page (``--page``, default the checkout's), so
the text a newcomer follows is the text that is run; ``tests/test_walkthrough.py``
runs this in ``make test``.  Its conventions:

* a fenced block whose info string is a language and a file name
  (```` ```yaml title="straggler.yaml" ````, as MkDocs Material titles a code
  block, or ```` ```yaml straggler.yaml ````) is written to that file when
  reached;
* a fenced block that starts with ``$ `` is a terminal: each ``$ COMMAND`` (a
  line ending in ``\\`` continues it) is run with bash, and the lines up to the
  next ``$ `` are what it prints (stdout and stderr, as a terminal shows them);
* ``$ COMMAND &`` runs in the background; the walk-through goes on once it has
  printed the lines shown under it and gone quiet (with ``--update``: once it
  has been quiet for 2 s), and ``$ wait`` waits for it and shows the rest.

Everything runs in a fresh temporary folder holding ``examples/my_ddp.py``,
with ``HOME`` there too (so the graph cache starts cold, sessions and run
folders are private, nothing of yours is touched) and this Python's ``bin``
folder first on ``PATH`` (``python`` and ``prism-debug`` are the project's).
Paths print as a newcomer's would: that folder is ``~/my-job``, the checkout
``~/prism-debug`` (and this Python's environment ``~/prism-debug/.venv``).

What legitimately varies is normalised on both sides before comparing (see
``normalise_line``): value digests (labelled by first appearance, so a
restore must still show the original's: ``DigestLabels`` says why),
decimal numbers (times, sizes, percentages), sizes in
bytes and RSS, snapshot ids' random suffix, session ids, pids, run folders,
timestamps and graph-cache keys; a table row's ``longest wait`` under 50 ms
(which op and which rank come last is then a race, not a fact of the job),
likewise the last rank of a console timeline's row; runs of blanks; and the
order in which the rank's relayed lines (``[rank N] …``) interleave with
prism-debug's own (two streams: each is compared in its own order).  The
script's own lines are compared exactly.  A snapshot id the page uses in a
later command is replaced by the id the run really made.

Why no golden-file library: cram/prysk and byexample want their own
annotations in the transcript, and none runs a background job, keeps two
output streams apart or writes a page's section back; this is stdlib only.

Exit code 0 when every command printed what the page shows, 1 with a
unified diff per differing command, 2 when the section is missing or
malformed.  ``--update`` rewrites the section's terminals with the real
output (paths as above) instead, for a maintainer to review with ``git diff``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "getting-started" / "walkthrough.md"
SECTION = "Walk-through: your own script"
SCRIPTS = (ROOT / "examples" / "my_ddp.py",)
SHOWN_HOME = "~"
SHOWN_CHECKOUT = "~/prism-debug"
WORK_NAME = "my-job"
COMMAND_TIMEOUT_S = 300
QUIET_S = 2.0  # a background command that has printed nothing for this long waits for you
# ... unless the page shows more lines than it has printed yet: a slow
# machine's rank may take longer than QUIET_S to get where it prints them
SHORT_QUIET_S = 20.0
WAIT_NOISE_MS = 50.0  # a longest wait shorter than this names a race, not a fact of the job

SNAPSHOT_ID = re.compile(r"\b(r\d+-it\d+-)([0-9a-f]{6})\b")
_TITLE = re.compile(r'^title="([^"]+)"$')  # a code block's title: the file it is
_RANK_LINE = re.compile(r"^\[rank \d+\] ")
_LONGEST_WAIT = re.compile(r"longest wait (\d+(?:\.\d+)?) ms(?:: .*)?$")
# a console timeline row: seq, op, group[i], bytes, start, duration, wait ms, last rank
# an iteration row's value digest: iteration, times, collectives, then the digest
_DIGEST = re.compile(r"^(\s*\d+\s+(?:\d+\.\d+\s+){3}\d+\s+)([0-9a-f]{16})(\s|$)")
_TIMELINE_LAST = re.compile(r"^(\s*\d+\s+\S+\s+\S+\[\d+\]\s.*\s)(\d+\.\d+)(\s+)(\S+)\s*$")
_RULES = (  # (pattern, replacement) in order, after the longest wait
    (re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:?\d{2}|Z)?"), "<when>"),
    (re.compile(r"\b\d{8}-\d{6}-\d+\b"), "<run>"),  # run folders: TIME-PID
    (SNAPSHOT_ID, r"\1<id>"),
    (re.compile(r"\bsession:? [0-9a-f]{8}\b"), "session <id>"),
    (re.compile(r"\b[0-9a-f]{16}\.prism\b"), "<key>.prism"),
    (re.compile(r"\bpid:? \d+"), "pid <n>"),
    # how a restore loaded the rank's memory depends on the kernel (userfaultfd)
    (re.compile(r"(MiB of images), (?:lazily|eagerly)\b.*$"), r"\1, <way>)"),
    (re.compile(r"\b\d+ bytes\b"), "<n> bytes"),
    (re.compile(r"\bRSS \d+ MiB"), "RSS <n> MiB"),
    (re.compile(r"\d+\.\d+"), "<n>"),
    (re.compile(r"\s+"), " "),
)


def normalise_line(line: str) -> str:
    """One line of prism-debug's output with what varies from run to run replaced."""
    def longest_wait(match: re.Match) -> str:
        if float(match.group(1)) < WAIT_NOISE_MS:
            return "longest wait <n> ms …"
        return match.group(0)

    def timeline_last(match: re.Match) -> str:
        if float(match.group(2)) < WAIT_NOISE_MS:
            return match.group(1) + match.group(2) + match.group(3) + "<rank>"
        return match.group(0)

    line = _LONGEST_WAIT.sub(longest_wait, line)
    line = _TIMELINE_LAST.sub(timeline_last, line)
    for pattern, replacement in _RULES:
        line = pattern.sub(replacement, line)
    return line.strip()


class DigestLabels:
    """Value digests by the order they first appear, across a whole walk-through
    (one side's: the page's or the run's).  A digest hashes the bytes the
    rank's collectives carried, and this CPU's math kernels (MKL picks its
    code path by instruction set) compute a float model's values with other
    roundings than another CPU's, so the page's digests are not this
    machine's.  What does not vary is which digests repeat: a restore or a
    perturbed run shows the original's, and a labelled row still says so."""

    def __init__(self) -> None:
        self._labels: dict[str, str] = {}

    def __call__(self, line: str) -> str:
        return _DIGEST.sub(self._label, line)

    def _label(self, match: re.Match) -> str:
        label = self._labels.setdefault(match.group(2), f"<digest {len(self._labels) + 1}>")
        return match.group(1) + label + match.group(3)


def streams(lines: list[str], digests: DigestLabels | None = None
            ) -> tuple[list[str], list[str]]:
    """(prism-debug's lines normalised, the rank's relayed lines exactly), each in order;
    ``digests`` labels the value digests of the iteration rows (a fresh labelling if None)."""
    digests = digests or DigestLabels()
    own = [normalise_line(digests(line)) for line in lines if not _RANK_LINE.match(line)]
    rank = [line.rstrip() for line in lines if _RANK_LINE.match(line)]
    return [line for line in own if line], rank


@dataclass(frozen=True)
class Step:
    """One ``$ COMMAND`` of a terminal block and the lines the page shows under it."""

    command: str
    expected: tuple[str, ...]
    first: int  # the page's line index of the command's first line
    end: int  # … one past its last output line

    @property
    def background(self) -> bool:
        return self.command.rstrip().endswith("&") and not self.command.rstrip().endswith("&&")


@dataclass(frozen=True)
class FileBlock:
    name: str
    text: str


@dataclass(frozen=True)
class Section:
    lines: tuple[str, ...]  # the whole page
    items: tuple[Step | FileBlock, ...]
    source: str = "the page"  # its name in messages


class WalkthroughError(Exception):
    """The page has no walk-through section, or one this runner cannot read."""


def read_section(text: str, source: str = "the page") -> Section:
    """The walk-through's files and commands, in the page's order (``source``
    names the page in messages)."""
    lines = text.split("\n")
    start = level = None
    in_fence = False
    end = len(lines)
    for index, line in enumerate(lines):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not (heading := re.match(r"^(#+)\s+(.*?)\s*$", line)):
            continue
        if start is None and heading.group(2) == SECTION:
            start, level = index, len(heading.group(1))
        elif start is not None and len(heading.group(1)) <= level:
            end = index
            break
    if start is None:
        raise WalkthroughError(f"no section titled '{SECTION}' in {source}")
    items: list[Step | FileBlock] = []
    index = start + 1
    while index < end:
        if not lines[index].startswith("```"):
            index += 1
            continue
        info = lines[index][3:].split()
        close = next((i for i in range(index + 1, end) if lines[i].startswith("```")), None)
        if close is None:
            raise WalkthroughError(f"{source} line {index + 1}: a code block that never closes")
        body = lines[index + 1:close]
        if len(info) == 2:
            title = _TITLE.match(info[1])
            items.append(FileBlock(title.group(1) if title else info[1], "\n".join(body) + "\n"))
        elif body and body[0].startswith("$ "):
            items.extend(_steps(body, index + 1))
        index = close + 1
    if not any(isinstance(item, Step) for item in items):
        raise WalkthroughError(f"the section '{SECTION}' has no $ command")
    return Section(tuple(lines), tuple(items), source)


def _steps(body: list[str], offset: int) -> list[Step]:
    steps = []
    index = 0
    while index < len(body):
        first = index
        command = body[index][2:]
        while command.endswith("\\") and index + 1 < len(body):
            index += 1
            command = command[:-1] + " " + body[index].strip()
        index += 1
        output_start = index
        while index < len(body) and not body[index].startswith("$ "):
            index += 1
        steps.append(Step(command.strip(), tuple(body[output_start:index]),
                          offset + first, offset + index))
    return steps


class Background:
    """A ``COMMAND &``: its lines, read as they come, and how many were shown so far."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.lines: list[str] = []
        self.shown = 0
        self.last_output = time.monotonic()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self.last_output = time.monotonic()

    def settle(self, expected: int) -> list[str]:
        """The lines it prints before the next command is typed."""
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while time.monotonic() < deadline and self._reader.is_alive():
            quiet = time.monotonic() - self.last_output
            if expected and len(self.lines) >= self.shown + expected and quiet > 0.3:
                break
            short = expected and len(self.lines) < self.shown + expected
            if len(self.lines) > self.shown and quiet > (SHORT_QUIET_S if short else QUIET_S):
                break
            time.sleep(0.05)
        return self.take()

    def take(self) -> list[str]:
        lines, self.shown = self.lines[self.shown:], len(self.lines)
        return lines

    def finish(self) -> list[str]:
        try:
            self.process.wait(timeout=COMMAND_TIMEOUT_S)
        finally:
            self.stop()
        self._reader.join(timeout=10)
        return self.take()

    def stop(self) -> None:
        if self.process.poll() is None:  # its own session: the command and what it started
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@dataclass
class Workspace:
    """The temporary folder the walk-through runs in, and how its paths are shown."""

    base: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.base / "home"

    @property
    def cwd(self) -> Path:
        return self.home / WORK_NAME

    @classmethod
    def create(cls) -> Workspace:
        # a short base: the bus's socket paths must fit a Unix socket's 107 bytes
        workspace = cls(Path(tempfile.mkdtemp(prefix="pdwt-")))
        workspace.cwd.mkdir(parents=True)
        for script in SCRIPTS:
            shutil.copy(script, workspace.cwd / script.name)
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("XDG_", "PRISM_DEBUG_"))
               or key in ("PRISM_DEBUG_CRIU", "PRISM_DEBUG_CUDA_CHECKPOINT")}
        bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a link
        env.update(HOME=str(workspace.home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
                   PRISM_DEBUG_RUNTIME=str(workspace.base / "bus"), PYTHONIOENCODING="utf-8",
                   PYTHONUNBUFFERED="1")
        env.pop("VIRTUAL_ENV", None)
        workspace.env = env
        return workspace

    def show(self, text: str) -> str:
        """Output with this machine's paths as the page shows them."""
        venv = Path(sys.executable).parent.parent
        replacements = [(str(self.home), SHOWN_HOME), (str(ROOT), SHOWN_CHECKOUT)]
        if not venv.is_relative_to(ROOT):
            replacements.insert(0, (str(venv), f"{SHOWN_CHECKOUT}/.venv"))
        for path, shown in sorted(replacements, key=lambda pair: -len(pair[0])):
            text = text.replace(path, shown)
        return text

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


@dataclass
class Outcome:
    step: Step
    command: str  # as run: the page's with the real snapshot ids
    output: list[str]  # as shown: this machine's paths replaced
    seconds: float

    def diff(self, source: str = "the page", labels: tuple[DigestLabels, DigestLabels] | None
             = None) -> list[str]:
        """The differences, normalised; ``labels``: the page's and the run's
        digest labels, shared by every command of the walk-through."""
        page, real = labels or (DigestLabels(), DigestLabels())
        want, got = streams(list(self.step.expected), page), streams(self.output, real)
        lines = []
        for name, expected, actual in zip(("prism-debug", "the rank"), want, got, strict=True):
            lines += difflib.unified_diff(expected, actual, f"{source} ({name}, normalised)",
                                          f"real output ({name}, normalised)", lineterm="")
        if lines:
            lines = [f"$ {self.command}   ({source} line {self.step.first + 1})"] + lines
        return lines


def run(section: Section, workspace: Workspace, update: bool,
        log=lambda text: print(text, flush=True)) -> list[Outcome]:
    """Every file and command of the section, in order."""
    ids: dict[str, str] = {}  # the page's snapshot ids -> the ones the run made
    jobs: list[Background] = []
    outcomes = []
    try:
        for item in section.items:
            if isinstance(item, FileBlock):
                (workspace.cwd / item.name).write_text(item.text)
                continue
            command = SNAPSHOT_ID.sub(lambda m: _real_id(ids, m), item.command)
            log(f"$ {command}")
            started = time.monotonic()
            if command == "wait":
                output = [line for job in jobs for line in job.finish()]
                jobs.clear()
            elif item.background:
                process = subprocess.Popen(
                    ["bash", "-c", command.rstrip()[:-1]], cwd=workspace.cwd, env=workspace.env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, start_new_session=True)
                jobs.append(Background(process))
                output = jobs[-1].settle(0 if update else len(item.expected))
            else:
                try:
                    done = subprocess.run(
                        ["bash", "-c", command], cwd=workspace.cwd, env=workspace.env,
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT_S)
                    output = done.stdout.splitlines()
                except subprocess.TimeoutExpired as exc:
                    output = (exc.stdout or "").splitlines() + [
                        f"(walkthrough: stopped after {COMMAND_TIMEOUT_S} s)"]
            output = workspace.show("\n".join(output)).split("\n") if output else []
            outcomes.append(Outcome(item, command, output, time.monotonic() - started))
            _learn_ids(ids, item.expected, output)
    finally:
        for job in jobs:
            job.stop()
    return outcomes


def _learn_ids(ids: dict[str, str], expected, actual) -> None:
    """Pair the page's snapshot ids with the run's, in order of appearance."""
    def found(lines):
        return list(dict.fromkeys(m.group(0) for line in lines for m in SNAPSHOT_ID.finditer(line)))

    made = found(actual)
    # (the run may make more ids than the page shows: those pair below)
    for old, new in zip(found(expected), made, strict=False):
        ids.setdefault(old, new)
    for new in made:  # for an id the page's output never showed (a placeholder)
        ids[SNAPSHOT_ID.sub(r"\1", new)] = new


def _real_id(ids: dict[str, str], match: re.Match) -> str:
    """The id the run made for the page's ``match``: the same one paired, else the
    latest snapshot of that rank and iteration, else the page's own."""
    return ids.get(match.group(0)) or ids.get(match.group(1)) or match.group(0)


def updated(section: Section, outcomes: list[Outcome]) -> str:
    """The page with each terminal's command and output replaced by what really ran."""
    lines = list(section.lines)
    for outcome in sorted(outcomes, key=lambda o: -o.step.first):
        step = outcome.step
        first_output = step.end - len(step.expected)
        command_lines = lines[step.first:first_output]
        if outcome.command != step.command:
            command_lines = [SNAPSHOT_ID.sub(_replacer(step.command, outcome.command), line)
                             for line in command_lines]
        lines[step.first:step.end] = command_lines + outcome.output
    return "\n".join(lines)


def _replacer(old: str, new: str):
    mapping = dict(zip((m.group(0) for m in SNAPSHOT_ID.finditer(old)),
                       (m.group(0) for m in SNAPSHOT_ID.finditer(new)),
                       strict=False))  # (an id only one side shows stays as it is)
    return lambda match: mapping.get(match.group(0), match.group(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--page", type=Path, default=PAGE,
                        help="the Markdown page holding the section (default: the checkout's "
                             "docs/getting-started/walkthrough.md)")
    parser.add_argument("--update", action="store_true",
                        help="rewrite the section's terminals with the real output")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    try:
        section = read_section(args.page.read_text(), args.page.name)
    except (OSError, WalkthroughError) as exc:
        print(f"walkthrough: error: {exc}", file=sys.stderr)
        return 2
    workspace = Workspace.create()
    started = time.monotonic()
    # killed (a test's timeout): still stop the background runs and remove the folder
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        outcomes = run(section, workspace, args.update)
    finally:
        if args.keep:
            print(f"walkthrough: kept {workspace.base}")
        else:
            workspace.remove()
    total = time.monotonic() - started
    for outcome in outcomes:
        print(f"{outcome.seconds:6.1f} s  $ {outcome.command}")
    if args.update:
        args.page.write_text(updated(section, outcomes))
        print(f"walkthrough: rewrote {len(outcomes)} commands' output in {args.page} "
              f"({total:.1f} s); review it with git diff")
        return 0
    labels = (DigestLabels(), DigestLabels())  # (digests repeat across commands)
    diffs = [outcome.diff(section.source, labels) for outcome in outcomes]
    failed = [diff for diff in diffs if diff]
    for diff in failed:
        print("\n".join(diff))
    differ = f"; {len(failed)} differ (tools/walkthrough.py --update rewrites them)"
    print(f"walkthrough: {len(outcomes) - len(failed)} of {len(outcomes)} commands printed what "
          f"{section.source} shows ({total:.1f} s){differ if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
