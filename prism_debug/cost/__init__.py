"""Collective cost model and hardware profiles (pure: no torch, no I/O beyond profiles)."""

from prism_debug.cost.hardware import (
    DEFAULT_PROFILE,
    HardwareProfile,
    OpFit,
    bundled_profiles,
    load_profile,
)
from prism_debug.cost.model import (
    CostModel,
    Estimate,
    Placement,
    PricedOp,
    bus_factor,
)
from prism_debug.cost.ops import ALIASES, COLLECTIVES, known_op, op_name

__all__ = [
    "ALIASES", "COLLECTIVES", "CostModel", "DEFAULT_PROFILE", "Estimate", "HardwareProfile",
    "OpFit", "Placement", "PricedOp", "bundled_profiles", "bus_factor", "known_op", "load_profile",
    "op_name",
]
