"""The bus wire protocol: frames, schemas, every error with its message (no sockets)."""

import contextlib
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism_debug.bus.protocol import (
    BASE_VERSION,
    EVENT_KINDS,
    MAX_FRAME_BYTES,
    VERBS,
    BadArguments,
    BadMessage,
    BusError,
    BusTimeout,
    InternalError,
    InvalidState,
    RankUnavailable,
    Request,
    SnapshotFailed,
    UnknownVerb,
    decode_event,
    decode_reply,
    decode_request,
    encode_error,
    encode_event,
    encode_reply,
    encode_request,
    error_from_type,
)
from prism_debug.errors import PrismError
from prism_debug.faults import parse_fault
from tests.faults.test_text import lines


def frame(**message):
    return json.dumps(message).encode()


def rejection(raw, verbs=VERBS):
    with pytest.raises(BusError) as info:
        decode_request(raw, verbs)
    return type(info.value), info.value.request_id, str(info.value)


# --- round trips ----------------------------------------------------------------------------

def test_a_request_round_trips_with_the_id_given_or_a_fresh_one():
    raw = encode_request("break", {"kind": "iter", "iteration": 3}, id="r-1")
    assert json.loads(raw) == {"v": 2, "id": "r-1", "verb": "break",
                               "args": {"kind": "iter", "iteration": 3}}
    assert decode_request(raw) == Request("r-1", "break", {"kind": "iter", "iteration": 3})
    first, second = (decode_request(encode_request("status")) for _ in range(2))
    assert first.id != second.id and len(first.id) == 16 and first.args == {}


def test_args_may_be_left_out_of_a_request():
    assert decode_request(frame(v=2, id="x", verb="where")) == Request("x", "where", {})


def test_a_reply_round_trips():
    assert decode_reply(encode_reply("r-1", {"state": "running"})) == (
        "r-1", {"state": "running"})
    assert json.loads(encode_reply("r-1", {})) == {"v": 2, "id": "r-1", "ok": True,
                                                   "result": {}}


def test_an_event_round_trips_with_its_topic():
    topic, body = encode_event(7, 4097, "paused", {"iteration": 3, "reason": "step"},
                               wall=1700000000.5)
    assert topic == b"rank.4097.paused"
    assert decode_event(topic, body) == {"v": 2, "seq": 7, "rank": 4097, "kind": "paused",
                                         "wall": 1700000000.5,
                                         "data": {"iteration": 3, "reason": "step"}}


