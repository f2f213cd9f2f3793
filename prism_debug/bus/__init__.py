"""The ZeroMQ control plane between controller, agent and clients.

The protocol and session discovery are pure Python and imported eagerly; the
parts that need ZeroMQ (:class:`BusClient`, the CURVE key helpers) load on first
use, so importing the protocol never drags libzmq into a process.
"""

from typing import Any

from prism_debug.bus.protocol import (
    AGENT_EVENT_KINDS,
    EVENT_KINDS,
    MAX_FRAME_BYTES,
    MAX_WIRE_BYTES,
    PROTOCOL_VERSION,
    VERBS,
    BadArguments,
    BadMessage,
    BusError,
    BusTimeout,
    Busy,
    InternalError,
    InvalidState,
    RankUnavailable,
    Request,
    SnapshotFailed,
    Unauthorized,
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
from prism_debug.bus.sessions import SessionInfo, SessionNotFound, find, live_sessions

_LAZY = {"BusClient": "prism_debug.bus.client", "ClientCurve": "prism_debug.bus.keys",
         "KeysError": "prism_debug.bus.keys", "ensure_keys": "prism_debug.bus.keys"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AGENT_EVENT_KINDS", "EVENT_KINDS", "MAX_FRAME_BYTES", "MAX_WIRE_BYTES",
           "PROTOCOL_VERSION", "VERBS", "BadArguments", "BadMessage", "BusClient", "BusError",
           "BusTimeout", "Busy", "ClientCurve",
           "InternalError", "InvalidState", "KeysError", "RankUnavailable", "Request",
           "SessionInfo", "SessionNotFound", "SnapshotFailed", "Unauthorized", "UnknownVerb",
           "decode_event", "decode_reply", "decode_request", "encode_error", "encode_event",
           "encode_reply", "encode_request", "ensure_keys", "error_from_type", "find",
           "live_sessions"]
