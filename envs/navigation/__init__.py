"""VAGEN's Navigation env on MiniWorld: world.py (the room, the camera), game.py (the rules, the
expert and ``make_env``). Importing this package imports no simulator; ``game.make_env`` does."""
