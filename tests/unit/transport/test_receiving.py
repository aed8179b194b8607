"""transport/receiving.py: each rejection counted once under its kind and its sender, and the
per-sender counts bounded however many identities the senders make up."""

from collections import Counter

import pytest

from tests.unit.transport.trajectories import make_trajectory
from transport.receiving import MAX_SENDER_KEYS, Rejected, count_rejected, decode_trajectory


def test_each_rejection_counts_once_by_kind_and_sender():
    rejected: Counter = Counter()
    for kind, actor in [("codec", "actor-1"), ("codec", "actor-1"), ("schema", "actor-2")]:
        count_rejected(rejected, kind, actor, "detail")
    assert rejected == Counter({"codec": 2, "codec/actor-1": 2, "schema": 1, "schema/actor-2": 1})


def test_made_up_identities_cannot_grow_the_counts_without_bound():
    rejected: Counter = Counter()
    senders = 3 * MAX_SENDER_KEYS
    for i in range(senders):
        count_rejected(rejected, "codec", f"rogue-{i}", "noise")
    assert len(rejected) == MAX_SENDER_KEYS + 1  # the kind, the first senders, then others
    assert rejected["codec"] == senders
    assert sum(v for k, v in rejected.items() if k.startswith("codec/")) == senders
    count_rejected(rejected, "codec", "rogue-1", "again")  # a sender already counted keeps its key
    assert rejected["codec/rogue-1"] == 2


def test_a_payload_over_the_bound_is_rejected_before_decoding():
    payload = make_trajectory().to_bytes()
    assert decode_trajectory(payload, "a", len(payload)).episode_id == 0
    with pytest.raises(Rejected) as e:
        decode_trajectory(payload, "a", len(payload) - 1)
    assert e.value.kind == "too_large"
