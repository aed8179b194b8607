"""configs/: every group composes, launch/config/builders.py maps them onto the components' config keys, and
the GPU experiment presets carry VAGEN's published hyper-parameters."""

import inspect
import os

import pytest

from envs.registry import has_solver
from launch.config.builders import actor_config, trainer_config, warm_start_config, worker_config
from launch.config.compose import CONFIGS, compose
from launch.model.prepare import prepare_model
from launch.model.tiny_model import build_tiny_model
from launch.run.supervisor import _episodes_per_actor


def test_default_is_the_tiny_async_frozenlake_run():
    cfg = compose([])
    assert cfg.env_name == "frozenlake" and cfg.train.mode == "async"
    assert cfg.algorithm.estimator == "bi_level_gae" and cfg.env["format"] == "grounding_worldmodeling"
    assert cfg.model.path is None and cfg.warm_start.enabled
    assert cfg.env["reasoning_reward"]["judge"] == "rule"


@pytest.mark.parametrize("name", [p.stem for p in sorted((CONFIGS / "experiment").glob("*_3b.yaml"))])
def test_experiment_presets_carry_vagen_hyper_parameters(name):
    cfg = compose([f"experiment={name}"])
    assert cfg.model.path == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert (cfg.learner.lr, cfg.learner.critic_lr, cfg.learner.grad_clip) == (1e-6, 1e-5, 1.0)
    assert cfg.train.batch_size == 128 and cfg.train.batch_size // cfg.learner.num_minibatches == 32
    assert (cfg.actors.temperature, cfg.actors.top_p, cfg.actors.max_tokens) == (0.7, 0.95, 200)
    assert cfg.train.steps == 300 and cfg.train.eval_every == 20
    assert cfg.algorithm.loss_args["clip_low"] == 0.2 and cfg.algorithm.value_clip == 0.5
    assert cfg.env["render"] in ("image", "both") and cfg.env_name in name  # both: VAGEN's PrimitiveSkill


@pytest.mark.parametrize("name", [p.stem for p in sorted((CONFIGS / "experiment").glob("*_3b.yaml"))])
def test_every_gpu_preset_has_a_lora_variant(name):
    """``learner=gpu_lora`` turns any GPU preset into its LoRA variant: the preset's run with
    adapters, the learner's other settings (GPUs, bf16, mini-batches) as the preset has them."""
    full, lora = compose([f"experiment={name}"]), compose([f"experiment={name}", "learner=gpu_lora"])
    assert not full.learner.lora.enabled and lora.learner.lora.enabled
    assert lora.learner.lr == pytest.approx(10 * full.learner.lr)
    assert (lora.learner.device, lora.learner.param_dtype, lora.learner.num_minibatches) == (
        full.learner.device, full.learner.param_dtype, full.learner.num_minibatches)
    assert lora.train == full.train and lora.actors == full.actors and lora.env == full.env
    assert actor_config(lora, 0, "/m", "tcp://h:1").lora_rank == lora.learner.lora.rank


def test_the_real_model_preset_warm_starts_on_fresh_demonstrations_then_runs_grpo():
    cfg = compose(["experiment=smollm2_frozenlake"])
    assert cfg.model.path == "HuggingFaceTB/SmolLM2-135M-Instruct" and cfg.model.package
    assert cfg.algorithm.estimator == "grpo" and cfg.algorithm.kl_in_reward is None
    assert cfg.warm_start.enabled and cfg.warm_start.seeds == cfg.warm_start.steps * cfg.warm_start.batch_size
    assert (cfg.env["format"], cfg.env["prompt"], cfg.env_name) == ("no_think", "none", "frozenlake")
    assert cfg.train.batch_size % cfg.actors.group_size == 0
    lora = compose(["experiment=smollm2_frozenlake_lora"])  # the same run, with adapters
    assert lora.learner.lora.enabled and lora.learner.lr == pytest.approx(10 * cfg.learner.lr)
    assert lora.train == cfg.train and lora.warm_start == cfg.warm_start and lora.env == cfg.env
    task = compose(["experiment=smollm2_arithmetic"])  # the same recipe on a reasoning-gym task
    assert (task.env_name, task.env["task"], task.env["format"]) == ("reasoning_gym", "basic_arithmetic", "no_think")
    assert task.warm_start.seeds == task.warm_start.steps * task.warm_start.batch_size
    assert task.warm_start.mistake == "random" and has_solver(task.env_name, task.env)
    assert task.train == cfg.train and task.algorithm == cfg.algorithm


