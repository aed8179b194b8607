"""`python -m launch.demo`: a synchronous RL loop in one process (the smallest end-to-end check).

It runs what exists end to end, with the real parts: builds the tiny model if no model is given
(any Hugging Face path or hub id works), samples groups of responses with vLLM (behaviour
log-probs of the distribution actually sampled), recomputes them with the transformers policy,
scores each response with a toy reward, wraps each as a wire Trajectory (transport.schema)
collated by learner.batch, takes a GRPO + clipped-PPO step (learner.advantages,
learner.losses), and hot-swaps the new weights into the running vLLM engine (`reload_weights`
in-process, then a prefix-cache reset). Every step prints one JSON line, also written to
`<out>/metrics.jsonl`.

The toy task: the reward of a response is the share of its tokens that are action words
(Up / Down / Left / Right), the vocabulary the grid environments answer in. A random model says
them rarely; reward rising shows that the loop learns. `policy/vllm_logp_gap` (max |HF - vLLM|
log-prob on the sampled tokens) stays ~1e-5 when every weight update reached the engine.
The Hydra entry point, envs, actors and the learner processes replace this in later issues.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ACTION_WORDS = ("Up", "Down", "Left", "Right")
PROMPTS = [
    "You are on a frozen lake. Which way do you go?",
    "Push the box onto the target. Your move?",
    "The goal is below and right of you. Act.",
    "Name your next actions.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.demo", description=__doc__.splitlines()[0])
    p.add_argument("--model", help="HF path or hub id; default: build the tiny model in <out>/tiny-model")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="run directory")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--group-size", type=int, default=16, help="responses sampled per prompt")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    model_path = args.model or _tiny_model(args.out / "tiny-model", args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    llm = LLM(
        model=str(model_path), dtype="float32", enforce_eager=True, seed=args.seed,
        kv_cache_memory_bytes=256 * 2**20, max_model_len=512,
        logprobs_mode="processed_logprobs", distributed_executor_backend="uni",
    )
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_dict=False
        )
        for p in PROMPTS
    ]
    sampling = SamplingParams(
        n=args.group_size, temperature=args.temperature, max_tokens=args.max_tokens, logprobs=0
    )
    target = _target_ids(tokenizer)
    history = []
    try:
        with open(args.out / "metrics.jsonl", "w") as log:
            for step in range(args.steps):
                t0 = time.perf_counter()
                outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
                batch = _batch(outputs, prompts, target, version=step)
                metrics = _train_step(policy, optimizer, batch, args.temperature)
                llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(policy.state_dict().items())})
                llm.reset_prefix_cache()
                metrics.update(step=step, time_s=round(time.perf_counter() - t0, 2))
                print(json.dumps(metrics), flush=True)
                log.write(json.dumps(metrics) + "\n")
                history.append(metrics)
    finally:
        del llm
    return history


def _tiny_model(path: Path, seed: int) -> Path:
    if not (path / "config.json").exists():
        from launch.tiny_model import build_tiny_model

        build_tiny_model(path, seed=seed)
    return path


def _target_ids(tokenizer) -> set[int]:
    """Ids of every vocabulary entry that reads as an action word (with or without a space)."""
    return {i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip() in ACTION_WORDS}


def _batch(outputs, prompts, target, version: int):
    """One wire Trajectory per sampled response, collated by the learner's code."""
    import numpy as np

    from learner.batch import collate
    from transport.schema import Trajectory

    trajectories = []
    for group, (prompt, out) in enumerate(zip(prompts, outputs)):
        for c in out.outputs:
            n, m = len(prompt), len(c.token_ids)
            policy = np.arange(n + m) >= n
            trajectories.append(Trajectory(
                run_id="demo", actor_id=0, episode_id=len(trajectories), env_name="action-words",
                seed=group, group_id=group,
                token_ids=np.array(list(prompt) + list(c.token_ids), dtype=np.int32),
                loss_mask=policy, turn_end=np.arange(n + m) == n + m - 1,
                behaviour_logprobs=np.array([0.0] * n + [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                                            dtype=np.float32),
                policy_version=np.where(policy, version, -1).astype(np.int32),
                turn_rewards=np.array([sum(t in target for t in c.token_ids) / m], dtype=np.float32),
            ))
    return collate(trajectories, multi_turn_reward=False)


def _train_step(policy, optimizer, batch, temperature: float) -> dict:
    """One GRPO + clipped-PPO step; the behaviour policy is the proximal one (synchronous)."""
    import torch

    from learner.advantages import grpo
    from learner.losses import entropy_from_logits, entropy_loss, ppo_policy_loss

    ids, mask, behav = batch.token_ids, batch.loss_mask, batch.behaviour_logprobs
    scores, groups = batch.scores, batch.group_ids
    adv = grpo(scores, groups)[:, None].expand_as(behav)
    # Position i predicts token i + 1: shift so that log-probs line up with the tokens.
    logits = policy(input_ids=ids).logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask, behav, adv = mask[:, 1:], behav[:, 1:], adv[:, 1:]
    loss, m = ppo_policy_loss(logp, behav, adv, mask)
    ent, m_ent = entropy_loss(entropy_from_logits(logits.detach()), mask)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    gap = (logp.detach() - behav).abs()[mask].max()
    return {
        "rollout/reward": round(float(scores.mean()), 4),
        "loss/policy": round(float(loss), 5),
        "policy/entropy": round(m_ent["entropy"], 4),
        "policy/vllm_logp_gap": float(gap),
        "optim/grad_norm": round(float(grad_norm), 4),
        "loss/clip_frac": m["clip_frac"],
    }


if __name__ == "__main__":
    main()
