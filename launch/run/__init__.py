"""One training run from start to summary: the loop (``loop``), the supervisor that owns the
actors (``supervisor``), checkpoints on disk (``checkpoints``), what the run writes and shows
(``metrics``), the processes' memory and CPU (``memory``), the episode pages (``pages``) and the
table of a sweep (``sweep``).

Imports launch/topology/, launch/model/ and launch/config/; no Ray (the topology holds it).
"""