def test_trainer_config_takes_the_algorithm_and_learner_groups():
    from learner.config import TrainerConfig

    cfg = compose(["algorithm=grpo", "learner.lr=0.5"])
    tc = trainer_config(cfg, "/m")
    assert isinstance(tc, TrainerConfig)
    assert tc.estimator == "grpo" and tc.lr == 0.5 and tc.model_path == "/m"
    assert tc.temperature == cfg.actors.temperature  # proximal log-probs at the sampling temperature


def test_every_learner_key_reaches_the_trainer_the_rank_or_the_placement():
    """trainer_config passes on the learner group's keys that TrainerConfig has, by name: any
    other key is the rank's (WorkerConfig) or the placement's, none is dropped unread."""
    import dataclasses

    from launch.config.schema import LearnerConfig
    from learner.config import TrainerConfig, WorkerConfig

    def names(cls):
        return {f.name for f in dataclasses.fields(cls)}

    placement = {"ranks", "cpus", "gpus", "device"}
    assert names(LearnerConfig) - names(TrainerConfig) - names(WorkerConfig) == placement
    cfg = compose(["learner.vtrace=false", "learner.critic_warmup=2", "learner.lr_schedule=cosine",
                   "train.steps=9", "seed=4"])
    tc = trainer_config(cfg, "/m")
    same = names(LearnerConfig) & names(TrainerConfig) - {"lora"}  # lora: its own test
    assert all(getattr(tc, k) == getattr(cfg.learner, k) for k in same)
    assert (tc.vtrace, tc.critic_warmup, tc.lr_steps, tc.seed) == (False, 2, 9, 4)


def test_learner_lora_reaches_the_trainer_and_the_actors_engines():
    """Off: the trainer trains every weight and the engines take full weights. On: the trainer
    gets its LoraSpec keys, each actor serves adapters of that rank and keeps max_staleness + 1
    of them; with merge, the pushes are full weights again (no LoRA in the engine)."""
    off = compose([])
    assert trainer_config(off, "/m").lora is None and actor_config(off, 0, "/m", "tcp://h:1").lora_rank == 0
    on = compose(["learner.lora.enabled=true", "learner.lora.rank=16", "learner.lora.alpha=32",
                  "learner.max_staleness=2", "learner.lora.probe_tolerance=0.01",
                  "learner.lora.target_modules=[q_proj]"])
    spec = trainer_config(on, "/m").lora_spec
    assert (spec.rank, spec.alpha, spec.target_modules, spec.merge) == (16, 32.0, ("q_proj",), False)
    ac = actor_config(on, 0, "/m", "tcp://h:1")
    assert (ac.lora_rank, ac.lora_keep, ac.lora_probe_tolerance) == (16, 3, 0.01)
    merged = compose(["learner.lora.enabled=true", "learner.lora.merge=true"])
    assert trainer_config(merged, "/m").lora_spec.merge and actor_config(merged, 0, "/m", "tcp://h:1").lora_rank == 0


def test_actor_config_keys_are_the_actors():
    from actors.config import ActorConfig

    cfg = compose(["actors.num=3", "env=sokoban"])
    ac = actor_config(cfg, 2, "/m", "tcp://127.0.0.1:1")
    assert isinstance(ac, ActorConfig) and ac.actor_id == 2 and ac.env_name == "sokoban"
    assert ac.max_turns == cfg.env["max_turns"] and ac.env_pool.envs_per_worker == cfg.actors.envs_per_worker


def test_the_engine_takes_as_many_images_as_an_episode_shows():
    from actors.vision import engine_image_args

    for env, images in (("frozenlake", 3), ("navigation", 4), ("svg", 3)):
        cfg = compose([f"env={env}", "env.render=image", "model.vision=true"])
        ac = actor_config(cfg, 0, "/m", "tcp://127.0.0.1:1")
        # SVG: the target on turn 1, the target and the last drawing on turn 2: 3 <= 2 x 2
        limit = engine_image_args(ac.max_turns * ac.images_per_turn)["limit_mm_per_prompt"]["image"]
        assert limit >= images and ac.max_turns == cfg.env["max_turns"]
    assert actor_config(compose(["env=svg"]), 0, "/m", "x").images_per_turn == 2


