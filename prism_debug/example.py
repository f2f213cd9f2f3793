"""The bundled example (``examples/train_gpt.py``): its arguments, defined once.

:class:`Example` holds the script's own defaults (a test reads them off the
script); ``prism-debug run`` with no command and a scenario's ``run.example``
both build their command line from it.  Pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from prism_debug.checked import Checked, at_least, declare, not_empty, positive

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train_gpt.py"


@dataclass(frozen=True, kw_only=True)
class Example(Checked):
    """The bundled example's arguments (examples/train_gpt.py), its defaults included."""

    iterations: int = declare("int", default=5, check=at_least(1))
    layers: int = declare("int", default=8, check=at_least(1))
    hidden: int = declare("int", default=256, check=at_least(1))
    heads: int = declare("int", default=8, check=at_least(1))
    seq_len: int = declare("int", default=128, check=at_least(1))
    vocab: int = declare("int", default=1024, check=at_least(1))
    micro_batches: int = declare("int", default=8, check=at_least(1))
    micro_batch_size: int = declare("int", default=2, check=at_least(1))
    tp: int = declare("int", default=8, check=at_least(1))
    pp: int = declare("int", default=4, check=at_least(1))
    backend: str = declare("text", default="gloo", check=not_empty)
    lr: float = declare("float", default=3e-4, check=positive)
    seed: int = declare("int", default=0)
    timing: bool = declare("bool", default=False)
    # a smaller job fed one replica's batches of a larger one (None: its own)
    data_parallel_size: int | None = declare("int", default=None, check=at_least(1))
    data_parallel_rank: int | None = declare("int", default=None, check=at_least(0))
    loss_hex: bool = declare("bool", default=False)  # print each loss exactly too

    def argv(self, names: tuple[str, ...] | None = None) -> list[str]:
        """The example's command-line arguments (only ``names``, in that order,
        when given: a short command line for the flags that matter)."""
        args: list[str] = []
        for name in names or [f.name for f in dataclasses.fields(self)]:
            flag, value = "--" + name.replace("_", "-"), getattr(self, name)
            if isinstance(value, bool):
                args += [flag] if value else []
            elif value is not None:
                args += [flag, str(value)]
        return args

    def layout_problem(self, world_size: int) -> str | None:
        """Why the example cannot run in a world of ``world_size`` ranks, or None."""
        if world_size % (self.tp * self.pp):
            return (f"world size {world_size} cannot be laid out as tp={self.tp} x "
                    f"pp={self.pp} x dp: use a multiple of {self.tp * self.pp}")
        return None

    def _rules(self):  # the example's own checks, so a bad layout fails at lint time
        if self.layers % self.pp:
            yield ("pp",), f"layers {self.layers} is not divisible by pp {self.pp}"
        if self.heads % self.tp:
            yield ("tp",), f"heads {self.heads} is not divisible by tp {self.tp}"
        if self.hidden % self.heads:
            yield ("heads",), f"hidden {self.hidden} is not divisible by heads {self.heads}"
        if self.data_parallel_rank is not None and not (
                self.data_parallel_size and self.data_parallel_rank < self.data_parallel_size):
            yield (("data_parallel_rank",), "data_parallel_rank needs data_parallel_size, "
                   "and must be below it")


# What ``prism-debug run`` with no command runs: the example as production runs
# it (the nccl backend, which prism-debug stands in for), four iterations unless
# --iterations says otherwise.  Its graph is profiled told the slices' count
# (graph_cache.PROFILE_ITERATIONS), so runs of any length share one graph.
RUN_DEFAULTS = Example(backend="nccl", iterations=4)
RUN_FLAGS = ("backend", "tp", "pp", "iterations")  # what its command line spells out
