"""Benchmark: one inference actor against env latency, and against vLLM alone, in the same run.

Run with `make bench` (or `python -m tests.benchmarks.bench_actor`). One real actor (vLLM's
AsyncLLM on the random tiny model, a FrozenLake env pool, the ZeroMQ stream to a receiver that
releases each trajectory at once) plays ``--episodes`` training episodes per row:

- Latency sweep: every env reset and step answers ``--latencies`` seconds late, as a remote
  simulator's would (envs/service.py's LatencyEnvClient: the wait holds no env worker), for each
  ``--concurrency`` (episodes in flight, one env slot each). Each row's trajectories/s is
  compared with the no-latency row of the same concurrency (aim: 0.9 or better at 100 ms).
- Raw vLLM: at the highest concurrency with no latency, ``--trials`` times in turn, the actor
  plays ``--episodes`` episodes and they are replayed on the same engine with no env and no
  episode logic: as many episodes in flight, each turn's prompt the previous one plus the answer
  just generated plus the env's tokens as the actor recorded them (the prefix cache, emptied
  first, then sees what it saw for the actor: the same prompt tokens, cached and not), the same
  number of tokens an answer, the same sampling settings. The median of the actor's tokens/s
  over vLLM's, trial by trial (aim: 0.9), and the CPU seconds each side's processes took.

The random model rarely ends an answer early, so every episode plays its 3 turns of
``--max-tokens`` tokens: rows differ in the latency and nothing else. ``--model PATH`` plays a
real model instead (SmolLM2-135M-Instruct's converted directory); its answers may end early,
and the replay generates exactly as many tokens as each answer had.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from tests.benchmarks.report import report
from tests.collector import Collector

MAX_TURNS = 3


class Recorder:
    """The engine, with each generate call's prompt ids and the token ids it returned."""

    def __init__(self, engine) -> None:
        self.engine, self.calls, self.recording = engine, [], False

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt, params, request_id):
        final = None
        async for final in self.engine.generate(prompt, params, request_id):
            yield final
        if self.recording:
            self.calls.append((list(prompt["prompt_token_ids"]), list(final.outputs[0].token_ids)))


@contextlib.contextmanager
def actor_rig(model: Path, concurrency: int, max_tokens: int, cores: tuple[int, ...]):
    """A started actor whose env client's latency the caller sets; all of it closed on exit."""
    from actors.actor import InferenceActor
    from envs.pool import EnvPool
    from envs.registry import resolve_config
    from envs.service import LatencyEnvClient, LocalEnvClient
    from transport.cores import bind_cores

    bind_cores(cores)  # before the env workers start: they inherit it, as the actor's do
    config = resolve_config("frozenlake", {"max_turns": MAX_TURNS})
    pool = EnvPool(("frozenlake", config), num_workers=1, envs_per_worker=concurrency)
    collector = Collector(window_bytes=64 << 20)
    loop = asyncio.new_event_loop()
    env = LatencyEnvClient(LocalEnvClient(pool), 0.0)
    actor = InferenceActor({
        "actor_id": 0, "run_id": "bench", "model_path": str(model), "env_name": "frozenlake",
        "env_config": config, "env_pool": {"env_workers": 1, "envs_per_worker": concurrency},
        "concurrency": concurrency, "group_size": 4, "temperature": 1.0,
        "max_tokens": max_tokens, "max_turns": MAX_TURNS, "max_context": 2048,
        "kv_cache_bytes": 256 << 20, "learner_address": collector.address, "cores": cores,
    }, env=env)
    try:
        loop.run_until_complete(actor.start())
        actor.engine = Recorder(actor.engine)
        yield loop, actor, env
    finally:
        try:
            loop.run_until_complete(actor.close())
        finally:
            loop.close()
            collector.close()
            pool.close()


def play(loop, actor, episodes: int) -> tuple[float, float]:
    """(trajectories/s, generated tokens/s) of ``episodes`` training episodes."""
    before = loop.run_until_complete(actor.stats())
    t0 = time.perf_counter()
    after = loop.run_until_complete(actor.run(num_episodes=episodes))
    dt = time.perf_counter() - t0
    done = after["episodes_done"] - before["episodes_done"]
    return done / dt, (after["tokens_generated"] - before["tokens_generated"]) / dt


def episodes_of(calls: list) -> list[list[tuple[list[int], int, list[int]]]]:
    """The recorded calls as episodes: each a list of (prompt ids, tokens generated, the tokens
    the env added after that answer). A call continues the episode whose last prompt plus its
    answer prefixes it: the answers are sampled, so that is one episode (siblings of a group
    share their first prompt, and a sibling's later turn also starts with it)."""
    chains: list[list[tuple[list[int], list[int]]]] = []
    for ids, answer in calls:
        for chain in chains:
            last = chain[-1][0] + chain[-1][1]
            if len(ids) > len(last) and ids[:len(last)] == last:
                chain.append((ids, answer))
                break
        else:
            chains.append([(ids, answer)])
    return [[(ids, len(answer), nxt[0][0][len(ids) + len(answer):] if nxt else [])
             for (ids, answer), nxt in zip(chain, [[c] for c in chain[1:]] + [None])]
            for chain in chains]


