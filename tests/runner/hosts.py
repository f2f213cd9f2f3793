"""Two torchrun agents on this machine standing for two hosts, each running
one ``prism-debug run`` worker (--nproc-per-node 1)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys


def run_on_two_hosts(run_args: list[str], env: dict[str, str] | None = None,
                     timeout_s: float = 300) -> list[subprocess.CompletedProcess]:
    """``prism-debug run RUN_ARGS`` under two torchrun agents that meet on a
    c10d rendezvous; each agent's exit code and output (stdout and stderr)."""
    with socket.socket() as probe:  # a free port for the rendezvous both agents name
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hosts",
         "-m", "prism_debug.cli", "run", *run_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=None if env is None else {**os.environ, **env},
        stdin=subprocess.DEVNULL, start_new_session=True) for _ in range(2)]
    try:
        outputs = [agent.communicate(timeout=timeout_s)[0] for agent in agents]
    finally:
        for agent in agents:  # the agent, its worker and the ranks, if still there
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
    return [subprocess.CompletedProcess(agent.args, agent.returncode, out)
            for agent, out in zip(agents, outputs, strict=True)]
