"""Shared by the grid-game tests: a correct answer, and an env set to a hand-drawn state."""
from tests.envs_api import env_reset


def answer(actions: list[str]) -> str:
    """A correct grounding_worldmodeling answer."""
    return (
        "<think><observation>I see it.</observation><reasoning>Go.</reasoning>"
        f"<prediction>It moves.</prediction></think><answer>{','.join(actions)}</answer>"
    )


def env_at(make_env, rows: str, **config):
    """An env (from the game's ``make_env``) whose state is the symbol grid ``rows``."""
    env = make_env(size=len(rows.split()), reasoning_reward=None, **config)
    env_reset(env, 0)
    env.game.load(rows)
    return env