json_scalars = (st.none() | st.booleans() | st.integers(-2**53, 2**53)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
_VALUES = {int: st.integers(-2**31, 2**31), str: st.text(max_size=30), bool: st.booleans(),
           type(None): st.none()}


def args_for(verb):
    """Valid arguments of ``verb``, from its schema (``break`` by hand: two shapes;
    the verbs with value checks too)."""
    if verb == "break":
        temporary = st.dictionaries(st.just("temporary"), st.booleans(), max_size=1)
        iteration = st.fixed_dictionaries({"kind": st.just("iter"),
                                           "iteration": st.integers(1, 10**9)})
        collective = st.fixed_dictionaries(
            {"kind": st.just("coll"), "op": st.text(max_size=20)},
            optional={"family": st.none() | st.text(max_size=10),
                      "seq": st.none() | st.integers(0, 10**6)})
        return st.builds(lambda a, b: {**a, **b}, iteration | collective, temporary)
    if verb == "back":
        return st.fixed_dictionaries({}, optional={"iterations": st.integers(1, 10**9)})
    if verb == "run_to":
        return st.fixed_dictionaries(
            {"iteration": st.integers(1, 10**9)},
            optional={"seq": st.none() | st.integers(1, 10**6), "reason": st.text(max_size=64)})
    if verb == "perturb":  # a fault in its dict form: from the grammar's own round trip
        return st.fixed_dictionaries({"fault": lines().map(lambda t: parse_fault(t).to_dict())},
                                     optional={"text": st.text(max_size=30)})
    schema = VERBS[verb]
    strategies = {name: st.one_of(*(_VALUES[t] for t in types))
                  for name, (types, _) in schema.items()}
    return st.fixed_dictionaries(
        {n: s for n, s in strategies.items() if schema[n][1]},
        optional={n: s for n, s in strategies.items() if not schema[n][1]})


requests = st.sampled_from(sorted(VERBS)).flatmap(
    lambda verb: st.tuples(st.just(verb), args_for(verb), st.text(min_size=1, max_size=64)))


@given(requests)
def test_every_valid_request_round_trips(request):
    verb, args, request_id = request
    assert decode_request(encode_request(verb, args, id=request_id)) == Request(
        request_id, verb, args)


@given(seq=st.integers(1, 2**53), rank=st.integers(0, 2**20), kind=st.sampled_from(EVENT_KINDS),
       data=st.dictionaries(st.text(max_size=8), json_values, max_size=5),
       wall=st.floats(0, 4e9))
def test_every_event_round_trips(seq, rank, kind, data, wall):
    topic, body = encode_event(seq, rank, kind, data, wall=wall)
    assert topic == f"rank.{rank}.{kind}".encode()
    assert decode_event(topic, body) == {"v": BASE_VERSION, "seq": seq, "rank": rank,
                                         "kind": kind, "wall": wall, "data": data}


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_a_request_or_a_bus_error(raw):
    with contextlib.suppress(BusError):
        assert isinstance(decode_request(raw), Request)


@given(st.dictionaries(st.sampled_from(["v", "id", "verb", "args", "x"]),
                       json_values | st.sampled_from(sorted(VERBS)) | st.just(1), max_size=5))
def test_arbitrary_json_objects_give_a_request_or_a_bus_error(message):
    with contextlib.suppress(BusError):
        assert isinstance(decode_request(json.dumps(message).encode()), Request)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_as_a_reply_raise_only_bus_errors(raw):
    with contextlib.suppress(BusError):
        decode_reply(raw)


def test_absurd_nesting_is_a_bad_message_not_a_recursion_error():
    assert rejection(b"[" * 200_000) == (
        BadMessage, None, "request is not UTF-8 JSON (maximum recursion depth exceeded while "
                          "decoding a JSON array from a unicode string)")


# --- BadMessage -----------------------------------------------------------------------------

@pytest.mark.parametrize("raw, message", [
    (b"\xff", "request is not UTF-8 JSON ('utf-8' codec can't decode byte 0xff in position "
              "0: invalid start byte)"),
    (b"{", "request is not UTF-8 JSON (Expecting property name enclosed in double quotes: "
           "line 1 column 2 (char 1))"),
    ('{"v": 2}'.encode("utf-16"), "request is not UTF-8 JSON ('utf-8' codec can't decode "
                                  "byte 0xff in position 0: invalid start byte)"),
    (b"[1, 2]", "request must be a JSON object, got list"),
    (b'"status"', "request must be a JSON object, got str"),
    (frame(id="a", verb="status"), "request has no version 'v'; this prism-debug speaks "
                                   "protocol versions 2 and 3 (run the same prism-debug on "
                                   "both ends)"),
    (frame(v=4, id="a", verb="status"), "request has protocol version 4; this prism-debug "
                                        "speaks protocol versions 2 and 3 (run the same "
                                        "prism-debug on both ends)"),
    (frame(v=True, id="a", verb="status"), "request has protocol version True; this "
                                           "prism-debug speaks protocol versions 2 and 3 (run "
                                           "the same prism-debug on both ends)"),
    (frame(v=2, verb="status"), "request 'id' must be a str of 1..64 characters, got none"),
    (frame(v=2, id=5, verb="status"), "request 'id' must be a str of 1..64 characters, got "
                                      "int"),
    (frame(v=2, id="", verb="status"), "request 'id' must be a str of 1..64 characters, got "
                                       "0 characters"),
    (frame(v=2, id="x" * 65, verb="status"), "request 'id' must be a str of 1..64 "
                                             "characters, got 65 characters"),
])
def test_a_frame_that_is_no_request_is_a_bad_message_without_an_id(raw, message):
    assert rejection(raw) == (BadMessage, None, message)


@pytest.mark.parametrize("message, text", [
    ({"v": 2, "id": "a"}, "request 'verb' must be a str, got none"),
    ({"v": 2, "id": "a", "verb": None}, "request 'verb' must be a str, got null"),
    ({"v": 2, "id": "a", "verb": "status", "args": [1]},
     "request 'args' must be an object, got list"),
    ({"v": 2, "id": "a", "verb": "status", "arg": {}},
     "request has unknown field 'arg' (a request holds v, id, verb and args)"),
    ({"v": 2, "id": "a", "verb": "status", "b": 0, "a": 0},
     "request has unknown fields 'a', 'b' (a request holds v, id, verb and args)"),
])
def test_a_bad_envelope_with_an_id_is_a_bad_message_that_keeps_the_id(message, text):
    assert rejection(frame(**message)) == (BadMessage, "a", text)


def test_a_frame_over_the_limit_is_a_bad_message():
    raw = encode_request("hello", {"client": "x" * MAX_FRAME_BYTES}, id="big")
    assert rejection(raw) == (BadMessage, None, f"request of {len(raw)} bytes exceeds the "
                                                "1048576-byte frame limit")


# --- UnknownVerb and BadArguments -----------------------------------------------------------

def test_an_unknown_verb_lists_the_known_ones():
    assert rejection(encode_request("stpe", id="q")) == (
        UnknownVerb, "q", "unknown verb 'stpe'; known verbs: agent.heartbeat, agent.hello, "
                          "back, break, breaks, continue, delete, detach, events, faults, hello, "
                          "leave, next, pause, peers, perturb, restore, reverse-continue, "
                          "run_to, snapshot, snapshots, status, step, timeline, unperturb, where")


@pytest.mark.parametrize("verb, args, text", [
    ("back", {"iterations": 0}, "argument 'iterations' of 'back' must be >= 1, got 0"),
    ("back", {"iterations": "2"}, "argument 'iterations' of 'back' must be an int, got str"),
    ("back", {"to": 2}, "unknown argument 'to' for 'back' (it takes iterations)"),
    ("reverse-continue", {"n": 1},
     "unknown argument 'n' for 'reverse-continue' (it takes no arguments)"),
    ("run_to", {}, "missing required argument 'iteration' of 'run_to'"),
    ("run_to", {"iteration": 0}, "argument 'iteration' of 'run_to' must be >= 1, got 0"),
    ("run_to", {"iteration": 3, "seq": 0}, "argument 'seq' of 'run_to' must be >= 1, got 0"),
    ("run_to", {"iteration": 3, "reason": "x" * 65},
     "argument 'reason' of 'run_to' must be at most 64 characters"),
])
def test_stepping_back_verbs_check_their_arguments(verb, args, text):
    assert rejection(encode_request(verb, args, id="s")) == (BadArguments, "s", text)


def test_stepping_back_verbs_take_their_arguments():
    assert decode_request(encode_request("back", {"iterations": 2}, id="s")).args == \
        {"iterations": 2}
    assert decode_request(encode_request("run_to", {"iteration": 4, "seq": None}, id="s")).args \
        == {"iteration": 4, "seq": None}


def test_a_caller_may_pass_its_own_verb_table():
    verbs = {"echo": {"text": ((str,), True)}}
    assert decode_request(encode_request("echo", {"text": "hi"}, id="e"), verbs) == Request(
        "e", "echo", {"text": "hi"})
    assert rejection(encode_request("status", id="e"), verbs) == (
        UnknownVerb, "e", "unknown verb 'status'; known verbs: echo")


@pytest.mark.parametrize("verb, args, message", [
    ("status", {"x": 1}, "unknown argument 'x' for 'status' (it takes no arguments)"),
    ("status", {"y": 1, "x": 1}, "unknown arguments 'x', 'y' for 'status' (it takes no "
                                 "arguments)"),
    ("hello", {"client": "c", "name": "n"}, "unknown argument 'name' for 'hello' (it takes "
                                            "client and rank)"),
    ("break", {"kind": "iter", "iteration": 2, "when": 1},
     "unknown argument 'when' for 'break' (it takes kind, iteration, op, family, seq and "
     "temporary)"),
    ("hello", {}, "missing required argument 'client' of 'hello'"),
    ("agent.hello", {}, "missing required arguments 'rank', 'pid', 'secret' of 'agent.hello'"),
    ("restore", {"id": 3}, "argument 'id' of 'restore' must be a str, got int"),
    ("events", {"on": 1}, "argument 'on' of 'events' must be a bool, got int"),
    ("delete", {"id": True}, "argument 'id' of 'delete' must be an int, got bool"),
    ("delete", {"id": 1.0}, "argument 'id' of 'delete' must be an int, got float"),
    ("agent.hello", {"rank": None, "pid": 1}, "argument 'rank' of 'agent.hello' must be an "
                                              "int, got null"),
    ("break", {"kind": "iter", "iteration": "3"},
     "argument 'iteration' of 'break' must be an int, got str"),
    ("break", {"kind": "coll", "op": "all_reduce", "family": 3},
     "argument 'family' of 'break' must be a str or null, got int"),
    ("break", {"kind": "coll", "op": "all_reduce", "seq": [1]},
     "argument 'seq' of 'break' must be an int or null, got list"),
    ("break", {}, "missing required argument 'kind' of 'break'"),
    ("break", {"kind": "iteration", "iteration": 3},
     "argument 'kind' of 'break' must be 'iter' or 'coll', got 'iteration'"),
    ("break", {"kind": "iter"}, "a break of kind 'iter' needs argument 'iteration'"),
    ("break", {"kind": "iter", "iteration": 0},
     "argument 'iteration' of 'break' must be >= 1, got 0"),
    ("break", {"kind": "iter", "iteration": 2, "op": "all_reduce"},
     "argument 'op' of 'break' does not apply to kind 'iter' (it takes iteration and "
     "temporary)"),
    ("break", {"kind": "iter", "iteration": 2, "seq": None, "family": "tp"},
     "arguments 'family', 'seq' of 'break' do not apply to kind 'iter' (it takes iteration "
     "and temporary)"),
    ("break", {"kind": "coll", "family": "tp"}, "a break of kind 'coll' needs argument 'op'"),
    ("break", {"kind": "coll", "op": "all_reduce", "iteration": 2},
     "argument 'iteration' of 'break' does not apply to kind 'coll' (it takes op, family, "
     "seq and temporary)"),
    ("perturb", {"fault": "slow 3 2"}, "argument 'fault' of 'perturb' must be an object, got str"),
    ("perturb", {"fault": {"action": "slow", "select": {"ranks": "3"}}},
     "argument 'fault' of 'perturb': slow: missing required key 'factor'"),
    ("perturb", {"fault": {"action": "fail", "select": {"ranks": "3"}, "at": {"time_s": 2}}},
     "argument 'fault' of 'perturb': fail: FailFault: at.time_s: faults start at an iteration "
     "(and a collective in it); time_s triggers are not supported"),
    ("unperturb", {"index": "0"}, "argument 'index' of 'unperturb' must be an int, got str"),
])
def test_arguments_that_do_not_fit_the_schema_are_bad_arguments(verb, args, message):
    assert rejection(encode_request(verb, args, id="q")) == (BadArguments, "q", message)


def test_every_spec_verb_has_a_schema():
    assert set(VERBS) == {"hello", "status", "where", "break", "breaks", "delete", "continue",
                          "step", "next", "pause", "timeline", "peers", "events", "snapshot",
                          "snapshots", "restore", "detach", "leave", "perturb", "faults",
                          "unperturb", "back", "reverse-continue", "run_to", "agent.hello",
                          "agent.heartbeat"}


def test_arguments_that_are_not_json_are_refused_when_encoding():
    with pytest.raises(BadArguments) as info:
        encode_request("snapshot", {"name": object()}, id="q")
    assert str(info.value) == ("arguments of 'snapshot' cannot be sent as JSON: Object of "
                               "type object is not JSON serializable")


# --- error replies --------------------------------------------------------------------------

ERRORS = [(BadMessage, "BadMessage"), (UnknownVerb, "UnknownVerb"),
          (BadArguments, "BadArguments"), (InvalidState, "InvalidState"),
          (RankUnavailable, "RankUnavailable"), (SnapshotFailed, "SnapshotFailed"),
          (BusTimeout, "Timeout"), (InternalError, "Internal")]


@pytest.mark.parametrize("cls, wire_type", ERRORS)
def test_each_error_travels_as_its_type_and_comes_back_as_its_class(cls, wire_type):
    assert cls.type == wire_type and issubclass(cls, BusError) and issubclass(cls, PrismError)
    raw = encode_error("r-9", cls("rank 3 is being restored: wait for the restored event"))
    assert json.loads(raw) == {"v": 2, "id": "r-9", "ok": False, "error": {
        "type": wire_type, "message": "rank 3 is being restored: wait for the restored event"}}
    with pytest.raises(cls) as info:
        decode_reply(raw)
    assert (type(info.value), info.value.request_id, info.value.type, str(info.value)) == (
        cls, "r-9", wire_type, "rank 3 is being restored: wait for the restored event")
    built = error_from_type(wire_type, "m", request_id="r")
    assert (type(built), built.type, built.message, built.request_id) == (cls, wire_type, "m",
                                                                          "r")


def test_an_unknown_error_type_keeps_its_name_on_a_plain_bus_error():
    error = error_from_type("QuotaExceeded", "too many clients")
    assert (type(error), error.type, str(error)) == (BusError, "QuotaExceeded",
                                                     "too many clients")
    with pytest.raises(BusError) as info:
        decode_reply(encode_error(None, "QuotaExceeded", "too many clients"))
    assert (type(info.value), info.value.type, info.value.request_id) == (
        BusError, "QuotaExceeded", None)


def test_encode_error_takes_a_class_a_type_string_or_any_exception():
    assert json.loads(encode_error("a", InvalidState, "step while running: pause first")
                      )["error"] == {"type": "InvalidState",
                                     "message": "step while running: pause first"}
    assert json.loads(encode_error("a", "Timeout", "late"))["error"] == {
        "type": "Timeout", "message": "late"}
    assert json.loads(encode_error("a", KeyError("rank")))["error"] == {
        "type": "Internal", "message": "KeyError: 'rank'"}
    # a decoding error goes back with the message it carries
    try:
        decode_request(b"[]")
    except BusError as exc:
        raw = encode_error(exc.request_id, exc)
    assert json.loads(raw) == {"v": 2, "id": None, "ok": False, "error": {
        "type": "BadMessage", "message": "request must be a JSON object, got list"}}


@pytest.mark.parametrize("raw, message", [
    (b"nope", "reply is not UTF-8 JSON (Expecting value: line 1 column 1 (char 0))"),
    (frame(v=2, id="a", ok="yes"), "reply 'ok' must be a bool, got str"),
    (frame(v=2, id=None, ok=True, result={}), "reply 'id' must be a str, got null"),
    (frame(v=2, id="a", ok=True, result=[]), "reply 'result' must be an object, got list"),
    (frame(v=2, id=3, ok=False, error={}), "error reply 'id' must be a str or null, got int"),
    (frame(v=2, id="a", ok=False, error={"type": "Internal"}),
     "error reply 'error' must be an object with str 'type' and 'message'"),
    (frame(v=0, id="a", ok=True, result={}), "reply has protocol version 0; this prism-debug "
                                             "speaks protocol version 2 (run the same "
                                             "prism-debug on both ends)"),
])
def test_a_malformed_reply_is_a_bad_message(raw, message):
    with pytest.raises(BadMessage) as info:
        decode_reply(raw)
    assert str(info.value) == message


# --- malformed events -----------------------------------------------------------------------

@pytest.mark.parametrize("topic, body, message", [
    (b"rank.1.paused", frame(v=2, seq=0, rank=1, kind="paused", wall=1.0, data={}),
     "event 'seq' must be an int >= 1, got 0"),
    (b"rank.1.paused", frame(v=2, seq=1, rank="1", kind="paused", wall=1.0, data={}),
     "event needs an int 'rank' and a str 'kind', got str and str"),
    (b"rank.1.paused", frame(v=2, seq=1, rank=1, kind="paused", wall=None, data={}),
     "event 'wall' must be a number, got null"),
    (b"rank.1.paused", frame(v=2, seq=1, rank=1, kind="paused", wall=1, data=[]),
     "event 'data' must be an object, got list"),
    (b"rank.2.paused", frame(v=2, seq=1, rank=1, kind="paused", wall=1.0, data={}),
     "event topic b'rank.2.paused' does not match its body (rank 1, kind 'paused')"),
])
def test_a_malformed_event_is_a_bad_message(topic, body, message):
    with pytest.raises(BadMessage) as info:
        decode_event(topic, body)
    assert str(info.value) == message


def test_the_protocol_imports_no_zeromq():
    code = ("import sys, prism_debug.bus, prism_debug.bus.protocol, prism_debug.bus.sessions\n"
            "print('zmq' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout == "False\n"
