"""learner/checkpoint.py's RNG states: they survive a file that ``torch.load(weights_only=True)``
reads (no pickle executed on load), and restoring them replays every generator exactly."""

import random

import numpy as np
import torch

from learner.checkpoint import rng_states, set_rng_states


def _draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), np.random.randn(), random.random()


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.randn()  # leaves a cached Gaussian in numpy's state
    torch.save(rng_states(), tmp_path / "rng.pt")
    expected = _draws()
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    set_rng_states(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == expected