def replay(loop, engine, calls: list, concurrency: int) -> float:
    """vLLM alone: the recorded episodes' turns with ``concurrency`` episodes in flight, each
    turn's prompt the last one plus the answer just generated plus the env's tokens as recorded
    (so the prefix cache sees what it saw for the actor); generated tokens/s."""
    from actors.engine import sampling_params

    queue = list(reversed(episodes_of(calls)))

    async def worker(k: int) -> int:
        tokens = 0
        while queue:
            episode, context = queue.pop(), None
            for turn, (ids, n, env_tokens) in enumerate(episode):
                context = ids if context is None else context
                params = sampling_params(temperature=1.0, top_p=1.0, detokenize=False,
                                         max_tokens=n, min_tokens=n, ignore_eos=True, logprobs=0)
                rid = f"raw-{k}-{len(queue)}-{turn}"
                final = None
                async for output in engine.generate({"prompt_token_ids": context}, params, rid):
                    final = output
                answer = list(final.outputs[0].token_ids)
                tokens += len(answer)
                context = context + answer + list(env_tokens)
        return tokens

    async def run() -> int:
        await engine.reset_prefix_cache()  # the actor's prompts are not cached ahead of the replay
        return sum(await asyncio.gather(*(worker(k) for k in range(concurrency))))

    t0 = time.perf_counter()
    tokens = loop.run_until_complete(run())
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=96, help="episodes a row")
    p.add_argument("--latencies", default="0,0.01,0.05,0.1,0.3", help="seconds, comma-separated")
    p.add_argument("--concurrency", default="16,64", help="episodes in flight, comma-separated")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens an answer")
    p.add_argument("--cores", default="1",
                   help="cores of the actor, its engine and env workers, as the default job binds "
                        "an actor to a core of its own (comma-separated; empty: unbound)")
    p.add_argument("--trials", type=int, default=5, help="actor-then-vLLM pairs")
    p.add_argument("--model", help="a model directory instead of the random tiny model "
                   "(model=smollm2_135m's: `python -m launch.model.packaged smollm2_135m` prints it)")
    p.add_argument("--json", help="also save the rows here")
    a = p.parse_args()
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from launch.model.tiny_model import build_tiny_model

    latencies = [float(x) for x in a.latencies.split(",")]
    concurrencies = [int(x) for x in a.concurrency.split(",")]
    cores = tuple(int(x) for x in a.cores.split(",") if x)
    rows, raw_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(a.model) if a.model else build_tiny_model(Path(tmp) / "model", seed=0)
        for c in concurrencies:
            with actor_rig(model, c, a.max_tokens, cores) as (loop, actor, env):
                play(loop, actor, c)  # warm-up: the engine's first batches
                base = None
                for latency in latencies:
                    env.latency_s = latency
                    traj_s, tok_s = play(loop, actor, a.episodes)
                    base = base or traj_s
                    rows.append({"in flight": c, "env latency s": latency,
                                 "traj/s": f"{traj_s:.2f}", "tokens/s": f"{tok_s:,.0f}",
                                 "vs no latency": f"{traj_s / base:.2f}"})
                if c == max(concurrencies):
                    env.latency_s = 0.0
                    raw_rows = against_vllm(loop, actor, c, a.episodes, a.trials)
    report(rows, a.json)
    if raw_rows:
        print()
        report(raw_rows)


VLLM_KINDS = ("EngineCore", "VLLM::Worker")
"""launch/run/memory.py's process kinds of vLLM's engine core and worker."""


def cpu_seconds(monitor) -> dict[str, float]:
    """CPU seconds (user + system) so far of this process (the actor, or the replay's loop),
    of vLLM's engine core and worker processes, and of the rest of its children (env workers),
    as ``monitor`` (a launch/run/memory.py MemoryMonitor of this process) classifies them."""
    monitor.sample_cpu()
    out = dict.fromkeys(("this process", "vLLM", "env workers"), 0.0)
    for pid, (kind, seconds) in monitor.cpu_by_pid.items():
        key = ("this process" if pid == os.getpid() else
               "vLLM" if kind in VLLM_KINDS else "env workers")
        out[key] += seconds
    return out


def against_vllm(loop, actor, concurrency: int, episodes: int, trials: int) -> list[dict]:
    """``trials`` times: the actor plays ``episodes`` recorded episodes, then vLLM replays
    them; a row a trial with the CPU seconds each side's processes took, and the median
    ratio."""
    from launch.run.memory import MemoryMonitor

    rows, ratios = [], []
    monitor = MemoryMonitor(os.getpid(), interval_s=24 * 3600)  # CPU only, sampled by hand

    def spent(before: dict) -> dict:
        return {k: v - before[k] for k, v in cpu_seconds(monitor).items()}

    try:
        for trial in range(trials):
            actor.engine.calls, actor.engine.recording = [], True
            before = cpu_seconds(monitor)
            _, tok_s = play(loop, actor, episodes)
            cpu_actor = spent(before)
            actor.engine.recording = False
            before = cpu_seconds(monitor)
            raw = replay(loop, actor.engine.engine, actor.engine.calls, concurrency)
            cpu_raw = spent(before)
            ratios.append(tok_s / raw)
            rows.append({"trial": trial + 1, "in flight": concurrency,
                         "turns": len(actor.engine.calls),
                         "episodes": len(episodes_of(actor.engine.calls)),
                         "actor tokens/s": f"{tok_s:,.0f}", "vLLM tokens/s": f"{raw:,.0f}",
                         "actor / vLLM": f"{tok_s / raw:.2f}",
                         "CPU s, actor: its process / env workers / vLLM": " / ".join(
                             f"{cpu_actor[k]:.2f}" for k in ("this process", "env workers", "vLLM")),
                         "CPU s, replay: its process / vLLM": " / ".join(
                             f"{cpu_raw[k]:.2f}" for k in ("this process", "vLLM"))})
    finally:
        monitor.close()
    rows.append({"trial": "median", "actor / vLLM": f"{statistics.median(ratios):.2f}"})
    return rows


if __name__ == "__main__":
    main()
