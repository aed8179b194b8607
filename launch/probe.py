"""`python -m launch.probe`: the learner's update on episodes sampled in the same process.

The same configuration as `python -m launch.train` (Hydra, the same overrides), played without
Ray, vLLM, env workers or the trajectory stream: each step samples ``train.batch_size`` episodes
(groups of ``actors.group_size`` per seed) with transformers' ``generate`` from the current
policy, trains the learner's ``Trainer`` on them (one rank on ``learner.device``: gloo on CPU,
nccl on GPU), and copies the new weights into the sampling model. Synchronous and exactly on-policy. It answers "is it the algorithm or the
system?": if a setting does not learn here, no staleness, transport or engine is to blame.

``model.path`` must name a model (e.g. a run's ``warm-start/``): the probe does not warm-start.
Every step and every greedy evaluation (``train.eval_every``, ``train.eval_seeds`` held-out
maps, as the run's) is printed and appended to ``probe.jsonl`` in the Hydra run directory.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from launch.config import RunConfig, to_run_config  # registers the schema with Hydra

os.environ.setdefault("HF_HUB_OFFLINE", "1")
log = logging.getLogger(__name__)


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return probe(to_run_config(cfg), Path(HydraConfig.get().runtime.output_dir))


def probe(cfg: RunConfig, out_dir: Path) -> float:
    """Run ``train.steps`` probe steps; returns the last greedy success."""
    import torch
    import torch.distributed as dist

    if not cfg.model.path:
        raise ValueError("the probe trains an existing model: give model.path=<a Hugging Face dir>")
    torch.manual_seed(cfg.seed)
    if cfg.learner.threads:
        torch.set_num_threads(cfg.learner.threads)
    with socket.socket() as s:  # a free port for the one-rank group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if str(cfg.learner.device).startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        return _probe(cfg, out_dir)
    finally:
        dist.destroy_process_group()


def _probe(cfg, out_dir: Path) -> float:
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from actors.vision import VisionTokens
    from launch.builders import env_config as make_env_config, trainer_config
    from launch.hf_episodes import evaluate_hf, play
    from learner.config import TrainerConfig
    from learner.trainer import Trainer

    path, device = str(cfg.model.path), str(cfg.learner.device)
    trainer = Trainer(TrainerConfig.from_dict(trainer_config(cfg, path)), device=device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    vision = VisionTokens.from_pretrained(path)  # None for a text-only model
    auto = AutoModelForCausalLM if vision is None else AutoModelForImageTextToText
    sampler = auto.from_pretrained(path).to(device).eval()
    env_config = make_env_config(cfg)  # the preset's reward terms, as the actors build it
    ac, tr = cfg.actors, cfg.train
    eval_seeds = range(tr.eval_seed_offset, tr.eval_seed_offset + tr.eval_seeds)
    rng = np.random.default_rng(cfg.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    success = float("nan")

    with open(out_dir / "probe.jsonl", "a", encoding="utf-8") as f:
        def write(record: dict) -> None:
            line = json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()})
            print(line, flush=True)
            f.write(line + "\n")
            f.flush()

        def evaluate(step: int) -> float:
            result = evaluate_hf(sampler, tokenizer, cfg.env_name, env_config, eval_seeds,
                                 ac.max_tokens, batch_size=64, vision=vision)
            write({"kind": "eval", "step": step, **result})
            return result["success"]

        success = evaluate(0)
        groups = -(-tr.batch_size // ac.group_size)
        for step in range(1, tr.steps + 1):
            t0 = time.perf_counter()
            seeds = rng.integers(0, tr.eval_seed_offset, groups)  # training maps: below the eval seeds
            results, _ = play(sampler, tokenizer, cfg.env_name, env_config,
                              [int(s) for s in seeds for _ in range(ac.group_size)],
                              max_new_tokens=ac.max_tokens, batch_size=64,
                              temperature=ac.temperature, top_p=ac.top_p,
                              group_ids=[g for g in range(groups) for _ in range(ac.group_size)],
                              version=step - 1, vision=vision)
            trajectories = [r.trajectory for r in results if r.trajectory is not None]
            t1 = time.perf_counter()
            metrics = trainer.train_step(trajectories, version=step - 1)
            sampler.load_state_dict(trainer.state_dict_for_publish())
            played = [r.metrics for r in results if r.trajectory is not None]
            means = {f"rollout/{k}": float(np.mean([m[k] for m in played]))
                     for k in ("success", "format_correct", "reward", "generated_tokens")}
            write({"kind": "train", "step": step, **means, **metrics,
                   "timing/sample_s": t1 - t0, "timing/probe_step_s": time.perf_counter() - t0})
            if tr.eval_every and step % tr.eval_every == 0 or step == tr.steps:
                success = evaluate(step)
    return success


if __name__ == "__main__":
    main()
