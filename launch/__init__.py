"""Where a run starts and how it is put together: everything above the four lower packages.

Wings, each a package that says what it owns; each imports only the wings below it
(``lint-imports`` checks this order, pyproject.toml):

- ``launch/train.py``: the Hydra entry, ``python -m launch.train``;
- ``launch/run/``: one run from start to summary: the loop, the supervisor (the one owner of the
  actors), checkpoints on disk, metrics, memory, the episode pages, the sweep table;
- ``launch/topology/``: where the processes live: the ``Cluster`` Protocol, its Ray and
  in-process backends, placement, and the factory that picks one;
- ``launch/model/``: the model a run starts from: hub access, the tiny models, the warm start,
  episodes played with transformers;
- ``launch/config/``: the run's typed schema, composing it, the builders that map it to each
  component's config, the command-line helpers and the reference generator;
- ``launch/tools/``: install-time tools, imported by nothing.
"""
