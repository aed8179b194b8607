"""actors.actor without vLLM: the config, the episode scheduler (groups, seeds, failures, stop),
the weight-update sequence and its failure path, over a fake engine, in-process FrozenLake envs,
the tiny tokenizer and a real trajectory source (ZeroMQ on loopback, or the in-process channel).
The real engine is tests/integration/test_actor.py's."""

import asyncio
from types import SimpleNamespace

import pytest

from actors import actor as actor_mod
from actors.actor import InferenceActor
from actors.config import ActorConfig
from actors.groups import GROUP_STRIDE, INCARNATION_STRIDE
from actors.weight_updates import WeightUpdateError
from envs.config import EnvPoolConfig
from envs.registry import load_config, make
from envs.wire import EpisodeFailure
from launch.model.tiny_tokenizer import build_tokenizer
from tests.envs_api import env_reset, env_step
from transport.channels import trajectory_source

ANSWER = "<think>x</think><answer>Up</answer>"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(seed=0)


@pytest.fixture(autouse=True)
def no_vllm(monkeypatch):
    monkeypatch.setattr(actor_mod, "sampling_params", lambda **kw: SimpleNamespace(**kw))


class FakeEngine:
    """The AsyncLLM calls the actor makes. Every answer is ANSWER + EOS, labelled with the version."""

    def __init__(self, answer_ids: list[int], fail_receive: bool = False, fail_generate: bool = False,
                 torn: bool = False):
        self.answer, self.fail_receive, self.fail_generate = answer_ids, fail_receive, fail_generate
        self.version, self.calls, self.paused = None, [], False
        self.torn = torn  # a failed receive had loaded part of the new weights

    async def generate(self, prompt, params, request_id):
        assert isinstance(prompt["prompt_token_ids"], list) and params.max_tokens >= 1
        while self.paused:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.001)
        if self.fail_generate:
            raise RuntimeError("engine dead")
        n = len(self.answer)
        out = SimpleNamespace(token_ids=self.answer, finish_reason="stop",
                              logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in self.answer],
                              weight_versions=[SimpleNamespace(version=self.version, start=0, end=n)])
        yield SimpleNamespace(outputs=[out])

    async def update_weight_version(self, version: str):
        self.version = version
        self.calls.append(("version", version))

    async def pause_generation(self, mode):
        self.paused = True
        self.calls.append(("pause", mode))

    async def resume_generation(self):
        self.paused = False
        self.calls.append(("resume",))

    async def collective_rpc(self, method, args=()):
        self.calls.append((method,))
        if method == "receive_weights" and self.fail_receive:
            raise RuntimeError("Worker failed with error 'receive failed'")
        if method == "weights_intact":
            return [not self.torn]
        return [int(self.version) + 1] if method == "receive_weights" else [None]

    async def reset_prefix_cache(self, reset_running_requests=False):
        self.calls.append(("reset", reset_running_requests))

    async def reset_encoder_cache(self):
        self.calls.append(("reset_encoder",))

    def shutdown(self):
        self.calls.append(("shutdown",))


class FakeEnvs:
    """One in-process FrozenLake per slot; a step on ``fail_seed``'s episode fails its worker."""

    def __init__(self, fail_seed: int | None = None):
        self.envs, self.seeds, self.fail_seed = {}, {}, fail_seed

    def _env(self, slot):
        return self.envs.setdefault(slot, make("frozenlake", **load_config("frozenlake")))

    async def system_prompt(self, slot):
        return self._env(slot).system_prompt()

    async def reset(self, slots, seeds):
        self.seeds[slots[0]] = seeds[0]
        return [env_reset(self._env(slots[0]), seeds[0])]

    async def step(self, slots, texts):
        if self.seeds[slots[0]] == self.fail_seed:
            return [EpisodeFailure("worker_crashed")]
        return [env_step(self._env(slots[0]), texts[0])]

    async def stats(self):
        return {"steps": 0}

    async def close(self):
        pass


def _actor(tokenizer, engine=None, envs=None, **cfg):
    cfg = {"model_path": "unused", "actor_id": 2, "env_pool": {"envs_per_worker": 4}, "concurrency": 3,
           "max_tokens": 16, **cfg}
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    engine = engine or FakeEngine(tokenizer.encode(ANSWER, add_special_tokens=False) + [eos])
    return InferenceActor(cfg, engine=engine, env=envs or FakeEnvs(), tokenizer=tokenizer)


