"""Floors for an evaluation: the same seeds played by policies that need no training, so that
every figure has beside it what a policy gets that knows the answer format and nothing else.

Scripted players (``scripted``), played here against an env built in this process, one greedy
episode a seed, each answer in the env's answer format (``envs.formats.format_example``: its
reasoning sections hold the format's example text):
- ``random``: each turn 1 to ``max_actions_per_turn`` actions drawn uniformly, from the env's
  named actions or, for a game whose actions take arguments (PrimitiveSkill's ``pick(x,y,z)``),
  from its ``random_action``; drawn from a generator seeded by the episode's seed;
- ``constant``: one named action, as many a turn as allowed, every turn; each action is played
  and the best (by success, then reward) is reported under its name (``constant:Up``), so the
  floor it gives is if anything high;
- for SVG, ``empty`` (an empty drawing) and ``one_shape`` (one black circle in the middle).
The loop adds ``blind``: the model itself with every picture white (the actors'
``evaluate(blind=True)``), for an env observed through pictures.

``python -m launch.run.baselines <env> [key=value ...]`` prints the scripted floors of an env's
evaluation seeds without a run (``--split``, ``--seeds``; the blind floor needs the model: a run).

Outcomes have the shape of the actors' (actors/actor.py's ``outcome``), so
launch/run/evaluation.py summarizes them with their intervals the same way; an episode whose
env raises counts as failed (``env_error``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from actors.episode import REWARD_PARTS, judge_scores
from envs.formats import format_example
from envs.gym_game import NoTextError
from launch.run import evaluation

Answer = Callable[[np.random.Generator], str]
"""A scripted player: the answer of a turn, from the episode's generator."""

EMPTY_SVG = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"></svg>'
ONE_SHAPE_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><circle cx="12" '
                 'cy="12" r="7" fill="none" stroke="#000000" stroke-width="2"/></svg>')
BASELINE_SEED = 7919
"""Mixed with an episode's seed into the random player's generator."""


def scripted(env: Any) -> dict[str, Answer]:
    """The scripted players that fit ``env`` (see the module docstring), by name; a name
    ``constant:<action>`` is one constant action's."""
    fmt = getattr(env, "format", None)
    if fmt is None:  # an env with no answer format of envs/formats.py (ActionWords)
        return {}
    if getattr(env, "target_svg", None) is not None:  # SVG: the answer is a drawing
        return {"empty": _constant(format_example(fmt, action_example=EMPTY_SVG)),
                "one_shape": _constant(format_example(fmt, action_example=ONE_SHAPE_SVG))}
    game = getattr(env, "game", None)
    if game is None:
        return {}
    names, sep, most = env.action_names, env.action_sep, env.max_actions
    own = getattr(game, "random_action", None)
    pick = own if own is not None else (lambda rng: names[int(rng.integers(len(names)))])

    def random_answer(rng: np.random.Generator) -> str:
        return format_example(fmt, action_example=sep.join(pick(rng) for _ in range(int(rng.integers(1, most + 1)))))

    players: dict[str, Answer] = {"random": random_answer}
    if own is None and getattr(game, "parse_action", None) is None:
        for name in names:
            players[f"constant:{name}"] = _constant(format_example(fmt, action_example=sep.join([name] * most)))
    return players


def _constant(text: str) -> Answer:
    """The player that answers ``text`` every turn."""
    return lambda rng: text


