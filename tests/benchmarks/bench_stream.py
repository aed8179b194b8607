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
- Ours with transport/_wire.c replaced by msgspec and numpy (the fallbacks), both ends.
- The floor of a checked receiver: a raw DEALER into a ROUTER that runs only msgspec's typed
  decode of each payload (types, unknown and missing fields; none of the checks after it).
- ``--stages`` instead: our receiver fed by a raw DEALER, cut after each stage of what it does
  with a payload (``STAGES``), and the CPU of its main thread a message against raw's.
- ``--paired`` instead: raw, ours, and a raw sender into our receiver in one pair of processes,
  taking turns in blocks of a fraction of a second, and the median of each round's ratios
  (``paired``): the comparison least moved by the machine's drift.

Both processes of every run use the stream's allocator settings (transport/heap.py
``keep_freed``, as the learner and the actors do), raw's too; ``--glibc-defaults`` runs all
without them. Our receiver returns at most ``--poll-max`` trajectories a poll (its default, 64).

Each is run ``--trials`` times, interleaved, and the medians are compared (a trial of 0.1 s
moved by +-0.1 with the machine's scheduling, hence ``--messages``' 0.4 s): the ratio of
messages/s is the figure that matters (aim: 0.9 or better). With both cores busy it follows the
ratio of CPU time a message (both processes, every thread), which is also reported: in all, and
split into each process's main thread and the I/O threads (ZeroMQ's, which copy to and from
the kernel).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from functools import partial

import psutil
import zmq

from tests.benchmarks.report import report
from tests.unit.transport.trajectories import make_trajectory
from transport import heap, stream, wire
from transport.schema import _DECODER
from transport.stream import TrajectoryReceiver, TrajectorySender


def _trajectories(length: int):
    return [make_trajectory(0, e, length=length, turns=4, seed=e) for e in range(8)]


def _ours_actor(address: str, length: int, n: int, received, keep_freed: bool = True) -> None:
    if keep_freed:
        heap.keep_freed()
    tx = TrajectorySender(address, actor_id=0)
    trajectories = _trajectories(length)
    for e in range(n):
        tx.send(trajectories[e % 8], timeout_s=60)
    received.wait(120)  # a multiprocessing child ends with os._exit: stay until delivered
    tx.close()


def _ours_actor_fallbacks(address: str, length: int, n: int, received,
                          keep_freed: bool = True) -> None:
    wire._wire = None  # this process encodes through msgspec and numpy
    _ours_actor(address, length, n, received, keep_freed)


def _raw_actor(address: str, length: int, n: int, received, keep_freed: bool = True) -> None:
    if keep_freed:
        heap.keep_freed()
    payloads = [t.to_bytes() for t in _trajectories(length)]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(address)
    for e in range(n):
        sock.send_multipart([b"TRAJ", payloads[e % 8]])
    received.wait(120)
    sock.close()


class _OurEnd:
    """The learner's end: our receiver; a message counts once decoded, checked and released."""

    poll_max = 64  # the receiver's default; --poll-max sets it

    def __init__(self, *, fallbacks: bool = False) -> None:
        self.rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=32 << 20)
        self.address = self.rx.address
        self.compiled = wire._wire
        if fallbacks:
            wire._wire = None  # checks in numpy until close

    def receive(self) -> int:
        items = self.rx.poll(1.0, max_messages=self.poll_max)
        for actor, _, size in items:
            self.rx.release(actor, size)
        return len(items)

    def close(self) -> None:
        wire._wire = self.compiled
        self.rx.close()


class _RawEnd:
    """The learner's end: a plain ROUTER; it grants an unbounded window to a HELLO (our sender
    asks for one), so every other message counts."""

    def __init__(self, *, copy: bool = True) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.RCVTIMEO, 120_000)
        self.address = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.copy = copy

    def receive(self) -> int:
        frames = self.sock.recv_multipart(copy=self.copy)
        if len(frames) == 2 and bytes(frames[1]) == b"HELLO":
            self.sock.send_multipart([frames[0], b"WINDOW", (1 << 40).to_bytes(8, "little")])
            return 0
        return 1

    def close(self) -> None:
        self.sock.close()


