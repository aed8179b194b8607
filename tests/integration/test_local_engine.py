"""actors/local_engine.py's InProcessEngine on the tiny model: what it adds to vLLM's LLMEngine
(pausing, cancelling, shutting down with requests in flight). Its AsyncLLM contract (episodes,
log-probs, weight updates in flight) is tested with the actor, on both engines, in
test_actor.py and test_actor_vision.py."""

import asyncio

import pytest

from actors.config import ActorConfig
from actors.engine import build_engine, sampling_params
from launch.model.tiny_model import build_tiny_model


def _params(max_tokens: int = 32):
    return sampling_params(temperature=1.0, max_tokens=max_tokens, ignore_eos=True,
                           detokenize=False, logprobs=0)


async def _answer(engine, request_id: str, max_tokens: int = 32):
    final = None
    async for output in engine.generate({"prompt_token_ids": [1, 2, 3, 4]}, _params(max_tokens), request_id):
        final = output
    return final


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("engine") / "model", seed=0)
    engine = build_engine(ActorConfig(model_path=str(path), engine="in_process",
                                      kv_cache_bytes=64 << 20, max_context=256), vision=False)
    yield engine
    engine.shutdown()


def _unfinished(engine) -> int:
    return asyncio.run(engine._call(lambda e: e.get_num_unfinished_requests()))


def test_concurrent_requests_each_get_their_own_final_output(engine):
    async def many():
        return await asyncio.gather(*(_answer(engine, f"r{i}", max_tokens=4 + i) for i in range(8)))

    outs = asyncio.run(many())
    assert [o.request_id for o in outs] == [f"r{i}" for i in range(8)]
    assert [len(o.outputs[0].token_ids) for o in outs] == [4 + i for i in range(8)]
    assert all(o.finished and len(o.outputs[0].logprobs) == len(o.outputs[0].token_ids) for o in outs)


def test_a_paused_engine_steps_no_request_until_resumed(engine):
    async def scenario():
        await engine.pause_generation(mode="keep")
        answer = asyncio.ensure_future(_answer(engine, "held", max_tokens=8))
        await asyncio.sleep(0.5)
        held = not answer.done()
        await engine.resume_generation()
        return held, await asyncio.wait_for(answer, 30)

    held, out = asyncio.run(scenario())
    assert held and len(out.outputs[0].token_ids) == 8


def test_a_wait_pause_lets_requests_in_flight_finish_and_holds_new_ones(engine):
    async def scenario():
        running = asyncio.ensure_future(_answer(engine, "running", max_tokens=64))
        await asyncio.sleep(0.05)
        await engine.pause_generation(mode="wait")
        finished_first = running.done()
        late = asyncio.ensure_future(_answer(engine, "late", max_tokens=4))
        await asyncio.sleep(0.3)
        late_held = not late.done()
        await engine.resume_generation()
        return finished_first, late_held, await asyncio.wait_for(late, 30)

    finished_first, late_held, late = asyncio.run(scenario())
    assert finished_first and late_held and len(late.outputs[0].token_ids) == 4


def test_a_cancelled_request_is_aborted(engine):
    async def scenario():
        await engine.pause_generation(mode="keep")  # the request stays in flight until cancelled
        answer = asyncio.ensure_future(_answer(engine, "cancelled", max_tokens=200))
        await asyncio.sleep(0.2)
        in_flight = await engine._call(lambda e: e.get_num_unfinished_requests())
        answer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await answer
        await engine.resume_generation()
        return in_flight

    assert asyncio.run(scenario()) == 1
    assert _unfinished(engine) == 0


def test_shutdown_fails_requests_in_flight_and_later_calls(tmp_path):
    path = build_tiny_model(tmp_path / "model", seed=1)
    engine = build_engine(ActorConfig(model_path=str(path), engine="in_process",
                                      kv_cache_bytes=64 << 20, max_context=256), vision=False)

    async def scenario():
        await engine.pause_generation(mode="keep")  # the request stays in flight
        answer = asyncio.ensure_future(_answer(engine, "in-flight", max_tokens=8))
        await asyncio.sleep(0.2)
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        with pytest.raises(RuntimeError, match="shut down"):
            await asyncio.wait_for(answer, 10)
        with pytest.raises(RuntimeError, match="shut down"):
            await engine.update_weight_version("1")

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()  # idempotent


@pytest.mark.parametrize("kind", ["async"])  # the actor's engine; in_process builds the same args
def test_long_seeded_prompts_all_at_once_do_not_kill_the_engine(tmp_path, kind):
    """More prompt tokens at once than one engine step prefills, every request seeded (as every
    answer of an actor is): on CPU vLLM would prefill some in chunks and then rewind their
    seeded generators, which a CPU generator cannot do, and its engine core died ("CPU Generator
    does not use offset") once the default job's prompts met the seeded sampling. Prompts are
    prefilled whole instead, and each seeded answer is the same as alone."""
    path = build_tiny_model(tmp_path / "model", seed=0)
    engine = build_engine(ActorConfig(model_path=str(path), engine=kind, kv_cache_bytes=64 << 20,
                                      max_context=2048, concurrency=8), vision=False)

    def params(seed):
        return sampling_params(temperature=1.0, max_tokens=4, ignore_eos=True, detokenize=False,
                               logprobs=0, seed=seed)

    async def answer(i, seed):
        final = None
        prompt = {"prompt_token_ids": [5 + (i + j) % 400 for j in range(1500)]}
        async for output in engine.generate(prompt, params(seed), f"{kind}-{i}-{seed}"):
            final = output
        return list(final.outputs[0].token_ids)

    async def together():  # 12,000 prompt tokens at once, then one of them alone
        return await asyncio.gather(*(answer(i, 100 + i) for i in range(8))), await answer(3, 103)

    try:
        both, alone = asyncio.run(together())
        assert all(len(a) == 4 for a in both)
        assert alone == both[3]  # seeded: the same answer alone
    finally:
        engine.shutdown()