@pytest.mark.parametrize("batch,group,actors,expected", [
    (32, 4, 1, [32]), (32, 4, 3, [12, 12, 8]), (30, 4, 2, [16, 16]), (5, 1, 2, [3, 2]),
])
def test_sync_mode_asks_each_actor_for_whole_groups(batch, group, actors, expected):
    cfg = compose([f"train.batch_size={batch}", f"actors.group_size={group}", f"actors.num={actors}"])
    split = _episodes_per_actor(cfg)
    assert split == expected
    assert sum(split) >= batch and all(n % group == 0 for n in split)


@pytest.mark.parametrize("step,ahead,stale,dropped,actors,group,expected", [
    (0, 1, 2, 0, 1, 4, 64),      # the first batch and one more
    (5, 1, 2, 0, 1, 4, 224),     # (5 + 1 + 1) batches of 32
    (5, 4, 2, 0, 1, 4, 256),     # run_ahead is capped at max_staleness
    (0, 1, 2, 3, 1, 4, 68),      # dropped trajectories are replaced, in whole groups
    (0, 1, 2, 0, 3, 4, 24),      # 64 over 3 actors -> 22 -> 24 (whole groups of 4)
    (0, 0, 0, 0, 1, 4, 32),      # strictly on-policy
])
def test_episode_budget(step, ahead, stale, dropped, actors, group, expected):
    from launch.run.supervisor import episode_budget

    got = episode_budget(step, batch_size=32, run_ahead=ahead, max_staleness=stale, dropped=dropped,
                         actors=actors, group_size=group)
    assert got == expected and got % group == 0
    assert got * actors >= (step + 1 + min(ahead, stale)) * 32 + dropped


def test_an_image_env_with_a_text_model_fails_before_anything_starts(tmp_path):
    text = str(build_tiny_model(tmp_path / "text", seed=0))
    vlm = str(build_tiny_model(tmp_path / "vlm", seed=0, vision=True))
    with pytest.raises(ValueError, match="needs a vision-language model"):
        prepare_model(compose([f"model.path={text}", "env.render=image"]), tmp_path)
    with pytest.raises(ValueError, match="env.render=both needs a vision-language model"):
        prepare_model(compose([f"model.path={text}", "env.render=both"]), tmp_path)
    for model, render in [(vlm, "image"), (text, "text")]:
        cfg = compose([f"model.path={model}", f"env.render={render}", "warm_start.enabled=false"])
        assert prepare_model(cfg, tmp_path) == model


def test_warm_start_config_is_the_warm_start_call_of_the_run():
    from launch.model.warm_start import warm_start

    kw = warm_start_config(compose(["seed=3", "warm_start.steps=7"]))
    params = inspect.signature(warm_start).parameters
    required = {n for n, p in params.items() if p.default is p.empty} - {"model_path", "out_dir"}
    assert required <= set(kw) <= set(params)
    assert (kw["env_name"], kw["seed"], kw["steps"], kw["n_seeds"]) == ("frozenlake", 3, 7, 24000)
    assert kw["env_config"]["prompt"] == "none" and kw["env_config"]["size"] == 4


@pytest.mark.parametrize("override, named", [
    ("actors.concurrncy=3", "concurrncy"),           # a misspelt key
    ("+train.stepz=3", "stepz"),                      # a new key in a typed group
    ("learner.lr=fast", "lr"),                        # a value of the wrong type
    ("logger.console=quiet", "logger.console"),       # a value the group's schema rejects
    ("+env.colour=red", "colour"),                    # an env keyword its factory does not take
    ("topology=mesh", "topology"),                    # no such topology
])
def test_a_bad_key_or_value_fails_at_compose_naming_it(override, named):
    with pytest.raises(Exception, match=named):
        compose([override])