async def _received(receiver, n: int, timeout_s: float = 5.0) -> list:
    got, loop = [], asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(got) < n and loop.time() < deadline:
        for actor, traj, nbytes in receiver.poll(0):
            got.append(traj)
            receiver.release(actor, nbytes)
        await asyncio.sleep(0.005)
    return got


def _play_to_a_learner(tokenizer, episodes: int, expect: int, address: str = "tcp://127.0.0.1:0",
                       **cfg) -> tuple[dict, list]:
    """An actor plays ``episodes`` sending to a real trajectory source at ``address`` (ZeroMQ, or
    the in-process channel); (its stats, the first ``expect`` received)."""
    receiver = trajectory_source(address)

    async def scenario():
        actor = _actor(tokenizer, learner_address=receiver.address, **cfg)
        await actor.start()
        running = asyncio.create_task(actor.run(num_episodes=episodes))
        trajs = await _received(receiver, expect)
        stats = await running
        await actor.close()
        return stats, trajs

    try:
        return asyncio.run(scenario())
    finally:
        receiver.close()


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown actor config keys"):
        ActorConfig.from_dict({"model_path": "m", "temprature": 1.0})
    with pytest.raises(ValueError, match="exceeds"):
        ActorConfig(model_path="m", concurrency=5, env_pool=EnvPoolConfig(env_workers=1, envs_per_worker=4))
    with pytest.raises(ValueError, match="unknown env_pool keys"):
        ActorConfig.from_dict({"model_path": "m", "env_pool": {"env_worker": 2}})
    with pytest.raises(ValueError, match="env service"):
        ActorConfig(model_path="m", env_slot_offset=4)
    assert ActorConfig.from_dict({"model_path": "m", "train_seeds": [5, 9]}).train_seeds == (5, 9)


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:0", "inproc://actor-unit-groups"])
def test_groups_share_seeds_and_trajectories_reach_the_learner(tokenizer, address):
    stats, trajs = _play_to_a_learner(tokenizer, 6, 6, address, group_size=3, seed=11)
    assert stats["episodes_done"] == stats["episodes_sent"] == 6 and len(trajs) == 6
    assert sorted({t.group_id for t in trajs}) == [2 * GROUP_STRIDE, 2 * GROUP_STRIDE + 1]
    for g in {t.group_id for t in trajs}:
        assert len({t.seed for t in trajs if t.group_id == g}) == 1
    assert all(set(t.policy_version[t.loss_mask].tolist()) == {0} for t in trajs)
    # The seed stream is fixed by (seed, actor_id, incarnation); a restarted actor repeats no group.
    a, b, c, d = (_actor(tokenizer, seed=s, actor_id=i, incarnation=k, group_size=1)
                  for s, i, k in ((11, 2, 0), (11, 2, 0), (11, 3, 0), (11, 2, 1)))
    draws = [[x._stream.next_member() for _ in range(5)] for x in (a, b, c, d)]
    assert draws[0] == draws[1]
    seeds = [[s for s, _ in draw] for draw in draws]
    assert seeds[0] != seeds[2] and seeds[0] != seeds[3]
    assert [g for _, g in draws[3]] == [2 * GROUP_STRIDE + INCARNATION_STRIDE + k for k in range(5)]
    # A resumed run's actor continues its incarnation's stream where the checkpoint left it.
    resumed = _actor(tokenizer, seed=11, actor_id=2, incarnation=0, group_size=1, skip_groups=2)
    assert [resumed._stream.next_member() for _ in range(3)] == draws[0][2:5]


def test_env_failures_lose_episodes_not_the_actor(tokenizer):
    first_seed = _actor(tokenizer, group_size=2)._stream.next_member()[0]  # the same seed stream

    async def scenario():
        actor = _actor(tokenizer, envs=FakeEnvs(fail_seed=first_seed), group_size=2)
        await actor.start()
        stats = await actor.run(num_episodes=6)
        await actor.close()
        return stats

    stats = asyncio.run(scenario())
    assert stats["episodes_failed"] == stats["failed/worker_crashed"] == 2  # the first group
    assert stats["episodes_done"] == 4


class FailSecondEpisode(FakeEnvs):
    """The second episode reset fails at its first step (one member of the first group)."""

    async def reset(self, slots, seeds):
        self.resets = getattr(self, "resets", 0) + 1
        self.seeds[slots[0]] = "fail" if self.resets == 2 else seeds[0]
        return [env_reset(self._env(slots[0]), seeds[0])]

    async def step(self, slots, texts):
        if self.seeds[slots[0]] == "fail":
            return [EpisodeFailure("worker_crashed")]
        return [env_step(self._env(slots[0]), texts[0])]


