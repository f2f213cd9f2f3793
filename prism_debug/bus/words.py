"""What the bus's events and states say in words, shared by the console (which
prints them) and the controller (which tells its own terminal when a rank waits
with nobody attached).  Pure functions of the event's data."""

from __future__ import annotations


def describe_pause(data: dict) -> str:
    """``paused at iteration 3 (break 1)``, ``paused before all_reduce on dp[3] (seq 12) ...``."""
    if data.get("at") == "collective":
        text = f"paused before {describe_collective(data)} in iteration {data['iteration']}"
    else:
        text = f"paused at iteration {data['iteration']}"
    return f"{text} ({data['reason']})" if data.get("reason") else text


def describe_collective(data: dict) -> str:
    text = str(data.get("op"))
    if data.get("family") is not None:
        text += f" on {format_group(data['family'], data.get('index'))}"
    if data.get("seq") is not None:
        text += f" (seq {data['seq']})"
    return text


def format_group(family: str | None, index: int | None) -> str:
    if family is None:
        return "-"
    return family if index is None else f"{family}[{index}]"


def how_to_resume(rank: int) -> str:
    """What a user does about a rank left paused: one phrase, the same everywhere."""
    return (f"`prism-debug attach --rank {rank}` to resume it (continue) or release it "
            "(detach)")
