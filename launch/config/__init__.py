"""The run's configuration: the typed schema Hydra composes into (``schema``), composing it
outside the Hydra entry (``compose``), the pure builders that map it to each component's config
(``builders``), command-line flags made from its dataclasses (``cli``) and the generator of
docs/config-reference.md (``reference``).

The bottom wing of launch/: imports the lower packages' configs and registries, nothing else of
launch/.
"""
