"""learner/buffer.py: FIFO batches, the staleness bound, and exact accounting of every entry."""

import pytest

from learner.buffer import TrajectoryBuffer
from tests.unit.transport.trajectories import make_trajectory


def test_fifo_batches_and_release():
    released = []
    buf = TrajectoryBuffer(max_staleness=2, release=lambda a, n: released.append((a, n)))
    for i in range(5):
        buf.put(f"actor-{i % 2}", make_trajectory(i % 2, i, version=3), 100 + i)
    assert buf.take(6, current_version=3) is None and len(buf) == 5  # too few: nothing taken
    batch = buf.take(3, current_version=3)
    assert [t.episode_id for t in batch] == [0, 1, 2]
    assert released == [("actor-0", 100), ("actor-1", 101), ("actor-0", 102)]


@pytest.mark.parametrize("on_stale", ["drop", "keep"])
def test_staleness_bound(on_stale):
    released = []
    buf = TrajectoryBuffer(max_staleness=1, on_stale=on_stale, release=lambda a, n: released.append(n))
    for version in (0, 1, 2, 3):  # at version 3: staleness 3, 2, 1, 0
        buf.put("actor-0", make_trajectory(version=version, episode_id=version), 10)
    assert buf.staleness(3) == [3, 2, 1, 0]
    if on_stale == "drop":
        batch = buf.take(2, current_version=3)
        assert [t.episode_id for t in batch] == [2, 3]
        assert buf.dropped["stale"] == 2 and buf.dropped_by_actor["actor-0"] == 2
    else:
        batch = buf.take(4, current_version=3)
        assert len(batch) == 4 and buf.stale_kept == 2 and not buf.dropped
    assert len(released) == 4  # every entry's bytes came back exactly once


def test_staleness_uses_the_oldest_token_version():
    t = make_trajectory(version=5)
    t.policy_version[t.loss_mask.nonzero()[0][0]] = 1  # one early token from version 1
    buf = TrajectoryBuffer(max_staleness=3)
    buf.put("a", t, 1)
    assert buf.take(1, current_version=5) is None and buf.dropped["stale"] == 1


def test_accounting_holds_for_random_traffic():
    import random

    rng = random.Random(0)
    released = []
    buf = TrajectoryBuffer(max_staleness=2, release=lambda actor, n: released.append(n))
    version, put = 0, 0
    for step in range(300):
        actor = f"actor-{rng.randrange(3)}"
        nbytes = rng.randrange(1, 1000)
        buf.put(actor, make_trajectory(version=max(0, version - rng.randrange(5))), nbytes)
        put += nbytes
        if step % 7 == 0:
            buf.take(rng.randrange(1, 4), current_version=version)
            version += 1
        # the bytes it holds are those of its entries: what was put and not released
        assert buf.bytes == put - sum(released) == sum(n for g in buf._groups.values() for _, _, n in g.entries)
    for actor in buf.received:
        held = sum(1 for g in buf._groups.values() for a, _, _ in g.entries if a == actor)
        assert buf.received[actor] == buf.taken[actor] + buf.dropped_by_actor[actor] + held


def _member(actor_id, group, k, *, episode, version=0):
    t = make_trajectory(actor_id, episode, version=version, seed=group)
    t.group_size = k
    return t


def test_batches_take_whole_groups_in_arrival_order():
    buf = TrajectoryBuffer(max_staleness=2, group_size=3)
    # group 1 (3 members) arrives interleaved with group 2 (3) and group 3 (3, last incomplete)
    order = [(1, 0), (2, 1), (1, 2), (3, 3), (2, 4), (1, 5), (3, 6), (2, 7)]
    for group, episode in order:
        buf.put("a", _member(0, group, 3, episode=episode), 1)
    # 4 wanted: group 1 alone (3) is not enough, groups 1 and 2 (6) are: no group is split
    assert [t.episode_id for t in buf.take(4, current_version=0)] == [0, 2, 5, 1, 4, 7]
    assert buf.take(1, current_version=0) is None  # group 3 is still missing a member
    buf.put("a", _member(0, 3, 3, episode=8), 1)
    assert [t.episode_id for t in buf.take(1, current_version=0)] == [3, 6, 8]
    assert len(buf) == 0 and buf.partial_groups_taken == 0


