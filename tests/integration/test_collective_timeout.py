"""A collective that one learner rank never joins fails within ``learner.dist_timeout_s``
instead of hanging the run: two processes join the learner's process group as the learner
does (learner/worker.py's ``join_learner_group``); rank 1 then never takes part in rank 0's
all-reduce. With gloo (CPU) rank 0's all-reduce raises; with NCCL (two GPUs or more) torch's
watchdog ends rank 0's process. Either way rank 0 is done within the timeout plus a margin, and
not before the timeout. NCCL refuses two ranks on one GPU, so its case needs two."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import pytest
import torch

TIMEOUT_S = 4.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(backend: str, rank: int, port: int, out: mp.Queue) -> None:
    import torch.distributed as dist

    from learner.worker import join_learner_group

    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    join_learner_group(backend, rank, 2, "127.0.0.1", port, TIMEOUT_S)
    ones = torch.ones(4, device=device)
    dist.all_reduce(ones)  # both ranks: the group works
    if device != "cpu":
        torch.cuda.synchronize()
    out.put((rank, "joined", time.monotonic()))
    if rank == 1:
        time.sleep(10 * TIMEOUT_S)  # never joins the next all-reduce
        return
    try:
        dist.all_reduce(ones)
        if device != "cpu":
            torch.cuda.synchronize()
        out.put((rank, "returned", time.monotonic()))
    except Exception as e:  # noqa: BLE001 - what the test wants to see
        out.put((rank, f"raised {type(e).__name__}: {e}", time.monotonic()))


@pytest.mark.parametrize("backend", [
    "gloo",
    pytest.param("nccl", marks=pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="NCCL needs two GPUs: it refuses two ranks on one device")),
])
def test_a_collective_a_rank_never_joins_fails_within_the_timeout(backend):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(backend, r, port, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        joined = {}
        while len(joined) < 2:
            rank, what, at = out.get(timeout=120)
            assert what == "joined", what
            joined[rank] = at
        procs[0].join(timeout=TIMEOUT_S + 60)
        assert not procs[0].is_alive(), "rank 0 still waits on a collective past its timeout"
        ended = time.monotonic()
        results = []
        while not out.empty():
            results.append(out.get())
        if backend == "gloo":
            ((rank, what, at),) = results
            assert rank == 0 and what.startswith("raised") and "timed out" in what.lower(), what
            assert at - joined[0] >= TIMEOUT_S * 0.9
        else:  # the watchdog tore the process down (a non-zero exit), or the wait raised
            assert not any(w == "returned" for _, w, _ in results)
            assert procs[0].exitcode != 0 or any(w.startswith("raised") for _, w, _ in results)
            assert ended - joined[0] >= TIMEOUT_S * 0.9
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
