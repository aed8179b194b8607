"""The Navigation env on the real MiniWorld (envs/navigation/): headless rendering, the expert,
the rewards, determinism, bad answers and the demonstrations."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from envs.navigation.game import step
from envs.registry import make, resolve_config
from tests.envs_api import env_reset, env_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _answer(actions: list[str]) -> str:
    return f"<think>I go.</think><answer>{','.join(actions)}</answer>"


@pytest.fixture(scope="module")
def env():
    env = make("navigation", **resolve_config("navigation", {"image_size": 64}))
    yield env
    env.close()


def test_it_renders_headless_with_no_display():
    code = ("import envs.navigation.world as w; import numpy as np\n"
            "world = w.NavWorld(32); world.generate(3); image = world.picture()\n"
            "assert image.shape == (32, 32, 3) and image.dtype == np.uint8\n"
            "assert len(np.unique(image.reshape(-1, 3), axis=0)) > 10\n"
            "world.close(); print('rendered')")
    environ = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "rendered", out.stderr[-2000:]


def test_envs_in_one_process_draw_their_own_rooms():
    # An env worker holds several envs; MiniWorld compiles every room into the same display list.
    config = resolve_config("navigation", {"image_size": 32})
    envs = [make("navigation", **config) for _ in range(3)]
    try:
        first = env_reset(envs[0], 1).images[0]
        env_reset(envs[1], 2), env_reset(envs[2], 3)
        again = env_step(envs[0], "no answer").observation.images[0]  # nothing moved
        assert np.array_equal(again, first)
    finally:
        for env in envs:
            env.close()


def test_the_expert_reaches_the_target_within_the_turns_on_every_seed(env):
    for seed in range(40):
        obs = env_reset(env, seed)
        game = env.game
        assert f"Navigate to the {game.target} and be as close as possible to it." in obs.text
        assert game.distance() >= 2.5
        plan = env.solve()
        rewards, turns = [], 0
        while True:
            result = env_step(env, _answer(plan[:5]))
            plan, turns = plan[5:], turns + 1
            rewards.append(result.reward)
            if result.done:
                break
        assert result.info["success"] and turns <= 4, seed
        assert game.distance() <= 1.5
        # +0.5 per well-formed turn, +10 once, on the turn that arrives
        assert rewards == [0.5] * (turns - 1) + [10.5], seed


def test_the_same_seed_is_the_same_room_and_picture(env):
    first = env_reset(env, 11)
    state, things = env.state_text(), env.game.things
    again = env_reset(env, 11)
    assert again.text == first.text and env.state_text() == state and env.game.things == things
    assert np.array_equal(again.images[0], first.images[0])
    others = {tuple(t.name for t in env.game.things) for s in range(12) if env_reset(env, s)}
    assert len(others) > 6


def test_turning_changes_the_picture_and_the_directions(env):
    obs = env_reset(env, 5)
    where = env.state_text().splitlines()[0].split()[-1]
    result = env_step(env, _answer(["rotateleft"]))
    assert not np.array_equal(result.observation.images[0], obs.images[0])
    after = env.state_text().splitlines()[0].split()[-1]
    turned = {"ahead": "right", "left": "ahead", "back": "left", "right": "back"}
    assert after == turned[where]


def test_a_bad_answer_executes_nothing_and_a_bad_action_stops_the_turn(env):
    env_reset(env, 2)
    pose = env.game.pose
    result = env_step(env, "moveahead")  # no tags
    assert env.game.pose == pose and result.reward == 0.0 and not result.info["format_correct"]
    result = env_step(env, _answer(["rotateleft", "fly", "moveahead"]))
    assert result.info["actions"] == ["rotateleft"] and result.reward == 0.0
    assert env.game.pose.heading == (pose.heading + 1) % 4 and (env.game.pose.i, env.game.pose.j) == (0, 0)


def test_a_wall_stops_the_agent(env):
    env_reset(env, 3)
    for _ in range(3):  # 15 steps ahead cross any room
        env_step(env, _answer(["moveahead"] * 5))
    pose = env.game.pose
    ahead = step(pose, "moveahead")
    assert env.game.world.free(pose.x, pose.z) and not env.game.world.free(ahead.x, ahead.z)
    assert env.game._next(pose, "moveahead") == pose  # blocked: the agent stays where it is


def test_the_action_cap_ends_the_episode_failed():
    env = make("navigation", **resolve_config("navigation", {"image_size": 32, "max_steps": 3,
                                                            "max_actions_per_turn": 5}))
    try:
        env_reset(env, 0)
        result = env_step(env, _answer(["lookup", "lookdown", "lookup", "lookdown"]))
        assert result.done and not result.info["success"]
        assert result.info["actions"] == ["lookup", "lookdown", "lookup"]
    finally:
        env.close()


def test_text_mode_lists_what_is_in_view_and_the_judge_rewards_the_truth():
    env = make("navigation", **resolve_config("navigation", {
        "render": "text", "format": "grounding", "reasoning_reward": {"judge": "rule"}}))
    try:
        obs = env_reset(env, 4)
        assert not obs.images
        view = env.game.view_text(env.game.pose)
        assert view in obs.text
        seen = [t.name for t in env.game.visible(env.game.pose)]
        assert [line.split(":")[0] for line in view.splitlines() if ":" in line] == seen
        truth = env.state_text()
        good = env_step(env, f"<think><observation>{truth}</observation><reasoning>go"
                             f"</reasoning></think><answer>lookup</answer>")
        assert good.info["metrics"]["reasoning/observation_score"] == 1.0
        bad = env_step(env, "<think><observation>nothing</observation><reasoning>go</reasoning>"
                            "</think><answer>lookdown</answer>")
        assert bad.info["metrics"]["reasoning/observation_score"] == 0.0
        assert good.reward > bad.reward
    finally:
        env.close()


def test_demonstrations_succeed_without_noise_and_wander_with_it():
    from actors.demonstrations import make_demonstrations
    from launch.model.tiny_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(seed=0)
    config = resolve_config("navigation", {"render": "text", "format": "free_think"})
    clean = make_demonstrations("navigation", config, tokenizer, [1, 2, 3], action_noise=0.0,
                                rng_seed=0)
    for traj in clean:
        assert traj.metrics["success"] == 1.0 and traj.metrics["random_action_share"] == 0.0
        text = tokenizer.decode(traj.token_ids.tolist())
        assert "<think>target " in text and " so I " in text
    noisy = make_demonstrations("navigation", config, tokenizer, [1, 2, 3], action_noise=1.0,
                                rng_seed=0)
    assert all(t.metrics["random_action_share"] == 1.0 for t in noisy)
    assert np.mean([t.metrics["success"] for t in noisy]) < 1.0
    # the systematic mistakes work here as for the grid games: the habit is always moveahead
    habit = make_demonstrations("navigation", config, tokenizer, [1, 2, 3], action_noise=1.0,
                                rng_seed=0, mistake="habit")
    written = [tokenizer.decode(t.token_ids[t.loss_mask].tolist()) for t in habit]  # the answers alone
    answers = [a for text in written for a in re.findall(r"<answer>(.*?)</answer>", text)]
    assert answers and all(set(re.split(r"\W+", a.strip())) <= {"moveahead", ""} for a in answers), answers


def test_textures_are_decoded_to_the_bytes_pyglet_gives():
    import pyglet
    from miniworld.utils import get_file_path

    from envs.navigation.world import rgba_rows

    for path in (get_file_path("textures", "stucco_1", "png"), get_file_path("meshes", "duckie", "png")):
        image = pyglet.image.load(path)
        theirs = np.frombuffer(image.get_image_data().get_data("RGBA", image.width * 4), np.uint8)
        ours = np.frombuffer(rgba_rows(path), np.uint8)
        # The colours, row for row; the textures are stored as RGB, so alpha is dropped (pyglet
        # fills an RGB file's alpha with its red, Pillow with 255).
        assert np.array_equal(ours.reshape(-1, 4)[:, :3], theirs.reshape(-1, 4)[:, :3])
