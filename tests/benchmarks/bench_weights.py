"""Benchmark: the weight broadcast (transport/weights.py) against an in-place memcpy, and the
memory a publish takes beyond the model, by bucket size.

Run with `python -m tests.benchmarks.bench_weights`. One publisher in this process, real gloo
on loopback, for 10M and 100M parameters in fp32 and bf16 (1M-parameter tensors) and buckets of
4 MiB, 32 MiB, 256 MiB and unbounded (the whole model in one bucket per dtype). For each, fresh
subscriber processes (1 and 2) receive a few publishes, reading each tensor and dropping it as
vLLM's loader does. Reported: the publish time (best of a few: the tensors read one at a time,
packed into buckets and broadcast), its payload rate in GB/s and the ratio to ``dst.copy_(src)``
of the same bytes in the same run; the publisher's bucket buffers at their peak (counted by the
publisher); and each subscriber's peak resident memory growth while receiving (measured: its
resident high-water mark, reset before the first publish, minus the resident set then), which
the bucket size bounds. Prints a Markdown table; `--json PATH` saves it.

With ``--model PATH`` (e.g. SmolLM2-135M-Instruct's converted directory) the rows are that
model's state instead, as the learner publishes it (a tied embedding table once), at the
default bucket size.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import resource
import time
from pathlib import Path

import torch

from tests.benchmarks.report import report
from transport.weights import WeightPublisher, WeightSubscriber

SIZES = [10_000_000, 100_000_000]
DTYPES = [torch.float32, torch.bfloat16]
BUCKETS_MIB = [4, 32, 256, 0]
SUBSCRIBERS = [1, 2]
TENSOR_NUMEL = 1_000_000
DEFAULT_BUCKET_MIB = 256
"""transport.weight_bucket_mb's default: a real model's rows use it."""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    """This process's resident high-water mark (``VmHWM``; ``ru_maxrss`` would also count the
    parent's resident set at the fork, which Linux carries across the exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _subscriber(port: int, rank: int, world_size: int, count: int, done) -> None:
    torch.set_num_threads(1)
    sub = WeightSubscriber("127.0.0.1", port, rank, world_size, timeout_s=60.0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the resident set now
    before = _rss_bytes()
    done.put(("ready", rank))  # measure nothing while processes still import torch
    for _ in range(count):
        _, named = sub.receive()
        for _name, tensor in named:  # read and drop, as a loader that copies into its model
            del tensor
    done.put(("done", max(0, _peak_rss_bytes() - before)))
    sub.close()


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _publish_to(named, bucket_mib: int, n: int, repeats: int, ctx) -> dict:
    publisher = WeightPublisher("127.0.0.1", 0, n + 1, timeout_s=60.0,
                                bucket_bytes=bucket_mib << 20)
    done = ctx.Queue()
    procs = [ctx.Process(target=_subscriber, daemon=True,
                         args=(publisher.port, r, n + 1, repeats + 1, done)) for r in range(1, n + 1)]
    try:
        for proc in procs:
            proc.start()
        assert all(done.get(timeout=120)[0] == "ready" for _ in procs)
        version = 0

        def publish():
            nonlocal version
            version += 1
            publisher.publish(iter(named), version, specs=specs)

        specs = [(name, str(t.dtype).removeprefix("torch."), t.shape) for name, t in named]
        publish()  # forms the group and sends the layout
        t_pub = _best_of(publish, repeats)
        grown = [done.get(timeout=120)[1] for _ in procs]
        return {"publish_s": t_pub, "buckets": publisher.buckets_sent // (repeats + 1),
                "publisher_MB": publisher.peak_buffer_bytes / 1e6,
                "subscriber_MB": max(grown) / 1e6}
    finally:
        publisher.close()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def synthetic():
    """(label, named tensors, bucket sizes) of each synthetic model: 1M-parameter tensors."""
    for numel in SIZES:
        for dtype in DTYPES:
            named = [(f"layers.{i}.weight", torch.randn(TENSOR_NUMEL).to(dtype))
                     for i in range(numel // TENSOR_NUMEL)]
            yield f"{numel // 1_000_000}M", named, BUCKETS_MIB


def of_model(path: str):
    """A real model's (label, named tensors, [the default bucket]) as the learner publishes it
    (learner/models.py's ``lazy_full_state``: a tied table once)."""
    from transformers import AutoModelForCausalLM

    from learner.models import lazy_full_state

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = model.state_dict()
    _, tensors = lazy_full_state(model)
    named = [(name, t.contiguous()) for name, t in tensors]
    unsent = sum(t.nbytes for t in state.values()) - sum(t.nbytes for _, t in named)
    print(f"{path}: {len(named)} of its {len(state)} state tensors sent; "
          f"{unsent / 1e6:.0f} MB of tied duplicates not sent", flush=True)
    yield f"{sum(t.numel() for _, t in named) / 1e6:.0f}M ({Path(path).name})", named, [DEFAULT_BUCKET_MIB]


def run(repeats: int, models) -> list[dict]:
    ctx = mp.get_context("spawn")
    rows = []
    for label, named, buckets in models:
        nbytes = sum(t.nbytes for _, t in named)
        dtype = named[0][1].dtype
        src, dst = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
        t_copy = _best_of(functools.partial(dst.copy_, src), repeats * 2)
        del src, dst
        for bucket_mib in buckets:
            for n in SUBSCRIBERS:
                got = _publish_to(named, bucket_mib, n, repeats, ctx)
                rows.append({
                    "params": label, "dtype": str(dtype)[6:],
                    "MB": round(nbytes / 1e6), "bucket_MiB": bucket_mib or "whole",
                    "buckets": got["buckets"], "subscribers": n,
                    "publish_ms": round(got["publish_s"] * 1e3, 1),
                    "broadcast_GB/s": round(nbytes / got["publish_s"] / 1e9, 2),
                    "memcpy_GB/s": round(nbytes / t_copy / 1e9, 2),
                    "ratio": f"{t_copy / got['publish_s']:.0%}",
                    "publisher_MB": round(got["publisher_MB"]),
                    "subscriber_MB": round(got["subscriber_MB"]),
                })
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", help="a model directory (model=smollm2_135m's: `python -m "
                        "launch.model.packaged smollm2_135m` prints it) instead of the synthetic sizes")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = run(args.repeats, of_model(args.model) if args.model else synthetic())
    report(rows, args.json)
    print("\nMemory beyond the model: the publisher holds one bucket per dtype (its buffers are "
          "reused); a subscriber about two (it reuses a buffer once nothing holds it, and the "
          "last bucket is still held when the next arrives). Unbounded buckets hold the whole "
          "model on both sides.")


if __name__ == "__main__":
    main()
