"""A prism group's ops where it has several real members: their part runs
on the real gloo communicator among them (backend/real_comms.py), the
virtual peers' part as the run's values policy says (backend/mixed.py).

The op keeps the prism group's path — arrival on the emulated clock, the
digest, the engine's completion, the watchdog and the flight recorder — and
only its data comes from the other real processes.  The real exchange
happens inside the op's hold of the emulated clock: it is the harness's
time, not the job's (the replay engine says when the op completes).

* Collectives: a group whose members are all real gets exactly the real
  op; one that mixes m real members with virtual peers gets the real op
  among the m, each virtual peer contributing as ``mixed`` assigns it (under
  ``mirror``, what its assigned real member contributes).  gloo lacks NCCL's
  AVG and PREMUL_SUM: they run as a SUM of pre-multiplied contributions, then
  the division, so a script written for NCCL gets NCCL's answer.
* Point-to-point ops between two real ranks run for real, whatever the rest
  of their group is; a real rank's sends to and receives from a virtual
  peer keep the virtual path.  A real send or receive is issued without
  waiting (two ranks that both send first must not deadlock, as in gloo):
  a receive's data, and its digest, are there once its Work is waited.
* The values' keys are the group's (its family, index and op count), the
  same on every member, so seeded virtual contributions agree everywhere.

(``group`` below is the :class:`~prism_debug.backend.process_group.PrismProcessGroup`
that owns these ops, which imports this module: unannotated, one way.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prism_debug.backend import mixed
from prism_debug.backend.real_comms import Communicator, RealGroup
from prism_debug.backend.work import nbytes as _nbytes
from prism_debug.backend.work import split_chunks

_ALLTOALL_TAG = 0x7072  # apart from the script's own tags (gloo matches on peer and tag)


class RealOps:
    def __init__(self, group, real: RealGroup) -> None:
        self._group = group
        self._rt = group._rt
        self.real = real
        self.mixed = mixed.MixedGroup(real.size, real.positions, real.index)
        # the group's collectives so far: every member issues them in one order
        # (its point-to-point ops are each rank's own, so they are not counted)
        self._collectives = 0

    @property
    def _pg(self) -> Communicator:
        pg = self.real.pg
        # (closed at a cut and at the rank's exit, where no op runs, until it reconnects)
        assert pg is not None, "the real communicator is closed"
        return pg

    def _real_rank(self, group_peer: int) -> int:
        """The gloo rank of the group's real member ``group_peer``."""
        real_rank = self.real.real_rank_of(group_peer)
        assert real_rank is not None, "point-to-point ops go real to real peers only"
        return real_rank

    def _key(self, i: int = 0) -> tuple:
        group = self._group
        return ("real", group.ref.family, group.ref.index, self._collectives, i)

    def _faulty(self) -> tuple:
        return self._group._faulty() if self._rt.peer_faults.active else ()

    # -- the real ops among the real members (gloo ranks = member indices) ------------

    def _reduce_real(self, tensor: torch.Tensor, op) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(op)
        self._pg.allreduce([tensor], opts).wait()

    def _reduce_real_to(self, tensor: torch.Tensor, op, member: int) -> None:
        opts = dist.ReduceOptions()
        opts.reduceOp = dist.ReduceOp(op)
        opts.rootRank = member
        self._pg.reduce([tensor], opts).wait()

    def _gather_real(self, outputs: list, input: torch.Tensor) -> None:
        self._pg.allgather([outputs], [input]).wait()

    def _broadcast_real(self, tensor: torch.Tensor, member: int) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = member
        self._pg.broadcast([tensor], opts).wait()

    def _alltoall_real(self, outputs: list, inputs: list) -> None:
        # gloo has no list all-to-all: a send and a receive per other member,
        # all issued before any is waited (the order a ring of them needs)
        me, works = self.real.index, []
        for j, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
            if j == me:
                out.copy_(inp)
            else:
                works.append(self._pg.send([inp.contiguous()], j, _ALLTOALL_TAG))
                works.append(self._pg.recv([out], j, _ALLTOALL_TAG))
        for work in works:
            work.wait()

    # -- reductions ----------------------------------------------------------------------

    def allreduce(self, tensors, opts, call: str):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs(tensors)
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        faulty = self._faulty()
        for i, tensor in enumerate(tensors):
            mixed.allreduce_mixed(self.mixed, tensor, op, rt.values, self._key(i),
                                  self._reduce_real, faulty)
        rt.digest(tensors)
        return group._complete("all_reduce", _nbytes(tensors), t0, arrival, tensors, call=call)

    def reduce(self, tensors, opts):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs(tensors)
        faulty = self._faulty()
        for i, tensor in enumerate(tensors):
            mixed.reduce_mixed(self.mixed, tensor, opts.rootRank, opts.reduceOp, rt.values,
                               self._key(i), self._reduce_real_to, faulty)
        if opts.rootRank == group._me:
            rt.digest(tensors)
        return group._complete("reduce", _nbytes(tensors), t0, arrival, tensors)

    def reduce_scatter(self, outputs, input_lists, opts):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        faulty = self._faulty()
        for i, (out, inputs) in enumerate(zip(outputs, input_lists, strict=True)):
            rt.inputs(inputs)
            whole = torch.stack([t.reshape(-1) for t in inputs])
            mixed.reduce_scatter_mixed(self.mixed, out, whole, opts.reduceOp, rt.values,
                                       self._key(i), self._reduce_real, faulty)
        rt.digest(outputs)
        nbytes = sum(_nbytes(inputs) for inputs in input_lists)
        return group._complete("reduce_scatter", nbytes, t0, arrival, outputs,
                               inputs=input_lists)

    def reduce_scatter_tensors(self, outputs, inputs, opts, call: str):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs(inputs)
        faulty = self._faulty()
        for i, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
            mixed.reduce_scatter_mixed(self.mixed, out, inp, opts.reduceOp, rt.values,
                                       self._key(i), self._reduce_real, faulty)
        rt.digest(outputs)
        return group._complete("reduce_scatter", _nbytes(inputs), t0, arrival, outputs,
                               inputs=inputs, call=call)

    # -- gathers -----------------------------------------------------------------------

    def allgather(self, output_lists, input_tensors):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs(input_tensors)
        for i, (outs, inp) in enumerate(zip(output_lists, input_tensors, strict=True)):
            mixed.allgather_mixed(self.mixed, outs, inp, rt.values, self._key(i),
                                  self._gather_real)
            rt.digest(outs)
        nbytes = _nbytes(input_tensors) * self.real.size
        return group._complete("all_gather", nbytes, t0, arrival, output_lists,
                               inputs=input_tensors)

    def all_gather_tensors(self, outputs, inputs, call: str):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs(inputs)
        for i, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
            slots = list(out.view(self.real.size, -1).unbind(0))
            mixed.allgather_mixed(self.mixed, slots, inp.reshape(-1), rt.values, self._key(i),
                                  self._gather_real)
        rt.digest(outputs)
        return group._complete("all_gather", _nbytes(outputs), t0, arrival, outputs,
                               inputs=inputs, call=call)

    def gather(self, output_lists, input_tensors, opts):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs(input_tensors)
        root, mine = opts.rootRank, opts.rootRank == group._me
        if root in self.real.positions:  # a virtual root: nothing reaches a real rank
            member = self.mixed.assigned[root]
            for i, inp in enumerate(input_tensors):  # (a non-root has no outputs)
                gloo = dist.GatherOptions()
                gloo.rootRank = member
                outs = output_lists[i] if mine else []
                slots = [outs[p] for p in self.real.positions] if mine else []
                self._pg.gather([slots] if mine else [], [inp], gloo).wait()
                if mine:
                    mixed.fill_virtual_slots(self.mixed, outs, rt.values, self._key(i))
                    rt.digest(outs)
        nbytes = _nbytes(input_tensors) * self.real.size
        return group._complete("gather", nbytes, t0, arrival, output_lists,
                               inputs=input_tensors)

    def scatter(self, output_tensors, input_lists, opts):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        root = opts.rootRank
        mine = root == group._me
        for i, out in enumerate(output_tensors):
            if root in self.real.positions:
                gloo = dist.ScatterOptions()
                gloo.rootRank = self.mixed.assigned[root]
                if mine:
                    rt.inputs(input_lists[i])
                chunks = [[input_lists[i][p] for p in self.real.positions]] if mine else []
                self._pg.scatter([out], chunks, gloo).wait()
            else:  # a virtual root's data is its own: no model of a real rank knows it
                rt.values.fill_seeded(out, self._key(i))
        rt.digest(output_tensors)
        nbytes = _nbytes(output_tensors) * self.real.size
        return group._complete("scatter", nbytes, t0, arrival, output_tensors,
                               source=root, inputs=input_lists if mine else [])

    def broadcast(self, tensors, opts):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        for i, tensor in enumerate(tensors):
            mixed.broadcast_mixed(self.mixed, tensor, opts.rootRank, rt.values, self._key(i),
                                  self._broadcast_real)
        rt.digest(tensors)
        return group._complete("broadcast", _nbytes(tensors), t0, arrival, tensors,
                               source=opts.rootRank)

    # -- all-to-all ----------------------------------------------------------------------

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs([input])
        n = self.real.size
        outs = split_chunks(output, output_split_sizes, n)
        ins = split_chunks(input, input_split_sizes, n)
        mixed.alltoall_mixed(self.mixed, outs, ins, rt.values, self._key(), self._alltoall_real)
        rt.digest([output])
        return group._complete("all_to_all", input.nbytes, t0, arrival, [output],
                               inputs=[input], call="all_to_all_single")

    def alltoall(self, output_tensors, input_tensors):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        self._collectives += 1
        rt.inputs(input_tensors)
        mixed.alltoall_mixed(self.mixed, output_tensors, input_tensors, rt.values, self._key(),
                             self._alltoall_real)
        rt.digest(output_tensors)
        return group._complete("all_to_all", _nbytes(input_tensors), t0, arrival,
                               output_tensors, inputs=input_tensors)

    def barrier(self):
        group = self._group
        t0, arrival = group._arrive()
        self._pg.barrier().wait()  # the real members meet; virtual peers arrive on time
        return group._complete("barrier", 0, t0, arrival, [])

    # -- point to point -------------------------------------------------------------------

    def is_real_peer(self, group_peer: int) -> bool:
        return group_peer in self.real.positions

    def send(self, tensors, dst: int, tag: int):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        rt.inputs(tensors)
        real_work = self._pg.send(tensors, self._real_rank(dst), tag)
        work = group._complete("send", _nbytes(tensors), t0, arrival, tensors,
                               group._peer(dst), dst)
        work.real_work = real_work
        return work

    def recv(self, tensors, src: int, tag: int):
        group, rt = self._group, self._rt
        t0, arrival = group._arrive()
        real_work = self._pg.recv(tensors, self._real_rank(src), tag)
        work = group._complete("recv", _nbytes(tensors), t0, arrival, tensors,
                               group._peer(src), src)
        work.source = src
        work.real_work = real_work
        work.on_real_done = lambda: rt.digest(tensors)
        return work