class _DecodeOnlyEnd(_RawEnd):
    """A zero-copy ROUTER that decodes each payload against the wire schema and checks nothing
    else (the receiver's least possible work)."""

    def __init__(self) -> None:
        super().__init__(copy=False)

    def receive(self) -> int:
        frames = self.sock.recv_multipart(copy=False)
        if len(frames) != 3:
            raise RuntimeError("a raw DEALER sends [TRAJ, payload]")
        _DECODER.decode(frames[2].buffer)
        return 1


def _received(payload, actor, max_bytes):
    return payload


def _decoded(payload, actor, max_bytes):
    return _DECODER.decode(payload)


def _columns_kept(payload, actor, max_bytes):
    msg = _DECODER.decode(payload)
    return msg, wire.columns(msg.flags, msg.token_ids, msg.behaviour_logprobs, msg.policy_version,
                             msg.turn_rewards)


def _checked(payload, actor, max_bytes):
    return _columns_kept(payload, actor, max_bytes)[0]  # the arrays are dropped at once


STAGES = [  # what the receiver does with a payload, cumulatively; each result is kept
    ("the receive loop only", _received),
    ("+ typed decode", _decoded),
    ("+ every check and the arrays (wire.columns), dropped", _checked),
    ("+ the arrays kept", _columns_kept),
    ("+ the Trajectory (from_bytes)", stream.decode_trajectory),
]


class _StagedEnd(_OurEnd):
    """Our receiver fed by a raw sender, running ``decode`` in place of decode_trajectory."""

    def __init__(self, decode) -> None:
        super().__init__()
        self.decode, stream.decode_trajectory = stream.decode_trajectory, decode

    def close(self) -> None:
        stream.decode_trajectory = self.decode
        super().close()


def stages(length: int, n: int, trials: int, keep_freed: bool = True) -> list[dict]:
    """Where the receiver's main thread spends its time: our receiver fed by a raw sender, with
    decode_trajectory cut after each stage, against raw's receiver in the same run."""
    runs = [("raw", partial(_RawEnd, copy=True))] + [
        (name, partial(_StagedEnd, decode)) for name, decode in STAGES]
    results: dict[str, list[tuple[float, dict[str, float]]]] = {name: [] for name, _ in runs}
    for _ in range(trials):
        for name, end in runs:
            results[name].append(run(_raw_actor, end(), length, n, keep_freed))
    raw = statistics.median(rate for rate, _ in results["raw"])
    return [{
        "tokens": length, "receiver does": name,
        "msg/s / raw": f"{statistics.median(rate for rate, _ in r) / raw:.2f}",
        "receiver main thread, us a message":
            f"{_median_cpu([cpu for _, cpu in r], 'receiver main'):.1f}",
    } for name, r in results.items()]


PAIRED_ARMS = ("raw, copying", "raw, zero-copy", "ours", "our receiver")
"""``--paired``'s arms: raw's two receives, our sender into our receiver, raw's into ours."""


def _paired_actor(raw_address: str, our_address: str, length: int, commands,
                  keep_freed: bool = True) -> None:
    """Sends a block of trajectories on the arm each command names, until a None."""
    if keep_freed:
        heap.keep_freed()
    trajectories = _trajectories(length)
    payloads = [t.to_bytes() for t in trajectories]
    context = zmq.Context.instance()
    raw, into_ours = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    raw.connect(raw_address)
    into_ours.connect(our_address)
    tx = TrajectorySender(our_address, actor_id=0)
    while (command := commands.recv()) is not None:
        arm, n = command
        for e in range(n):
            if arm == "ours":
                tx.send(trajectories[e % 8], timeout_s=60)
            else:  # raw's bytes, into raw's receiver or into ours
                (into_ours if arm == "our receiver" else raw).send_multipart(
                    [b"TRAJ", payloads[e % 8]])
    for sock in (raw, into_ours):
        sock.close()
    tx.close()


