"""The rank's exit freezes the collector after the script's own exit
handlers, and loses nothing the script left to its exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from prism_debug.agent.shutdown import FULL_COLLECTION_ENV

# An exit handler registered before the agent's runs after it (last
# registered, first run): it sees whether the collector was frozen, and a
# handler registered after it (as the script's are) runs before it
SCRIPT = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at the end:", gc.get_freeze_count() > 0))
from prism_debug.agent.shutdown import spare_the_collector_at_exit
spare_the_collector_at_exit()
atexit.register(lambda: print("frozen in the script's handler:", gc.get_freeze_count() > 0))
log = open(sys.argv[1], "w")  # never closed: the exit must still flush it
log.write("written, never closed\\n" * 1000)
"""


def run(tmp_path, full_collection: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != FULL_COLLECTION_ENV}
    if full_collection is not None:
        env[FULL_COLLECTION_ENV] = full_collection
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "log")], env=env,
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("full_collection", [None, "0"])
def test_the_collector_is_frozen_after_the_scripts_handlers(tmp_path, full_collection):
    assert run(tmp_path, full_collection) == ("frozen in the script's handler: False\n"
                                              "frozen at the end: True\n")
    assert (tmp_path / "log").read_text() == "written, never closed\n" * 1000


def test_the_full_collection_is_kept_on_request(tmp_path):
    assert run(tmp_path, "1") == ("frozen in the script's handler: False\n"
                                  "frozen at the end: False\n")
    assert (tmp_path / "log").read_text() == "written, never closed\n" * 1000