def test_composing_checks_the_env_keys_without_building_the_env(monkeypatch):
    import functools

    import envs.frozenlake

    real = envs.frozenlake.make_env

    @functools.wraps(real)  # its signature, which the check reads
    def refuse(**config):
        raise AssertionError("composing built the env")

    monkeypatch.setattr(envs.frozenlake, "make_env", refuse)
    assert compose(["env.size=5"]).env["size"] == 5
    with pytest.raises(ValueError, match="env 'frozenlake'.*'colour'"):
        compose(["+env.colour=red"])


def test_a_keys_choices_are_a_str_enum_that_compares_as_its_word():
    from launch.config.schema import Console, Topology, TrainMode

    cfg = compose(["train.mode=sync", "logger.console=all"])
    assert cfg.train.mode is TrainMode["sync"] and cfg.train.mode == "sync"
    assert cfg.logger.console is Console.all and f"{cfg.logger.console}" == "all"
    assert cfg.topology == "ray" and {"ray": 1}[cfg.topology] == 1 and Topology("local") == "local"
    # the components get plain words (an actor's config crosses to a Ray process)
    ac, wc = actor_config(cfg, 0, "/m", "x"), worker_config(cfg, "/m")
    assert type(ac.dtype) is str and (type(wc.on_stale), type(wc.partial_groups)) == (str, str)
    with pytest.raises(Exception, match="train.mode=Sync") as info:
        compose(["train.mode=Sync"])
    assert "expected one of [async, sync]" in str(info.value.__cause__)


def test_code_below_the_entry_gets_dataclasses():
    from launch.config.schema import ActorsConfig, RunConfig

    cfg = compose(["actors.num=2"])
    assert isinstance(cfg, RunConfig) and isinstance(cfg.actors, ActorsConfig) and cfg.actors.num == 2
    assert isinstance(cfg.env, dict) and cfg.env["max_turns"] == 3


def test_every_group_file_composes_into_the_schema():
    for group in ("env", "model", "algorithm", "actors", "learner", "logger", "transport"):
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            overrides = [f"{group}={path.stem}"]
            if path.stem == "action_words":
                overrides.append("warm_start.enabled=false")
            compose(overrides)


def test_the_config_reference_is_up_to_date():
    from launch.config.reference import main

    assert main(["--check"]) == 0, "run: python -m launch.config.reference"


def test_mapping_values_compose_and_reach_the_trainer():
    cfg = compose(["algorithm.kl_loss={kind: k3, coef: 0.1, tags: [observation]}",
                   "algorithm.estimator_args.gamma_turn=0.9"])
    tc = trainer_config(cfg, "/m")
    assert tc.kl_loss == {"kind": "k3", "coef": 0.1, "tags": ["observation"]}
    assert tc.estimator_args["gamma_turn"] == 0.9 and tc.kl_in_reward == {"kind": "k1", "coef": 0.001}


def test_secondary_command_lines_speak_the_runs_names():
    """``python -m envs.main`` takes the actors group's pool keys (envs/config.py), same names,
    and the pool's timeouts reach the actors' pools."""
    import dataclasses

    from envs.config import EnvPoolConfig
    from envs.main import parse_args

    pool_keys = {f.name for f in dataclasses.fields(EnvPoolConfig)}
    assert pool_keys <= {f.name for f in dataclasses.fields(type(compose([]).actors))}
    args = parse_args(["--env", "frozenlake", "--env-workers", "3", "--step-timeout-s", "5"])
    assert (args.env_workers, args.envs_per_worker, args.step_timeout_s) == (3, 16, 5.0)
    cfg = compose(["actors.step_timeout_s=7", "actors.reset_timeout_s=9"])
    ac = actor_config(cfg, 0, "/m", "tcp://127.0.0.1:1")
    assert (ac.env_pool.step_timeout_s, ac.env_pool.reset_timeout_s) == (7.0, 9.0)
    with pytest.raises(ValueError, match="step_timeout_s"):
        compose(["actors.step_timeout_s=0"])


