"""The job's structure: group families now, the slicing-built execution graph later (pure core)."""

from prism_debug.graph.families import (
    WORLD_FAMILY,
    FamilyRecorder,
    FamilySummary,
    GroupRef,
)

__all__ = ["WORLD_FAMILY", "FamilyRecorder", "FamilySummary", "GroupRef"]
