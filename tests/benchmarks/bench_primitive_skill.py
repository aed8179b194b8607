"""Benchmark: what one PrimitiveSkill simulator (one env worker's) costs: control steps per second,
seconds per skill and per expert episode, the camera's render time, and the process's memory.

Run with `python -m tests.benchmarks.bench_primitive_skill` (`--episodes`, `--json PATH`). Each task
runs in a fresh child process (so memory is one simulator's): it builds the env, plays the expert
for ``--episodes`` seeds through the env's own turns (text observations), then renders the camera.
The baseline, measured in the same run, is a FrozenLake turn in the same kind of process: the
ratio says how many FrozenLake turns one PrimitiveSkill turn costs. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import time

TASKS = ("PlaceTwoCube", "StackThreeCube", "AlignTwoCube", "PutAppleInDrawer")


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _measure(task: str | None, episodes: int, out) -> None:
    import numpy as np

    from envs.registry import make, resolve_config
    from tests.envs_api import env_reset, env_step

    before = _rss_mib()
    if task is None:  # the baseline: FrozenLake turns
        env = make("frozenlake", **resolve_config("frozenlake", {}))
        start, turns = time.perf_counter(), 0
        for seed in range(episodes * 50):
            env_reset(env, seed)
            answer = "<think><observation>a</observation><reasoning>b</reasoning><prediction>c" \
                     "</prediction></think><answer>Left,Down</answer>"
            turns += 1
            env_step(env, answer)
        out.put({"turn_s": (time.perf_counter() - start) / turns})
        return
    env = make("primitive_skill", **resolve_config("primitive_skill", {"task": task}))
    built = _rss_mib()
    start = time.perf_counter()
    turns = skills = successes = 0
    for seed in range(episodes):
        env_reset(env, seed)
        while True:
            actions = env.solve()[:2]
            result = env_step(env, f"<think>x</think><answer>{'|'.join(actions)}</answer>")
            turns, skills = turns + 1, skills + len(result.info["actions"])
            if result.done:
                successes += result.info["success"]
                break
    elapsed = time.perf_counter() - start
    env_reset(env, 0)  # control steps per second: the first object's pick, as the controller counts
    positions = env.game.sim.positions()
    first = np.array(next(p for n, p in positions.items() if n.endswith("_cube") or n == "apple"))
    t0 = time.perf_counter()
    env.game.skills.pick(first)
    pick_s, steps = time.perf_counter() - t0, env.game.skills.steps
    t0 = time.perf_counter()
    for _ in range(5):
        env.game.image(300)
    render_s = (time.perf_counter() - t0) / 5
    out.put({"episode_s": elapsed / episodes, "turn_s": elapsed / turns, "skill_s": elapsed / skills,
             "control_steps_per_s": steps / pick_s, "render_300px_s": render_s,
             "success": successes / episodes, "rss_mib": _rss_mib(), "sim_mib": built - before})
    env.close()


def _run(task: str | None, episodes: int) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(task, episodes, out))
    proc.start()
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            try:
                return out.get(timeout=5)
            except queue.Empty:
                if not proc.is_alive():  # it died before reporting: its traceback is above
                    raise RuntimeError(f"the {task or 'FrozenLake'} measurement exited "
                                       f"({proc.exitcode}) without a result") from None
        raise TimeoutError(f"the {task or 'FrozenLake'} measurement took over 30 min")
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    base = _run(None, args.episodes)
    rows = {task: _run(task, args.episodes) for task in TASKS}
    print("| task | expert success | s / episode | s / turn (x FrozenLake turn) | s / skill | "
          "control steps / s | 300 px render (s) | process RSS (MiB) | simulator (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task, r in rows.items():
        print(f"| {task} | {r['success']:.2f} | {r['episode_s']:.2f} | {r['turn_s']:.2f} "
              f"(x{r['turn_s'] / base['turn_s']:,.0f}) | {r['skill_s']:.2f} | "
              f"{r['control_steps_per_s']:.0f} | {r['render_300px_s']:.3f} | {r['rss_mib']:.0f} | "
              f"{r['sim_mib']:.0f} |")
    print(f"FrozenLake turn (baseline): {base['turn_s'] * 1e3:.3f} ms")
    result = {"baseline": base, "tasks": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
