"""Hot reload into a restored rank: which changed functions can be patched in
place and what must be refused (``planner``); pure Python, the core's rules."""

from prism_debug.reload.planner import FilePlan, Patch, ReloadPlan, plan, plan_file

__all__ = ["FilePlan", "Patch", "ReloadPlan", "plan", "plan_file"]
