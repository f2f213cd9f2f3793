"""Messages of virtual peers: matching receives to sends, and the graph file."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism_debug.graph import ExecutionGraph, GraphError
from prism_debug.graph.build import RecordedEnd, RecordedIssue, SliceRecord, build_graph
from prism_debug.graph.messages import (
    OBJECTS,
    TENSOR,
    MessageBook,
    MessageCounter,
    MissingMessage,
    PeerMessage,
    messages_from_json,
    messages_to_json,
)

STRIDE, CLASSES = 4, 2  # pp=2 x dp=4: rank = dp + 4 * stage


def class_of(rank: int) -> int:
    return (rank // STRIDE) % CLASSES


def message(iteration=1, delta=STRIDE, kind=OBJECTS, order=0, payload=b"x", **kw):
    return PeerMessage(iteration, delta, kind, order, payload, **kw)


def test_a_receive_gets_the_send_of_the_same_order_from_that_peer_class():
    first, second = message(payload=b"first"), message(order=1, payload=b"second")
    vote = message(kind=TENSOR, payload=b"\0\0\0\0", dtype="int32", shape=(1,))
    book = MessageBook(class_of, 3, {0: (first, second, vote)}, known=(0, 1))
    # rank 5 (stage 1) receives from rank 1 (stage 0): delta +4, as rank 0 sent to rank 4
    assert book.receive(1, 5, 1, OBJECTS) is first
    assert book.receive(1, 5, 1, TENSOR) is vote  # kinds are numbered apart
    assert book.receive(1, 5, 1, OBJECTS) is second
    assert book.receive(1, 5, 1, OBJECTS) is None  # a known class sent no third: mirror


def test_iterations_after_the_profiled_ones_use_the_last_profiled_one():
    late = message(iteration=3, payload=b"steady")
    book = MessageBook(class_of, 3, {0: (message(), late)}, known=(0, 1))
    assert book.receive(7, 4, 0, OBJECTS) is late
    assert book.receive(1, 4, 0, OBJECTS).payload == b"x"


def test_a_receive_from_a_class_not_profiled_yet_is_missing():
    book = MessageBook(class_of, 3, {}, known=(1,))
    assert book.receive(1, 5, 1, OBJECTS) == MissingMessage(1, 1, 0, 4, OBJECTS, 0)
    assert book.receive(1, 5, 1, OBJECTS) == MissingMessage(1, 1, 0, 4, OBJECTS, 1)
    assert book.receive(1, 1, 5, OBJECTS) is None  # from class 1, known: nothing, mirror
    assert MissingMessage(1, 1, 0, 4, OBJECTS, 1).describe() == (
        "objects (send_object_list) #1 that rank 1 sends +4 ranks away in iteration 1")


def test_the_first_slice_knows_no_class_and_misses_everything():
    book = MessageBook(lambda rank: -1, 0, {}, known=())
    missing = book.receive(1, 0, 4, TENSOR)
    assert missing.describe() == (
        "a control tensor #0 that rank 4 sends -4 ranks away in iteration 1")


def test_a_counter_numbers_per_iteration_peer_and_kind():
    counter = MessageCounter()
    assert [counter.next(1, 4, OBJECTS) for _ in range(3)] == [0, 1, 2]
    assert counter.next(1, 4, TENSOR) == 0
    assert counter.next(1, -4, OBJECTS) == 0
    assert counter.next(2, 4, OBJECTS) == 0


messages_strategy = st.dictionaries(
    st.integers(0, 7),
    st.lists(st.builds(PeerMessage, st.integers(1, 9), st.integers(-9, 9), st.sampled_from(
        (OBJECTS, TENSOR)), st.integers(0, 9), st.binary(max_size=40), st.sampled_from(
        ("", "int32", "bool")), st.lists(st.integers(0, 4), max_size=3).map(tuple))).map(tuple),
    max_size=4)


@given(messages_strategy)
def test_messages_round_trip_through_json(messages):
    assert messages_from_json(json.loads(json.dumps(messages_to_json(messages)))) == messages


def _graph_with(messages) -> ExecutionGraph:
    families = ({"name": "pp", "group_size": 2, "num_groups": 4, "complete": True, "stride": 4},
                {"name": "dp", "group_size": 4, "num_groups": 2, "complete": True, "stride": 1})
    program = (RecordedIssue(0.001, "send", "pp", 8, "int32", 4), RecordedEnd(0.002))
    back = (RecordedIssue(0.001, "recv", "pp", 8, "int32", -4), RecordedEnd(0.002))
    slices = [SliceRecord(0, families, (program,) * 3, messages),
              SliceRecord(4, families, (back,) * 3)]
    return build_graph(8, 8, slices)


def test_the_graph_keeps_each_class_messages_and_its_profiled_iterations(tmp_path):
    sent = (message(payload=b"meta"), message(kind=TENSOR, payload=b"\1\0\0\0", dtype="int32",
                                              shape=(1,)))
    graph = _graph_with(sent)
    assert graph.messages == {0: sent} and graph.message_iterations == 3
    path = tmp_path / "g.prism"
    graph.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert ExecutionGraph.load(path) == graph


def test_a_version_1_graph_with_point_to_point_is_refused(tmp_path):
    # version 1 recorded neither messages nor batches: its p2p would replay wrong
    data = _graph_with(()).to_dict()
    data["version"] = 1
    del data["messages"], data["message_iterations"]
    path = tmp_path / "old.prism"
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    with pytest.raises(GraphError, match=r"graph format version 1 does not record which "
                                         r"point-to-point ops form one batch"):
        ExecutionGraph.load(path)


def test_an_unknown_version_is_refused(tmp_path):
    data = _graph_with(()).to_dict()
    data["version"] = 9
    with pytest.raises(GraphError, match="graph format version 9; this prism-debug reads "
                                         "versions 1, 2, 3: profile the job again"):
        ExecutionGraph.from_dict(data)


def test_a_graph_of_pickles_others_may_write_is_refused(tmp_path):
    path = tmp_path / "g.prism"
    _graph_with((message(),)).save(path)
    os.chmod(path, 0o666)
    with pytest.raises(GraphError, match=r"carries pickled objects and others may write to it "
                                         r"\(mode -rw-rw-rw-\)"):
        ExecutionGraph.load(path)
    _graph_with((message(kind=TENSOR, dtype="int32", shape=(1,)),)).save(path)
    os.chmod(path, 0o666)
    ExecutionGraph.load(path)  # raw tensor bytes are no code: any graph may carry them


@given(st.lists(st.tuples(st.integers(1, 4), st.sampled_from((STRIDE, -STRIDE)),
                          st.sampled_from((OBJECTS, TENSOR))), max_size=30))
def test_receives_in_send_order_get_exactly_the_messages_sent(sends):
    """Whatever a stage sends, in whatever order, the rank it sends to gets each
    message back by receiving in the same order (per iteration, peer and kind)."""
    counter = MessageCounter()
    sent = [PeerMessage(it, delta, kind, counter.next(it, delta, kind), bytes([n % 256]))
            for n, (it, delta, kind) in enumerate(sends)]
    book = MessageBook(class_of, 4, {0: sent}, known=(0, 1))
    for m in sent:
        if m.peer_delta == STRIDE:  # stage 0's rank 1 sends to stage 1's rank 5
            assert book.receive(m.iteration, 5, 1, m.kind) == m
