"""learner/door.py and rank 0's Inbox: a trajectory that passes the wire's checks but means
nothing to the learner is refused with its reason, counted once, its credit returned; the
learner's buffer never holds it, and the accounting identity holds."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from PIL import Image

from learner import worker
from learner.door import REASONS, Door
from learner.worker import Inbox
from tests.unit.transport.trajectories import make_trajectory
from transport.channels import trajectory_sink
from transport.schema import GROUP_STRIDE, INCARNATION_STRIDE, EncodedImage

VOCAB, MAX_TOKENS, VERSION = 1000, 256, 3


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def _bad(reason: str, episode_id: int = 0):
    """A trajectory the wire accepts that the door must refuse for ``reason``."""
    t = make_trajectory(episode_id=episode_id, version=VERSION, length=64, seed=episode_id)
    if reason == "first_token_policy":
        t.loss_mask[0] = True
        t.policy_version[0] = VERSION
    elif reason == "token_out_of_vocab":
        t.token_ids[5] = VOCAB
    elif reason == "future_version":
        t.policy_version[t.loss_mask.nonzero()[0][-1]] = VERSION + 1
    elif reason == "too_long":
        t = make_trajectory(episode_id=episode_id, version=VERSION, length=MAX_TOKENS + 2)
    elif reason == "image":
        t.images.append(EncodedImage(png=_png(8, 8)[:-20], height=8, width=8))  # cut short
    return t


DOOR = Door(vocab_size=VOCAB, max_tokens=MAX_TOKENS)


def test_a_good_trajectory_passes_at_its_own_and_later_versions():
    t = make_trajectory(version=VERSION)
    t.images.append(EncodedImage(png=_png(12, 8), height=8, width=12))
    assert DOOR.refusal(t, VERSION) is None and DOOR.refusal(t, VERSION + 5) is None
    edge = make_trajectory(version=VERSION, length=MAX_TOKENS)
    edge.token_ids[:] = VOCAB - 1
    assert DOOR.refusal(edge, VERSION) is None  # the last id and the longest length pass


@pytest.mark.parametrize("reason", REASONS)
def test_each_meaningless_trajectory_is_refused_for_its_reason(reason):
    assert DOOR.refusal(_bad(reason), VERSION) == reason


def test_an_image_whose_size_is_not_what_it_says_is_refused():
    t = make_trajectory(version=VERSION)
    t.images.append(EncodedImage(png=_png(12, 8), height=12, width=8))  # swapped
    assert DOOR.refusal(t, VERSION) == "image"
    t.images[0] = EncodedImage(png=b"not a png at all", height=8, width=12)
    assert DOOR.refusal(t, VERSION) == "image"


def test_negative_ids_are_out_of_the_vocabulary():
    t = make_trajectory(version=VERSION)
    t.token_ids[3] = -1
    assert DOOR.refusal(t, VERSION) == "token_out_of_vocab"


def test_the_inbox_refuses_counts_returns_credit_and_keeps_the_identity():
    """Over a real ZeroMQ stream whose window holds about two messages: ten refused messages
    and then good ones all arrive, so the refused ones' credit came back."""
    good = [make_trajectory(episode_id=100 + i, version=VERSION, seed=i) for i in range(3)]
    bad = [_bad(REASONS[i % len(REASONS)], episode_id=i) for i in range(10)]
    window = 2 * len(good[0].to_bytes()) + 64
    inbox = Inbox("tcp://127.0.0.1:0", max_staleness=2, window_bytes=window, door=DOOR,
                  version=lambda: VERSION)
    sink = trajectory_sink(inbox.address, actor_id=7)
    try:
        for t in bad + good:
            sink.send(t, timeout_s=20)
        deadline = time.monotonic() + 20
        while len(inbox.buffer) < len(good) and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = inbox.stats(VERSION)
        assert stats["buffer/size"] == len(good)
        assert stats["buffer/refused"] == len(bad)
        assert {r: stats[f"buffer/refused_{r}"] for r in REASONS} == {r: 2.0 for r in REASONS}
        counts = inbox.per_actor()["actor-7"]
        assert counts == {"received": 13, "taken": 0, "dropped": 10}
        batch = inbox.take(3, VERSION, timeout_s=1)
        assert [t.episode_id for t in batch] == [100, 101, 102]
        assert np.array_equal(batch[0].token_ids, good[0].token_ids)
    finally:
        sink.close(flush_s=0)
        inbox.close()


def test_without_a_door_the_same_trajectory_reaches_the_buffer():
    """What the door stops would otherwise be trained on (and end the learner's step)."""
    inbox = Inbox("inproc://door-test", max_staleness=2)
    sink = trajectory_sink(inbox.address, actor_id=1)
    try:
        sink.send(_bad("first_token_policy"), timeout_s=5)
        deadline = time.monotonic() + 10
        while not len(inbox.buffer) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(inbox.buffer) == 1 and inbox.stats(VERSION)["buffer/refused"] == 0
    finally:
        sink.close(flush_s=0)
        inbox.close()


def test_the_inbox_counts_what_each_incarnation_sent_refused_ones_too_within_a_bound(monkeypatch):
    """The driver's ledger settles a dead incarnation with what the learner got from it."""
    monkeypatch.setattr(worker, "MAX_ORIGINS", 3)
    inbox = Inbox("inproc://origin-test", max_staleness=2, door=DOOR, version=lambda: VERSION)
    sink = trajectory_sink(inbox.address, actor_id=7)
    sent = []
    for i, incarnation in enumerate([0, 0, 1, 2, 3, 4]):  # 7/3 and 7/4 are past the bound
        t = _bad("token_out_of_vocab", episode_id=i) if i == 1 else make_trajectory(
            actor_id=7, episode_id=i, version=VERSION, seed=i)
        t.actor_id = 7
        t.group_id = 7 * GROUP_STRIDE + incarnation * INCARNATION_STRIDE + i
        assert t.origin == f"7/{incarnation}"
        sent.append(t)
    try:
        for t in sent:
            sink.send(t, timeout_s=5)
        deadline = time.monotonic() + 10
        while sum(inbox.received_by_origin().values()) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert inbox.received_by_origin() == {"7/0": 2, "7/1": 1, "7/2": 1, "others": 2}
        assert inbox.counters()["received_by_origin"] == inbox.received_by_origin()
    finally:
        sink.close(flush_s=0)
        inbox.close()
