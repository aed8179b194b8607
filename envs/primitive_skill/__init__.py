"""VAGEN's PrimitiveSkill env on ManiSkill 3: tasks.py (the simulated tasks), skills.py (the pick /
place / push controller), game.py (the game and ``make_env``). Importing this package imports no
simulator; ``game.make_env`` does."""
