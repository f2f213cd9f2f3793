"""The pdb habits the console keeps, apart from its commands: every line
through one ``message()``/``error()`` pair (or one JSON line each with
``--json``), ``;``-separated commands, help from docstrings, a history file,
Ctrl-C that abandons the line and not the session.

:class:`~prism_debug.console.console.Console` adds the commands."""

from __future__ import annotations

import cmd
import inspect
import io
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

logger = logging.getLogger(__name__)

HISTORY_LENGTH = 1000


def default_history_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(state).expanduser() / "prism-debug" / "console_history"


def split_commands(line: str) -> list[str]:
    """``break iter 3; c; status`` -> three commands (``;;``, pdb's separator, works too)."""
    return [part.strip() for part in line.replace("\n", ";").split(";") if part.strip()]


class Shell(cmd.Cmd):
    """A :class:`cmd.Cmd` that is scriptable: stdin and stdout injectable, no
    prompt when not interactive, an exit status that says whether any command
    failed."""

    def __init__(self, prompt: str, stdin: TextIO | None = None, stdout: TextIO | None = None,
                 json_mode: bool = False, interactive: bool | None = None) -> None:
        super().__init__(stdin=stdin, stdout=stdout)
        self.json_mode = json_mode
        if interactive is None:
            isatty = getattr(self.stdin, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        # input() (and with it readline's history and completion) only reads sys.stdin.
        self.use_rawinput = interactive and self.stdin is sys.stdin
        # A piped script gets no prompt noise between its outputs.
        self.prompt = prompt if interactive else ""
        self.history_path = default_history_path()
        self.num_errors = 0

    # -- output: every line goes through message() or error() -----------------

    def message(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def error(self, text: str, type: str = "BadArguments") -> None:
        """Report a failed command; it never ends the console."""
        self.num_errors += 1
        if self.json_mode:
            self.message(json.dumps({"error": {"type": type, "message": text}}))
        else:
            self.message(f"*** {text}")

    @property
    def exit_status(self) -> int:
        """0 if every command so far succeeded, 1 if any reported an error."""
        return 0 if self.num_errors == 0 else 1

    def _show(self, result: dict, render: Callable[[dict], str]) -> None:
        self.message(json.dumps(result) if self.json_mode else render(result))

    def _usage(self, command: str) -> None:
        doc = inspect.cleandoc(getattr(self, "do_" + command).__doc__)
        self.error(f"usage: {doc.splitlines()[0]}")

    # -- the command loop -------------------------------------------------------

    def cmdloop(self, intro: str | None = None) -> None:
        history = self._load_history() if self.use_rawinput else False
        try:
            while True:
                try:
                    super().cmdloop(intro)
                    return
                except KeyboardInterrupt:
                    # pdb's habit: Ctrl-C at the prompt abandons the line, not the session.
                    if not self.interactive:
                        raise
                    self.message("--KeyboardInterrupt--")
                    intro = None
        finally:
            if history:
                self._save_history()

    def run_commands(self, text: str, detach: bool = True) -> int:
        """Run ``;``-separated commands (``--command``); 0 if all succeeded, else 1.

        Running out of commands ends the input (:meth:`end_of_input`: the
        console detaches) like the end of piped input, unless ``detach`` is
        false (to go on with :meth:`cmdloop`).
        """
        num_errors = self.num_errors
        stop = False
        for line in split_commands(text):
            stop = self.postcmd(self.onecmd(line), line)
            if stop:
                break
        if detach and not stop:
            self.end_of_input()
        return 0 if self.num_errors == num_errors else 1

    def end_of_input(self) -> None:
        """What running out of commands does (nothing here)."""

    def precmd(self, line: str) -> str:
        # `break iter 3; c; status`: run the first, queue the rest (pdb does this for ;;).
        commands = split_commands(line)
        if len(commands) <= 1:
            return commands[0] if commands else line
        self.cmdqueue[0:0] = commands[1:]
        return commands[0]

    def default(self, line: str) -> None:
        name = line.split()[0]
        self.error(f"unknown command {name!r}; type help for the list", type="UnknownVerb")

    def do_help(self, arg: str) -> None:
        """h(elp) [COMMAND]

        Without argument, list the commands; with one, show its help.
        """
        if arg:
            method = getattr(self, "do_" + arg, None)
            if method is None or not method.__doc__:
                return self.error(f"no help on {arg!r}; type help for the list")
            text = inspect.cleandoc(method.__doc__)
        else:
            buffer, stdout = io.StringIO(), self.stdout
            self.stdout = buffer
            try:
                super().do_help("")
            finally:
                self.stdout = stdout
            text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).rstrip("\n")
        self._show({"help": text}, lambda _: text)

    do_h = do_help

    # -- history ----------------------------------------------------------------

    def _load_history(self) -> bool:
        try:
            import readline
        except ImportError:  # no readline (some builds): no history, input() still works
            return False
        readline.set_history_length(HISTORY_LENGTH)
        try:
            readline.read_history_file(self.history_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot read the console history %s: %s", self.history_path, exc)
        return True

    def _save_history(self) -> None:
        import readline
        try:
            self.history_path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(self.history_path)
        except OSError as exc:
            logger.warning("cannot write the console history %s: %s", self.history_path, exc)
