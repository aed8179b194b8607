"""envs/text_env.py and the environments of other ecosystems through it: reasoning-gym's tasks
(envs/reasoning_task.py), TextArena's games (envs/textarena_game.py) and OpenEnv's template
environment, in this process and behind its own server (envs/openenv_env.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from envs import splits
from envs.registry import check_config, has_solver, make, resolve_config
from envs.text_env import Outcome, TextEnv
from tests.envs_api import env_reset, env_step
from tests.openenv_template import ENTRY_POINT, serve, write_template


def reply(answer: str) -> str:
    return f"<think>I think.</think><answer>{answer}</answer>"


class Scripted:
    """A source that counts its calls: the answer "win" succeeds, "bad" is an invalid move."""

    name, task, answer_is, example = "scripted", "Say win.", "a word", "win"
    has_reference, draws = True, False

    def __init__(self, layouts: int = 1000) -> None:
        self.acts, self.ends, self.layouts, self._seed = [], 0, layouts, 0

    def start(self, seed: int) -> Outcome:
        self._seed = seed
        return Outcome(f"start {seed % self.layouts}")

    def layout(self) -> str:
        return str(self._seed % self.layouts)

    def act(self, answer: str) -> Outcome:
        self.acts.append(answer)
        if answer == "bad":
            return Outcome("no such move", valid=False)
        win = answer == "win"
        return Outcome("won" if win else "again", reward=2.0 * win, done=win, success=win)

    def reference(self, rng, noise):
        return ("lose", True) if rng.random() < noise else ("win", False)

    def end(self) -> None:
        self.ends += 1

    def close(self) -> None:
        pass


def test_a_malformed_reply_never_reaches_the_source_and_earns_nothing():
    source = Scripted()
    env = TextEnv(source, max_turns=3, held_out=False)
    env_reset(env, 1)
    result = env_step(env, "win")  # no tags
    assert source.acts == [] and result.reward == 0.0 and not result.done
    assert result.info["format_correct"] is False and result.info["actions_valid"] is False
    assert "not in the required format (missing <think>)" in result.observation.text
    result = env_step(env, reply("bad"))  # well-formed, but the game refuses the move
    assert source.acts == ["bad"] and result.reward == 0.0 and result.info["metrics"]["invalid"] == 1.0
    result = env_step(env, reply("again"))  # the last turn: truncated, no success
    assert result.reward == 0.5 and result.done and not result.info["success"] and source.ends == 1
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(reply("win"))


def test_a_win_pays_the_source_reward_and_the_format_reward_and_ends_the_episode():
    source = Scripted()
    env = TextEnv(source, max_turns=3, held_out=False, format="no_think", format_reward=0.25)
    env_reset(env, 1)
    _, reward, terminated, truncated, info = env.step("<answer>win</answer>")
    assert (reward, terminated, truncated, info["success"]) == (2.25, True, False, True)
    assert info["actions"] == ["win"] and source.ends == 1


def test_held_out_seeds_play_only_maps_of_their_split():
    env = TextEnv(Scripted(layouts=200), held_out=True)
    for seed in [*range(20), *splits.seeds_of("test", 20)]:
        key = env.reset(seed=seed)[1]["map"]
        assert splits.split_of(key) == splits.seed_split(seed)
    one_map = TextEnv(Scripted(layouts=1), held_out=True)
    with pytest.raises(RuntimeError, match="held_out=false"):
        one_map.reset(seed=splits.seeds_of("test", 1)[0])


def test_demonstrations_answer_with_the_reference_and_count_their_mistakes():
    env = TextEnv(Scripted(), format="free_think", held_out=False)
    env_reset(env, 0)
    rng = np.random.default_rng(0)
    replies = [env.demonstrate(rng, 0.5) for _ in range(200)]
    assert {r for r, _, _ in replies} == {reply_ for reply_ in
                                         (f"<think>I work it out and give my answer.</think><answer>{a}</answer>"
                                          for a in ("win", "lose"))}
    assert 60 < sum(wrong for _, wrong, _ in replies) < 140
    with pytest.raises(ValueError, match="no_think or free_think"):
        TextEnv(Scripted(), format="grounding", held_out=False).demonstrate(rng, 0.0)


def test_the_judge_is_refused_for_a_source_without_state_text():
    with pytest.raises(ValueError, match="reasoning_reward=null"):
        TextEnv(Scripted(), reasoning_reward={"judge": "rule"})
    with pytest.raises(ValueError, match="render=text"):
        TextEnv(Scripted(), render="image")


# reasoning-gym


@pytest.mark.parametrize("task", ["basic_arithmetic", "chain_sum"])
def test_a_reasoning_gym_answer_is_scored_by_the_task(task):
    env = make("reasoning_gym", **resolve_config("reasoning_gym", {"task": task}))
    obs = env_reset(env, 3)
    answer = env.source._entry["answer"]
    assert obs.text == env.source._entry["question"]
    _, reward, terminated, _, info = env.step(reply(answer))
    assert (reward, terminated, info["success"], info["metrics"]["score"]) == (1.5, True, True, 1.0)
    env_reset(env, 3)
    result = env_step(env, reply("not a number"))
    assert (result.reward, result.done, result.info["success"]) == (0.5, True, False)
    env.close()


def test_a_retry_turn_tells_the_score_and_a_second_answer_can_succeed():
    env = make("reasoning_gym", **resolve_config("reasoning_gym", {"max_turns": 2, "format": "no_think"}))
    env_reset(env, 11)
    first = env_step(env, "<answer>12345678</answer>")
    assert not first.done and "Your answer scored 0.00 of 1. Try again." in first.observation.text
    second = env_step(env, f"<answer>{env.source._entry['answer']}</answer>")
    assert second.done and second.info["success"] and second.reward == 1.5


def test_reasoning_gym_seeds_replay_and_hold_questions_out():
    config = resolve_config("reasoning_gym", {"task": "chain_sum"})
    a, b = make("reasoning_gym", **config), make("reasoning_gym", **config)
    assert env_reset(a, 5).text == env_reset(b, 5).text != env_reset(b, 6).text
    figures = splits.report(lambda **c: make("reasoning_gym", **c), config,
                            splits.seeds_of("test", 64), 512)
    assert figures["shared"] == 0 and figures["eval_maps"] == 64


def test_a_scorer_that_raises_scores_zero_and_is_counted(monkeypatch):
    env = make("reasoning_gym", **resolve_config("reasoning_gym", {}))
    env_reset(env, 0)
    monkeypatch.setattr(env.source.dataset, "score_answer", lambda *a: 1 / 0)
    result = env_step(env, reply("1"))
    assert result.info["metrics"]["scorer_error"] == 1.0 and result.info["metrics"]["score"] == 0.0


def test_reasoning_gym_settings_are_checked_before_an_env_is_built():
    with pytest.raises(ValueError, match="has no task 'no_such_task'"):
        make("reasoning_gym", **resolve_config("reasoning_gym", {"task": "no_such_task"}))
    with pytest.raises(ValueError, match="env 'reasoning_gym'.*max_actions_per_turn"):
        check_config("reasoning_gym", {**resolve_config("reasoning_gym", {}), "max_actions_per_turn": 2})
    assert has_solver("reasoning_gym", resolve_config("reasoning_gym", {}))
    assert not has_solver("reasoning_gym", resolve_config("reasoning_gym", {"task": "propositional_logic"}))


# TextArena


HANOI = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


def test_tower_of_hanoi_is_won_by_its_seven_moves():
    env = make("textarena", **resolve_config("textarena", {}))
    obs = env_reset(env, 0)
    assert "Tower of Hanoi with 3 disks" in obs.text and "A: [3, 2, 1]" in obs.text
    rewards = []
    for move in HANOI:
        result = env_step(env, reply(move))
        rewards.append(result.reward)
        assert result.info["actions_valid"]
    assert result.done and result.info["success"] and result.info["metrics"]["game_reward"] == 1.0
    assert rewards == [0.5] * 6 + [1.5]
    assert "[A C]" not in obs.text.split("Current Board")[1]  # the answer's echo is not shown back


def test_an_invalid_move_is_the_games_to_judge_and_the_second_in_a_row_ends_it():
    env = make("textarena", **resolve_config("textarena", {}))
    env_reset(env, 0)
    first = env_step(env, reply("[C A]"))  # tower C is empty
    assert (first.reward, first.done, first.info["actions_valid"]) == (0.0, False, False)
    assert "You tried to move a disk from an empty tower" in first.observation.text
    second = env_step(env, reply("[B A]"))
    assert second.done and not second.info["success"] and second.info["metrics"]["game_reward"] == 0.0


def test_textarena_games_in_one_process_keep_their_own_randomness():
    # Minesweeper lays its mines at the first move from Python's global generator
    config = resolve_config("textarena", {"id": "Minesweeper-v0"})
    alone = make("textarena", **config)
    env_reset(alone, 4)
    expected = env_step(alone, reply("[3 3]")).observation.text
    crowd = [make("textarena", **config) for _ in range(3)]
    for i, env in enumerate(crowd):
        env_reset(env, 4 if i == 1 else i)
    random.seed(12345)
    outer = random.getstate()
    texts = [env_step(env, reply("[3 3]")).observation.text for env in crowd]
    assert texts[1] == expected and random.getstate() == outer


def test_mastermind_holds_codes_out_and_replays_by_seed():
    config = resolve_config("textarena", {"id": "Mastermind-v0", "held_out": True})
    a, b = make("textarena", **config), make("textarena", **config)
    assert env_reset(a, 9).text == env_reset(b, 9).text
    assert a.source.layout() == b.source.layout()
    figures = splits.report(lambda **c: make("textarena", **c), config, splits.seeds_of("test", 32), 256)
    assert figures["shared"] == 0


def _first_listed(text: str) -> str:
    return text.rsplit("Available Moves:", 1)[1].split("'")[1]


def test_tictactoe_is_played_against_a_fixed_opponent_the_same_way_for_a_seed():
    config = resolve_config("textarena", {"id": "TicTacToe-v0", "num_players": 2,
                                          "opponent": "random_available", "max_turns": 9})

    def game(seed: int) -> list[str]:
        env = make("textarena", **config)
        texts = [env_reset(env, seed).text]
        while True:
            result = env_step(env, reply(_first_listed(texts[-1])))
            texts.append(result.observation.text)
            if result.done:
                reward = result.info["metrics"]["game_reward"]
                assert reward in (-1.0, 0.0, 1.0) and result.info["success"] == (reward == 1.0)
                assert result.reward == 0.5 + reward
                return texts

    first = game(3)
    assert "Player 1 placed their symbol (X)" in first[1]  # the opponent moved between our turns
    assert game(3) == first and any(game(seed) != first for seed in (4, 5, 6))


def test_a_move_the_game_refuses_is_invalid_in_a_game_for_two():
    env = make("textarena", **resolve_config("textarena", {"id": "TicTacToe-v0", "num_players": 2,
                                                           "opponent": "random_available"}))
    env_reset(env, 0)
    env_step(env, reply("[4]"))
    refused = env_step(env, reply("[4]"))  # our own mark is there
    assert not refused.info["actions_valid"] and "cell 4 is already occupied" in refused.observation.text


def test_textarena_refuses_games_it_cannot_play_with_a_reason():
    with pytest.raises(ValueError, match="is not a game for 1 player"):
        env_reset(make("textarena", **resolve_config("textarena", {"id": "TicTacToe-v0"})), 0)
    with pytest.raises(ValueError, match="needs an opponent: env.opponent"):
        make("textarena", **resolve_config("textarena", {"id": "TicTacToe-v0", "num_players": 2}))
    with pytest.raises(ValueError, match="lists no available moves"):
        env_reset(make("textarena", **resolve_config("textarena", {"id": "Nim-v0", "num_players": 2,
                                                                   "opponent": "random_available",
                                                                   "seat": 1})), 0)
    with pytest.raises(RuntimeError, match="NLTK's 'words' data.*nltk.downloader words"):
        env_reset(make("textarena", **resolve_config("textarena", {"id": "Wordle-v0"})), 0)
    with pytest.raises(ValueError, match="has no game 'NoSuchGame-v0'"):
        make("textarena", **resolve_config("textarena", {"id": "NoSuchGame-v0"}))
    assert not has_solver("textarena", resolve_config("textarena", {}))


# OpenEnv


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return write_template(tmp_path_factory.mktemp("openenv"))


def test_the_openenv_template_runs_in_process(template):
    config = resolve_config("openenv", {"import_path": str(template), "entry_point": ENTRY_POINT,
                                        "success_reward": 1.0})
    env = make("openenv", **config)
    obs = env_reset(env, 0)
    assert "echoed_message: Echo Env environment ready!" in obs.text
    short = env_step(env, reply("hello"))  # the echo env pays 0.1 a character, up to 1
    assert short.reward == pytest.approx(0.5 + 0.5) and not short.done
    assert "echoed_message: hello" in short.observation.text
    long = env_step(env, reply("hello world"))
    assert long.done and long.info["success"] and long.reward == pytest.approx(1.5)


def test_a_json_answer_is_validated_by_the_action_class_before_the_environment(template):
    config = resolve_config("openenv", {"import_path": str(template), "entry_point": ENTRY_POINT,
                                        "action_field": None, "max_turns": 5})
    env = make("openenv", **config)
    env_reset(env, 0)
    steps = env.source.env.state.step_count
    for answer, why in [("{", "not JSON"), ("[1]", "a JSON object is wanted"),
                        ('{"message": 3}', "message: Input should be a valid string"),
                        ('{"message": "a", "x": 1}', "x: Extra inputs are not permitted")]:
        result = env_step(env, reply(answer))
        assert not result.info["actions_valid"] and why in result.observation.text, answer
    assert env.source.env.state.step_count == steps  # the environment never saw them
    assert env_step(env, reply('{"message": "abc"}')).info["actions_valid"]


def test_the_template_server_is_played_one_session_an_episode(template):
    with serve(template) as url:
        config = resolve_config("openenv", {"url": url, "session_wait_s": 1.0, "max_turns": 2})
        a, b = make("openenv", **config), make("openenv", **config)
        assert "Echo Env environment ready!" in env_reset(a, 0).text
        with pytest.raises(RuntimeError, match="no free session for 1 s.*max_concurrent_envs"):
            env_reset(b, 1)  # the template serves one session at a time
        bad = env_step(a, reply('{"message": 1}'))
        assert bad.info["actions_valid"]  # the answer's text is the message field: any text is valid
        assert env_step(a, reply("hi")).done  # the turn limit ends the episode, and its session
        assert "Echo Env environment ready!" in env_reset(b, 1).text
        b.close()
        json_config = {**config, "action_field": None}
        c = make("openenv", **json_config)
        env_reset(c, 0)
        refused = env_step(c, reply('{"message": 1}'))
        assert not refused.info["actions_valid"] and "1 is not of type 'string'" in refused.observation.text
        c.close(), a.close()


def test_openenv_settings_are_refused_with_a_reason(template):
    with pytest.raises(ValueError, match="exactly one of entry_point"):
        make("openenv", **resolve_config("openenv", {}))
    with pytest.raises(RuntimeError, match="no OpenEnv server answers"):
        make("openenv", **resolve_config("openenv", {"url": "http://127.0.0.1:9"}))
    with pytest.raises(ValueError, match="returns no pictures: env.render=text"):
        make("openenv", **resolve_config("openenv", {"import_path": str(template), "entry_point": ENTRY_POINT,
                                                     "render": "image"}))



def test_an_openenv_observation_with_a_picture_is_shown_as_an_image():
    config = resolve_config("openenv", {"entry_point": "tests.unit.envs.painter_env:Painter",
                                        "image_fields": ["canvas"], "render": "image",
                                        "image_size": 12, "action_field": "colour"})
    env = make("openenv", **config)
    obs = env_reset(env, 0)
    assert obs.text.count("<image>") == 1 and obs.images[0].shape == (12, 12, 3)
    assert "paint it" in obs.text and "canvas" not in obs.text
    red = env_step(env, reply("red")).observation.images[0]
    assert tuple(red[6, 6]) == (255, 0, 0) and tuple(red[0, 6]) == (255, 255, 255)  # padded white
    assert env_step(env, reply("green")).done
    with pytest.raises(ValueError, match="returns pictures: env.render=image"):
        make("openenv", **{**config, "render": "text"})
    with pytest.raises(ValueError, match="names no pydantic action class.*env.action_class"):
        make("openenv", **{**config, "entry_point": "tests.unit.envs.painter_env:Unannotated"})
    assert make("openenv", **{**config, "entry_point": "tests.unit.envs.painter_env:Unannotated",
                              "action_class": "tests.unit.envs.painter_env:Paint"}).source.draws
