"""Collective names: one canonical spelling per op, and every other spelling
people type for it, read in one place.

The canonical names are torch.distributed's functions (``all_reduce``,
``reduce_scatter``, …): what graph files, reports, the console and the cost
model write.  Every reader of an op name — ``cost --op``, ``calibrate
--nccl-tests OP=PATH``, the console's ``break coll OP``, graph files, the cost
model itself — goes through :func:`op_name`, so a spelling one accepts the
others accept too.  Case, ``_`` and ``-`` do not matter (``allreduce``,
``All-Reduce``); torch's variants of one op (``all_gather_into_tensor``,
``isend``) and nccl-tests' names (``alltoall``) are aliases.  Pure Python.
"""

from __future__ import annotations

import difflib

from prism_debug.errors import ConfigError

#: the canonical names, in the order help texts list them
COLLECTIVES = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
    "reduce", "gather", "scatter", "barrier", "send", "recv",
)

# spellings beyond the canonical name with "_" and "-" dropped: torch's other
# functions for one op, and nccl-tests' and NCCL's names
_EXTRA = {
    "all_gather": ("all_gather_into_tensor", "allgather_base", "all_gather_base"),
    "reduce_scatter": ("reduce_scatter_tensor", "reduce_scatter_base"),
    "all_to_all": ("all_to_all_single",),
    "send": ("isend", "sendrecv"),  # nccl-tests' sendrecv_perf times send/recv pairs
    "recv": ("irecv",),
}


def _squeeze(word: str) -> str:
    return word.lower().replace("_", "").replace("-", "")


_BY_KEY = {_squeeze(name): name for name in COLLECTIVES}
_BY_KEY.update({_squeeze(alias): name for name, extra in _EXTRA.items() for alias in extra})

#: every accepted spelling (up to case, ``_`` and ``-``) -> its canonical name,
#: as the docs' op-name table (docs/reference/op-names.md) lists them
ALIASES = {alias: name for name in COLLECTIVES
           for alias in dict.fromkeys((name, name.replace("_", ""), name.replace("_", "-"),
                                       *_EXTRA.get(name, ())))}


def known_op(word: str) -> str | None:
    """The canonical name of ``word``, or None when it names no op."""
    return _BY_KEY.get(_squeeze(word)) if isinstance(word, str) else None


def op_name(word: str, what: str = "collective") -> str:
    """The canonical name of ``word``; :class:`ConfigError` naming the
    canonical names (and the closest one) when it is none of them.
    ``what`` says where it was written (``--op``)."""
    found = known_op(word)
    if found is not None:
        return found
    close = difflib.get_close_matches(_squeeze(str(word)), list(_BY_KEY), n=1, cutoff=0.7)
    hint = f" (did you mean {_BY_KEY[close[0]]}?)" if close else ""
    raise ConfigError(f"{what}: unknown collective {word!r}{hint}; use one of "
                      f"{', '.join(COLLECTIVES)} (case, '_' and '-' do not matter: allreduce "
                      "and all-reduce are all_reduce)")


def op_problem(word: object) -> str | None:
    """A check (prism_debug.checked's form) for an op name in a file."""
    if isinstance(word, str) and known_op(word) is not None:
        return None
    return f"must be one of {', '.join(COLLECTIVES)}, got {word!r}"
