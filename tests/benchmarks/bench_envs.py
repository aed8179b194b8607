"""Benchmark: what one env of the image envs costs in an env worker: Navigation (a MiniWorld
room) and SVG (resvg in its render worker): resets and turns with the expert playing, the
picture's render time, and the process's memory.

Run with `python -m tests.benchmarks.bench_envs` (`--episodes`, `--json PATH`). Each row runs in a
fresh child process (so memory is one env's): it builds the env and plays the expert for
``--episodes`` seeds through the env's own turns (Navigation: the shortest plan, 5 actions a
turn, as VAGEN's; SVG: the target's own SVG, one turn); Navigation's camera is then timed alone.
The baseline, measured in the same run, is a FrozenLake text turn in the same kind of process:
the ratio says how many FrozenLake turns one turn of the env costs. Prints a Markdown table.
(PrimitiveSkill has its own: bench_primitive_skill.)
"""

from __future__ import annotations

import argparse
import json
import time

from tests.benchmarks.report import in_fresh_process

ROWS = {"frozenlake text (baseline)": ("frozenlake", {"format": "free_think"}),
        "navigation text": ("navigation", {"render": "text"}),
        "navigation image 224 px": ("navigation", {"render": "image", "image_size": 224}),
        "navigation image 112 px": ("navigation", {"render": "image", "image_size": 112}),
        "svg shapes 224 px": ("svg", {"targets": "shapes", "image_size": 224}),
        "svg icons 224 px": ("svg", {"targets": "icons", "image_size": 224})}


def _measure(name: str, overrides: dict, episodes: int, out) -> None:
    import numpy as np
    import psutil

    from envs.registry import make, resolve_config
    from tests.envs_api import env_reset, env_step

    env = make(name, **resolve_config(name, overrides))
    built = psutil.Process().memory_info().rss / 2**20
    turns = actions = successes = 0
    reset_s = turn_s = 0.0
    for seed in range(episodes):
        t = time.perf_counter()
        env_reset(env, seed)
        reset_s += time.perf_counter() - t
        while True:
            if name == "svg":
                answer = env.demonstrate(np.random.default_rng(seed), 0.0)[0]
            else:
                plan = env.solve() or ["moveahead"]
                answer = f"<think>go</think><answer>{','.join(plan[:env.max_actions])}</answer>"
            t = time.perf_counter()
            result = env_step(env, answer)
            turn_s += time.perf_counter() - t
            turns, actions = turns + 1, actions + len(result.info["actions"])
            if result.done:
                successes += bool(result.info["success"])
                break
    render_ms = float("nan")
    if name == "navigation":
        t = time.perf_counter()
        for _ in range(50):
            env.game.image(0)
        render_ms = (time.perf_counter() - t) / 50 * 1000
    env.close()
    out.put({"episodes": episodes, "success": successes / episodes, "reset_ms": reset_s / episodes * 1000,
             "turn_ms": turn_s / turns * 1000, "actions_per_s": actions / turn_s,
             "render_ms": render_ms, "rss_mib": built,
             "peak_rss_mib": psutil.Process().memory_info().rss / 2**20})


def run(label: str, episodes: int) -> dict:
    name, overrides = ROWS[label]
    return {"row": label, **in_fresh_process(_measure, name, overrides, episodes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--json", help="also save the rows here")
    args = parser.parse_args()
    rows = [run(label, args.episodes * (10 if "baseline" in label else 1)) for label in ROWS]
    base = rows[0]["turn_ms"]
    print(f"One env in its own process, the expert playing {args.episodes} episodes a row "
          f"(FrozenLake: {args.episodes * 10}).\n")
    print("| env | expert success | reset ms | turn ms | turn vs FrozenLake | actions/s | "
          "render ms | RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['row']} | {r['success']:.2f} | {r['reset_ms']:.1f} | {r['turn_ms']:.2f} | "
              f"{r['turn_ms'] / base:.1f}x | {r['actions_per_s']:,.0f} | {r['render_ms']:.1f} | "
              f"{r['peak_rss_mib']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
