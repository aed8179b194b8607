"""launch/model/warm_start.py from the command line, a few steps on the tiny models: the text model on
text FrozenLake, the tiny Qwen2-VL on FrozenLake rendered as pictures (``--render image``). The
output is a model directory the next stage loads (for the VLM: with its processor), trained."""

from __future__ import annotations

import filecmp
import json

import numpy as np
import pytest
import torch

from envs.registry import load_config
from launch.model.tiny_model import build_tiny_model
from launch.model.warm_start import PROCESSOR_FILES, config_defaults, main, parse_args


@pytest.mark.parametrize("vision", [False, True], ids=["text", "image"])
def test_warm_start_writes_a_trained_model_the_next_stage_loads(tmp_path, vision, capsys):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from actors.vision import VisionTokens

    base = build_tiny_model(tmp_path / "base", vision=vision, seed=0)
    render = ["--render", "image", "--image-size", "56"] if vision else []
    out = main(["--model", str(base), "--out", str(tmp_path / "out"), "--prompt", "brief",
                *render, "--seeds", "8", "--steps", "3", "--batch-size", "4", "--log-every", "1",
                "--eval-seeds", "2", "--max-new-tokens", "8"])

    # The console shows the phase's progress: the demonstrations, then the last step at least.
    printed = capsys.readouterr().out
    assert "warm start: 8 demonstrations in" in printed
    assert "warm start: step 3/3, loss " in printed and "min left" in printed
    records = [json.loads(line) for line in (out / "warm_start.jsonl").read_text().splitlines()]
    assert records[0]["demo/episodes"] == 8
    assert [r["step"] for r in records if "sft/loss" in r] == [1.0, 2.0, 3.0]
    evals = [(r["step"], r["eval/episodes"]) for r in records if "eval/episodes" in r]
    assert evals == [(0, 2.0), (3, 2.0)]

    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    before, after = (auto.from_pretrained(p, dtype=torch.float32).state_dict() for p in (base, out))
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert AutoTokenizer.from_pretrained(out).encode("<answer>Left</answer>") == \
        AutoTokenizer.from_pretrained(base).encode("<answer>Left</answer>")
    if vision:  # the actor reads the same image tokens from the warm start as from its base
        assert all(filecmp.cmp(base / name, out / name, shallow=False) for name in PROCESSOR_FILES)
        assert (VisionTokens.from_pretrained(str(out)).placeholder ==
                VisionTokens.from_pretrained(str(base)).placeholder)
        assert any(k.startswith("model.visual.") and not torch.equal(before[k], after[k])
                   for k in before)
    else:
        assert VisionTokens.from_pretrained(str(out)) is None


def test_an_image_env_needs_a_vision_language_model(tmp_path):
    base = build_tiny_model(tmp_path / "base", seed=0)
    with pytest.raises(ValueError, match="vision tokens"):
        main(["--model", str(base), "--out", str(tmp_path / "out"), "--render", "image",
              "--seeds", "2", "--steps", "1"])


def test_command_line_defaults_are_the_root_configs_warm_start():
    """``python -m launch.model.warm_start`` with no tuning flags warm-starts as ``make train`` does,
    and its flags are the run's warm_start keys, same names."""
    import dataclasses

    from launch.config.compose import compose

    config = compose([]).warm_start
    args = parse_args(["--model", "m", "--out", "o"])
    for f in dataclasses.fields(config):
        if f.name != "enabled":
            assert getattr(args, f.name) == getattr(config, f.name), f.name
    assert config_defaults() == config
    args = parse_args(["--model", "m", "--out", "o", "--action-noise", "0.3",
                       "--actions-per-turn", "null", "--seeds", "7"])
    assert (args.action_noise, args.actions_per_turn, args.seeds) == (0.3, None, 7)
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--out", "o", "--noise", "0.3"])  # the old name is gone


def test_demonstrations_built_in_processes_are_those_built_here(tmp_path):
    from launch.model.warm_start import demonstrations

    model = build_tiny_model(tmp_path / "tiny")
    kwargs = {"action_noise": 0.3, "rng_seed": 5, "mistake": "random"}
    config = load_config("frozenlake")
    here = demonstrations(str(model), "frozenlake", config, range(10, 17), **kwargs)
    apart = demonstrations(str(model), "frozenlake", config, range(10, 17), workers=3, **kwargs)
    assert [d.episode_id for d in apart] == list(range(7)) == [d.episode_id for d in here]
    for a, b in zip(here, apart):
        assert (a.seed, a.metrics) == (b.seed, b.metrics)
        assert np.array_equal(a.token_ids, b.token_ids)
        assert np.array_equal(a.turn_rewards, b.turn_rewards)
