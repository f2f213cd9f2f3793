"""prism-debug: run one rank of a huge torch.distributed job on the machine you have.

A training script may call :func:`iteration`; everything else is driven from
the ``prism-debug`` command line or, from Python, :mod:`prism_debug.api` (run a
rank, restore a snapshot, run a scenario), imported on its own so that this
package stays light inside the rank.
"""

from prism_debug.errors import PrismError

__version__ = "0.1.0"
__all__ = ["PrismError", "__version__", "iteration"]


def iteration() -> None:
    """Mark the end of one training iteration.

    Scripts without a torch optimizer (or with several, stepping at odd times)
    call this once per iteration; from the first call on, optimizer steps no
    longer count.  Outside ``prism-debug run`` it does nothing.
    """
    import sys

    agent_module = sys.modules.get("prism_debug.agent.agent")
    agent = agent_module.active_agent() if agent_module else None
    if agent is not None:
        agent.mark_iteration()
