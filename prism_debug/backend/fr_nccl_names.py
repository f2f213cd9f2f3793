"""What ProcessGroupNCCL records of one op: the flight recorder's sizes, dtypes
and profiling name, and the watchdog's ``OpType``, ``NumelIn`` and ``NumelOut``.

The prism group is handed the tensors the Python API was given (a list of
``world_size`` outputs for ``dist.all_gather``); NCCL flattens such lists
into one stacked tensor before it records them, so its flight record of a
one-element list-form all-gather over 8 ranks holds input ``[[1]]`` and
output ``[[8, 1]]``, and its watchdog prints ``NumelIn=1, NumelOut=8``.
torch's analyzer (fr_trace) checks exactly that (output numel = input numel
× group size), so a record of the unflattened list reads as a size mismatch
on every call.

The rules follow ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`` of
torch 2.10-2.13 (``collective()`` sums numels over its input and output
vectors, ``collectiveCoalesced()`` takes the first of each, ``pointToPoint``
the one tensor, ``endCoalescing`` none); where gloo records the same, the
tests check them against torch's own recorder on a real gloo group.  Pure:
tensors are read through ``.shape`` and ``.dtype`` only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from prism_debug.backend.fr_dump_format import scalar_type_name
from prism_debug.errors import ConfigError

__all__ = ["NcclCall", "UNDEFINED", "nccl_call", "nccl_call_of"]

Shape = tuple[int, ...]
#: c10::toString of an undefined tensor's dtype: NCCL's placeholder for a
#: gather's output (a scatter's input) on ranks other than the root
UNDEFINED = "Undefined"
_PLACEHOLDER: tuple[Shape, str] = ((0,), UNDEFINED)  # at::Tensor() has sizes [0]

# the prism group's call -> (profiling title without "nccl:", OpType, how NCCL sums numels)
_CALLS: dict[str, tuple[str, str, str]] = {
    "all_reduce": ("all_reduce", "ALLREDUCE", "sum"),
    "allreduce_coalesced": ("allreduce_coalesced", "COALESCED", "first"),
    "barrier": ("all_reduce_barrier", "ALLREDUCE", "sum"),
    "reduce": ("reduce", "REDUCE", "sum"),
    "broadcast": ("broadcast", "BROADCAST", "sum"),
    "all_gather": ("all_gather", "ALLGATHER", "sum"),
    "_all_gather_base": ("_all_gather_base", "_ALLGATHER_BASE", "sum"),
    "all_gather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", "COALESCED",
                                         "first"),
    "reduce_scatter": ("reduce_scatter", "REDUCE_SCATTER", "sum"),
    "_reduce_scatter_base": ("_reduce_scatter_base", "_REDUCE_SCATTER_BASE", "sum"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "COALESCED",
                                        "first"),
    "all_to_all": ("all_to_all", "ALLTOALL", "sum"),
    "all_to_all_single": ("all_to_all", "ALLTOALL_BASE", "sum"),
    "gather": ("gather", "GATHER", "sum"),
    "scatter": ("scatter", "SCATTER", "sum"),
    "send": ("send", "SEND", "sum"),
    "recv": ("recv", "RECV", "sum"),
    # the Work of a batch (batch_isend_irecv, _coalescing_manager): endCoalescing
    # makes it with no tensors, so its numels stay 0
    "coalesced": ("coalesced", "COALESCED", "none"),
}


@dataclasses.dataclass(frozen=True)
class NcclCall:
    """One op as ProcessGroupNCCL records it (FlightRecorder entry, WorkNCCL)."""
    profiling_name: str  # "nccl:all_gather", "nccl:send 0->1", "nccl:recv 1<-0"
    op_type: str  # WorkNCCL's OpType, as opTypeToString prints it
    input_sizes: tuple[Shape, ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[Shape, ...]
    output_dtypes: tuple[str, ...]
    numel_in: int
    numel_out: int


def nccl_call(call: str, inputs: Sequence[tuple[Shape, str]],
              outputs: Sequence[tuple[Shape, str]], *, group_size: int, group_rank: int,
              peer: int | None = None) -> NcclCall:
    """The record of ``call`` given the (shape, dtype) of the tensors the prism
    group was handed: ``inputs`` where the op has its own (gathers, scatters,
    reduce-scatters, all-to-all; else the outputs are the inputs), ``outputs``
    flat (a list-form all-gather's ``world_size`` tensors per input, in order).
    ``peer``: the group rank a send goes to or a receive comes from."""
    try:
        title, op_type, numels = _CALLS[call]
    except KeyError:
        raise ConfigError(f"no NCCL record known for {call!r} "
                          f"(known: {', '.join(sorted(_CALLS))})") from None
    ins, outs = list(inputs), list(outputs)
    n = group_size
    if call == "barrier":  # an all-reduce of a one-element float tensor
        ins = outs = [((1,), "Float")]
    elif call == "coalesced":
        ins = outs = []
    elif call == "all_gather":  # newLikeFlat(outputs): one [n, *shape] per input
        outs = [_stacked(outs[i * n:(i + 1) * n]) for i in range(len(ins))] if ins else outs
    elif call == "reduce_scatter":  # newLikeFlat(inputs)
        ins = [_stacked(ins[i * n:(i + 1) * n]) for i in range(len(outs))] if outs else ins
    elif call == "gather":
        outs = outs or [_PLACEHOLDER]
    elif call == "scatter":
        # collective(outputs, inputs): NCCL passes them the other way round
        ins, outs = outs, ins or [_PLACEHOLDER]
    elif call in ("send", "recv") or not ins:
        ins = outs
    if call in ("send", "recv"):
        if peer is None:
            raise ConfigError(f"a {call} needs its peer")
        arrow = "->" if call == "send" else "<-"
        title = f"{call} {group_rank}{arrow}{peer}"
    if numels == "sum":
        numel_in, numel_out = _numel(ins), _numel(outs)
    elif numels == "first":
        numel_in, numel_out = _numel(ins[:1]), _numel(outs[:1])
    else:
        numel_in = numel_out = 0
    return NcclCall(f"nccl:{title}", op_type, tuple(s for s, _ in ins),
                    tuple(d for _, d in ins), tuple(s for s, _ in outs),
                    tuple(d for _, d in outs), numel_in, numel_out)


def nccl_call_of(call: str, outputs: Any, inputs: Any, *, group_size: int, group_rank: int,
                 peer: int | None = None) -> NcclCall:
    """:func:`nccl_call` of the tensors themselves (nested lists allowed);
    ``inputs`` None: the op's outputs are its inputs."""
    return nccl_call(call, [] if inputs is None else _described(inputs), _described(outputs),
                     group_size=group_size, group_rank=group_rank, peer=peer)


def _stacked(tensors: list[tuple[Shape, str]]) -> tuple[Shape, str]:
    """newLikeFlat: tensors of one shape stacked along a new first dimension.

    Tensors of different shapes NCCL does not stack (it broadcasts each in a
    coalesced group): kept as the first's shape, the count in front."""
    shape, dtype = tensors[0]
    return (len(tensors), *shape), dtype


def _numel(described: list[tuple[Shape, str]]) -> int:
    return sum(math.prod(shape) for shape, _ in described)


def _described(tensors: Any) -> list[tuple[Shape, str]]:
    flat: list[tuple[Shape, str]] = []
    for item in tensors:
        if isinstance(item, (list, tuple)):
            flat.extend(_described(item))
        elif hasattr(item, "shape"):
            flat.append((tuple(int(d) for d in item.shape), _dtype_name(item.dtype)))
    return flat


def _dtype_name(dtype: Any) -> str:
    try:
        return scalar_type_name(dtype)
    except ConfigError:  # a dtype torch's recorder names in a way not tabled here
        return str(dtype).removeprefix("torch.")