@pytest.mark.parametrize("whole_groups", [True, False])
def test_whole_groups_are_sent_together_and_say_how_many(tokenizer, whole_groups):
    stats, trajs = _play_to_a_learner(tokenizer, 6, 5, envs=FailSecondEpisode(), group_size=3,
                                      whole_groups=whole_groups)
    assert stats["episodes_failed"] == 1 and len(trajs) == stats["episodes_sent"] == 5
    first, second = 2 * GROUP_STRIDE, 2 * GROUP_STRIDE + 1
    if whole_groups:  # the group that lost a member says so; each group arrives in one piece
        assert [(t.group_id, t.group_size) for t in trajs] == [(first, 2)] * 2 + [(second, 3)] * 3
        assert stats["groups_partial"] == 1 and stats["episodes_held"] == 0
    else:
        assert all(t.group_size == 0 for t in trajs) and stats["groups_partial"] == 0


def test_stop_ends_run_and_engine_errors_propagate(tokenizer):
    async def scenario():
        actor = _actor(tokenizer)
        await actor.start()
        running = asyncio.create_task(actor.run())
        while actor.counts["episodes_done"] < 5:
            await asyncio.sleep(0.005)
        await actor.stop()
        stats = await running
        broken = _actor(tokenizer)
        await broken.start()
        broken.engine.fail_generate = True
        with pytest.raises(RuntimeError, match="engine dead"):
            await broken.run(num_episodes=3)
        broken_stats = await broken.stats()
        await actor.close()
        await actor.close()  # idempotent
        await broken.close()
        return stats, broken_stats, actor.engine

    stats, broken, engine = asyncio.run(scenario())
    assert stats["episodes_done"] >= 5 and engine is None
    # every episode started ended one way: done, failed or cancelled (those the stop found in flight)
    assert 1 <= stats["episodes_cancelled"] <= 3 and stats["episodes_failed"] == 0
    assert stats["episodes_started"] == stats["episodes_done"] + stats["episodes_cancelled"]
    # the engine's error failed each episode it reached and cancelled the others in flight
    assert broken["episodes_started"] == 3 and broken["episodes_done"] == 0
    assert broken["episodes_failed"] == broken["failed/engine_RuntimeError"] >= 1
    assert broken["episodes_failed"] + broken["episodes_cancelled"] == 3


def test_weight_update_sequence_and_failure(tokenizer):
    async def scenario():
        ok = _actor(tokenizer)
        await ok.start()
        timings = await ok.update_weights(1)
        calls = list(ok.engine.calls)
        bad = _actor(tokenizer, engine=FakeEngine([5], fail_receive=True))
        await bad.start()
        with pytest.raises(WeightUpdateError, match="still serving version 0"):
            await bad.update_weights(1)
        # half of the new weights loaded: generating would mix two versions, so it stays paused
        torn = _actor(tokenizer, engine=FakeEngine([5], fail_receive=True, torn=True))
        await torn.start()
        with pytest.raises(WeightUpdateError, match="stays paused"):
            await torn.update_weights(1)
        torn_paused, torn_stats = torn.engine.paused, await torn.stats()
        torn.engine.fail_receive = torn.engine.torn = False  # the group re-formed: a full update
        await torn.update_weights(1)
        assert torn_paused and torn_stats["weights_torn"] == 1 and not torn.engine.paused
        result = (calls, timings, await ok.stats(), await bad.stats(), bad.engine.paused)
        for actor in (ok, bad, torn):
            await actor.close()
        return result

    calls, timings, ok, bad, paused = asyncio.run(scenario())
    assert calls == [("version", "0"), ("pause", "keep"), ("receive_weights",), ("reset", True),
                     ("version", "1"), ("resume",)]
    assert timings["version"] == 1 and timings["total_s"] >= timings["receive_s"] >= 0
    assert ok["version"] == 1 and ok["weight_updates"] == 1
    assert bad["version"] == 0 and bad["weight_update_failures"] == 1 and not paused


def test_a_vlm_update_waits_for_answers_in_flight(tokenizer):
    """With images, vLLM must never re-encode a preempted request: the pause lets the answers
    in flight finish ("wait"), then both the prefix and the encoder caches are reset."""
    async def scenario():
        actor = _actor(tokenizer)
        actor.vision = object()  # what start (_start_engine) sets for a model with an image processor
        await actor.start()
        await actor.update_weights(1)
        calls = list(actor.engine.calls)
        await actor.close()
        return calls

    assert asyncio.run(scenario()) == [("version", "0"), ("pause", "wait"), ("receive_weights",),
                                       ("reset", True), ("reset_encoder",), ("version", "1"),
                                       ("resume",)]


