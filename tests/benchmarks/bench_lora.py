"""LoRA side by side with full fine-tuning: the engine's decoding speed with and without an
adapter, the log-prob drift of merged pushes, and a short run of the real loop each way.

    python -m tests.benchmarks.bench_lora [--model DIR] [--parts engine,drift,learner,loop] [--rank 8]
        [--steps 4] [--set K=V ...] [--json out.json]

- ``engine``: vLLM (in-process, each engine in a fresh child process) decoding 32 answers of 64
  tokens at once, sampled: an engine built without LoRA (the baseline), and an engine built with
  LoRA answering with an adapter of ``--rank`` and without one.
- ``drift``: the engine's log-probs of a fixed text against the learner's (transformers + the
  adapter, float32), for the adapter pushed as it is and for it merged into the weights (what
  ``learner.lora.merge`` pushes), in the engine's float32 and bfloat16.
- ``learner``: two learner steps of GRPO on the same 8 FrozenLake demonstrations (micro-batches of
  4, layers recomputed), each way in a fresh child process: its step time and peak resident
  memory (the process's high-water mark: the model, the optimizer, the step).
- ``loop``: ``launch.run.loop.train`` twice on the same config (GRPO on FrozenLake, no warm
  start, the Ray topology, evaluations of 4 maps before and after): full fine-tuning, then
  ``learner.lora.enabled=true``; per step the push's bytes and seconds, the learner's step, and
  the learner process's peak memory (PSS).

The adapter of ``engine`` and ``drift`` is PEFT's with A and B random (B scaled down so the
model's answers move by about a nat): decoding costs the same whatever its values. Without
``--model`` the tiny model is built (a smoke test: its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from tests.benchmarks.report import report

TEXT = ("You are on a frozen lake. Reach the gift without falling into a hole. The map: S is you, "
        "G the gift, H a hole, F frozen ice. Row 1: S F F F. Row 2: F H F H. Row 3: F F F H. "
        "Row 4: H F F G. Answer with moves. <answer>Down,Down,Right,Right,Down,Right</answer> "
        "The ice holds; you step down twice and right twice, then down and right to the gift.")


def make_adapter(model_dir: str, rank: int, out: Path) -> tuple[Path, Path, list[int], list[float]]:
    """A random adapter of ``rank`` on ``model_dir`` (PEFT), the merged model, the text's token
    ids and their log-probs under the adapted model (float32: the learner's)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learner import lora
    from learner.models import token_logprobs
    from transport import adapters

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    spec = lora.LoraSpec(rank=rank, alpha=2 * rank, init_seed=0)
    lora.inject(model, spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.mul_(0.05)
    tensors = {e.name: e.read().clone() for e in lora.adapter_entries(model)}
    adapter = adapters.write_adapter(out / "adapter", lora.peft_config(spec, model, model_dir), tensors)
    merged = {e.name: e.read().clone() for e in lora.merged_entries(model, spec)}
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base.load_state_dict(merged, strict=False)
    base.save_pretrained(out / "merged")
    from learner.checkpoint import copy_model_files

    copy_model_files(model_dir, out / "merged")
    ids = AutoTokenizer.from_pretrained(model_dir)(TEXT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = token_logprobs(model, torch.tensor([ids]), 1.0)[0][0, 1:].tolist()
    return adapter, out / "merged", ids, logp


def engine_case(queue, model_dir: str, lora_rank: int, dtype: str, adapter: str | None,
                ids: list[int], answers: int, tokens: int) -> None:
    """In a child process: an in-process engine; the text's log-probs (with the adapter if given)
    and, with ``answers``, decoding speed with and without the adapter."""
    import asyncio

    from vllm.lora.request import LoRARequest

    from actors.config import ActorConfig
    from actors.engine import build_engine, sampling_params

    slots = max(answers, 1)  # the engine's max_num_seqs
    engine = build_engine(ActorConfig.from_dict({
        "model_path": model_dir, "engine": "in_process", "dtype": dtype, "kv_cache_bytes": 512 << 20,
        "max_context": 512, "lora_rank": lora_rank, "env_pool": {"envs_per_worker": slots},
        "concurrency": slots}), vision=False)
    request = LoRARequest("bench", 1, adapter) if adapter else None

    async def generate(prompt, params, rid, lora):
        final = None
        async for out in engine.generate(prompt, params, rid, **({"lora_request": lora} if lora else {})):
            final = out
        return final

    async def measure() -> dict:
        out = {}
        if request is not None:
            await engine.collective_rpc("add_lora", args=(request,))
        scored = await generate({"prompt_token_ids": ids}, sampling_params(
            max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False), "score", request)
        out["logprobs"] = [d[t].logprob for d, t in zip(scored.prompt_logprobs[1:], ids[1:])]
        for label, lora in (("base", None), ("adapter", request)) if answers else ():
            if label == "adapter" and lora is None:
                continue
            params = sampling_params(max_tokens=tokens, temperature=1.0, ignore_eos=True, detokenize=False)
            for warm in (True, False):
                t0 = time.perf_counter()
                done = await asyncio.gather(*(generate({"prompt_token_ids": ids[:32]}, params,
                                                       f"{label}-{warm}-{i}", lora) for i in range(answers)))
                if not warm:
                    n = sum(len(d.outputs[0].token_ids) for d in done)
                    out[f"tokens_per_s_{label}"] = n / (time.perf_counter() - t0)
        return out

    try:
        queue.put(asyncio.run(measure()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put({"error": f"{type(e).__name__}: {e}"})
    finally:
        engine.shutdown()


def learner_case(queue, model_dir: str, lora_rank: int) -> None:
    """In a child process: a learner (one rank) with or without LoRA, two steps on 8
    demonstrations; its step times and peak resident memory."""
    import resource
    import socket

    import torch.distributed as dist

    from launch.config.compose import compose
    from learner.config import TrainerConfig
    from learner.trainer import Trainer
    from tests.benchmarks.bench_learner import _batch

    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        trajectories = _batch(compose([]), Path(model_dir), 8)
        for i, t in enumerate(trajectories):  # rewards that move the policy: half the group wins
            t.turn_rewards[:] = float(i % 2)
        trainer = Trainer(TrainerConfig(
            model_path=model_dir, estimator="grpo", lr=1e-4, micro_batch_size=4, activation_checkpointing=True,
            lora={"rank": lora_rank, "alpha": 2 * lora_rank} if lora_rank else None))
        times = []
        for step in range(2):
            t0 = time.perf_counter()
            trainer.train_step(trajectories, step)
            times.append(time.perf_counter() - t0)
        queue.put({"step_s": times[-1], "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20})
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put({"error": f"{type(e).__name__}: {e}"})


def learner_part(model_dir: str, rank: int) -> list[dict]:
    full, lora = (in_child(model_dir, r, target=learner_case) for r in (0, rank))
    return [{"learner": "full fine-tuning", "step s": full["step_s"], "peak GiB": full["peak_gib"],
             "step vs full": 1.0, "memory vs full": 1.0},
            {"learner": f"LoRA (rank {rank})", "step s": lora["step_s"], "peak GiB": lora["peak_gib"],
             "step vs full": lora["step_s"] / full["step_s"], "memory vs full": lora["peak_gib"] / full["peak_gib"]}]


def in_child(*args, target=engine_case) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(queue, *args))
    proc.start()
    try:
        result = queue.get(timeout=900)
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def engine_part(model_dir: str, adapter: Path, ids: list[int], rank: int) -> list[dict]:
    plain = in_child(model_dir, 0, "float32", None, ids, 32, 64)
    with_lora = in_child(model_dir, rank, "float32", str(adapter), ids, 32, 64)
    base = plain["tokens_per_s_base"]
    return [{"engine": "built without LoRA", "answers": "base weights", "tokens/s": base, "ratio": 1.0},
            {"engine": f"built with LoRA (max rank {rank})", "answers": "base weights",
             "tokens/s": with_lora["tokens_per_s_base"], "ratio": with_lora["tokens_per_s_base"] / base},
            {"engine": f"built with LoRA (max rank {rank})", "answers": f"adapter of rank {rank}",
             "tokens/s": with_lora["tokens_per_s_adapter"], "ratio": with_lora["tokens_per_s_adapter"] / base}]


def drift_part(model_dir: str, adapter: Path, merged: Path, ids: list[int], learner: list[float],
               rank: int) -> list[dict]:
    rows = []
    for dtype in ("float32", "bfloat16"):
        for push, args in (("adapter", (model_dir, rank, dtype, str(adapter))),
                           ("merged", (str(merged), 0, dtype, None))):
            got = in_child(*args, ids, 0, 0)["logprobs"]
            gaps = [abs(a - b) for a, b in zip(got, learner, strict=True)]
            rows.append({"engine dtype": dtype, "push": push, "tokens": len(gaps),
                         "mean gap (nats)": sum(gaps) / len(gaps), "max gap (nats)": max(gaps)})
    return rows


def loop_part(model_dir: str | None, steps: int, extra: list[str]) -> list[dict]:
    from launch.config.compose import compose
    from launch.run.loop import train
    from launch.run.metrics import read_records

    base = ["algorithm=grpo", "algorithm.kl_in_reward=null", "warm_start.enabled=false",
            f"train.steps={steps}", "train.batch_size=16", "train.eval_every=0", "train.eval_seeds=4",
            "train.baselines=false",
            "train.held_out_check=0", "train.checkpoint_every=0", "actors.group_size=8",
            "actors.max_tokens=24", "logger.wandb=false", *extra]
    if model_dir:
        base.append(f"model.path={model_dir}")
    rows = []
    for label, more in (("full fine-tuning", []), ("LoRA", ["learner.lora.enabled=true"])):
        with tempfile.TemporaryDirectory() as d:
            summary = train(compose([*base, *more]), Path(d))
            records = [r for r in read_records(Path(d)) if r["kind"] == "train"]
        later = records[1:] or records
        rows.append({"run": label, "push MB": records[-1]["weights/bytes"] / 1e6,
                     "push s": _mean(later, "weights/push_s"), "learner step s": _mean(later, "timing/step_s"),
                     "learner peak GiB": summary.get("memory", {}).get("memory/peak_LearnerWorker_gib")})
    full = rows[0]
    for row in rows:  # the learner's own process only with Ray (topology=local has one process)
        row["push vs full"] = row["push s"] / full["push s"]
        row["memory vs full"] = (row["learner peak GiB"] / full["learner peak GiB"]
                                 if full["learner peak GiB"] else None)
    return rows


def _rounded(rows: list[dict]) -> list[dict]:
    return [{k: float(f"{v:.3g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_lora", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a model directory (model=smollm2_135m's converted one); default: the tiny model")
    p.add_argument("--parts", default="engine,drift,learner,loop")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides of the loop runs")
    p.add_argument("--json")
    args = p.parse_args()
    parts = args.parts.split(",")
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        model_dir = args.model
        if model_dir is None:
            from launch.model.tiny_model import build_tiny_model

            model_dir = str(build_tiny_model(Path(d) / "tiny"))
        if {"engine", "drift"} & set(parts):
            adapter, merged, ids, learner = make_adapter(model_dir, args.rank, Path(d))
        if "engine" in parts:
            out["engine"] = _rounded(engine_part(model_dir, adapter, ids, args.rank))
            print("\nDecoding 32 answers of 64 tokens at once (tokens/s; ratio to the engine without LoRA)")
            report(out["engine"])
        if "drift" in parts:
            out["drift"] = _rounded(drift_part(model_dir, adapter, merged, ids, learner, args.rank))
            print("\nThe engine's log-probs of a fixed text against the learner's (float32, with the adapter)")
            report(out["drift"])
        if "learner" in parts:
            out["learner"] = _rounded(learner_part(model_dir, args.rank))
            print("\nTwo learner steps on the same 8 demonstrations, each way in a fresh process")
            report(out["learner"])
        if "loop" in parts:
            out["loop"] = _rounded(loop_part(args.model, args.steps, args.set))
            print(f"\nThe loop, {args.steps} steps each way (means over the steps after the first)")
            report(out["loop"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
