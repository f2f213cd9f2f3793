"""A prism group's ops where it has several real members: their part runs
on the real gloo communicator among them (backend/real_comms.py).

The op keeps the prism group's path — arrival on the emulated clock, the
digest, the engine's completion, the watchdog and the flight recorder — and
only its data comes from the other real processes.  The real exchange
happens inside the op's hold of the emulated clock: it is the harness's
time, not the job's (the replay engine says when the op completes).

* A group whose members are all real runs each collective as the job's
  backend does.  gloo lacks NCCL's AVG and PREMUL_SUM: they run as a SUM,
  then the division or after the multiplication NCCL does, so a script
  written for NCCL gets NCCL's answer.
* Point-to-point ops between two real ranks run for real, whatever the rest
  of their group is; a real rank's sends to and receives from a virtual
  peer keep the virtual path.  A real send or receive is issued without
  waiting (two ranks that both send first must not deadlock, as in gloo):
  a receive's data, and its digest, are there once its Work is waited.
* A group that mixes several real members with virtual peers is not served
  yet: its collectives raise :class:`UnsupportedOperation` (one real member
  with virtual peers is the usual case, and takes the virtual path).

(``group`` below is the :class:`~prism_debug.backend.process_group.PrismProcessGroup`
that owns these ops, which imports this module: unannotated, one way.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prism_debug.backend.real_comms import RealGroup
from prism_debug.errors import UnsupportedOperation

_R = dist.ReduceOp.RedOpType


class RealOps:
    def __init__(self, group, real: RealGroup) -> None:
        self._group = group
        self._rt = group._rt
        self.real = real

    # -- collectives among all-real members ---------------------------------------

    def _all_real(self, op: str) -> None:
        if not self.real.all_real:
            raise UnsupportedOperation(
                f"{op} on {self._group!r}: the group has {len(self.real.members)} real members "
                f"(ranks {', '.join(map(str, self.real.members))}) among {self.real.size}; "
                "collectives of a group that mixes several real ranks with virtual peers are "
                "not supported yet: choose --ranks so that each such group has all or one of "
                "its members real")

    def allreduce(self, tensors, opts, call: str):
        self._all_real("all_reduce")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(tensors)
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        _reduce(self.real.pg, tensors, op, self.real.size)
        rt.digest(tensors)
        return group._complete("all_reduce", _nbytes(tensors), t0, arrival, tensors, call=call)

    def reduce(self, tensors, opts):
        self._all_real("reduce")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(tensors)
        kind, factor = _kind(opts.reduceOp)
        before = [t.clone() for t in tensors] if opts.rootRank != group._me else None
        gloo_opts = dist.ReduceOptions()
        gloo_opts.rootRank = opts.rootRank
        gloo_opts.reduceOp = _gloo_op(kind)
        _premultiply(tensors, kind, factor)
        self.real.pg.reduce(tensors, gloo_opts).wait()
        if before is not None:  # NCCL writes the result on the root only
            for tensor, old in zip(tensors, before):
                tensor.copy_(old)
        else:
            _average(tensors, kind, self.real.size)
            rt.digest(tensors)
        return group._complete("reduce", _nbytes(tensors), t0, arrival, tensors)

    def reduce_scatter(self, outputs, input_lists, opts):
        self._all_real("reduce_scatter")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        for inputs in input_lists:
            rt.inputs(inputs)
        # as an all-reduce of each stacked input, then this rank's chunk: gloo's
        # reduce_scatter reduces in the same order, and every op kind is served
        for out, inputs in zip(outputs, input_lists):
            whole = torch.stack([t.reshape(-1) for t in inputs])
            _reduce(self.real.pg, [whole], opts.reduceOp, self.real.size)
            out.copy_(whole[group._me].view_as(out))
        rt.digest(outputs)
        nbytes = sum(_nbytes(inputs) for inputs in input_lists)
        return group._complete("reduce_scatter", nbytes, t0, arrival, outputs,
                               inputs=input_lists)

    def reduce_scatter_tensors(self, outputs, inputs, opts, call: str):
        self._all_real("reduce_scatter")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(inputs)
        for out, inp in zip(outputs, inputs):
            whole = inp.clone()
            _reduce(self.real.pg, [whole], opts.reduceOp, self.real.size)
            out.copy_(whole.reshape(self.real.size, -1)[group._me].view_as(out))
        rt.digest(outputs)
        return group._complete("reduce_scatter", _nbytes(inputs), t0, arrival, outputs,
                               inputs=inputs, call=call)

    def allgather(self, output_lists, input_tensors, call: str = "all_gather"):
        self._all_real("all_gather")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(input_tensors)
        self.real.pg.allgather(output_lists, input_tensors).wait()
        for outs in output_lists:
            rt.digest(outs)
        nbytes = _nbytes(input_tensors) * self.real.size
        return group._complete("all_gather", nbytes, t0, arrival, output_lists,
                               inputs=input_tensors)

    def all_gather_tensors(self, outputs, inputs, call: str):
        self._all_real("all_gather")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(inputs)
        for out, inp in zip(outputs, inputs):
            self.real.pg._allgather_base(out, inp).wait()
        rt.digest(outputs)
        return group._complete("all_gather", _nbytes(outputs), t0, arrival, outputs,
                               inputs=inputs, call=call)

    def gather(self, output_lists, input_tensors, opts):
        self._all_real("gather")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(input_tensors)
        gloo_opts = dist.GatherOptions()
        gloo_opts.rootRank = opts.rootRank
        self.real.pg.gather(output_lists, input_tensors, gloo_opts).wait()
        if opts.rootRank == group._me:
            for outs in output_lists:
                rt.digest(outs)
        nbytes = _nbytes(input_tensors) * self.real.size
        return group._complete("gather", nbytes, t0, arrival, output_lists,
                               inputs=input_tensors)

    def scatter(self, output_tensors, input_lists, opts):
        self._all_real("scatter")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        root = opts.rootRank == group._me
        if root:
            for inputs in input_lists:
                rt.inputs(inputs)
        gloo_opts = dist.ScatterOptions()
        gloo_opts.rootRank = opts.rootRank
        self.real.pg.scatter(output_tensors, input_lists if root else [], gloo_opts).wait()
        rt.digest(output_tensors)
        nbytes = _nbytes(output_tensors) * self.real.size
        return group._complete("scatter", nbytes, t0, arrival, output_tensors,
                               source=opts.rootRank, inputs=input_lists if root else [])

    def broadcast(self, tensors, opts):
        self._all_real("broadcast")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        gloo_opts = dist.BroadcastOptions()
        gloo_opts.rootRank = opts.rootRank
        self.real.pg.broadcast(tensors, gloo_opts).wait()
        rt.digest(tensors)
        return group._complete("broadcast", _nbytes(tensors), t0, arrival, tensors,
                               source=opts.rootRank)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        self._all_real("all_to_all")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs([input])
        self.real.pg.alltoall_base(output, input, list(output_split_sizes or []),
                               list(input_split_sizes or []), dist.AllToAllOptions()).wait()
        rt.digest([output])
        return group._complete("all_to_all", input.nbytes, t0, arrival, [output],
                               inputs=[input], call="all_to_all_single")

    def alltoall(self, output_tensors, input_tensors):
        self._all_real("all_to_all")
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(input_tensors)
        # gloo has no list all-to-all: one send and one receive per peer,
        # all issued before any is waited (the order a ring of them needs)
        works = []
        for peer, (out, inp) in enumerate(zip(output_tensors, input_tensors)):
            if peer == group._me:
                out.copy_(inp)
            else:
                works.append(self.real.pg.send([inp.contiguous()], peer, _ALLTOALL_TAG))
                works.append(self.real.pg.recv([out], peer, _ALLTOALL_TAG))
        for work in works:
            work.wait()
        rt.digest(output_tensors)
        return group._complete("all_to_all", _nbytes(input_tensors), t0, arrival,
                               output_tensors, inputs=input_tensors)

    def barrier(self):
        group = self._group
        t0, arrival = group._arrive()
        self.real.pg.barrier().wait()  # a barrier of the real members only
        return group._complete("barrier", 0, t0, arrival, [])

    # -- point to point -------------------------------------------------------------

    def is_real_peer(self, group_peer: int) -> bool:
        return group_peer in self.real.positions

    def send(self, tensors, dst: int, tag: int):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(tensors)
        real_work = self.real.pg.send(tensors, self.real.real_rank_of(dst), tag)
        work = group._complete("send", _nbytes(tensors), t0, arrival, tensors,
                               group._peer(dst), dst)
        work.real_work = real_work
        return work

    def recv(self, tensors, src: int, tag: int):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        real_work = self.real.pg.recv(tensors, self.real.real_rank_of(src), tag)
        work = group._complete("recv", _nbytes(tensors), t0, arrival, tensors,
                               group._peer(src), src)
        work.source_rank = src
        work.real_work = real_work
        work.on_real_done = lambda: rt.digest(tensors)
        return work


_ALLTOALL_TAG = 0x7072  # apart from the script's own tags (gloo matches on peer and tag)


def _kind(op) -> tuple[int, object]:
    kind = (op if isinstance(op, _R) else op.op).value
    return kind, (op.factor if kind == _R.PREMUL_SUM.value else None)


def _gloo_op(kind: int) -> dist.ReduceOp:
    if kind in (_R.AVG.value, _R.PREMUL_SUM.value):
        return dist.ReduceOp.SUM
    return dist.ReduceOp(_R(kind))


def _premultiply(tensors, kind: int, factor) -> None:
    if kind == _R.PREMUL_SUM.value:
        for tensor in tensors:
            tensor.mul_(factor.item() if isinstance(factor, torch.Tensor) else factor)


def _average(tensors, kind: int, n: int) -> None:
    if kind == _R.AVG.value:
        for tensor in tensors:
            tensor.div_(n)


def _reduce(pg, tensors, op, n: int) -> None:
    """``op`` over the real members, in place, as NCCL defines it."""
    kind, factor = _kind(op)
    opts = dist.AllreduceOptions()
    opts.reduceOp = _gloo_op(kind)
    _premultiply(tensors, kind, factor)
    pg.allreduce(tensors, opts).wait()
    _average(tensors, kind, n)


def _nbytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)
