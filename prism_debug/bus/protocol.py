"""The bus wire protocol: versioned JSON frames for requests, replies and events.

Pure Python (no ZeroMQ), so the controller, the agent and the clients share one
definition of every frame and every check, and the tests exercise it without
sockets.  A decoder never lets anything but a :class:`BusError` escape: a
malformed frame becomes an error reply and never takes the controller down.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

from prism_debug.errors import (
    BadArguments,
    BadMessage,
    BusError,
    BusTimeout,
    Busy,
    ConfigError,
    InternalError,
    InvalidState,
    RankUnavailable,
    SnapshotFailed,
    Unauthorized,
    UnknownVerb,
)
from prism_debug.faults import fault_from_dict

# 2: faults travel as typed dicts (perturb, faults, unperturb); 3: a client's hello may
# name the rank it drives (a controller running several ranks).  A frame carries the
# lowest version that says it, and must: only a hello naming a rank is version 3.  So
# a single-rank session's frames are byte for byte what they were, a version-2 peer (an
# older client, a rank restored from an older snapshot) is still understood, and an
# older controller refuses a hello naming a rank by its version.
PROTOCOL_VERSION = 3
READ_VERSIONS = (2, 3)
BASE_VERSION = 2  # what every frame but a rank-naming hello carries
MAX_FRAME_BYTES = 1 << 20
# What ZeroMQ itself accepts on every socket of the bus (ZMQ_MAXMSGSIZE): a larger
# frame is dropped as its header arrives, before any memory is allocated for it, and its
# sender disconnected.  Above MAX_FRAME_BYTES because the agent's replies (a long
# timeline, a deep stack) may be larger than a request ever is.
MAX_WIRE_BYTES = 8 << 20
MAX_ID_CHARS = 64
MAX_REASON_CHARS = 64  # a pause's reason, as run_to names it
MAX_BREAKPOINTS = 10_000  # a breakpoint table run_to hands over

EVENT_KINDS = ("iteration.start", "iteration.end", "coll.enter", "coll.exit", "paused",
               "resumed", "snapshot", "restored", "output", "agent.lost", "agent.back",
               "exited")
# what the agent inside the rank publishes; anything else it sends is dropped (and
# counted), so a rank cannot forge the controller's own events (snapshot, exited …)
AGENT_EVENT_KINDS = frozenset(("iteration.start", "iteration.end", "coll.enter", "coll.exit",
                               "paused", "resumed"))


# --- errors -------------------------------------------------------------------------------
# The classes live in prism_debug.errors (the whole tree in one file); each one's ``type``
# is the string that travels in an error reply, so a client re-raises exactly the class the
# controller raised.

_ERROR_TYPES: dict[str, type[BusError]] = {
    cls.type: cls for cls in (BadMessage, UnknownVerb, BadArguments, InvalidState,
                              RankUnavailable, SnapshotFailed, BusTimeout, InternalError,
                              Unauthorized, Busy)}


def error_from_type(error_type: str, message: str, *,
                    request_id: str | None = None) -> BusError:
    """The error an error reply describes; an unknown type (a newer peer) keeps its name on
    a plain :class:`BusError` rather than being lost."""
    cls = _ERROR_TYPES.get(error_type)
    if cls is None:
        return BusError(message, request_id=request_id, error_type=error_type)
    return cls(message, request_id=request_id)


# --- verb schemas -------------------------------------------------------------------------
# verb -> {argument: (allowed JSON types, required)}.  Types are matched exactly
# (``type(v) in allowed``), which is what JSON produces and keeps ``True`` from passing as
# an int.

ArgSchema = Mapping[str, tuple[tuple[type, ...], bool]]
_NONE = type(None)
_NO_ARGS: ArgSchema = types.MappingProxyType({})

VERBS: Mapping[str, ArgSchema] = types.MappingProxyType({
    "hello": {"client": ((str,), True), "rank": ((int,), False)},
    "status": _NO_ARGS,
    "where": _NO_ARGS,
    "break": {"kind": ((str,), True), "iteration": ((int,), False), "op": ((str,), False),
              "family": ((str, _NONE), False), "seq": ((int, _NONE), False),
              "temporary": ((bool,), False)},
    "breaks": _NO_ARGS,
    "delete": {"id": ((int,), False)},
    "continue": _NO_ARGS,
    "step": _NO_ARGS,
    "next": _NO_ARGS,
    "pause": _NO_ARGS,
    # stepping back (run --history K): the controller restores the nearest
    # earlier snapshot and replays to the stop with run_to, which passes breakpoints
    "back": {"iterations": ((int,), False)},
    "reverse-continue": _NO_ARGS,
    "run_to": {"iteration": ((int,), True), "seq": ((int, _NONE), False),
               "reason": ((str,), False), "breakpoints": ((list,), False)},
    "timeline": _NO_ARGS,
    "peers": {"selector": ((str,), False)},
    "events": {"on": ((bool,), True)},
    "snapshot": {"name": ((str,), False)},
    "snapshots": _NO_ARGS,
    "restore": {"id": ((str,), True), "lazy": ((bool, _NONE), False)},
    # detach releases the rank (every breakpoint deleted, a pause resumed) and leaves;
    # leave only leaves: the rank stays as it is, paused or not
    "detach": _NO_ARGS,
    "leave": _NO_ARGS,
    "perturb": {"fault": ((dict,), True), "text": ((str,), False)},
    "faults": _NO_ARGS,
    "unperturb": {"index": ((int,), False)},
    # the agent inside the rank speaks to the controller's ROUTER too
    # the secret is the session's (agent.json / the control file, 0600): it proves the
    # hello comes from the rank the controller started, with the peer's pid
    "agent.hello": {"rank": ((int,), True), "pid": ((int,), True),
                    "secret": ((str,), True)},
    "agent.heartbeat": _NO_ARGS,
})

# what only a controller asks of its ranks' agents: never a client's (the server
# does not take them), so no console can hold a rank at a boundary
CONTROLLER_VERBS: Mapping[str, ArgSchema] = types.MappingProxyType({
    # a change every real rank makes at one boundary (agent/agreed.py): the
    # boundary each reaches next, held; then the latest of them and the change
    "hold_boundary": _NO_ARGS,
    "agree_boundary": {"iteration": ((int,), True), "change": ((str,), True),
                       "fault": ((dict,), False), "text": ((str,), False),
                       "index": ((int,), False)},
})
AGENT_VERBS: Mapping[str, ArgSchema] = types.MappingProxyType({**VERBS, **CONTROLLER_VERBS})

_EXPECTED = {int: "an int", str: "a str", bool: "a bool", float: "a float", _NONE: "null",
             list: "a list", dict: "an object"}
_GOT = {int: "int", str: "str", bool: "bool", float: "float", _NONE: "null", list: "list",
        dict: "object"}


def _got(value: Any) -> str:
    return _GOT.get(type(value), type(value).__name__)


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _plural(word: str, items) -> str:
    return word if len(items) == 1 else word + "s"


def _quoted(names) -> str:
    return ", ".join(repr(n) for n in names)


def _check_break(args: dict[str, Any], request_id: str) -> None:
    """``break`` takes one of two argument sets, selected by ``kind``."""
    kind = args["kind"]
    if kind == "iter":
        if "iteration" not in args:
            raise BadArguments("a break of kind 'iter' needs argument 'iteration'",
                               request_id=request_id)
        if args["iteration"] < 1:
            raise BadArguments(f"argument 'iteration' of 'break' must be >= 1, got "
                               f"{args['iteration']}", request_id=request_id)
        stray: list[str] = [name for name in ("op", "family", "seq") if name in args]
        takes = "iteration and temporary"
    elif kind == "coll":
        if "op" not in args:
            raise BadArguments("a break of kind 'coll' needs argument 'op'",
                               request_id=request_id)
        stray = ["iteration"] if "iteration" in args else []
        takes = "op, family, seq and temporary"
    else:
        raise BadArguments(f"argument 'kind' of 'break' must be 'iter' or 'coll', got "
                           f"{kind!r}", request_id=request_id)
    if stray:
        raise BadArguments(f"{_plural('argument', stray)} {_quoted(stray)} of 'break' "
                           f"{'does' if len(stray) == 1 else 'do'} not apply to kind {kind!r} "
                           f"(it takes {takes})", request_id=request_id)


def _check_perturb(args: dict[str, Any], request_id: str) -> None:
    """``perturb`` carries a fault in its dict form: it must read back as one."""
    try:
        fault_from_dict(args["fault"])
    except ConfigError as exc:
        raise BadArguments(f"argument 'fault' of 'perturb': {exc}",
                           request_id=request_id) from None


def _check_back(args: dict[str, Any], request_id: str) -> None:
    if args.get("iterations", 1) < 1:
        raise BadArguments(f"argument 'iterations' of 'back' must be >= 1, got "
                           f"{args['iterations']}", request_id=request_id)


def _check_run_to(args: dict[str, Any], request_id: str) -> None:
    for name in ("iteration", "seq"):
        if args.get(name) is not None and args[name] < 1:
            raise BadArguments(f"argument {name!r} of 'run_to' must be >= 1, got "
                               f"{args[name]}", request_id=request_id)
    table = args.get("breakpoints", [])
    if len(table) > MAX_BREAKPOINTS or not all(type(row) is dict for row in table):
        raise BadArguments(f"argument 'breakpoints' of 'run_to' must be a list of at most "
                           f"{MAX_BREAKPOINTS} objects (breaks' rows)", request_id=request_id)
    if len(args.get("reason", "")) > MAX_REASON_CHARS:
        raise BadArguments(f"argument 'reason' of 'run_to' must be at most "
                           f"{MAX_REASON_CHARS} characters", request_id=request_id)


# Checks a schema cannot express, per verb.
_VALUE_CHECKS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "break": _check_break, "perturb": _check_perturb, "back": _check_back,
    "run_to": _check_run_to}


def check_args(verb: str, args: dict[str, Any], schema: ArgSchema, request_id: str) -> None:
    """Raise :class:`BadArguments` unless ``args`` fit ``schema`` (and the verb's own
    value checks)."""
    for name, value in args.items():
        spec = schema.get(name)
        if spec is None:
            unknown = sorted(n for n in args if n not in schema)
            takes = _join(list(schema)) if schema else "no arguments"
            raise BadArguments(f"unknown {_plural('argument', unknown)} "
                               f"{_quoted(unknown)} for {verb!r} (it takes {takes})",
                               request_id=request_id)
        if type(value) not in spec[0]:
            expected = " or ".join(_EXPECTED.get(t, t.__name__) for t in spec[0])
            raise BadArguments(f"argument {name!r} of {verb!r} must be {expected}, got "
                               f"{_got(value)}", request_id=request_id)
    if len(args) < len(schema):
        missing = [name for name, (_, required) in schema.items()
                   if required and name not in args]
        if missing:
            raise BadArguments(f"missing required {_plural('argument', missing)} "
                               f"{_quoted(missing)} of {verb!r}", request_id=request_id)
    value_check = _VALUE_CHECKS.get(verb)
    # only for the verb as VERBS defines it: a caller's own table may reuse the name
    if value_check is not None and schema is VERBS.get(verb):
        value_check(args, request_id)


# --- requests -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    id: str
    verb: str
    args: dict[str, Any]


_REQUEST_FIELDS = frozenset(("v", "id", "verb", "args"))


def _dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def new_request_id() -> str:
    return secrets.token_hex(8)


def _version_of(verb: str, args: Mapping[str, Any]) -> int:
    """The lowest protocol version that says this request: an older controller
    refuses a hello naming a rank by its version, not by an argument it lacks."""
    return PROTOCOL_VERSION if verb == "hello" and "rank" in args else BASE_VERSION


def encode_request(verb: str, args: Mapping[str, Any] | None = None,
                   id: str | None = None) -> bytes:  # noqa: A002 - the wire's name
    """One request frame.  Arguments are not checked here: the receiver checks them, and
    tests need to send bad ones."""
    args = dict(args or {})
    request_id = new_request_id() if id is None else id
    message = {"v": _version_of(verb, args), "id": request_id, "verb": verb, "args": args}
    try:
        return _dumps(message)
    except (TypeError, ValueError) as exc:
        raise BadArguments(f"arguments of {verb!r} cannot be sent as JSON: {exc}",
                           request_id=request_id) from exc


def _parse(frame: bytes, what: str, versions: tuple[int, ...] = (BASE_VERSION,)
           ) -> dict[str, Any]:
    """The JSON object in ``frame``, checked for size and protocol version."""
    if len(frame) > MAX_FRAME_BYTES:
        raise BadMessage(f"{what} of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte "
                         "frame limit")
    try:
        # decode first: json.loads on bytes would also accept UTF-16 and UTF-32
        message = json.loads(bytes(frame).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise BadMessage(f"{what} is not UTF-8 JSON ({exc})") from None
    if type(message) is not dict:
        raise BadMessage(f"{what} must be a JSON object, got {_got(message)}")
    version = message.get("v")
    if type(version) is not int or version not in versions:
        shown = "no version 'v'" if version is None else f"protocol version {version!r}"
        raise BadMessage(f"{what} has {shown}; this prism-debug speaks protocol "
                         f"{_plural('version', versions)} {_join([str(v) for v in versions])} "
                         "(run the same prism-debug on both ends)")
    return message


def decode_request(frame: bytes, verbs: Mapping[str, ArgSchema] = VERBS) -> Request:
    """The request in ``frame``, or :class:`BadMessage` / :class:`UnknownVerb` /
    :class:`BadArguments` (carrying the request id whenever the frame had a usable one)."""
    message = _parse(frame, "request", READ_VERSIONS)
    request_id = message.get("id")
    if type(request_id) is not str or not 1 <= len(request_id) <= MAX_ID_CHARS:
        got = "none" if "id" not in message else (
            f"{len(request_id)} characters" if type(request_id) is str else _got(request_id))
        raise BadMessage(f"request 'id' must be a str of 1..{MAX_ID_CHARS} characters, "
                         f"got {got}")
    verb = message.get("verb")
    if type(verb) is not str:
        got = "none" if "verb" not in message else _got(verb)
        raise BadMessage(f"request 'verb' must be a str, got {got}", request_id=request_id)
    if len(message) > 3:
        stray = message.keys() - _REQUEST_FIELDS
        if stray:
            raise BadMessage(f"request has unknown {_plural('field', stray)} "
                             f"{_quoted(sorted(stray))} (a request holds v, id, verb and args)",
                             request_id=request_id)
    args = message.get("args", {})
    if type(args) is not dict:
        raise BadMessage(f"request 'args' must be an object, got {_got(args)}",
                         request_id=request_id)
    if message["v"] != _version_of(verb, args):
        named = " naming a rank" if verb == "hello" and "rank" in args else ""
        raise BadMessage(f"request has protocol version {message['v']}, but a {verb!r} "
                         f"request{named} is version {_version_of(verb, args)} (run the same "
                         "prism-debug on both ends)", request_id=request_id)
    schema = verbs.get(verb)
    if schema is None:
        raise UnknownVerb(f"unknown verb {verb!r}; known verbs: {', '.join(sorted(verbs))}",
                          request_id=request_id)
    check_args(verb, args, schema, request_id)
    return Request(request_id, verb, args)


# --- replies ------------------------------------------------------------------------------

def encode_reply(id: str, result: Mapping[str, Any]) -> bytes:  # noqa: A002
    return _dumps({"v": BASE_VERSION, "id": id, "ok": True, "result": dict(result)})


def encode_error(id: str | None, exc_or_type: BaseException | type[BusError] | str,  # noqa: A002
                 message: str | None = None) -> bytes:
    """An error reply.  ``exc_or_type`` is a :class:`BusError` (instance or class), a type
    string, or any other exception, which goes out as ``Internal`` with its class named."""
    if isinstance(exc_or_type, str):
        error_type = exc_or_type
    elif isinstance(exc_or_type, BusError):
        error_type = exc_or_type.type
        message = exc_or_type.message if message is None else message
    elif isinstance(exc_or_type, type) and issubclass(exc_or_type, BusError):
        error_type = exc_or_type.type
    else:
        error_type = InternalError.type
        if message is None:
            message = f"{type(exc_or_type).__name__}: {exc_or_type}"
    return _dumps({"v": BASE_VERSION, "id": id, "ok": False,
                   "error": {"type": error_type, "message": message or ""}})


def decode_reply(frame: bytes) -> tuple[str, dict[str, Any]]:
    """``(id, result)`` of an ok reply; an error reply raises the error it carries (with
    ``request_id`` set), a malformed one :class:`BadMessage`."""
    message = _parse(frame, "reply")
    reply_id = message.get("id")
    ok = message.get("ok")
    if ok is True:
        if type(reply_id) is not str:
            raise BadMessage(f"reply 'id' must be a str, got {_got(reply_id)}")
        result = message.get("result")
        if type(result) is not dict:
            raise BadMessage(f"reply 'result' must be an object, got {_got(result)}",
                             request_id=reply_id)
        return reply_id, result
    if ok is not False:
        raise BadMessage(f"reply 'ok' must be a bool, got {_got(ok)}")
    if reply_id is not None and type(reply_id) is not str:
        raise BadMessage(f"error reply 'id' must be a str or null, got {_got(reply_id)}")
    error = message.get("error")
    if (type(error) is not dict or type(error.get("type")) is not str
            or type(error.get("message")) is not str):
        raise BadMessage("error reply 'error' must be an object with str 'type' and "
                         "'message'", request_id=reply_id)
    raise error_from_type(error["type"], error["message"], request_id=reply_id)


# --- events -------------------------------------------------------------------------------

def event_topic(rank: int, kind: str = "") -> bytes:
    """The topic of an event, or with no kind the prefix that subscribes to one rank's
    events (the trailing dot keeps rank 1 from matching rank 10)."""
    return f"rank.{rank}.{kind}".encode("ascii")


def encode_event(seq: int, rank: int, kind: str, data: Mapping[str, Any],
                 wall: float | None = None) -> tuple[bytes, bytes]:
    """``(topic, body)``: the two frames of one event on the PUB socket."""
    body = {"v": BASE_VERSION, "seq": seq, "rank": rank, "kind": kind,
            "wall": time.time() if wall is None else wall, "data": dict(data)}
    return event_topic(rank, kind), _dumps(body)


def decode_event(topic: bytes, body: bytes) -> dict[str, Any]:
    """The event body as a dict (``v, seq, rank, kind, wall, data``), checked against its
    topic; :class:`BadMessage` when it is not one."""
    event = _parse(body, "event")
    seq, rank, kind = event.get("seq"), event.get("rank"), event.get("kind")
    if type(seq) is not int or seq < 1:
        raise BadMessage(f"event 'seq' must be an int >= 1, got {seq!r}")
    if type(rank) is not int or type(kind) is not str:
        raise BadMessage(f"event needs an int 'rank' and a str 'kind', got {_got(rank)} and "
                         f"{_got(kind)}")
    if type(event.get("wall")) not in (int, float):
        raise BadMessage(f"event 'wall' must be a number, got {_got(event.get('wall'))}")
    if type(event.get("data")) is not dict:
        raise BadMessage(f"event 'data' must be an object, got {_got(event.get('data'))}")
    if bytes(topic) != f"rank.{rank}.{kind}".encode("ascii", "replace"):
        raise BadMessage(f"event topic {bytes(topic)!r} does not match its body (rank {rank}, "
                         f"kind {kind!r})")
    return event
