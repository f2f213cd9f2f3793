"""The prism ProcessGroup: what torch.distributed talks to in the real rank.

Every op follows the same path (DESIGN.md §2): note the real rank's arrival
on the emulated clock, fill the outputs as the virtual peers would have,
fold inputs and outputs into the iteration digest, ask the engine when the op
completes, and return a Work that blocks until then.  The bookkeeping itself
is excluded from the emulated clock.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from prism_debug.backend.real_ops import RealOps
from prism_debug.backend.runtime import Runtime
from prism_debug.backend.work import PrismWork, coalesced_work, flat_tensors, split_chunks
from prism_debug.backend.work import nbytes as _nbytes
from prism_debug.graph import GroupRef


class PrismProcessGroup(dist.ProcessGroup):
    def __init__(self, runtime: Runtime, global_ranks: list[int], ref: GroupRef,
                 timeout: datetime.timedelta, backend_name: str) -> None:
        group_rank = global_ranks.index(runtime.rank)
        # (torch binds ProcessGroup(rank, size) too, for groups written in
        # Python; its stub names only the (store, rank, size) form)
        super().__init__(group_rank, len(global_ranks))  # type: ignore[call-arg]
        self._rt = runtime
        self.global_ranks = global_ranks
        self.ref = ref
        self.timeout = timeout
        self._backend_name = backend_name
        self._me = group_rank
        self._n = len(global_ranks)
        self._stream = runtime.engine.group(global_ranks, ref)
        self._peer_streams: dict[int, object] = {}
        self._coalesced: list[PrismWork] | None = None  # between _start/_end_coalescing
        self._group_name = ""
        self._group_desc = "undefined"
        # the watchdog's view: this group's number, its ops so far, its timeout
        self.pg_id = runtime.next_group_id()
        self.num_issued = 0
        self.timeout_s = runtime.collective_timeout_s or timeout.total_seconds()
        # the group's other real members, where it has some (--ranks): their
        # part of its ops runs on a real communicator among them
        real = runtime.real_comms and runtime.real_comms.group(
            global_ranks, ref, datetime.timedelta(seconds=self.timeout_s))
        self._real = RealOps(self, real) if real else None

    def __repr__(self) -> str:
        return (f"PrismProcessGroup({self.ref.family}[{self.ref.index}], "
                f"rank {self._me} of {self._n})")

    # -- identity -------------------------------------------------------------

    def getBackendName(self) -> str:
        return "prism"

    # A Python group keeps no C++ backend to hold its name: torch's setters
    # and getters (which DeviceMesh, DTensor and functional collectives use)
    # must land here.
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def new_group(self, ranks, timeout=None, pg_options=None, group_name=None, group_desc=None):
        """Called by torch for every ``new_group`` on the default group, by
        members and non-members alike: where families are recorded."""
        rt = self._rt
        ranks = list(ranks)
        ref = rt.families.add(ranks, group_desc)
        if rt.rank not in ranks:
            return None
        pg = PrismProcessGroup(rt, ranks, ref, timeout or self.timeout, self._backend_name)
        pg._set_group_name(group_name)
        pg._set_group_desc(group_desc or "undefined")
        return pg

    # -- the common path --------------------------------------------------------

    def _arrive(self) -> tuple[float | None, float]:
        """The real rank enters an op: the clock stops for the harness's
        bookkeeping (the token that releases it) at the rank's arrival."""
        return self._rt.clock.arrive()

    def _complete(self, op: str, nbytes: int, t0: float | None, arrival: float, result: list,
                  stream=None, peer: int | None = None, inputs: list | None = None,
                  source: int | None = None, call: str | None = None) -> PrismWork:
        """``inputs``: the op's inputs where they are not ``result`` (gathers,
        reduce-scatter); ``source``: the group rank the data came from (a
        broadcast's root, a receive's peer); ``call``: the op as NCCL tells
        its variants apart ("_all_gather_base", "allreduce_coalesced", ...;
        backend/fr_nccl_names.py), where that is not ``op``."""
        rt = self._rt
        tracker = rt.tracker
        if rt.peer_faults.active and op != "send" and rt.peer_faults.apply(
                self, op, result, tracker.iteration, tracker.num_collectives + 1,
                peer if source is None else source):
            rt.digest(flat_tensors(result))  # what a faulty peer changed is part of the values
        watch = rt.watch
        if watch is not None:  # may pause the rank: inside the hold, off the clock too
            watch.enter(op, self.ref, tracker.num_collectives + 1, nbytes)
        done = rt.engine.collective(stream or self._stream, op, nbytes, arrival, rt.p2p_batch)
        if rt.completer.unknown:  # the engine advanced: it may answer what it could not
            rt.completer.engine_advanced()
        self.num_issued += 1
        work = PrismWork(rt, done, result, group=self, seq=self.num_issued, op=call or op,
                         arrival=arrival, inputs=inputs, peer=peer)
        if self._coalesced is not None:
            self._coalesced.append(work)
        work.record = tracker.collective(op, self.ref, nbytes, arrival, done)
        if watch is not None:
            watch.exit(op, self.ref, tracker.num_collectives, done)
        rt.mark_activity(arrival)
        if rt.flight is not None:
            rt.flight.note(self, call or op, result, inputs, peer, done, rt.tracker.iteration)
        if rt.recorder is not None:
            delta = 0 if peer is None else self.global_ranks[peer] - rt.rank
            work.recorded = rt.recorder.issue(arrival, op, self.ref.family, nbytes,
                                              _dtype(result), delta, rt.p2p_batch)
        rt.clock.leave(t0)
        return work

    def _key(self) -> tuple:
        tracker = self._rt.tracker
        return (tracker.iteration, tracker.num_collectives)

    def _faulty(self) -> tuple:
        """The faulty peers of the reduction about to be counted (its values take them)."""
        tracker = self._rt.tracker
        return self._rt.peer_faults.reduction(self, tracker.iteration,
                                              tracker.num_collectives + 1)

    # -- reductions -------------------------------------------------------------

    # (torch's stub overloads allreduce with its Python API's forms too; the
    # dispatcher calls a group written in Python with tensors and options)
    def allreduce(self, tensors, opts=None,  # type: ignore[override]
                  call: str = "all_reduce"):
        if self._real is not None:
            return self._real.allreduce(tensors, opts, call)
        rt = self._rt
        t0, arrival = rt.clock.arrive()  # _arrive, inlined on the commonest op
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        rt.inputs(tensors)
        tracker = rt.tracker
        reduce_peers, n = rt.values.reduce_peers, self._n
        faulty = self._faulty() if rt.peer_faults.active else ()
        for i, tensor in enumerate(tensors):
            reduce_peers(tensor, op, n, (tracker.iteration, tracker.num_collectives, i), faulty)
        rt.digest(tensors)
        return self._complete("all_reduce", _nbytes(tensors), t0, arrival, tensors, call=call)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts, "allreduce_coalesced")

    def reduce(self, tensors, opts):
        if self._real is not None:
            return self._real.reduce(tensors, opts)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs(tensors)
        # NCCL writes the result on the root only: a non-root's buffer stays as it was
        if opts.rootRank == self._me:
            key, faulty = self._key(), self._faulty()
            for i, tensor in enumerate(tensors):
                rt.values.reduce_peers(tensor, opts.reduceOp, self._n, (*key, i), faulty)
            rt.digest(tensors)
        return self._complete("reduce", _nbytes(tensors), t0, arrival, tensors)

    def reduce_scatter(self, output_tensors, input_lists, opts):
        _check_lengths("reduce_scatter", output_tensors, input_lists)
        if self._real is not None:
            return self._real.reduce_scatter(output_tensors, input_lists, opts)
        t0, arrival = self._arrive()
        rt = self._rt
        key, faulty = self._key(), self._faulty()
        for i, (out, inputs) in enumerate(zip(output_tensors, input_lists, strict=True)):
            rt.inputs(inputs)
            out.copy_(inputs[self._me])
            rt.values.reduce_peers(out, opts.reduceOp, self._n, (*key, i), faulty)
        rt.digest(output_tensors)
        nbytes = sum(_nbytes(inputs) for inputs in input_lists)
        return self._complete("reduce_scatter", nbytes, t0, arrival, output_tensors,
                              inputs=input_lists)

    def reduce_scatter_single(self, output, input, opts):
        return self._reduce_scatter_tensors([output], [input], opts, "_reduce_scatter_base")

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        return self._reduce_scatter_tensors(outputs, inputs, opts,
                                            "reduce_scatter_tensor_coalesced")

    def _reduce_scatter_tensors(self, outputs, inputs, opts, call: str):
        _check_lengths(call, outputs, inputs)
        if self._real is not None:
            return self._real.reduce_scatter_tensors(outputs, inputs, opts, call)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs(inputs)
        key, faulty = self._key(), self._faulty()
        for i, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
            out.copy_(_chunk(inp, self._n, self._me).view_as(out))
            rt.values.reduce_peers(out, opts.reduceOp, self._n, (*key, i), faulty)
        rt.digest(outputs)
        return self._complete("reduce_scatter", _nbytes(inputs), t0, arrival, outputs,
                              inputs=inputs, call=call)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    # -- gathers ----------------------------------------------------------------

    def allgather(self, output_lists, input_tensors, opts=None):
        _check_lengths("all_gather", output_lists, input_tensors)
        if self._real is not None:
            return self._real.allgather(output_lists, input_tensors)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs(input_tensors)
        key = self._key()
        for i, (outs, inp) in enumerate(zip(output_lists, input_tensors, strict=True)):
            self._gather_into(outs, inp, (*key, i))
        nbytes = _nbytes(input_tensors) * self._n
        return self._complete("all_gather", nbytes, t0, arrival, output_lists,
                              inputs=input_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # Here the outer list is by rank and the inner by input, the other way
        # round from allgather's.
        by_input = [[per_rank[i] for per_rank in output_lists] for i in range(len(input_list))]
        return self.allgather(by_input, input_list, opts)

    def all_gather_single(self, output, input, opts=None):
        return self._all_gather_tensors([output], [input], "_all_gather_base")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._all_gather_tensors(outputs, inputs, "all_gather_into_tensor_coalesced")

    def _all_gather_tensors(self, outputs, inputs, call: str):
        _check_lengths(call, outputs, inputs)
        if self._real is not None:
            return self._real.all_gather_tensors(outputs, inputs, call)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs(inputs)
        key = self._key()
        for i, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
            chunks = out.view(self._n, -1)
            mine = inp.reshape(1, -1)
            if rt.values.policy == "mirror":
                chunks.copy_(mine.expand(self._n, -1))
            else:
                rt.values.peer_copy(chunks, mine.expand(self._n, -1), (*key, i))
                chunks[self._me].copy_(mine[0])
        rt.digest(outputs)
        return self._complete("all_gather", _nbytes(outputs), t0, arrival, outputs,
                              inputs=inputs, call=call)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _gather_into(self, outs: list, mine: torch.Tensor, key: tuple) -> None:
        """``outs[peer]`` gets what ``peer`` holds where the real rank holds ``mine``."""
        for peer, out in enumerate(outs):
            if peer == self._me:
                out.copy_(mine)
            else:
                self._rt.values.peer_copy(out, mine, (*key, peer))
        self._rt.digest(outs)

    def gather(self, output_lists, input_tensors, opts):
        if opts.rootRank == self._me:  # (a non-root has no outputs)
            _check_lengths("gather", output_lists, input_tensors)
        if self._real is not None:
            return self._real.gather(output_lists, input_tensors, opts)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs(input_tensors)
        if opts.rootRank == self._me:
            key = self._key()
            for i, (outs, inp) in enumerate(zip(output_lists, input_tensors, strict=True)):
                self._gather_into(outs, inp, (*key, i))
        nbytes = _nbytes(input_tensors) * self._n
        return self._complete("gather", nbytes, t0, arrival, output_lists,
                              inputs=input_tensors)

    def scatter(self, output_tensors, input_lists, opts):
        if self._real is not None:
            return self._real.scatter(output_tensors, input_lists, opts)
        t0, arrival = self._arrive()
        rt = self._rt
        key = self._key()
        for i, out in enumerate(output_tensors):
            if opts.rootRank == self._me:
                rt.inputs(input_lists[i])
                out.copy_(input_lists[i][self._me])
            else:
                # The root's data is its own; no model of the real rank knows it.
                rt.values.fill_seeded(out, (*key, i))
        rt.digest(output_tensors)
        nbytes = _nbytes(output_tensors) * self._n
        return self._complete("scatter", nbytes, t0, arrival, output_tensors,
                              source=opts.rootRank,
                              inputs=input_lists if opts.rootRank == self._me else [])

    def broadcast(self, tensors, opts):
        if self._real is not None:
            return self._real.broadcast(tensors, opts)
        t0, arrival = self._arrive()
        rt = self._rt
        # Mirrored, the root holds what the real rank holds: nothing to change.
        if opts.rootRank != self._me and rt.values.policy != "mirror":
            key = self._key()
            for i, tensor in enumerate(tensors):
                rt.values.peer_copy(tensor, tensor, (*key, i))
        rt.digest(tensors)
        return self._complete("broadcast", _nbytes(tensors), t0, arrival, tensors,
                              source=opts.rootRank)

    # -- all-to-all -------------------------------------------------------------

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if self._real is not None:
            return self._real.alltoall(output_tensors, input_tensors)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs(input_tensors)
        key = self._key()
        mine = input_tensors[self._me]
        for peer, out in enumerate(output_tensors):
            self._from_peer(out, mine, peer, (*key, peer))
        rt.digest(output_tensors)
        return self._complete("all_to_all", _nbytes(input_tensors), t0, arrival, output_tensors,
                              inputs=input_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if self._real is not None:
            return self._real.all_to_all_single(output, input, output_split_sizes,
                                                input_split_sizes)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs([input])
        key = self._key()
        ins = split_chunks(input, input_split_sizes, self._n)
        outs = split_chunks(output, output_split_sizes, self._n)
        for peer, out in enumerate(outs):
            self._from_peer(out, ins[self._me], peer, (*key, peer))
        rt.digest([output])
        return self._complete("all_to_all", input.nbytes, t0, arrival, [output],
                              inputs=[input], call="all_to_all_single")

    def _from_peer(self, out: torch.Tensor, mine: torch.Tensor, peer: int, key: tuple) -> None:
        # Peer j sends the real rank its chunk for the real rank; mirrored, that
        # is the real rank's own chunk for itself — when the sizes agree.
        if peer == self._me:
            out.copy_(mine)
        elif out.shape == mine.shape:
            self._rt.values.peer_copy(out, mine, key)
        else:
            self._rt.values.fill_seeded(out, key)

    # -- synchronisation ----------------------------------------------------------

    def barrier(self, opts=None):
        if self._real is not None:
            return self._real.barrier()
        t0, arrival = self._arrive()
        return self._complete("barrier", 0, t0, arrival, [])

    # -- point to point -----------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        if self._real is not None and self._real.is_real_peer(dst):
            return self._real.send(tensors, dst, tag)
        t0, arrival = self._arrive()
        rt = self._rt
        rt.inputs(tensors)
        return self._complete("send", _nbytes(tensors), t0, arrival, tensors, self._peer(dst), dst)

    def recv(self, tensors, src, tag=0):
        if self._real is not None and self._real.is_real_peer(src):
            return self._real.recv(tensors, src, tag)
        t0, arrival = self._arrive()
        rt = self._rt
        key = self._key()
        for i, tensor in enumerate(tensors):
            rt.values.fill_seeded(tensor, (*key, i))
        rt.digest(tensors)
        work = self._complete("recv", _nbytes(tensors), t0, arrival, tensors, self._peer(src), src)
        work.source = src
        return work

    def recv_anysource(self, tensors, tag=0):
        # In lockstep every peer is ready at once; the lowest other rank wins.
        return self.recv(tensors, 1 if self._me == 0 else 0, tag)

    def _peer(self, group_peer: int):
        stream = self._peer_streams.get(group_peer)
        if stream is None:
            if not 0 <= group_peer < self._n:
                raise ValueError(f"peer {group_peer} is not a rank of {self!r}")
            stream = self._peer_streams[group_peer] = self._rt.engine.peer_stream(
                self._stream, self._rt.rank, self.global_ranks[group_peer])
        return stream

    # -- coalescing -----------------------------------------------------------------

    def _start_coalescing(self, device=None):
        self._coalesced = []

    def _end_coalescing(self, device=None):
        works, self._coalesced = self._coalesced or [], None
        return coalesced_work(self._rt, self, works)

    # -- lifecycle --------------------------------------------------------------------

    def abort(self):
        pass

    def shutdown(self):
        pass


def _check_lengths(call: str, outputs: list, inputs: list) -> None:
    """One output (or list of outputs) per input, as torch's backends check:
    a list of another length is the script's error, never cut short."""
    if len(outputs) != len(inputs):
        raise RuntimeError(f"{call}: requires input/output tensor lists to have the same "
                           f"length ({len(outputs)} outputs, {len(inputs)} inputs)")


def _dtype(result: list) -> str:
    while isinstance(result, (list, tuple)) and result:
        result = result[0]
    return str(result.dtype).removeprefix("torch.") if isinstance(result, torch.Tensor) else ""


def _chunk(tensor: torch.Tensor, n: int, index: int) -> torch.Tensor:
    return tensor.reshape(n, -1)[index]

