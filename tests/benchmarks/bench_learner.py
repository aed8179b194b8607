"""Benchmark: one learner step of the default job's shape, whole mini-batch vs length-sorted
micro-batches, and each against the plain transformers passes over the same tokens.

Run with `make bench` (or `python -m tests.benchmarks.bench_learner`). One process, a gloo group
of one, the tiny model and the default job's algorithm group (``launch.config.compose.compose``: vagen_full,
policy, critic and reference model); the batch is one mini-batch of the default job, 32 FrozenLake
episodes as its warm start's demonstrations write them (configs/train.yaml: its prompt, moves per
turn, mistakes; real token sequences, 1 to 3 turns, so lengths vary as in RL). The baseline is
``micro_batch_size`` 0: every forward as wide as the longest episode. One thread by default, as
the default job's learner has (a core of its own). Prints a Markdown table; `--json PATH` saves
it. ``--model PATH --episodes N``: a real model (SmolLM2-135M-Instruct's converted directory)
and a batch of N episodes instead, tokenised by its own tokenizer.

The plain baseline (``plain_step``) runs, on unwrapped Hugging Face models (no FSDP) and the
exact micro-batch tensors the trainer cut, only the passes a step cannot do without: the
no-grad forwards of the policy (proximal log-probs), the critic (values) and the reference, then
per micro-batch the policy's forward and backward of the sampled tokens' log-probs and the
critic's of its values; the AdamW steps are timed apart. The step over the baseline is the
learner's overhead: FSDP's hooks, the entropy bonus, the losses, the advantages, the metrics.

With ``--breakdown`` a second table splits that overhead at the default micro-batch size: FSDP's
hooks (the torch profiler's ``FSDP::*`` and post-backward events over one step), the entropy
bonus's gradient (the step with ``entropy_coef`` 0 subtracted) and what is left (the losses,
gradient clipping, the advantages, the metrics).
"""

from __future__ import annotations

import argparse
import math
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tests.benchmarks.report import report


def _batch(cfg, model_dir: Path, n: int):
    from transformers import AutoTokenizer

    from actors.demonstrations import make_demonstrations
    from launch.config.builders import env_config

    tok = AutoTokenizer.from_pretrained(model_dir)
    ws = cfg.warm_start
    return make_demonstrations(cfg.env_name, env_config(cfg), tok,
                               range(n), action_noise=ws.action_noise, rng_seed=0,
                               actions_per_turn=ws.actions_per_turn, mistake=ws.mistake,
                               reasoning=ws.reasoning)


def _cuts(trainer, trajectories) -> tuple[list, list]:
    """The token tensors the trainer's step computes on: (prepare chunks, update micro-batches)."""
    from learner.rows import split_rows

    rows = trainer.rows(trajectories)[-1]
    n = rows.batch.token_ids.shape[0]
    prepare = [rows.select(part).batch.token_ids for part in trainer._chunks(n)]
    update = [[rows.select(part).batch.token_ids for part in trainer._chunks(mb.stop - mb.start, mb.start)]
              for mb in split_rows(n, trainer.cfg.num_minibatches)]
    return prepare, update


def plain_step(model_dir: Path, prepare: list, update: list, epochs: int, temperature: float,
               repeats: int, critic: bool, ref: bool) -> tuple[float, float]:
    """(best seconds of the plain passes, best seconds of the AdamW steps) over ``repeats``;
    ``critic`` / ``ref``: the trainer has that model."""
    from transformers import AutoModel, AutoModelForCausalLM

    from learner.models import ValueModel, load_model

    policy = load_model(AutoModelForCausalLM, str(model_dir))
    ref = load_model(AutoModelForCausalLM, str(model_dir)).requires_grad_(False) if ref else None
    critic = ValueModel(load_model(AutoModel, str(model_dir)), seed=0).eval() if critic else None
    optims = [torch.optim.AdamW(m.parameters(), lr=1e-6) for m in (policy, critic) if m is not None]

    def logp(model, ids):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float() / temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])

    def passes() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            for ids in prepare:
                logp(policy, ids)
                if critic is not None:
                    critic(ids)
                if ref is not None:
                    logp(ref, ids)
        for _ in range(epochs):
            for micro in update:
                for ids in micro:
                    logp(policy, ids).sum().backward()
                    if critic is not None:
                        critic(ids).sum().backward()
        return time.perf_counter() - t0

    def steps() -> float:
        t0 = time.perf_counter()
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    passes()
    steps()  # warm-up, and the optimizers' state exists from here on
    best_passes, best_steps = math.inf, math.inf
    for _ in range(repeats):
        best_passes = min(best_passes, passes())
        best_steps = min(best_steps, steps() * epochs * len(update))
    return best_passes, best_steps


