"""ActionWords: a one-turn task a model with random weights learns in a few RL steps.

The reward of an answer is the share of its characters (spaces aside) that spell action words (Up,
Down, Left, Right: the grid games' vocabulary), wherever they occur ("Downward" counts its
"Down"). A random model writes them rarely, so a rising reward shows that the whole loop (actors,
stream, learner, weight broadcast) learns, in minutes on a CPU. Used by the
end-to-end test of the real loop and for checking a new deployment: ``env=action_words
algorithm=grpo warm_start.enabled=false``. The prompt varies with the seed; the task does not.

Called through the env registry (envs/registry.py) like any env.
"""

from __future__ import annotations

import re

import gymnasium as gym

from envs.protocol import TEXT, observation_space

ACTION_WORDS = ("Up", "Down", "Left", "Right")
_WORD = re.compile("|".join(ACTION_WORDS))
PROMPTS = (
    "You are on a frozen lake. Which way do you go?",
    "Push the box onto the target. Your move?",
    "The goal is below and right of you. Act.",
    "Name your next actions.",
)


class ActionWordsEnv(gym.Env):
    """One turn; the prompt is the seed's. A gymnasium env like every env here (envs.protocol)."""

    def __init__(self, *, prompt: str = "none", max_turns: int = 1) -> None:
        if max_turns != 1:
            raise ValueError(f"ActionWords has one turn, got max_turns={max_turns}")
        self.prompt = prompt
        self.action_space, self.observation_space = TEXT, observation_space()
        self._seed = 0

    def system_prompt(self) -> str:
        return "" if self.prompt == "none" else "Answer with moves: Up, Down, Left or Right."

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self._seed = int(self.np_random.integers(2**31)) if seed is None else seed
        return {"text": PROMPTS[self._seed % len(PROMPTS)], "images": ()}, {}

    def step(self, llm_text: str) -> tuple[dict, float, bool, bool, dict]:
        hits = _WORD.findall(llm_text)
        chars = len("".join(llm_text.split()))
        reward = sum(map(len, hits)) / chars if chars else 0.0
        info = {"success": reward >= 0.5, "format_correct": True, "actions_valid": True,
                "actions": hits, "metrics": {"env_reward": reward, "n_actions": float(len(hits))}}
        return {"text": "done", "images": ()}, reward, True, False, info

    def state_text(self) -> str:
        return f"prompt {self._seed % len(PROMPTS)}"

    def close(self) -> None:
        pass


make_env = ActionWordsEnv
"""The registry's factory is the class: its signature is the keys a config may hold."""
