"""Rank selectors, as people type them: ``4096``, ``4096-4103``, ``1,5,9-12``,
``node 512`` (the ranks on node 512)."""

from __future__ import annotations

from prism_debug.errors import ConfigError


def select_ranks(text: str, world_size: int, gpus_per_node: int) -> list[int]:
    """The ranks ``text`` names, in order, each once; :class:`ConfigError`
    saying what is wrong otherwise."""
    text = text.strip()
    words = text.split()
    if len(words) == 2 and words[0] == "node":
        if not words[1].isdigit():
            raise ConfigError(f"node {words[1]!r} is not a number")
        node = int(words[1])
        nodes = -(-world_size // gpus_per_node)
        if node >= nodes:
            raise ConfigError(f"node {node} is outside the world: nodes are 0-{nodes - 1}")
        return list(range(node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node)))
    ranks: list[int] = []
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ConfigError(f"cannot read {part!r} as ranks: use R, A-B, a list of them "
                              "separated by commas, or node N")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ConfigError(f"the range {part} runs backwards")
        if last >= world_size:
            raise ConfigError(f"rank {last} is outside the world of {world_size} ranks")
        ranks.extend(range(first, last + 1))
    return list(dict.fromkeys(ranks))
