"""Environments: the agent protocol (gymnasium envs, registered as ``vagen/...`` ids on import),
reasoning formats, built-in envs and env worker pools.

Imports transport only (for the wire codec); knows nothing of actors or learner.
"""

from envs.registry import make

__all__ = ["make"]
