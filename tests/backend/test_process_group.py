"""The prism group refuses what torch's backends refuse: an op's list of
outputs and list of inputs go together, one per input, and a list of another
length is an error before the op is issued — never silently cut short."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from prism_debug.backend.process_group import PrismProcessGroup
from prism_debug.backend.runtime import Runtime
from prism_debug.backend.tracker import IterationTracker
from prism_debug.backend.values import Values
from prism_debug.cost import DEFAULT_PROFILE, CostModel, load_profile
from prism_debug.engine import EmulatedClock
from prism_debug.engine.lockstep import LockstepEngine
from prism_debug.graph import FamilyRecorder, GroupRef

WORLD = 4


def group() -> PrismProcessGroup:
    clock = EmulatedClock()
    rt = Runtime(rank=0, world_size=WORLD, clock=clock,
                 engine=LockstepEngine(CostModel(load_profile(DEFAULT_PROFILE)), 8),
                 values=Values("mirror", 0),
                 tracker=IterationTracker(clock.now(), lambda record: None, False),
                 families=FamilyRecorder(WORLD))
    return PrismProcessGroup(rt, list(range(WORLD)), GroupRef("world", 0),
                             datetime.timedelta(seconds=600), "nccl")


def chunks(n: int) -> list[torch.Tensor]:
    return [torch.zeros(2) for _ in range(n)]


def reduce_scatter_options() -> dist.ReduceScatterOptions:
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    return opts


def root_options(cls):
    opts = cls()
    opts.rootRank = 0
    return opts


OPS = {
    "all_gather": lambda pg: pg.allgather([chunks(WORLD)] * 2, chunks(1)),
    "gather": lambda pg: pg.gather([chunks(WORLD)], chunks(2), root_options(dist.GatherOptions)),
    "reduce_scatter": lambda pg: pg.reduce_scatter(chunks(2), [chunks(WORLD)],
                                                   reduce_scatter_options()),
    "reduce_scatter_tensor_coalesced": lambda pg: pg.reduce_scatter_tensor_coalesced(
        [torch.zeros(2)] * 2, [torch.zeros(2 * WORLD)], reduce_scatter_options()),
    "all_gather_into_tensor_coalesced": lambda pg: pg.allgather_into_tensor_coalesced(
        [torch.zeros(2 * WORLD)], [torch.zeros(2)] * 3),
}


@pytest.mark.parametrize("call", OPS)
def test_an_op_whose_output_and_input_lists_differ_in_length_is_refused(call):
    pg = group()
    tracker = pg._rt.tracker
    with pytest.raises(RuntimeError, match="requires input/output tensor lists to have the "
                                           "same length"):
        OPS[call](pg)
    assert tracker.num_collectives == 0 and pg.num_issued == 0  # nothing was issued


def test_lists_of_one_length_go_through():
    pg = group()
    outputs, inputs = [chunks(WORLD), chunks(WORLD)], [torch.ones(2), torch.full((2,), 2.0)]
    pg.allgather(outputs, inputs).wait()
    assert all(torch.equal(out, inp) for outs, inp in zip(outputs, inputs, strict=True)
               for out in outs)
    assert pg.num_issued == 1
    pg._rt.completer.close()
