"""The job's structure: group families and the execution graph (pure core)."""

from prism_debug.errors import GraphError
from prism_debug.graph.execution import (
    ClassProgram,
    Event,
    ExecutionGraph,
    Mesh,
    OpSpec,
)
from prism_debug.graph.families import (
    WORLD_FAMILY,
    FamilyRecorder,
    FamilySummary,
    GroupRef,
)
from prism_debug.graph.fits import GapFit

__all__ = [
    "WORLD_FAMILY", "ClassProgram", "Event", "ExecutionGraph", "FamilyRecorder", "FamilySummary",
    "GapFit", "GraphError", "GroupRef", "Mesh", "OpSpec",
]