def test_tensor_parallel_follows_the_engines_gpus_and_sets_the_weight_ranks():
    from launch.topology.ray_cluster import RayCluster

    assert compose([]).actors.tp == 1
    gpu = compose(["actors=gpu", "actors.gpus_per_engine=2"])
    assert gpu.actors.tp == 2 and actor_config(gpu, 0, "/m", "tcp://h:1").tensor_parallel == 2
    assert compose(["actors.tensor_parallel=2"]).actors.tp == 2  # CPU: worker processes
    with pytest.raises(ValueError, match="must equal actors.gpus_per_engine"):
        compose(["actors=gpu", "actors.gpus_per_engine=2", "actors.tensor_parallel=4"])
    roles = RayCluster(compose(["actors.num=3", "actors.tensor_parallel=2"]))._roles()
    assert (roles.engine_workers, roles.engine_gpus) == (2, 0)


@pytest.mark.parametrize("more", ["actors.num=2", "learner.ranks=2", "actors.tensor_parallel=2"])
def test_the_local_topology_runs_one_actor_and_one_learner_rank(more):
    with pytest.raises(ValueError, match="topology=local runs one actor and one learner rank"):
        compose(["topology=local", more])


def test_the_local_topology_restarts_no_actor_and_says_why():
    from launch.topology.local_cluster import LocalCluster

    cluster = LocalCluster(compose(["topology=local"]))
    crash = ValueError("engine step failed")
    with pytest.raises(RuntimeError, match="topology=local restarts no actor") as info:
        cluster.restart_actor(0, crash)
    assert info.value.__cause__ is crash


def test_hub_access_is_off_for_local_models_and_a_hub_id_fails_clearly(monkeypatch, tmp_path):
    from launch.model.hub import hub_access

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub_access(compose([]))  # the tiny model: built here, nothing to fetch
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub_access(compose([f"model.path={tmp_path}"]))  # a local directory
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network either way on a test machine
    with pytest.raises(RuntimeError, match=r"'no-such-org/no-such-model' .* could not be fetched "
                                           r"from the Hugging Face hub \(HF_HUB_OFFLINE=1 is set\)"):
        hub_access(compose(["model.path=no-such-org/no-such-model"]))


def test_the_stream_is_keyed_on_a_cluster_and_open_on_loopback_unless_told(tmp_path):
    from launch.topology.ray_cluster import stream_keys
    from transport import security

    assert stream_keys(compose([]), networked=False) is None  # auto, loopback
    server, client = stream_keys(compose([]), networked=True)  # auto, a cluster: per run
    assert server.allowed == (client.public,) and client.server_public == server.public
    assert stream_keys(compose([]), networked=True)[0].public != server.public  # fresh each run
    assert stream_keys(compose(["transport.curve=off"]), networked=True) is None
    assert stream_keys(compose(["transport.curve=on"]), networked=False) is not None
    security.write(tmp_path)
    given = stream_keys(compose([f"transport.curve_keys={tmp_path}"]), networked=True)
    assert given == (security.read_server(tmp_path), security.read_client(tmp_path))
    with pytest.raises(ValueError, match="no socket to secure"):
        compose(["topology=local", "transport.curve=on"])
    with pytest.raises(Exception, match="transport.curve=maybe") as info:
        compose(["transport.curve=maybe"])
    assert "expected one of [auto, on, off]" in str(info.value.__cause__)
    config = actor_config(compose(["actors.env_curve=/keys", "actors.env_address=tcp://h:1"]),
                          0, "m", "tcp://h:2")
    assert config.env_curve == "/keys"


def test_a_warm_start_stopped_half_way_leaves_no_model_to_resume_from(tmp_path):
    """The warm start writes into warm-start.tmp/ and renames it when done: one stopped
    half-way (its config.json already written) is run again, one finished is reused."""
    text = str(build_tiny_model(tmp_path / "text", seed=0))
    cfg = compose([f"model.path={text}", "env=frozenlake"])
    calls = []

    def interrupted(path, out):
        calls.append(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # save_pretrained writes this first
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_model(cfg, tmp_path, interrupted)
    assert not (tmp_path / "warm-start").exists() and calls == [tmp_path / "warm-start.tmp"]

    def finished(path, out):
        calls.append(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return str(out)

    assert prepare_model(cfg, tmp_path, finished) == str(tmp_path / "warm-start")
    assert prepare_model(cfg, tmp_path, finished) == str(tmp_path / "warm-start")  # reused
    assert len(calls) == 2 and not (tmp_path / "warm-start.tmp").exists()