def play(env: Any, seeds: Iterable[int], answer: Answer) -> list[dict[str, Any]]:
    """One episode of ``answer`` on each of ``seeds``: their outcomes."""
    out = []
    for seed in seeds:
        rng = np.random.default_rng([seed, BASELINE_SEED])
        turns, reward, success, well_formed = 0, 0.0, 0.0, 0.0
        parts, scores = dict.fromkeys(REWARD_PARTS, 0.0), dict[str, float]()
        try:
            env.reset(seed=int(seed))
            done = False
            while not done:
                _, r, terminated, truncated, info = env.step(answer(rng))
                turns, reward, done = turns + 1, reward + float(r), terminated or truncated
                success = float(info.get("success", False))
                well_formed += float(info.get("format_correct", False))
                metrics = info.get("metrics", {})
                for name, key in REWARD_PARTS.items():
                    parts[name] += float(metrics.get(key, 0.0))
                for name, value in judge_scores(metrics).items():
                    scores[name] = scores.get(name, 0.0) + value
        except Exception as e:  # noqa: BLE001 - the episode counts as failed, with its reason
            out.append({"seed": int(seed), "sample": -1, "failure": "env_error", "error": repr(e)[:200]})
            continue
        out.append({"seed": int(seed), "sample": -1, "failure": None, "success": success,
                    "reward": reward, "format_correct": well_formed / turns, "turns": float(turns), **parts,
                    **{name: total / turns for name, total in scores.items()}})
    return out


def run_scripted(make: Callable[..., Any], config: Mapping[str, Any],
                 seeds: list[int]) -> dict[str, list[dict[str, Any]]]:
    """Every scripted player's outcomes on ``seeds``, in an env ``make(**config)`` builds (with
    ``render: text`` where the env has text, the players reading nothing); of the constant
    players only the best. {} for an env none fits."""
    if config.get("render", "text") != "text" and "target_svg" not in config and "targets" not in config:
        # the players read nothing: the symbol text is as good as a picture and costs no render,
        # where the env has text; a gymnasium env that only draws keeps its pictures
        try:
            env = make(**{**config, "render": "text", "blank_images": False})
        except NoTextError:
            env = make(**config)
    else:
        env = make(**config)
    try:
        results = {name: play(env, seeds, answer) for name, answer in scripted(env).items()}
    finally:
        env.close()
    constants = {name: o for name, o in results.items() if name.startswith("constant:")}
    if constants:
        best = max(constants, key=lambda n: (_mean(constants[n], "success"), _mean(constants[n], "reward")))
        results = {n: o for n, o in results.items() if n not in constants or n == best}
    return results


def _mean(outcomes: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([o.get(key, 0.0) if o["failure"] is None else 0.0 for o in outcomes]))


def baselines_text(figures: Mapping[str, Mapping[str, float]]) -> str:
    """"floors: random 0.184 [0.14, 0.24] reward 2.57 | constant:Down 0.121 [0.09, 0.17] ...":
    each baseline's success with its 95% interval and mean reward."""
    return "floors: " + " | ".join(
        f"{name} {f['success']:.3f} [{f['success_lo']:.2f}, {f['success_hi']:.2f}] reward {f['reward']:.2f}"
        for name, f in figures.items())


def write_outcomes(run_dir: Path, name: str, outcomes: list[dict[str, Any]]) -> Path:
    """A baseline's outcomes, ``<run dir>/evals/baseline_<name>.jsonl``, one JSON object a line."""
    return evaluation.write_lines(Path(run_dir) / "evals" / f"baseline_{name}.jsonl", outcomes)


def summarize(results: Mapping[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Each baseline's evaluation record (launch/run/evaluation.py's ``summarize``)."""
    return {name: evaluation.summarize(outcomes) for name, outcomes in results.items()}


def main(argv: list[str] | None = None) -> None:
    """Print the scripted floors of an env's evaluation seeds (see the module docstring)."""
    from envs import splits
    from envs.registry import make, parse_overrides, resolve_config

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("env")
    parser.add_argument("overrides", nargs="*", help="env settings as key=value (YAML values)")
    parser.add_argument("--split", default="validation", choices=splits.HELD_OUT)
    parser.add_argument("--seeds", type=int, default=256)
    args = parser.parse_args(argv)
    seeds = splits.seeds_of(args.split, args.seeds)
    results = run_scripted(lambda **c: make(args.env, **c),
                           resolve_config(args.env, parse_overrides(args.overrides)), seeds)
    print(f"{' '.join([args.env, *args.overrides])} on {len(seeds)} {args.split} seeds: "
          f"{baselines_text(summarize(results)) if results else 'no scripted floor fits this env'}")


if __name__ == "__main__":
    main()
