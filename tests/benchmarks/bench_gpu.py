"""The learner on a GPU: its train step in bf16 (FSDP2 over NCCL, one rank) on a randomly
initialised model of about 0.5B parameters (Qwen2.5-0.5B's shape), and the bucketed weight
publish from GPU memory.

Needs only torch and transformers (no vLLM, no Ray, no network), so it runs on a bare GPU
machine in a few minutes: ``python -m tests.benchmarks.bench_gpu --out DIR``. It prints and
writes ``DIR/bench_gpu.json``:

- train: tokens per second of ``Trainer.train_step`` (GRPO: a forward for the proximal
  log-probs, then forward and backward in micro-batches, one AdamW step) and the model FLOPs
  utilisation against the card's dense bf16 peak, counting 2N + 4 l d L FLOPs per token for a
  forward and 6N + 12 l d L for a forward and backward (N parameters, l layers, width d,
  sequence length L; PaLM's accounting, no recomputation counted);
- publish: ``weights_for_publish`` (each tensor gathered from its FSDP shard when reached)
  into ``WeightPublisher.publish`` with NCCL: with two or more GPUs a subscriber process on the
  second receives into its GPU memory and checks every tensor against the learner's; with one
  GPU the group holds the publisher alone (NCCL's broadcast to itself) and the buckets are
  unpacked on the device and compared with the state they came from; ``--shared-gpu`` puts a
  subscriber process on that one GPU instead (NCCL between two processes on one device: where
  NCCL refuses, ``receiver_error`` says how). Reports GB/s, the bucket count, and the GPU memory
  the publish took beyond the model (peak allocated minus before), against the bucket size.

``--device cpu --size tiny`` runs the same code with gloo on the CPU (a subscriber process
included): the check that the script works before a GPU is at hand.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

SIZES = {  # Qwen2.5-0.5B's shape (494M parameters), and a tiny one for the CPU check
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
}
PEAK_BF16_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4, "A100": 312.0}


def build_model(path: Path, size: str) -> dict:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**SIZES[size], max_position_embeddings=4096, tie_word_embeddings=True,
                         rope_theta=1e6, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    return {"params": sum(p.numel() for p in model.parameters()), "layers": config.num_hidden_layers,
            "width": config.hidden_size, "vocab": config.vocab_size}


def trajectories(n: int, length: int, prompt: int, vocab: int, seed: int = 0):
    """GRPO groups of 8 with a ``prompt``-token prompt and one answer to the end (one turn)."""
    from transport.schema import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        mask = np.arange(length) >= prompt
        turn_end = np.zeros(length, bool)
        turn_end[-1] = True
        out.append(Trajectory(
            run_id="bench", actor_id=0, episode_id=i, env_name="bench", seed=i, group_id=i // 8,
            token_ids=rng.integers(1, vocab, length).astype(np.int32), loss_mask=mask,
            turn_end=turn_end, behaviour_logprobs=np.where(mask, -2.0, 0.0).astype(np.float32),
            policy_version=np.where(mask, 0, -1).astype(np.int32),
            turn_rewards=rng.normal(size=1).astype(np.float32)))
    return out


def bench_train(trainer, model: dict, args, device: torch.device) -> dict:
    batch = trajectories(args.batch, args.seq, args.seq // 4, model["vocab"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    trainer.train_step(batch, version=0)  # warm-up: allocations, kernels chosen
    sync()
    t0 = time.perf_counter()
    for step in range(args.steps):
        metrics = trainer.train_step(batch, version=step + 1)
    sync()
    step_s = (time.perf_counter() - t0) / args.steps
    tokens = args.batch * args.seq
    n, layers, d, L = model["params"], model["layers"], model["width"], args.seq
    flops = tokens * ((2 * n + 4 * layers * d * L) + (6 * n + 12 * layers * d * L))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    out = {"device": name, "step_s": step_s, "tokens_per_s": tokens / step_s,
           "tflops_per_s": flops / step_s / 1e12, "tokens_per_step": tokens,
           "micro_batch_size": args.micro_batch, "entropy": metrics.get("policy/entropy"),
           "prepare_s": metrics.get("timing/prepare_s")}
    out["mfu"] = out["tflops_per_s"] / peak if peak else None
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def _subscriber(port: int, device: str, rounds: int, results) -> None:
    """The second GPU's (or the CPU's) end: receive ``rounds`` publishes, checksum each tensor."""
    from transport.weights import WeightSubscriber

    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        sub = WeightSubscriber("127.0.0.1", port, 1, timeout_s=120)
        for _ in range(rounds):
            version, named = sub.receive()
            sums = {name: float(t.double().sum()) for name, t in named}
            results.put((version, sums, device))
        sub.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put(("error", repr(e), None))


def bench_publish(trainer, bucket_mb: float, device: torch.device, loopback: bool = False,
                  shared_gpu: bool = False) -> dict:
    from transport.packing import Layout
    from transport.weights import WeightPublisher, WeightSyncError

    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    two = not loopback and (device.type == "cpu" or gpus >= 2 or shared_gpu)
    receiver = "cpu" if device.type == "cpu" else ("cuda:1" if gpus >= 2 else "cuda:0")
    backend = "nccl" if device.type == "cuda" else "gloo"
    bucket = int(bucket_mb * 2**20)
    publisher = WeightPublisher("127.0.0.1", 0, 2 if two else 1, backend=backend,
                                timeout_s=120, bucket_bytes=bucket)
    proc, results, rounds = None, None, 3
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        if two:
            ctx = mp.get_context("spawn")
            results = ctx.Queue()
            proc = ctx.Process(target=_subscriber, daemon=True, args=(
                publisher.port, receiver, rounds, results))
            proc.start()
        times, extra = [], []
        for version in range(1, rounds + 1):
            sync()
            before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            specs, tensors = trainer.weights_for_publish()
            try:
                publisher.publish(tensors, version, specs=specs)
            except WeightSyncError as e:  # reported, not raised: the figure is that it failed
                return {"receiver": receiver, "exact": False, "receiver_error": str(e)}
            sync()
            times.append(time.perf_counter() - t0)
            if device.type == "cuda":
                extra.append(torch.cuda.max_memory_allocated(device) - before)
        state = {n: t.detach() for n, t in trainer.weights_for_publish()[1]}
        layout = Layout.build([(n, str(t.dtype).removeprefix("torch."), t.shape)
                               for n, t in state.items()], bucket)
        nbytes = layout.nbytes
        out = {"model_bytes": nbytes, "bucket_bytes": bucket, "buckets": len(layout.buckets),
               "largest_bucket_bytes": layout.largest_bucket_bytes,
               "publish_s": min(times), "gb_per_s": nbytes / min(times) / 1e9,
               "publisher_peak_buffer_bytes": publisher.peak_buffer_bytes}
        if extra:
            out["gpu_bytes_beyond_model"] = max(extra)
        if two:
            got = [results.get(timeout=300) for _ in range(rounds)]
            if got[0][0] == "error":  # reported, not raised: the figure is that it failed
                return out | {"receiver": receiver, "exact": False, "receiver_error": got[0][1]}
            want = {n: float(t.double().sum()) for n, t in state.items()}
            out["receiver"] = got[-1][2]
            out["exact"] = [v for v, _, _ in got] == list(range(1, rounds + 1)) and got[-1][1] == want
        else:  # one GPU: the buckets made on the device give back exactly the state
            buffers = layout.pack_all(list(state.values()), device)
            views = dict(v for b, buf in zip(layout.buckets, buffers) for v in b.unpack(buf))
            out["receiver"] = "none: a group of the publisher alone, buckets unpacked on its device"
            out["exact"] = all(torch.equal(views[n], t) for n, t in state.items())
        return out
    finally:
        publisher.close()
        if proc is not None:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--size", default="0.5b", choices=sorted(SIZES))
    p.add_argument("--batch", type=int, default=64, help="trajectories per train step")
    p.add_argument("--seq", type=int, default=1024, help="tokens per trajectory")
    p.add_argument("--micro-batch", type=int, default=8, help="rows per forward/backward")
    p.add_argument("--steps", type=int, default=3, help="timed train steps (after one warm-up)")
    p.add_argument("--bucket-mb", type=float, nargs="+", default=[256, 32],
                   help="bucket sizes to publish with, MiB")
    p.add_argument("--critic-check", action="store_true",
                   help="also one step of bi-level GAE (policy, critic and value head)")
    p.add_argument("--loopback", action="store_true",
                   help="no subscriber process, as on a machine of one GPU")
    p.add_argument("--shared-gpu", action="store_true",
                   help="with one GPU, run the subscriber process on that GPU too (NCCL between two "
                        "processes on one device)")
    p.add_argument("--skip-train", action="store_true", help="only the publishes")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    from learner.config import TrainerConfig
    from learner.trainer import Trainer

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=300))
    report: dict = {"torch": torch.__version__, "argv": vars(args) | {"out": str(args.out)}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            model = build_model(Path(tmp), args.size)
            report["model"] = model | {"build_s": time.perf_counter() - t0}
            cfg = TrainerConfig(model_path=tmp, estimator="grpo", lr=1e-6,
                                param_dtype="bfloat16" if device.type == "cuda" else "float32",
                                micro_batch_size=args.micro_batch)
            trainer = Trainer(cfg, device=device)
        if not args.skip_train:
            report["train"] = bench_train(trainer, model, args, device)
            print(json.dumps({"train": report["train"]}), flush=True)
        if args.critic_check:  # the critic's path (bi-level GAE) on the device: one step, timed
            del trainer
            with tempfile.TemporaryDirectory() as tmp:
                build_model(Path(tmp), args.size)
                critic = Trainer(TrainerConfig(model_path=tmp, estimator="bi_level_gae", lr=1e-6,
                                               param_dtype=cfg.param_dtype, value_norm=True,
                                               estimator_args=dict(gamma_token=1.0, lam_token=1.0,
                                                                   gamma_turn=0.95, lam_turn=0.95),
                                               micro_batch_size=args.micro_batch), device=device)
            report["critic_check"] = bench_train(critic, model, argparse.Namespace(
                **vars(args) | {"steps": 1}), device)
            print(json.dumps({"critic_check": report["critic_check"]}), flush=True)
            trainer = critic
        report["publish"] = []
        for bucket_mb in args.bucket_mb:
            report["publish"].append(bench_publish(trainer, bucket_mb, device, args.loopback,
                                                   args.shared_gpu))
            print(json.dumps({"publish": report["publish"][-1]}), flush=True)
    finally:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_gpu.json").write_text(json.dumps(report, indent=1))
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
