"""The core (cost model, graph, engine, tracker) imports no torch, CRIU, ZeroMQ or click."""

import json
import subprocess
import sys

CORE = ["prism_debug.cost", "prism_debug.graph", "prism_debug.engine",
        "prism_debug.backend.tracker", "prism_debug.agent.config", "prism_debug.errors",
        "prism_debug.snapshot.store"]
FORBIDDEN = {"torch", "zmq", "pycriu", "click"}


def test_core_modules_import_no_adapters():
    code = (f"import json, sys\nfor m in {CORE!r}: __import__(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert loaded & FORBIDDEN == set()
