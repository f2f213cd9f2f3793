"""Several hosts under torchrun: one ``prism-debug run`` per host, each a
torchrun worker that runs its share of the job's real ranks; here two
torchrun agents on this machine stand for two hosts."""

from __future__ import annotations

import re
import sys

import pytest

from prism_debug.errors import ConfigError
from prism_debug.process.torchrun import WORKER_ONLY, host_of, under_torchrun
from tests.runner.hosts import run_on_two_hosts
from tests.runner.test_multi_rank import EXAMPLE, losses, torchrun

WORKER = {"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "1", "GROUP_RANK": "1",
          "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.5",
          "MASTER_PORT": "29400", "TORCHELASTIC_USE_AGENT_STORE": "True"}
SMALL = ["--iterations", "2", "--layers", "2", "--hidden", "64", "--heads", "4",
         "--seq-len", "32", "--vocab", "128", "--micro-batches", "2", "--tp", "4", "--pp", "1",
         "--loss-hex"]


def test_a_worker_takes_its_hosts_share_of_the_ranks():
    assert under_torchrun(WORKER) and not under_torchrun({"RANK": "1"})
    host = host_of(WORKER, (0, 1, 2, 3))
    assert (host.node_rank, host.nnodes, host.local_ranks, host.job_ranks) == (1, 2, (2, 3),
                                                                                (0, 1, 2, 3))
    assert host.side_store == {"host": "10.0.0.5", "port": 29400, "prefix": "prism/job7/1/"}
    assert not host.hosts_store
    first = host_of(dict(WORKER, RANK="0", TORCHELASTIC_USE_AGENT_STORE="False"), (0, 1))
    assert first.local_ranks == (0,) and first.hosts_store
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in WORKER_ONLY


@pytest.mark.parametrize("env, ranks, error", [
    (WORKER, (0, 1, 2), "--ranks names 3 ranks, which 2 hosts cannot share equally"),
    (WORKER, (), "under torchrun, give every host the same --ranks"),
    (dict(WORKER, LOCAL_WORLD_SIZE="2"), (0, 1), "torchrun started 2 workers on this host: run "
                                                  "one prism-debug per host (--nproc-per-node 1)"),
    ({k: v for k, v in WORKER.items() if k != "MASTER_PORT"}, (0, 1),
     "torchrun's variable 'MASTER_PORT' is missing"),
])
def test_a_worker_that_cannot_place_its_ranks_says_why(env, ranks, error):
    with pytest.raises(ConfigError, match=re.escape(error)):
        host_of(env, ranks)


@pytest.mark.slow
def test_two_hosts_run_four_real_ranks_of_8192_as_one_real_tp4_job(tmp_path):
    # tp 4 across the two hosts (ranks 0-1 on one, 2-3 on the other): every
    # tensor-parallel all-reduce crosses hosts; dp 2048 is mirrored
    real = losses(torchrun(*SMALL, "--data-parallel-size", "2048", "--data-parallel-rank", "0",
                           nproc=4))
    hosts = run_on_two_hosts(["--world-size", "8192", "--ranks", "0-3", "--lockstep",
                              "--no-bus", "--run-dir", str(tmp_path), "--", sys.executable,
                              str(EXAMPLE), *SMALL])
    outputs = [host.stdout for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], "\n".join(outputs)[-4000:]
    printed = [losses(out.replace("[rank 0] ", "")) for out in outputs]
    assert real in printed and [] in printed  # the host with rank 0 prints them, as tp rank 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-0", "node-1"]
    ran = {p.name for node in tmp_path.iterdir() for p in node.iterdir()}
    assert ran == {"rank-0", "rank-1", "rank-2", "rank-3"}
