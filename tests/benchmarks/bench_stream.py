"""Benchmark: the trajectory stream against raw ZeroMQ sending the same bytes, in the same run.

Run with `make bench` (or `python -m tests.benchmarks.bench_stream`). An actor process sends N
realistic trajectories (2k and 16k tokens, 4 turns); the learner side (this process) receives
them.

- Ours: TrajectorySender (encode, credit) -> TrajectoryReceiver (decode, every schema check) and
  a release of each trajectory as soon as it arrives, which returns the actor's credit.
- Raw: a DEALER sending the already-encoded payloads to a ROUTER that only receives them, with
  copying receives and with zero-copy ones; the faster of the two is the baseline.
- Each end alone: our sender into a raw ROUTER (which grants it one unbounded window), and a raw
  DEALER into our receiver; where the rest of the gap is.

Each is run ``--trials`` times, interleaved, and the medians are compared: the ratio of
messages/s is the figure that matters (aim: 0.9 or better).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import zmq

from tests.benchmarks.report import report
from tests.unit.transport.trajectories import make_trajectory
from transport.stream import TrajectoryReceiver, TrajectorySender


def _trajectories(length: int):
    return [make_trajectory(0, e, length=length, turns=4, seed=e) for e in range(8)]


def _ours_actor(address: str, length: int, n: int, received) -> None:
    tx = TrajectorySender(address, actor_id=0)
    trajectories = _trajectories(length)
    for e in range(n):
        tx.send(trajectories[e % 8], timeout_s=60)
    received.wait(120)  # a multiprocessing child ends with os._exit: stay until delivered
    tx.close()


def _raw_actor(address: str, length: int, n: int, received) -> None:
    payloads = [t.to_bytes() for t in _trajectories(length)]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(address)
    for e in range(n):
        sock.send_multipart([b"TRAJ", payloads[e % 8]])
    received.wait(120)
    sock.close()


def run_ours(length: int, n: int) -> float:
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=32 << 20)
    ctx = mp.get_context("spawn")
    received = ctx.Event()
    proc = ctx.Process(target=_ours_actor, args=(rx.address, length, n, received))
    proc.start()
    got, t0 = 0, None
    deadline = time.monotonic() + 120
    try:
        while got < n and time.monotonic() < deadline:
            for actor, _, size in rx.poll(1.0):
                t0 = t0 or time.perf_counter()
                rx.release(actor, size)
                got += 1
        dt = time.perf_counter() - t0
    finally:
        received.set()
        proc.join()
        rx.close()
    if got < n:
        raise RuntimeError(f"received {got} of {n} trajectories; rejected {dict(rx.rejected)}")
    return (n - 1) / dt  # the first message starts the clock


def run_raw(length: int, n: int, *, copy: bool) -> float:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVTIMEO, 120_000)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    ctx = mp.get_context("spawn")
    received = ctx.Event()
    proc = ctx.Process(target=_raw_actor, args=(f"tcp://127.0.0.1:{port}", length, n, received))
    proc.start()
    got, t0 = 0, None
    try:
        while got < n:
            sock.recv_multipart(copy=copy)
            t0 = t0 or time.perf_counter()
            got += 1
        dt = time.perf_counter() - t0
    finally:
        received.set()
        proc.join()
        sock.close()
    return (n - 1) / dt


def run_sender_only(length: int, n: int) -> float:
    """Our sender (encode, credit) into a raw ROUTER that grants it one unbounded window."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVTIMEO, 120_000)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    ctx = mp.get_context("spawn")
    received = ctx.Event()
    proc = ctx.Process(target=_ours_actor, args=(f"tcp://127.0.0.1:{port}", length, n, received))
    proc.start()
    got, t0 = 0, None
    try:
        while got < n:
            frames = sock.recv_multipart()
            if frames[1] == b"HELLO":
                sock.send_multipart([frames[0], b"WINDOW", (1 << 40).to_bytes(8, "little")])
                continue
            t0 = t0 or time.perf_counter()
            got += 1
        dt = time.perf_counter() - t0
    finally:
        received.set()
        proc.join()
        sock.close()
    return (n - 1) / dt


def run_receiver_only(length: int, n: int) -> float:
    """A raw DEALER sending encoded trajectories into our receiver (decode, checks, release)."""
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=32 << 20)
    ctx = mp.get_context("spawn")
    received = ctx.Event()
    proc = ctx.Process(target=_raw_actor, args=(rx.address, length, n, received))
    proc.start()
    got, t0 = 0, None
    try:
        while got < n:
            for actor, _, size in rx.poll(1.0):
                t0 = t0 or time.perf_counter()
                rx.release(actor, size)
                got += 1
        dt = time.perf_counter() - t0
    finally:
        received.set()
        proc.join()
        rx.close()
    return (n - 1) / dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000, help="2k-token messages a trial")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", help="also save the rows here")
    args = parser.parse_args()
    rows = []
    for length in (2048, 16384):
        n = args.messages if length == 2048 else args.messages // 4
        rates: dict[str, list[float]] = {"raw, copying": [], "raw, zero-copy": [], "ours": [],
                                         "our sender": [], "our receiver": []}
        for _ in range(args.trials):
            rates["raw, copying"].append(run_raw(length, n, copy=True))
            rates["raw, zero-copy"].append(run_raw(length, n, copy=False))
            rates["ours"].append(run_ours(length, n))
            rates["our sender"].append(run_sender_only(length, n))
            rates["our receiver"].append(run_receiver_only(length, n))
        median = {k: statistics.median(v) for k, v in rates.items()}
        raw = max(median["raw, copying"], median["raw, zero-copy"])
        size = len(_trajectories(length)[0].to_bytes())
        rows.append({
            "tokens": length, "message": f"{size / 1024:.0f} KiB",
            "raw msg/s, copying": f"{median['raw, copying']:,.0f}",
            "raw msg/s, zero-copy": f"{median['raw, zero-copy']:,.0f}",
            "ours msg/s": f"{median['ours']:,.0f}",
            "ours MB/s": f"{median['ours'] * size / 1e6:,.0f}",
            "ours / raw (faster)": f"{median['ours'] / raw:.2f}",
            "our sender alone / raw": f"{median['our sender'] / raw:.2f}",
            "our receiver alone / raw": f"{median['our receiver'] / raw:.2f}",
            "ours / raw, each trial": " ".join(
                f"{o / max(c, z):.2f}" for o, c, z in
                zip(rates["ours"], rates["raw, copying"], rates["raw, zero-copy"])),
        })
    report(rows, args.json)


if __name__ == "__main__":
    main()
