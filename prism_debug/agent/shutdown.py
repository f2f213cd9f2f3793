"""The rank's interpreter exits without the collector's passes over torch.

When Python exits it clears every module and runs the cyclic garbage
collector over what is left, several times.  With torch loaded (and
``torch._dynamo``, which a torch optimizer's first step imports) that is
some 300,000 tracked objects: 0.8 to 0.9 s of CPU per process on this
project's machines, a sixth to a quarter of a short rank's life, paid by
every run, every profiling slice and every restored copy.  Freezing the collector once
the exit handlers begin moves every object alive then out of its reach.
Reference counting still frees what it frees when the modules are cleared,
so a file the script left open is flushed and closed as before.  Only
objects that are still alive at exit and in a reference cycle are no longer
finalized.  CPython does not promise to finalize them either ("It is not
guaranteed that ``__del__()`` methods are called for objects that still
exist when the interpreter exits", the data model's words).
``PRISM_DEBUG_EXIT_GC=1`` keeps the full collection for a script whose
exit depends on it.
"""

from __future__ import annotations

import atexit
import gc
import os

FULL_COLLECTION_ENV = "PRISM_DEBUG_EXIT_GC"


def spare_the_collector_at_exit() -> None:
    """Freeze the collector when the process exits (unless
    ``$PRISM_DEBUG_EXIT_GC`` is ``1``).  Exit handlers run last registered
    first, so the script's own handlers (registered after torch's import,
    which installs the agent) run before this one.  Handlers registered
    earlier still run, with the collector on for what they allocate."""
    if os.environ.get(FULL_COLLECTION_ENV) != "1":
        atexit.register(gc.freeze)
