"""The debugger console: pdb-style commands that drive one real rank over the bus."""

from prism_debug.console.console import Console

__all__ = ["Console"]
