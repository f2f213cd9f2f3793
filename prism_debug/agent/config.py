"""What the controller tells the agent in the real rank (a JSON file named by
``PRISM_DEBUG_CONFIG``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

ENV_VAR = "PRISM_DEBUG_CONFIG"
# set by the first process of the rank that loads the agent (its pid): the processes
# it starts inherit it and load the agent without a bus link (only the rank talks)
OWNER_ENV_VAR = "PRISM_DEBUG_BUS_OWNER"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    rank: int
    world_size: int
    gpus_per_node: int
    hardware: dict  # HardwareProfile.to_dict()
    seed: int
    values: str
    events_path: str
    iterations: int | None = None  # stop cleanly after this many iterations
    record_ops: bool = False  # per-op records for --trace
    digests: bool = True
    record_program: bool = False  # profiling a slice: record the rank's program
    graph_path: str | None = None  # replay virtual peers from this graph (else lockstep)
    trace_ranks: tuple[int, ...] = ()  # virtual ranks whose ops go into the trace
    # snapshots: stop for a CRIU dump after these iterations, or every K
    snapshot_at: tuple[int, ...] = ()
    snapshot_every: int | None = None
    # --history: stop for a snapshot after every other iteration too, marked as
    # the history's (the controller keeps a ring of the last K and prunes the rest)
    history: bool = False
    # kept open by the agent; read after every snapshot stop (a restored copy
    # finds there, through CRIU's inherited descriptors, what its restore asks)
    control_path: str | None = None
    # the controller's command endpoint on the debugger bus (None: no bus)
    bus: str | None = None
    bus_curve: dict | None = None  # the session's agent CURVE keys when the bus uses CURVE
    bus_secret: str | None = None  # proves the rank's hello (this file is 0600)
    start_paused: bool = False  # pause at init_process_group until a client continues
    faults: tuple[dict, ...] = ()  # Fault.to_dict()s put in force at the start
    # Variability.to_dict(): the peers' compute drawn from the engine's generator
    # (seeded with ``seed``); None: the graph's own gaps
    variability: dict | None = None
    collective_timeout_s: float | None = None  # overrides every group's timeout
    watch_nonfinite: bool = False  # report the first iteration the rank sends NaN/inf
    # several real ranks (--ranks): all of them (this one included), and the
    # store where they meet (SideStore.to_dict(): its prefix is the run's secret)
    real_ranks: tuple[int, ...] = ()
    side_store: dict | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside the world of {self.world_size} ranks")

    def snapshot_due(self, iteration: int) -> bool:
        return iteration in self.snapshot_at or bool(
            self.snapshot_every and iteration % self.snapshot_every == 0)

    def write(self, path: Path) -> None:
        """Written 0600, whatever the umask: it holds the bus secret."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o600)  # a file that existed keeps its mode otherwise
            f.write(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def read(cls, path: str | Path) -> AgentConfig:
        data = json.loads(Path(path).read_text())
        data["trace_ranks"] = tuple(data.get("trace_ranks", ()))
        data["snapshot_at"] = tuple(data.get("snapshot_at", ()))
        data["faults"] = tuple(data.get("faults", ()))
        data["real_ranks"] = tuple(data.get("real_ranks", ()))
        return cls(**data)

    @classmethod
    def from_environment(cls) -> AgentConfig | None:
        path = os.environ.get(ENV_VAR)
        return cls.read(path) if path else None


def claim_bus(config: AgentConfig) -> AgentConfig:
    """The rank's own process talks on the bus; the processes it starts that import
    torch too (a ``subprocess`` of Python, spawned DataLoader workers) load the agent
    without a link, so none of them can speak for the rank.  The first process to load
    the agent claims the bus in its environment, which its children inherit (a pid,
    not a flag: a process that execs itself keeps its claim; a restored copy keeps
    its pid, which CRIU restores)."""
    owner = os.environ.get(OWNER_ENV_VAR)
    if owner is None:
        os.environ[OWNER_ENV_VAR] = str(os.getpid())
        return config
    if owner == str(os.getpid()):
        return config
    return dataclasses.replace(config, bus=None, bus_curve=None, bus_secret=None,
                               start_paused=False)
