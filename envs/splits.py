"""Held-out maps: which seeds are whose, and which maps each split may draw.

An episode's *map* is everything its start is drawn from: the layout and the start (a FrozenLake
grid with its player, a Sokoban room, a Navigation room with its objects and the agent's pose, a
PrimitiveSkill table, an SVG target), as the env's layout text says it; its *key* is a hash of
that text. A map belongs to one split, fixed by its key (``split_of``: 10% validation, 10% test,
the rest training), and a seed names the split it plays by its range (``seed_split``: the
validation and test seeds of ``SEEDS``, every other seed training). An env that holds maps out
(``held_out=True``, every env with maps to hold out by default) draws the episode of a seed
from its generator again and again until the map is of the seed's split (``draw``), so:

- The warm start's demonstrations and RL's episodes (training seeds) never play a map that an
  evaluation (validation or test seeds) plays: the split is by map, not by seed, so a map that
  recurs under many seeds is held out under all of them.
- Same seed, same episode still holds: the draws come from the seed's own generator.
- Training sees 80% of the maps, in their proportions; each held-out split is an unbiased
  sample of the maps the generator draws, restricted to its own.
- Defaults are tuned on ``validation``; reported figures are ``test`` figures
  (``train.eval_split``).

An env whose maps barely vary (gymnasium's CliffWalking: one map, one start) cannot hold maps
out: ``draw`` fails after ``MAX_DRAWS`` draws naming the setting that turns it off, and with it
off an evaluation plays training maps (``report`` says so). ``report`` measures what the split
buys at a run's start: how many of the evaluation seeds' maps are among a sample of training
maps (0 with the split), and ``python -m envs.splits <env> [key=value ...]`` prints it with and
without the split.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

SPLITS = ("train", "validation", "test")
HELD_OUT = ("validation", "test")
SHARE = 0.1
"""Of the maps, each held-out split's share."""
SEEDS: Mapping[str, range] = {"validation": range(1_000_000, 2_000_000),
                              "test": range(2_000_000, 3_000_000)}
"""The seeds of each held-out split; every other non-negative seed is a training seed."""
MAX_DRAWS = 1000
"""Draws of a map of the seed's split before ``draw`` gives up (a held-out split takes 10 on
average)."""


def map_key(layout: str) -> str:
    """The map's key: 16 hex digits of a hash of its layout text."""
    return hashlib.blake2b(layout.encode(), digest_size=8).hexdigest()


def split_of(key: str) -> str:
    """The split a map belongs to, by its key: ``SHARE`` of the keys each held-out split's."""
    u = int(key[:8], 16) / 2**32
    return "test" if u < SHARE else "validation" if u < 2 * SHARE else "train"


def seed_split(seed: int) -> str:
    """The split a seed plays."""
    for split, seeds in SEEDS.items():
        if seed in seeds:
            return split
    return "train"


def seeds_of(split: str, n: int) -> list[int]:
    """The first ``n`` seeds of a held-out split."""
    if split not in SEEDS:
        raise ValueError(f"evaluation seeds come from {HELD_OUT}, not {split!r}")
    if n > len(SEEDS[split]):
        raise ValueError(f"{split} has {len(SEEDS[split])} seeds, not {n}")
    return list(SEEDS[split][:n])


def meets_held_out(low: int, high: int) -> bool:
    """Seeds [low, high) include a held-out split's."""
    return any(low < seeds.stop and seeds.start < high for seeds in SEEDS.values())


def draw(next_map: Callable[[], str], split: str | None, what: str = "this env") -> str:
    """Draw maps with ``next_map`` (which draws the next map from the episode's generator and
    returns its layout text) until one is of ``split``, or only once with ``split`` None (maps
    not held out); returns its key. Fails after ``MAX_DRAWS`` draws, naming ``what``."""
    seen = set()
    for _ in range(MAX_DRAWS):
        key = map_key(next_map())
        if split is None or split_of(key) == split:
            return key
        seen.add(key)
    raise RuntimeError(
        f"{what}: no {split} map in {MAX_DRAWS} draws ({len(seen)} distinct maps drawn): its maps "
        "vary too little to hold any out; set held_out=false (env.held_out=false) to play every "
        "seed on any map, evaluations on training maps included")


def wanted(seed: int | None, held_out: bool) -> str | None:
    """The split ``draw`` wants for ``seed`` (None, a seed the env draws itself: training), or
    None where the env does not hold maps out."""
    if not held_out:
        return None
    return "train" if seed is None else seed_split(seed)


def keys(env: Any, seeds: Iterable[int]) -> list[str]:
    """The map key of each seed's episode in ``env`` (``reset``'s ``info["map"]``)."""
    return [env.reset(seed=int(seed))[1]["map"] for seed in seeds]


def report(make: Callable[..., Any], config: Mapping[str, Any], eval_seeds: list[int],
           train_sample: int) -> dict[str, Any]:
    """What an evaluation's seeds play, against ``train_sample`` training seeds (``[0, n)``: the
    warm start's first demonstrations, and seeds RL draws): ``{"held_out", "eval_seeds",
    "eval_maps" (distinct), "train_seeds", "train_maps" (distinct), "shared" (evaluation seeds
    whose map is among the sample's)}``; ``make(**config)`` builds the env. ``{}`` for an env
    with no maps (no ``info["map"]``)."""
    env = make(**config)
    try:
        if "map" not in env.reset(seed=0)[1]:
            return {}
        train = set(keys(env, range(train_sample)))
        evaluated = keys(env, eval_seeds)
    finally:
        env.close()
    return {"held_out": bool(config.get("held_out", True)), "eval_seeds": len(eval_seeds),
            "eval_maps": len(set(evaluated)), "train_seeds": train_sample, "train_maps": len(train),
            "shared": sum(key in train for key in evaluated)}


def report_text(split: str, figures: Mapping[str, Any]) -> str:
    """One line for a run's start: "held-out maps (validation): 256 seeds play 243 distinct maps,
    0 of them among 1024 training seeds' 811 maps"."""
    if not figures:
        return f"held-out maps ({split}): this env has no maps to hold out"
    line = (f"held-out maps ({split}): {figures['eval_seeds']} seeds play {figures['eval_maps']} "
            f"distinct maps, {figures['shared']} of them among {figures['train_seeds']} training "
            f"seeds' {figures['train_maps']} maps")
    return line if figures["held_out"] else line + " (env.held_out=false: evaluations may play training maps)"


def main(argv: list[str] | None = None) -> None:
    """``python -m envs.splits frozenlake [key=value ...]``: the overlap with and without the split."""
    from envs.registry import make, parse_overrides, resolve_config

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("env")
    parser.add_argument("overrides", nargs="*", help="env settings as key=value (YAML values)")
    parser.add_argument("--split", default="validation", choices=HELD_OUT)
    parser.add_argument("--eval-seeds", type=int, default=256)
    parser.add_argument("--train-seeds", type=int, default=4096)
    args = parser.parse_args(argv)
    config = resolve_config(args.env, parse_overrides(args.overrides))
    seeds = seeds_of(args.split, args.eval_seeds)
    for held_out in (True, False) if "held_out" in config else (True,):
        figures = report(lambda **c: make(args.env, **c), {**config, "held_out": held_out}
                         if "held_out" in config else config, seeds, args.train_seeds)
        print(f"held_out={str(held_out).lower()}: {report_text(args.split, figures)}")


if __name__ == "__main__":
    main()
