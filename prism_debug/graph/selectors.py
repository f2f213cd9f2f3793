"""Rank selectors, as people type them: ``4096``, ``4096-4103``, ``1,5,9-12``,
``node 512`` (the ranks on node 512); node lists for links: ``512``,
``512-515,600``; iteration lists for options: ``3,10``.

Parsing checks the text without expanding it (``0-999999999`` is cheap to
check); :func:`select_ranks` expands what :func:`rank_spans` accepts.
:func:`rank_list` and :func:`number_list` read command-line options, where
blank text (the option not given) lists nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prism_debug.checked import MAX_ITERATIONS
from prism_debug.errors import ConfigError


def rank_spans(text: str, world_size: int, gpus_per_node: int) -> list[tuple[int, int]]:
    """The ``(first, last)`` rank ranges ``text`` names, checked but not
    expanded; :class:`ConfigError` saying what is wrong otherwise."""
    text = text.strip()
    words = text.split()
    if len(words) == 2 and words[0] == "node":
        if not words[1].isdecimal():
            raise ConfigError(f"node {words[1]!r} is not a number")
        node = int(words[1])
        nodes = -(-world_size // gpus_per_node)
        if node >= nodes:
            raise ConfigError(f"node {node} is outside the world: nodes are 0-{nodes - 1}")
        return [(node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node) - 1)]
    return _spans(text, world_size,
                  "ranks: use R, A-B, a list of them separated by commas, or node N",
                  lambda rank: f"rank {rank} is outside the world of {world_size} ranks")


def node_spans(text: str, num_nodes: int) -> list[tuple[int, int]]:
    """The ``(first, last)`` node ranges ``text`` names, checked but not expanded."""
    return _spans(text, num_nodes, "nodes: use N, A-B, or a list of them separated by commas",
                  lambda node: f"node {node} is outside the world: nodes are 0-{num_nodes - 1}")


def expand(spans: list[tuple[int, int]]) -> list[int]:
    """The numbers in ``spans``, in order, each once."""
    return list(dict.fromkeys(n for first, last in spans for n in range(first, last + 1)))


def select_ranks(text: str, world_size: int, gpus_per_node: int) -> list[int]:
    """The ranks ``text`` names, in order, each once; :class:`ConfigError`
    saying what is wrong otherwise."""
    return expand(rank_spans(text, world_size, gpus_per_node))


# the most numbers a command-line list may expand to: a trace of more ranks
# cannot be read, and a snapshot after every iteration is --snapshot-every 1
MAX_LISTED = 1 << 16


def rank_list(text: str, world_size: int, gpus_per_node: int, option: str) -> tuple[int, ...]:
    """:func:`select_ranks` for the command-line ``option`` (``--trace-ranks``)
    that gave ``text``: () when it is blank; its errors start with the option.
    At most :data:`MAX_LISTED` ranks, counted before they are expanded."""
    if not text.strip():
        return ()
    try:
        spans = rank_spans(text, world_size, gpus_per_node)
        _at_most(spans, "ranks")
        return tuple(expand(spans))
    except ConfigError as exc:
        raise ConfigError(f"{option}: {exc}") from None


def number_list(text: str, option: str, what: str, high: int = MAX_ITERATIONS
                ) -> tuple[int, ...]:
    """The numbers the command-line ``option`` lists in ``text`` (``3,10``,
    ``2-5``, each at most ``high``), in order, each once; () when it is blank.
    ``what`` names them in errors: ``--snapshot-at: cannot read 'x' as
    iterations: use N, A-B, or …``.  Bounds and the count are checked before
    anything is expanded."""
    if not text.strip():
        return ()
    try:
        spans = _spans(text, high + 1, f"{what}: use N, A-B, or a list of them separated by "
                                       "commas", lambda n: f"{what} go up to {high}, not {n}")
        _at_most(spans, what)
        return tuple(expand(spans))
    except ConfigError as exc:
        raise ConfigError(f"{option}: {exc}") from None


def _at_most(spans: list[tuple[int, int]], what: str) -> None:
    count = sum(last - first + 1 for first, last in spans)
    if count > MAX_LISTED:
        raise ConfigError(f"{count} {what} listed, more than the {MAX_LISTED} a list may "
                          "hold: list fewer")


def _spans(text: str, count: int | None, readable_as: str,
           outside: Callable[[int], str] | None) -> list[tuple[int, int]]:
    """``count`` None: no upper bound (and no ``outside`` message)."""
    spans = []
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        # isdecimal, not isdigit: "²" is a digit int() cannot read
        # (and short: int() of thousands of digits raises)
        if not low.isdecimal() or (dash and not high.isdecimal()) or len(part) > 40:
            raise ConfigError(f"cannot read {part!r} as {readable_as}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ConfigError(f"the range {part} runs backwards")
        if count is not None and last >= count:
            assert outside is not None
            raise ConfigError(outside(last))
        spans.append((first, last))
    return spans


def ranks_text(ranks: Iterable[int]) -> str:
    """Ranks as a user reads them: ``0-3, 5, 8-9``."""
    ranks = sorted(set(ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(parts)
