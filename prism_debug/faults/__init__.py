"""Faults of virtual peers: one typed value from a scenario file, the command
line or the console to the replay engine and the backend (pure core: no
torch, ZeroMQ, CRIU or click).

``model`` defines the value, ``text`` the grammar people type, ``select``
whom a fault hits in a given world and graph.
"""

from prism_debug.faults.model import (
    FAULT_TYPES,
    MISSING_ACTIONS,
    VALUE_ACTIONS,
    Action,
    CorruptFault,
    DelayFault,
    DesyncFault,
    DesyncKind,
    Duration,
    FailFault,
    Fault,
    HangFault,
    InfFault,
    Intermittent,
    LinkFault,
    NanFault,
    Selector,
    SlowFault,
    Trigger,
    fault_from_dict,
)
from prism_debug.faults.select import Injection, Topology, resolve, select, select_nodes
from prism_debug.faults.text import USAGE, USAGE_TEXT, fault_text, parse_fault, rank_text

__all__ = [
    "FAULT_TYPES", "MISSING_ACTIONS", "USAGE", "USAGE_TEXT", "VALUE_ACTIONS", "Action",
    "CorruptFault", "DelayFault", "DesyncFault", "DesyncKind", "Duration", "FailFault", "Fault",
    "HangFault", "InfFault", "Injection", "Intermittent", "LinkFault", "NanFault", "Selector",
    "SlowFault", "Topology", "Trigger", "fault_from_dict", "fault_text", "parse_fault",
    "rank_text", "resolve", "select", "select_nodes",
]