@pytest.mark.parametrize("policy", ["train", "drop"])
def test_a_group_that_lost_a_member_is_trained_or_dropped_and_counted(policy):
    buf = TrajectoryBuffer(max_staleness=2, group_size=3, partial_groups=policy)
    for episode in range(2):  # the actor sent 2 of 3: one episode failed
        buf.put("a", _member(0, 1, 2, episode=episode), 1)
    for episode in range(2, 5):
        buf.put("a", _member(0, 2, 3, episode=episode), 1)
    batch = buf.take(3, current_version=0)
    if policy == "train":
        assert [t.episode_id for t in batch] == [0, 1, 2, 3, 4] and buf.partial_groups_taken == 1
    else:
        assert [t.episode_id for t in batch] == [2, 3, 4] and buf.dropped["partial_group"] == 2
    assert buf.received["a"] == buf.taken["a"] + buf.dropped_by_actor["a"] == 5


def test_a_group_that_never_completes_is_dropped_once_stale():
    released = []
    buf = TrajectoryBuffer(max_staleness=1, on_stale="keep", group_size=3,
                           release=lambda a, n: released.append(n))
    buf.put("a", _member(0, 1, 3, episode=0, version=0), 7)  # its actor died while sending
    buf.put("a", _member(0, 2, 1, episode=1, version=1), 7)
    assert buf.take(1, current_version=1) is not None and len(buf) == 1  # 1 version old: waits
    assert buf.take(1, current_version=2) is None and buf.dropped["incomplete_group"] == 1
    assert len(buf) == 0 and released == [7, 7]


def test_grouped_traffic_keeps_the_accounting():
    import random

    rng = random.Random(1)
    buf = TrajectoryBuffer(max_staleness=1, group_size=4, partial_groups="drop")
    version, sent = 0, 0
    for group in range(200):
        actor = f"actor-{rng.randrange(3)}"
        k = rng.choice([4, 4, 4, 3, 0])
        for _ in range(k if rng.random() > 0.05 else k - 1):  # a few arrive incomplete
            buf.put(actor, _member(0, group, k, episode=sent, version=max(0, version - rng.randrange(3))), 1)
            sent += 1
        if group % 5 == 0:
            batch = buf.take(rng.randrange(1, 9), current_version=version)
            if batch:
                ids = {t.group_id for t in batch if t.group_size}
                assert all(sum(t.group_id == g for t in batch) == next(
                    t.group_size for t in batch if t.group_id == g) for g in ids)  # whole groups
            version += 1
    for actor in buf.received:
        held = sum(1 for g in buf._groups.values() for a, _, _ in g.entries if a == actor)
        assert buf.received[actor] == buf.taken[actor] + buf.dropped_by_actor[actor] + held


def test_bad_config():
    with pytest.raises(ValueError):
        TrajectoryBuffer(max_staleness=-1)
    with pytest.raises(ValueError):
        TrajectoryBuffer(max_staleness=1, on_stale="downweight")
    with pytest.raises(ValueError, match="partial_groups"):
        TrajectoryBuffer(max_staleness=1, partial_groups="wait")


def test_a_checkpoints_counters_carry_on_with_what_was_buffered_counted_dropped():
    buf = TrajectoryBuffer(max_staleness=1)
    for i in range(5):
        buf.put(f"actor-{i % 2}", make_trajectory(i % 2, i, version=0), 10)
    buf.refuse("actor-1", "token_out_of_vocab", 10)
    assert len(buf.take(3, current_version=0)) == 3  # 2 left buffered: actor-1's and actor-0's
    saved = buf.counters()
    assert saved == {"received": {"actor-0": 3, "actor-1": 3}, "taken": {"actor-0": 2, "actor-1": 1},
                     "dropped": {"refused/token_out_of_vocab": 1, "resumed": 2},
                     "dropped_by_actor": {"actor-0": 1, "actor-1": 2},
                     "stale_kept": 0, "partial_groups_taken": 0}
    resumed = TrajectoryBuffer(max_staleness=1)
    resumed.carry(saved)
    resumed.put("actor-0", make_trajectory(0, 9, version=0), 10)
    assert len(resumed.take(1, current_version=0)) == 1
    for actor in ("actor-0", "actor-1"):  # received == taken + dropped + buffered, across the resume
        assert resumed.received[actor] == resumed.taken[actor] + resumed.dropped_by_actor[actor]
    assert resumed.received["actor-0"] == 4 and resumed.dropped["resumed"] == 2
