"""tests/benchmarks/bench_actor.episodes_of: the replay's episodes from recorded calls, by hand."""

from tests.benchmarks.bench_actor import episodes_of


def test_siblings_sharing_a_first_prompt_keep_their_own_turns():
    # Two episodes of a group start from the same prompt P. B's second turn is recorded before
    # A's, and A's third turn also starts with P: each turn must join the episode whose prompt
    # plus answer it starts with, not the first episode that shares P.
    p = [1, 2, 3]
    a1, b1 = [10, 11], [20]
    b2 = p + b1 + [7]
    a2 = p + a1 + [8, 8]
    a3 = a2 + [12] + [9]
    calls = [(p, a1), (p, b1), (b2, [21, 22]), (a2, [12]), (a3, [13])]
    assert episodes_of(calls) == [
        [(p, 2, [8, 8]), (a2, 1, [9]), (a3, 1, [])],
        [(p, 1, [7]), (b2, 2, [])],
    ]