def test_evaluate_plays_greedy_and_sampled_episodes_without_sending(tokenizer):
    async def scenario():
        actor = _actor(tokenizer)
        await actor.start()
        out = await actor.evaluate([1, 2, 3, 4, 5], samples=2)
        stats = await actor.stats()
        await actor.close()
        return out, stats

    out, stats = asyncio.run(scenario())
    outcomes = out["outcomes"]
    assert set(out) == {"outcomes"}
    assert [(o["seed"], o["sample"]) for o in outcomes] == (
        [(s, -1) for s in range(1, 6)] + [(s, j) for s in range(1, 6) for j in range(2)])
    for o in outcomes:
        # FrozenLake's rule judge scores the answers: its scores come with the episode's
        assert set(o) == {"seed", "sample", "failure", "success", "reward", "format_correct", "turns",
                          "reward_env", "reward_format", "reward_reasoning",
                          "observation_score", "prediction_score"}
        assert o["failure"] is None and 1 <= o["turns"] <= 3 and 0 <= o["observation_score"] <= 1
    assert stats["episodes_done"] == 0  # evaluation is not training


def test_evaluate_records_the_episodes_of_its_first_seeds(tokenizer):
    """record=3: the episodes of seeds 1, 2, 3 come back turn by turn, the failed one (seed 2)
    with its reason, as its outcome does."""
    async def scenario():
        actor = _actor(tokenizer, envs=FakeEnvs(fail_seed=2))
        await actor.start()
        out = await actor.evaluate([1, 2, 3, 4, 5], record=3)
        await actor.close()
        return out

    out = asyncio.run(scenario())
    episodes = out.pop("episodes")
    failed = [o for o in out["outcomes"] if o["failure"]]
    assert len(out["outcomes"]) == 5 and [(o["seed"], o["failure"]) for o in failed] == [(2, "worker_crashed")]
    assert failed[0]["success"] == 0 and failed[0]["reward"] == 0  # it scored nothing
    assert [e["seed"] for e in episodes] == [1, 2, 3]
    assert [e["failure"] for e in episodes] == [None, "worker_crashed", None]
    assert episodes[1]["turns"] == [] and episodes[1]["metrics"] == {}
    for e in (episodes[0], episodes[2]):
        assert len(e["turns"]) == e["metrics"]["turns"] >= 1
        assert all(t["answer"] == ANSWER and t["images"] == [] for t in e["turns"])
        assert sum(t["reward"] for t in e["turns"]) == pytest.approx(e["metrics"]["reward"])
        assert e["turns"][0]["observation"].startswith("Turn 1 of 3.")


def test_episode_budget_holds_the_actor_back_until_raised(tokenizer):
    receiver = trajectory_source("tcp://127.0.0.1:0")

    async def scenario():
        actor = _actor(tokenizer, group_size=2, learner_address=receiver.address)
        await actor.start()
        await actor.set_episode_budget(4)
        running = asyncio.create_task(actor.run())
        first = await _received(receiver, 6, timeout_s=1.0)  # only 4 may come
        held = (await actor.stats())["episodes_started"]
        await actor.set_episode_budget(8)
        second = await _received(receiver, 4, timeout_s=5.0)
        await asyncio.sleep(0.2)
        after = (await actor.stats())["episodes_started"]
        await actor.stop()
        await running
        await actor.close()
        return len(first), held, len(second), after

    try:
        first, held, second, after = asyncio.run(scenario())
    finally:
        receiver.close()
    assert (first, held) == (4, 4)
    assert (second, after) == (4, 8)


def test_only_the_expected_reload_warnings_are_filtered():
    import logging

    from actors.vllm_extension import ReloadWarningFilter

    def record(layer):
        return logging.LogRecord("x", logging.WARNING, "f", 1, "%s: Failed to load weights", (layer,), None)

    f = ReloadWarningFilter()
    assert not f.filter(record("RotaryEmbedding"))
    assert f.filter(record("QKVParallelLinear")) and f.filter(record("ParallelLMHead"))
    f.expected.add("ParallelLMHead")  # a model whose output layer is tied to its embeddings
    assert not f.filter(record("ParallelLMHead")) and f.filter(record("QKVParallelLinear"))


