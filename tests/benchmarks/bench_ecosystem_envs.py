"""Benchmark: what one env of another ecosystem costs in an env worker's process: TextArena's
TowerOfHanoi and Mastermind, reasoning-gym's basic_arithmetic and chain_sum, and OpenEnv's template
(the echo env ``openenv init`` writes) in the process and behind its own server.

Run with `python -m tests.benchmarks.bench_ecosystem_envs` (`--episodes`, `--json PATH`). Each row
runs in a fresh child process: it builds the env and plays ``--episodes`` seeds with a scripted
player (TowerOfHanoi: its 7-move solution; Mastermind: fixed guesses; reasoning-gym: the item's
own answer; OpenEnv: "hello"), timing resets and turns (a turn: parse the reply, the source's
move, the observation). The baseline, measured in the same run, is a FrozenLake text turn in the
same kind of process: the ratio says how many FrozenLake turns one turn costs. Prints a Markdown
table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.benchmarks.report import in_fresh_process

ENTRY_POINT = "echo_env.server.echo_env_environment:EchoEnvironment"  # the template's
HANOI = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]
ROWS = {"frozenlake text (baseline)": ("frozenlake", {"format": "free_think"}),
        "textarena TowerOfHanoi-v0": ("textarena", {}),
        "textarena Mastermind-v0": ("textarena", {"id": "Mastermind-v0", "held_out": True}),
        "reasoning-gym basic_arithmetic": ("reasoning_gym", {}),
        "reasoning-gym chain_sum": ("reasoning_gym", {"task": "chain_sum"}),
        "openenv echo, in process": ("openenv", {"entry_point": ENTRY_POINT}),
        "openenv echo, its server": ("openenv", {})}


def _answer(name: str, env, turn: int) -> str:
    if name == "frozenlake":
        return f"<think>go</think><answer>{','.join((env.solve() or ['Left'])[:env.max_actions])}</answer>"
    if name == "textarena":
        move = HANOI[turn % 7] if "Hanoi" in env.source.name else ["[1 2 3 4]", "[2 3 4 5]", "[3 4 5 6]"][turn % 3]
        return f"<think>go</think><answer>{move}</answer>"
    if name == "reasoning_gym":
        return f"<think>go</think><answer>{env.source._entry['answer']}</answer>"
    return "<think>go</think><answer>hello</answer>"


def _measure(name: str, overrides: dict, episodes: int, out) -> None:
    from envs.registry import make, resolve_config
    from tests.envs_api import env_reset, env_step

    env = make(name, **resolve_config(name, overrides))
    turns = successes = 0
    reset_s = turn_s = 0.0
    for seed in range(episodes):
        t = time.perf_counter()
        env_reset(env, seed)
        reset_s += time.perf_counter() - t
        for turn in range(100):
            answer = _answer(name, env, turn)
            t = time.perf_counter()
            result = env_step(env, answer)
            turn_s += time.perf_counter() - t
            turns += 1
            if result.done:
                successes += bool(result.info["success"])
                break
    env.close()
    out.put({"episodes": episodes, "success": successes / episodes, "reset_ms": reset_s / episodes * 1000,
             "turn_ms": turn_s / turns * 1000, "turns_per_s": turns / turn_s})


def run(label: str, episodes: int, extra: dict) -> dict:
    name, overrides = ROWS[label]
    return {"row": label, **in_fresh_process(_measure, name, {**overrides, **extra}, episodes)}


def main() -> None:
    from tests.openenv_template import serve, write_template

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--json", help="also save the rows here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        template = write_template(Path(folder))
        with serve(template) as url:
            for label, (name, _) in ROWS.items():
                extra = ({} if name != "openenv" else {"import_path": str(template)} if "process" in label
                         else {"url": url})
                rows.append(run(label, args.episodes * (10 if "baseline" in label else 1), extra))
    base = rows[0]["turn_ms"]
    print(f"One env in its own process, a scripted player, {args.episodes} episodes a row "
          f"(FrozenLake: {args.episodes * 10}, its expert).\n")
    print("| env | success | reset ms | turn ms | turn vs FrozenLake | turns/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['row']} | {r['success']:.2f} | {r['reset_ms']:.2f} | {r['turn_ms']:.3f} | "
              f"{r['turn_ms'] / base:.1f}x | {r['turns_per_s']:,.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
