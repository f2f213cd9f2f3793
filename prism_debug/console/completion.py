"""What the console's tab key offers after each command's name: pure of the
console's own state, but for the snapshot ids the controller lists."""

from __future__ import annotations

from typing import Any

from prism_debug.console.parsing import break_choices
from prism_debug.errors import PrismError


class Completion:
    """The ``complete_<command>`` methods :class:`cmd.Cmd` calls (the
    console's ``client`` answers ``snapshots``)."""

    client: Any

    def complete_break(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        choices = break_choices(line[:begidx].split()[1:])
        return [choice for choice in choices if choice.startswith(text)]

    complete_b = complete_tbreak = complete_break

    def complete_events(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        return [choice for choice in ("on", "off") if choice.startswith(text)]

    def complete_info(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        return ["breaks"] if "breaks".startswith(text) else []

    def complete_restore(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        try:
            snapshots = self.client.request("snapshots", timeout_s=1.0)["snapshots"]
        except PrismError:
            return []  # completion stays silent; the command itself reports errors
        return [s["id"] for s in snapshots if s["id"].startswith(text)]