def paired(length: int, block: int, rounds: int, keep_freed: bool = True) -> dict:
    """Every arm in one pair of processes, a block of ``block`` messages each in turn (the order
    rotating), ``rounds`` times: each round's ratios compare blocks run within a fraction of a
    second of each other, so the machine's drift, which moves separate trials by +-0.1, mostly
    cancels. Each block's clock starts at its first message (or batch) and stops at its last."""
    raw = _RawEnd(copy=True)
    raw.sock.setsockopt(zmq.RCVTIMEO, 1000)  # as ours waits: a second, then a look at the sender
    ours = _OurEnd()
    ctx = mp.get_context("spawn")
    commands, theirs = ctx.Pipe()
    proc = ctx.Process(target=_paired_actor,
                       args=(raw.address, ours.address, length, theirs, keep_freed))
    proc.start()
    rates: dict[str, list[float]] = {arm: [] for arm in PAIRED_ARMS}
    try:
        for r in range(rounds + 1):  # round 0 warms up: connections, credit, caches
            for arm in PAIRED_ARMS[r % 4:] + PAIRED_ARMS[:r % 4]:
                raw.copy = arm == "raw, copying"
                end = ours if arm in ("ours", "our receiver") else raw
                commands.send((arm, block))
                t0, counted = _timed_receive(end, block, proc)
                if r:
                    rates[arm].append(counted / (time.perf_counter() - t0))
        commands.send(None)
        proc.join(60)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        raw.close()
        ours.close()
    out = {"tokens": length, "rounds x block": f"{rounds} x {block}"}
    fastest, summary = paired_ratios(rates)
    out["raw msg/s (faster)"] = f"{statistics.median(rates[fastest]):,.0f}"
    for arm, (median, low, high) in summary.items():
        out[f"{arm} / raw, median of rounds"] = f"**{median:.2f}**"
        out[f"{arm} / raw, middle half"] = f"{low:.2f}-{high:.2f}"
    return out


def paired_ratios(rates: dict[str, list[float]]) -> tuple[str, dict[str, tuple[float, ...]]]:
    """The faster raw arm by median, and for each of ours the median of its round-by-round
    ratios to that arm with their quartiles (the middle half of the rounds lies between)."""
    fastest = max(PAIRED_ARMS[:2], key=lambda arm: statistics.median(rates[arm]))
    summary = {}
    for arm in PAIRED_ARMS[2:]:
        each = [o / b for o, b in zip(rates[arm], rates[fastest], strict=True)]
        low, _, high = statistics.quantiles(each, n=4, method="inclusive")
        summary[arm] = (statistics.median(each), low, high)
    return fastest, summary


def run(actor, end, length: int, n: int, keep_freed: bool = True) -> tuple[float, dict[str, float]]:
    """Messages/s of ``n`` trajectories from ``actor`` (a process) into ``end``, and the CPU
    microseconds a message of each process's main thread and of their other threads (ZeroMQ's
    I/O threads); the first message (or batch) starts both."""
    ctx = mp.get_context("spawn")
    received = ctx.Event()
    proc = ctx.Process(target=actor, args=(end.address, length, n, received, keep_freed))
    proc.start()
    try:
        sender, receiver = psutil.Process(proc.pid), psutil.Process()
        cpu0: dict[str, float] = {}
        t0, counted = _timed_receive(end, n, proc,
                                     on_start=lambda: cpu0.update(_cpu(sender, receiver)))
        dt = time.perf_counter() - t0
        cpu = _cpu(sender, receiver)  # the sender waits for `received`: alive
    finally:
        received.set()
        proc.join()
        end.close()
    return counted / dt, {k: (cpu[k] - cpu0[k]) / counted * 1e6 for k in cpu}


def _timed_receive(end, n: int, sender, on_start=lambda: None,
                   timeout_s: float = 120.0) -> tuple[float, int]:
    """Receive ``n`` messages at ``end``. The clock starts once the first message (or batch) is
    in, which is not counted, and ``on_start`` runs then: (the clock's start, the messages
    counted). RuntimeError when the ``sender`` process dies, or ``timeout_s`` passes, first."""
    got, t0, before = 0, None, 0
    deadline = time.monotonic() + timeout_s
    while got < n:
        try:
            k = end.receive()
        except zmq.Again:  # raw's receive timed out
            k = 0
        if k and t0 is None:
            t0, before = time.perf_counter(), k
            on_start()
        elif not k and (not sender.is_alive() or time.monotonic() > deadline):
            why = "in time" if sender.is_alive() else f"before the sender died ({sender.exitcode})"
            raise RuntimeError(f"received {got} of {n} trajectories {why}")
        got += k
    return t0, n - before