def test_cpu_thread_binding_gives_each_engine_worker_its_cores(monkeypatch):
    from actors.engine import cpu_thread_binding

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert cpu_thread_binding([0, 1], 1) == "0,1"
    assert cpu_thread_binding([0, 1], 2) == "0|1"
    assert cpu_thread_binding([0, 1, 2, 3], 2) == "0,2|1,3"
    assert cpu_thread_binding([], 2) == "0|1"  # unbound: the machine's first cores
    assert cpu_thread_binding([3], 2) == "3|0"  # fewer cores than workers: the next ones, wrapped


class StuckEngine(FakeEngine):
    """Takes requests and never yields (until ``release``): a stalled engine."""

    def __init__(self, answer_ids):
        super().__init__(answer_ids)
        self.release = asyncio.Event()

    async def generate(self, prompt, params, request_id):
        await self.release.wait()
        async for out in super().generate(prompt, params, request_id):
            yield out


def test_liveness_counts_a_stall_only_while_requests_wait_on_a_silent_engine(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    engine = StuckEngine(tokenizer.encode(ANSWER, add_special_tokens=False) + [eos])

    async def scenario():
        actor = _actor(tokenizer, engine=engine, group_size=1)
        await actor.start()
        idle = await actor.liveness()
        await asyncio.sleep(0.3)
        idle_later = await actor.liveness()  # no request in flight: idle time is no stall
        running = asyncio.create_task(actor.run(num_episodes=2))
        await asyncio.sleep(0.4)
        stalled = await actor.liveness()
        engine.release.set()
        await running
        after = await actor.liveness()
        await actor.close()
        return idle, idle_later, stalled, after

    idle, idle_later, stalled, after = asyncio.run(scenario())
    assert idle == idle_later == {"requests": 0, "stalled_s": 0.0, "engine_dead": False}
    assert stalled["requests"] == 2 and 0.3 <= stalled["stalled_s"] < 5
    assert after["requests"] == 0 and after["stalled_s"] == 0.0


class SeedRecorder(FakeEngine):
    """Records each request's sampling seed."""

    def __init__(self, answer_ids):
        super().__init__(answer_ids)
        self.seeds = []

    async def generate(self, prompt, params, request_id):
        self.seeds.append(params.seed)
        async for out in super().generate(prompt, params, request_id):
            yield out


def test_each_answer_is_sampled_with_a_seed_of_its_episode_and_turn(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    answer = tokenizer.encode(ANSWER, add_special_tokens=False) + [eos]

    def play(**cfg):
        engine = SeedRecorder(answer)

        async def scenario():
            actor = _actor(tokenizer, engine=engine, group_size=2, concurrency=1, max_turns=2, **cfg)
            await actor.start()
            await actor.run(num_episodes=4)
            await actor.evaluate([3, 4])  # greedy: no seed
            await actor.close()

        asyncio.run(scenario())
        return engine.seeds

    first, again, other = play(seed=5), play(seed=5), play(seed=6)
    assert first == again  # the same run again samples with the same seeds
    train, evals = first[:-4], first[-4:]
    assert evals == [None] * 4 and None not in train
    assert len(set(train)) == len(train)  # every (group, member, turn) its own
    assert set(train).isdisjoint(other[:-4])  # another run seed, other seeds
    assert train[0] == actor_mod.sampling_seed(5, 2 * GROUP_STRIDE, 0, 0)  # actor 2's first group


def test_sampled_evaluation_episodes_are_seeded_by_their_seed_and_sample_on_any_actor(tokenizer):
    """The same held-out seed's k-th sampled episode gets the same sampling seeds whichever
    actor plays it and whatever else that actor plays: evaluations split over any number of
    actors pair up seed by seed."""
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    answer = tokenizer.encode(ANSWER, add_special_tokens=False) + [eos]

    def seeds_of(eval_seeds):
        engine = SeedRecorder(answer)

        async def scenario():
            actor = _actor(tokenizer, engine=engine, concurrency=1, max_turns=1, seed=5)
            await actor.start()
            await actor.evaluate(eval_seeds, samples=2)
            await actor.close()

        asyncio.run(scenario())
        return engine.seeds

    both = seeds_of([3, 4])  # greedy 3, 4; then 3 twice, 4 twice
    alone = seeds_of([4])
    assert both[:2] == [None, None] and alone[0] is None
    assert both[4:] == alone[1:] == [actor_mod.sampling_seed(5, actor_mod.EVAL_KEY, 4, j + 1, 0) for j in range(2)]
    assert len(set(both[2:])) == 4