def fsdp_hook_s(trainer, batch) -> float:
    """Seconds of one step spent in FSDP's own hooks (outermost profiler events only; the
    profiler adds a little to each)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step(batch, version=0)
    outer = ("FSDP::pre_forward", "FSDP::post_forward", "FSDP::pre_backward",
             "FSDP::root_pre_forward", "FSDP::root_post_backward_callback",
             "FSDP::cast_forward_inputs", "RegisterPostBackwardFunctionBackward")
    return sum(e.cpu_time_total for e in prof.key_averages()
               if e.key.split(" (")[0] in outer) / 1e6


def timed_steps(trainer, batch, repeats: int) -> tuple[float, list[dict]]:
    """(the best seconds of ``repeats`` steps after a warm-up one, their metrics)."""
    trainer.train_step(batch, version=0)  # warm-up
    times, outs = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs.append(trainer.train_step(batch, version=0))
        times.append(time.perf_counter() - t0)
    return min(times), outs


def breakdown(micro: int, step: float, plain: float, optim: float, hooks: float,
              no_entropy: float) -> list[dict]:
    """Where a step's time over the plain passes goes (module docstring), from the step, the
    plain passes and AdamW of the same row, FSDP's hooks and the step without entropy bonus."""
    rest = step - plain - optim
    parts = {"FSDP hooks": hooks, "entropy bonus gradient": step - no_entropy}  # < 0: noise
    parts["losses, clipping, advantages, metrics (the remainder)"] = rest - sum(parts.values())
    return [{"micro_batch_size": micro, "part": name, "s": round(v, 3),
             "share of step over plain": f"{v / rest:.0%}", "share of step": f"{v / step:.1%}"}
            for name, v in parts.items()]


def run(micro_sizes: list[int], repeats: int, threads: int, prompt: str | None,
        split: int | None = None, model_path: str | None = None,
        episodes: int = 32) -> tuple[list[dict], list[dict]]:
    import dataclasses

    from launch.config.compose import compose
    from launch.model.tiny_model import build_tiny_model
    from learner.config import TrainerConfig
    from learner.trainer import Trainer

    torch.set_num_threads(threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    rows, parts = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(model_path) if model_path else build_tiny_model(Path(tmp) / "tiny")
            cfg = compose([f"env.prompt={prompt}"] if prompt else [])
            batch = _batch(cfg, model, episodes)
            algo = dataclasses.asdict(cfg.algorithm)
            del algo["reasoning_reward"]  # an env setting
            base = None

            def trainer_for(micro: int, **changes) -> Trainer:
                return Trainer(TrainerConfig.from_dict(
                    {"model_path": str(model), **algo, "micro_batch_size": micro, **changes}))

            sizes = micro_sizes if split is None or split in micro_sizes else [*micro_sizes, split]
            for micro in sizes:
                trainer = trainer_for(micro)
                best, outs = timed_steps(trainer, batch, repeats)
                base = base or best
                hooks = fsdp_hook_s(trainer, batch) if micro == split else None
                cuts, epochs, temperature = _cuts(trainer, batch), trainer.cfg.epochs, trainer.cfg.temperature
                has = {"critic": trainer.critic is not None, "ref": trainer.ref is not None}
                del trainer
                plain, optim = plain_step(model, *cuts, epochs=epochs, temperature=temperature,
                                          repeats=repeats, **has)
                rows.append({"micro_batch_size": micro or "whole", "step_s": round(best, 2),
                             "padding": round(outs[-1]["learner/padding"], 3),
                             "speed_vs_whole": f"{base / best:.2f}x",
                             "prepare_s": round(min(o["timing/prepare_s"] for o in outs), 2),
                             "plain_passes_s": round(plain, 2), "adamw_s": round(optim, 2),
                             "step / (plain + adamw)": f"{best / (plain + optim):.2f}x",
                             "step / plain": f"{best / plain:.2f}x"})
                if micro == split:
                    no_entropy = timed_steps(trainer_for(micro, entropy_coef=0.0), batch, repeats)[0]
                    parts = breakdown(micro, best, plain, optim, hooks, no_entropy)
    finally:
        dist.destroy_process_group()
    return rows, parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro", type=int, nargs="+", default=[0, 16, 8, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (the default job's learner: one, on a core of its own)")
    p.add_argument("--prompt", help="the env's prompt (default: the job's)")
    p.add_argument("--breakdown", type=int, nargs="?", const=8, metavar="MICRO",
                   help="also split the step's time over the plain passes at this micro-batch size")
    p.add_argument("--model", help="a model directory instead of the tiny model (model=smollm2_135m's: "
                   "`python -m launch.model.packaged smollm2_135m` prints it)")
    p.add_argument("--episodes", type=int, default=32, help="episodes in the batch")
    p.add_argument("--json")
    args = p.parse_args()
    rows, parts = run(args.micro, args.repeats, args.threads, args.prompt, args.breakdown,
                      args.model, args.episodes)
    report(rows, args.json)
    if parts:
        print()
        report(parts)


if __name__ == "__main__":
    main()
