"""The engine's requests beside the trajectories made of them, for tests of a real model's
token-in-token-out: record what a vLLM engine served, and check each trained turn against it."""

import numpy as np


def record_requests(engine, requests: list) -> None:
    """Wrap ``engine.generate`` (on this instance) so that each request it serves appends
    (prompt ids, answer ids, finish reason) to ``requests`` once its answer is complete."""
    generate = engine.generate

    async def recording(prompt, params, request_id):
        final = None
        async for output in generate(prompt, params, request_id):
            final = output
            yield output
        out = final.outputs[0]
        requests.append((list(final.prompt_token_ids), list(out.token_ids), out.finish_reason))

    engine.generate = recording


def turn_spans(traj) -> list[tuple[int, int]]:
    """[start, end) of each answer's tokens in the trajectory."""
    mask = traj.loss_mask.astype(np.int8)
    starts = np.flatnonzero(np.diff(mask, prepend=0) == 1)
    ends = np.flatnonzero(traj.turn_end) + 1
    assert len(starts) == len(ends)
    return list(zip(starts.tolist(), ends.tolist()))


def check_turns(trajectories, requests, *, max_tokens: int, end_of_turn: int) -> tuple[int, int, int]:
    """Every turn of ``trajectories`` is one of the engine's ``requests``: its prompt the
    trajectory up to the turn, its answer the turn's policy tokens. An answer that stopped ends
    on ``end_of_turn``; one cut at ``max_tokens`` is followed by ``end_of_turn`` as an env
    token, not trained on. Returns (turns, answers cut, cut answers followed by another turn)."""
    by_prompt: dict[tuple, list] = {}
    for prompt, answer, finish in requests:
        by_prompt.setdefault(tuple(prompt), []).append((answer, finish))
    turns = cut = cut_then_observed = 0
    for traj in trajectories:
        ids = traj.token_ids.tolist()
        spans = turn_spans(traj)
        for k, (start, end) in enumerate(spans):
            finishes = [f for a, f in by_prompt.get(tuple(ids[:start]), []) if a == ids[start:end]]
            assert finishes, f"turn {k}: no engine request had this prompt and this answer"
            turns += 1
            if finishes[0] == "stop":
                assert ids[end - 1] == end_of_turn
            else:
                assert finishes[0] == "length" and end - start == max_tokens
                assert ids[end] == end_of_turn and not traj.loss_mask[end]
                cut += 1
                cut_then_observed += k + 1 < len(spans)
    return turns, cut, cut_then_observed
