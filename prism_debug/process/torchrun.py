"""``prism-debug run`` on several hosts, under the launcher the job already
uses: ``torchrun`` (torch's elastic agent and its c10d rendezvous).

One ``prism-debug run`` per host is one torchrun worker
(``--nproc-per-node 1``), and every host is given the same command line:

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT --rdzv-id JOB \\
        -m prism_debug.cli run --world-size 8192 --ranks 0-3 -- python train.py

The worker's own torchrun variables say which host it is (``RANK`` of
``WORLD_SIZE`` workers: torchrun numbers hosts in rendezvous order, not by
``--node-rank``); host i owns the i-th equal slice of ``--ranks`` and starts
those ranks for real.  The ranks of every host meet on torchrun's own store
(the rendezvous agent's, at ``MASTER_ADDR:MASTER_PORT``) under a prefix of
this job's run id and restart count: torchrun's trust model, a cluster
network whose hosts trust each other, is the job's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from prism_debug.errors import ConfigError

# what torchrun sets in its workers that must not reach the ranks this
# worker starts: they get the variables of their own emulated rank instead
WORKER_ONLY = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
               "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
               "TORCHELASTIC_SIGNALS_TO_HANDLE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
               # the agent turns NCCL's async error handling on for its workers:
               # the ranks keep the user's own setting
               "TORCH_NCCL_ASYNC_ERROR_HANDLING")


@dataclasses.dataclass(frozen=True)
class Host:
    """This host's place in a run of several hosts."""

    node_rank: int
    nnodes: int
    local_ranks: tuple[int, ...]  # the real ranks this host runs
    job_ranks: tuple[int, ...]  # every host's
    side_store: dict  # SideStore.to_dict(): torchrun's store, this job's prefix
    hosts_store: bool  # this worker must serve the store (torchrun left it to rank 0)


def under_torchrun(env: Mapping[str, str]) -> bool:
    """Whether this process is a torchrun worker."""
    return "TORCHELASTIC_RUN_ID" in env and "GROUP_RANK" in env


def host_of(env: Mapping[str, str], ranks: tuple[int, ...]) -> Host:
    """This worker's share of ``ranks``, from torchrun's variables."""
    try:
        node_rank, nnodes = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_world = int(env["LOCAL_WORLD_SIZE"])
        address, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"prism-debug runs under torchrun, but torchrun's variable {exc} is "
                          "missing or not a number: start it with torchrun itself") from None
    if local_world != 1:
        raise ConfigError(f"torchrun started {local_world} workers on this host: run one "
                          "prism-debug per host (--nproc-per-node 1); it starts the host's "
                          "real ranks itself")
    if not ranks:
        raise ConfigError("under torchrun, give every host the same --ranks: each runs an "
                          "equal share of them")
    if len(ranks) % nnodes:
        raise ConfigError(f"--ranks names {len(ranks)} ranks, which {nnodes} hosts cannot "
                          f"share equally: name a multiple of {nnodes}")
    share = len(ranks) // nnodes
    run_id = env["TORCHELASTIC_RUN_ID"]
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Host(
        node_rank=node_rank, nnodes=nnodes,
        local_ranks=ranks[node_rank * share:(node_rank + 1) * share], job_ranks=ranks,
        # a restarted job's rendezvous is a new store round: keys apart per attempt
        side_store={"host": address, "port": port, "prefix": f"prism/{run_id}/{restart}/"},
        hosts_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "True") != "True"
        and node_rank == 0)
