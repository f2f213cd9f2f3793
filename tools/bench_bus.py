"""The debugger bus: command round trips, event throughput with 1 and 8
clients, and what watching costs the rank per collective.

One ``prism-debug run --paused`` of ``tools/bus_workload.py`` (blocks of
small all-reduces as rank 4097 of 8192, each block an iteration):

* round trip: ``status`` (forwarded through the controller to the rank and
  back) from 1 client, then from 8 clients at once, p50/p99;
* per block the bench turns collective events on or off, alternately, and
  ``next`` runs the block; the script's own wall time per all-reduce gives
  the cost in the rank (on vs off, medians, side by side in one run), and
  the clients count the events they receive.

The rank normally samples collective events (2,000 a second); the bench
lifts that (``PRISM_DEBUG_COLL_EVENTS_PER_S``) to measure the bus itself,
and measures the sampled default as well.

Last line: ``bus: rtt_p50_us=… rtt_p99_us=… events_per_s_8_clients=…
coll_cost_ratio_on_off=…`` (the ratio with the default sampling).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prism_debug.bus import sessions  # noqa: E402
from prism_debug.bus.client import BusClient  # noqa: E402


def start(work: Path, blocks: int, ops: int, rate: str) -> tuple[subprocess.Popen, object]:
    env = dict(os.environ, PRISM_DEBUG_SESSIONS=str(work / "sessions"),
               PRISM_DEBUG_COLL_EVENTS_PER_S=rate, OMP_NUM_THREADS="1")
    run = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--paused",
         "--hardware", "zero",
         "--no-digest", "--run-dir", str(work / "run"), "--", sys.executable,
         str(ROOT / "tools" / "bus_workload.py"), "--blocks", str(blocks), "--ops", str(ops)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        text=True)
    os.environ["PRISM_DEBUG_SESSIONS"] = env["PRISM_DEBUG_SESSIONS"]
    deadline = time.monotonic() + 120
    while not (live := sessions.live_sessions()):
        if run.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"bench_bus: the run did not start:\n{run.stderr.read()}")
        time.sleep(0.05)
    return run, live[0]


def round_trips(info, num_clients: int, count: int) -> list[float]:
    times: list[float] = []
    lock = threading.Lock()

    def client_loop() -> None:
        with BusClient.for_session(info) as client:
            client.request("hello", client="bench")
            mine = []
            for _ in range(count):
                started = time.perf_counter()
                client.request("status")
                mine.append(time.perf_counter() - started)
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=client_loop) for _ in range(num_clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def blocks(info, clients: list[BusClient], num_blocks: int) -> tuple[list, list, float]:
    """Run ``num_blocks`` blocks, events on for every other one; the per-op
    wall times (on, off) and the events per second the clients received."""
    driver = clients[0]
    on_times, off_times, rates = [], [], []
    for block in range(num_blocks):
        events_on = block % 2 == 1
        for client in clients:
            client.events()  # drop what came before
        driver.request("events", on=events_on)
        started = time.perf_counter()
        after = driver.request("next")["after"]
        while True:
            event = driver.next_event({"paused", "exited"}, timeout_s=300)
            if event is None or event["kind"] == "exited" or event["data"]["number"] > after:
                break
        elapsed = time.perf_counter() - started
        # the block's last events, until the bus is quiet (a backlog still being
        # published would slow the next block)
        received = [[] for _ in clients]
        while True:
            batches = [client.events(timeout_s=0.3) for client in clients]
            for got, batch in zip(received, batches, strict=True):
                got.extend(batch)
            if not any(batches):
                break
        lines = [e["data"]["line"] for e in received[0] if e["kind"] == "output"]
        us = [float(line.split()[-1]) for line in lines if line.startswith("block ")]
        if not us:
            continue
        (on_times if events_on else off_times).append(us[-1])
        print(f"  {len(clients)} client(s), block {block + 1},"
              f" events {'on ' if events_on else 'off'}: {us[-1]:.2f} us per all-reduce",
              flush=True)
        if events_on:
            counts = [sum(e["kind"].startswith("coll.") for e in got) for got in received]
            rates.append(sum(counts) / len(clients) / elapsed)
    return on_times, off_times, statistics.median(rates) if rates else 0.0


def measure(rate: str, num_blocks: int, ops: int, rtt_count: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="prism-bench-bus-"))
    run, info = start(work, 2 * num_blocks + 1, ops, rate)
    figures = {}
    try:
        with BusClient.for_session(info) as first:
            first.request("hello", client="bench")
            while first.request("status")["state"] == "starting":
                time.sleep(0.05)
            figures["rtt_1"] = round_trips(info, 1, rtt_count)
            figures["rtt_8"] = round_trips(info, 8, rtt_count // 8)
            first.request("next")  # the first block warms up (torch, groups)
            first.next_event({"paused"}, timeout_s=300)
            figures["blocks_1"] = blocks(info, [first], num_blocks)
            others = [BusClient.for_session(info) for _ in range(7)]
            try:
                for client in others:
                    client.request("hello", client="bench")
                time.sleep(0.3)
                figures["blocks_8"] = blocks(info, [first, *others], num_blocks)
            finally:
                for client in others:
                    client.close()
            first.request("continue")
    finally:
        run.wait(timeout=300)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6, help="blocks per client count (even)")
    parser.add_argument("--ops", type=int, default=10000, help="all-reduces per block")
    parser.add_argument("--round-trips", type=int, default=2000)
    args = parser.parse_args()
    print("unsampled (every collective's events sent) …", flush=True)
    raw = measure("1e12", args.blocks, args.ops, args.round_trips)
    print("sampled (the default, 2,000 collective events a second) …", flush=True)
    sampled = measure("2000", args.blocks, args.ops, args.round_trips // 4)
    rtt1, rtt8 = raw["rtt_1"], raw["rtt_8"]
    print(f"round trip (status, forwarded to the rank): 1 client p50 "
          f"{percentile(rtt1, 0.5) * 1e6:.0f} us p99 {percentile(rtt1, 0.99) * 1e6:.0f} us; "
          f"8 clients p50 {percentile(rtt8, 0.5) * 1e6:.0f} us p99 "
          f"{percentile(rtt8, 0.99) * 1e6:.0f} us")
    print(f"{'events':>10} {'clients':>8} {'us/op off':>10} {'us/op on':>9} {'ratio':>6} "
          f"{'events/s per client':>20}")
    ratio = 0.0
    for name, figures in (("unsampled", raw), ("sampled", sampled)):
        for clients in (1, 8):
            on, off, rate = figures[f"blocks_{clients}"]
            ratio = statistics.median(on) / statistics.median(off)
            print(f"{name:>10} {clients:>8} {statistics.median(off):>10.2f} "
                  f"{statistics.median(on):>9.2f} {ratio:>6.3f} {rate:>20.0f}")
    on, off, _ = sampled["blocks_1"]
    print(f"bus: rtt_p50_us={percentile(rtt1, 0.5) * 1e6:.0f} "
          f"rtt_p99_us={percentile(rtt1, 0.99) * 1e6:.0f} "
          f"events_per_s_8_clients={raw['blocks_8'][2]:.0f} "
          f"coll_cost_ratio_on_off={statistics.median(on) / statistics.median(off):.3f}")


if __name__ == "__main__":
    main()
