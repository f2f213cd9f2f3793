"""The ``break`` command's grammar: its request's arguments from what was
typed, and what ``break <TAB>`` offers next."""

from __future__ import annotations

from prism_debug.cost.ops import COLLECTIVES, op_name

#: Collective and p2p names offered by ``break coll <TAB>``: the canonical ones
#: (any spelling cost/ops.py reads is accepted)
COLLECTIVE_OPS = COLLECTIVES


def parse_break(arg: str) -> dict:
    """The ``break`` request's arguments for ``iter N`` or ``coll OP [FAMILY] [seq N]``;
    OP in any spelling, sent as its canonical name (an unknown one is a
    :class:`ConfigError` naming them)."""
    words = arg.split()
    if len(words) == 2 and words[0] in ("iter", "iteration"):
        return {"kind": "iter", "iteration": int(words[1])}
    if len(words) >= 2 and words[0] in ("coll", "collective"):
        op, rest = op_name(words[1], "break coll"), words[2:]
        family: str | None = None
        seq: int | None = None
        while rest:
            if rest[0] == "seq" and len(rest) >= 2 and seq is None:
                seq, rest = int(rest[1]), rest[2:]
            elif rest[0] != "seq" and family is None and seq is None:
                family, rest = rest[0], rest[1:]
            else:
                raise ValueError(f"unexpected {rest[0]!r}")
        return {"kind": "coll", "op": op, "family": family, "seq": seq}
    raise ValueError(f"not a breakpoint: {arg!r}")


def break_choices(words: list[str]) -> tuple[str, ...]:
    """What may follow ``break WORDS``: a kind, a collective, ``seq``."""
    if not words:
        return ("iter", "coll")
    if words[0] == "coll" and len(words) == 1:
        return COLLECTIVE_OPS
    if words[0] == "coll" and "seq" not in words:
        return ("seq",)
    return ()


def is_int(word: str) -> bool:
    try:
        int(word)
    except ValueError:
        return False
    return True