def _cpu(sender: psutil.Process, receiver: psutil.Process) -> dict[str, float]:
    """CPU seconds so far: each process's main thread, and the rest of both."""
    out = {"sender main": 0.0, "receiver main": 0.0, "I/O": 0.0}
    for name, process in (("sender main", sender), ("receiver main", receiver)):
        for thread in process.threads():
            part = name if thread.id == process.pid else "I/O"
            out[part] += thread.user_time + thread.system_time
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=16000,
                        help="2k-token messages a trial (a quarter as many at 16k): about 0.4 s")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", help="also save the rows here")
    parser.add_argument("--stages", action="store_true",
                        help="only where the receiver's time goes, stage by stage")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="both ends without the stream's allocator settings (keep_freed)")
    parser.add_argument("--poll-max", type=int, default=_OurEnd.poll_max,
                        help="the most trajectories our receiver returns a poll")
    parser.add_argument("--paired", action="store_true",
                        help="only ours against raw in blocks that take turns in one run")
    parser.add_argument("--rounds", type=int, default=120, help="--paired: rounds of blocks")
    parser.add_argument("--block", type=int, default=2000,
                        help="--paired: 2k-token messages a block (a quarter as many at 16k)")
    args = parser.parse_args()
    _OurEnd.poll_max = args.poll_max
    keep_freed = not args.glibc_defaults
    if keep_freed:
        heap.keep_freed()
    if args.paired:
        report([paired(length, args.block if length == 2048 else args.block // 4, args.rounds,
                       keep_freed) for length in (2048, 16384)], args.json)
        return
    if args.stages:
        report([row for length in (2048, 16384) for row in stages(
            length, args.messages if length == 2048 else args.messages // 4, args.trials,
            keep_freed)], args.json)
        return
    rows = []
    for length in (2048, 16384):
        n = args.messages if length == 2048 else args.messages // 4
        runs = [  # (name, actor, end), each end made when its run starts
            ("raw, copying", _raw_actor, partial(_RawEnd, copy=True)),
            ("raw, zero-copy", _raw_actor, partial(_RawEnd, copy=False)),
            ("ours", _ours_actor, _OurEnd),
            ("our sender", _ours_actor, _RawEnd),
            ("our receiver", _raw_actor, _OurEnd),
            ("decode only", _raw_actor, _DecodeOnlyEnd),
        ] + ([("ours, fallbacks", _ours_actor_fallbacks, partial(_OurEnd, fallbacks=True))]
             if wire.COMPILED else [])
        rates: dict[str, list[float]] = {name: [] for name, _, _ in runs}
        cpu_us: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in runs}
        for _ in range(args.trials):
            for name, actor, end in runs:
                rate, cpu = run(actor, end(), length, n, keep_freed)
                rates[name].append(rate)
                cpu_us[name].append(cpu)
        median = {k: statistics.median(v) for k, v in rates.items()}
        fastest = max(("raw, copying", "raw, zero-copy"), key=median.get)
        raw = median[fastest]
        size = len(_trajectories(length)[0].to_bytes())
        rows.append({
            "tokens": length, "message": f"{size / 1024:.0f} KiB",
            "raw msg/s, copying": f"{median['raw, copying']:,.0f}",
            "raw msg/s, zero-copy": f"{median['raw, zero-copy']:,.0f}",
            "ours msg/s": f"{median['ours']:,.0f}",
            "ours MB/s": f"{median['ours'] * size / 1e6:,.0f}",
            "ours / raw (faster)": f"{median['ours'] / raw:.2f}",
            "ours without _wire.c / raw": (f"{median['ours, fallbacks'] / raw:.2f}"
                                           if wire.COMPILED else "(not built)"),
            "our sender alone / raw": f"{median['our sender'] / raw:.2f}",
            "our receiver alone / raw": f"{median['our receiver'] / raw:.2f}",
            "typed decode alone / raw": f"{median['decode only'] / raw:.2f}",
            "CPU us a message, raw / ours": " ".join(
                f"{part}: {_median_cpu(cpu_us[fastest], part):.0f} / "
                f"{_median_cpu(cpu_us['ours'], part):.0f}"
                for part in ("all", "sender main", "receiver main", "I/O")),
            "ours / raw, each trial": " ".join(
                f"{o / max(c, z):.2f}" for o, c, z in
                zip(rates["ours"], rates["raw, copying"], rates["raw, zero-copy"])),
        })
    report(rows, args.json)


def _median_cpu(trials: list[dict[str, float]], part: str) -> float:
    return statistics.median(sum(t.values()) if part == "all" else t[part] for t in trials)


if __name__ == "__main__":
    main()
