"""What the learner trains and how: ``TrainerConfig`` and the estimators and policy losses it
names. Pure configuration; ``learner/trainer.py`` runs it, ``launch/config/builders.py`` builds it from
the model, algorithm and learner config groups.

Invariant: a ``TrainerConfig`` that constructs is valid: unknown keys, estimators, losses, dtypes
and estimator/loss arguments raise ValueError naming the key, not a failure mid-training.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch

from learner import advantages, losses, spans
from learner.lora import LoraSpec
from learner.schedule import lr_at

ESTIMATORS = {"masked_gae": advantages.masked_gae, "bi_level_gae": advantages.bi_level_gae,
              "turn_wise_gae": advantages.turn_wise_gae, "grpo": advantages.grpo}
POLICY_LOSSES = {"ppo": losses.ppo_policy_loss, "decoupled_ppo": losses.decoupled_ppo_loss,
                 "tis": losses.tis_policy_loss}
PARAM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class TrainerConfig:
    """What the learner trains and how; ``launch/config/builders.py`` builds it from the model,
    algorithm and learner groups. Algorithm keys mean what configs/algorithm/*.yaml says."""

    model_path: str
    """Hugging Face directory of the policy (and of the frozen reference policy)."""
    critic_path: str | None = None
    """Where the critic's backbone starts; None: from model_path."""
    lr: float = 1e-6
    """Policy AdamW learning rate."""
    critic_lr: float = 1e-5
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    """AdamW epsilon (policy and critic)."""
    grad_clip: float = 1.0
    """Max global grad norm, policy and critic separately; 0: no clipping."""
    epochs: int = 1
    """Passes over the batch per train_step."""
    num_minibatches: int = 1
    """Optimizer steps per epoch."""
    micro_batch_size: int = 0
    """Rows per forward/backward on each rank (gradients accumulate); 0: a whole mini-batch."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input for the backward and recompute the layer there (the
    policy's and the critic's): activations of one layer at a time, for about a third more
    compute."""
    logit_chunk_mib: float = 256.0
    """The most float32 logits (MiB) computed at once when scoring tokens: a micro-batch whose
    logits take more is scored in chunks of positions that take this much, each chunk's logits
    recomputed in the backward (learner/models.py); 0: a whole micro-batch's at once."""
    temperature: float = 1.0
    """The actors' sampling temperature: log-probs are log_softmax(logits / temperature)."""
    param_dtype: str = "float32"
    """Compute dtype (FSDP mixed precision; weights, gradients and optimizer stay float32)."""
    seed: int = 0
    """Seeds the value head's initialisation (the same on every rank)."""
    estimator: str = "bi_level_gae"
    """masked_gae | bi_level_gae | turn_wise_gae | grpo (no critic)."""
    estimator_args: dict = field(default_factory=dict)
    vtrace: bool = False
    """Pass log_rho = log pi_prox - log pi_behaviour to a GAE estimator (ignored by grpo)."""
    multi_turn_reward: bool = True
    whiten_advantages: bool = True
    loss: str = "ppo"
    """ppo (ratio vs pi_prox) | decoupled_ppo (pi_prox and pi_behaviour) | tis (pi_behaviour)."""
    loss_args: dict = field(default_factory=dict)
    """Keyword arguments of the policy loss; its ``agg`` also aggregates the other terms."""
    lr_schedule: str = "constant"
    """The policy's learning rate over its steps: constant | cosine (from ``lr`` down to
    ``lr_floor * lr`` at train step ``lr_steps``, held there after; learner/schedule.py). The
    critic keeps ``critic_lr``."""
    lr_steps: int = 0
    """Train steps the schedule spans (the run's train.steps), the critic warm-up's included;
    the policy's schedule runs over the steps after the warm-up."""
    lr_floor: float = 0.0
    """Where the cosine ends, as a fraction of ``lr`` (in [0, 1])."""
    critic_warmup: int = 0
    """The first k train steps update only the critic (the policy keeps its weights): bi-level
    and masked GAE read a freshly initialised value head's token-to-token noise as advantages."""
    value_clip: float | None = 0.5
    """Clip range of the value loss, in return units."""
    value_coef: float = 1.0
    value_norm: bool = False
    """The critic's head predicts returns normalised by running statistics of the policy tokens'
    returns (V = std * head + mean). The first batch sets them, so a fresh head starts at the mean
    return instead of 0; afterwards they follow an exponential moving average and the head is
    rescaled to keep its predictions (PopArt). Without it, Adam moves a fresh head's output by
    about lr per step: far too slow to reach returns of several units."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (the starting value when entropy_target is set)."""
    entropy_target: float | None = None
    """Mean entropy per policy token to hold: after each step the coefficient moves by
    entropy_adapt_rate * (target - entropy), kept in [0, 1]. None: a fixed coefficient."""
    entropy_adapt_rate: float = 0.05
    kl_in_reward: dict | None = None
    """{kind: k1, coef: c}: reward -= c * (log pi_behaviour - log pi_ref) on policy tokens."""
    kl_loss: dict | None = None
    """{kind: k1 | k3 | mse, coef: c[, tags: [name, ...]]}: c * KL(pi || pi_ref) added to the
    policy loss; with ``tags``, only the policy tokens inside those sections of the answers
    (e.g. [observation]: from <observation> to </observation>) count, the others as 0."""
    lora: dict | None = None
    """learner/lora.py's ``LoraSpec`` keys ({rank, alpha, dropout, target_modules, merge, ...}):
    the policy (and the critic's backbone) train LoRA adapters only, the reference policy is
    the policy with its adapters off; None: every weight trains."""

    def __post_init__(self) -> None:
        _one_of("estimator", self.estimator, ESTIMATORS)
        _one_of("loss", self.loss, POLICY_LOSSES)
        _one_of("param_dtype", self.param_dtype, PARAM_DTYPES)
        _check_kwargs("estimator_args", ESTIMATORS[self.estimator], self.estimator_args)
        _check_kwargs("loss_args", POLICY_LOSSES[self.loss], self.loss_args)
        if min(self.epochs, self.num_minibatches) < 1 or min(self.micro_batch_size, self.logit_chunk_mib) < 0:
            raise ValueError("epochs and num_minibatches must be >= 1, micro_batch_size and "
                             "logit_chunk_mib >= 0")
        lr_at(1, lr=self.lr, steps=self.lr_steps, schedule=self.lr_schedule, floor=self.lr_floor)
        if self.lr_schedule != "constant" and self.lr_steps <= self.critic_warmup:
            raise ValueError(f"lr_schedule {self.lr_schedule} needs lr_steps > critic_warmup, "
                             f"got {self.lr_steps}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.entropy_coef <= 1.0 or self.entropy_adapt_rate < 0:
            raise ValueError("entropy_coef must be in [0, 1] and entropy_adapt_rate >= 0")
        for name, kinds in (("kl_in_reward", ("k1",)), ("kl_loss", losses.KL_KINDS)):
            kl = getattr(self, name)
            keys = {"kind", "coef"} | ({"tags"} if name == "kl_loss" else set())
            if kl is not None and ({"kind", "coef"} - set(kl) or set(kl) - keys
                                   or kl["kind"] not in kinds):
                raise ValueError(f"{name} must be {{kind: one of {kinds}, coef: float}}, got {kl}")
        if self.lora is not None:
            LoraSpec.from_dict(self.lora)
        if self.kl_loss is not None and "tags" in self.kl_loss:
            try:
                spans.check_tags(self.kl_loss["tags"])
            except ValueError as e:
                raise ValueError(f"kl_loss.{e}") from None

    @property
    def has_critic(self) -> bool:
        """Every estimator but grpo (a group baseline) needs the critic's values."""
        return self.estimator != "grpo"

    def policy_lr(self, steps_done: int) -> float:
        """The policy's learning rate in the train step after ``steps_done``: ``lr_schedule``
        over the policy's steps (a critic's warm-up steps are not counted; grpo has none)."""
        warm = self.critic_warmup if self.has_critic else 0
        return lr_at(steps_done - warm + 1, lr=self.lr, steps=self.lr_steps - warm,
                     schedule=self.lr_schedule, floor=self.lr_floor)

    @classmethod
    def from_dict(cls, d: Mapping) -> "TrainerConfig":
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown TrainerConfig keys: {unknown}")
        return cls(**d)

    @property
    def lora_spec(self) -> LoraSpec | None:
        return None if self.lora is None else LoraSpec.from_dict(self.lora)

    @property
    def agg(self) -> str:
        return self.loss_args.get("agg", "token-mean")


@dataclass
class WorkerConfig:
    """One learner rank's process (learner/worker.py): its trainer, where it runs, and rank 0's
    stream and buffer settings; ``launch/config/builders.py`` builds it from the run config."""

    trainer: TrainerConfig
    cores: tuple[int, ...] = ()
    """CPU cores of the rank's own (the placement's); () for wherever the OS puts it."""
    threads: int | None = None
    """torch threads; None: one per bound core, else Ray's (one per CPU it reserved)."""
    log_file: str | None = None
    """Where the rank's output goes; None: the console."""
    dist_timeout_s: float = 1800.0
    """Timeout of the learner ranks' process group."""
    max_staleness: int = 1
    """Rank 0's buffer: versions a trajectory may lag (learner/buffer.py)."""
    on_stale: str = "drop"
    """drop | keep."""
    group_size: int = 1
    """The actors' GRPO group size (the buffer counts partial groups against it)."""
    partial_groups: str = "train"
    """train | drop: a group that lost a member."""
    window_bytes: int = 8 << 20
    """Rank 0's stream: bytes in flight per actor."""
    weight_timeout_s: float = 120.0
    """A silent peer fails a weight push after this long."""
    max_tokens: int = 1 << 20
    """Rank 0's door (learner/door.py): the most tokens a trajectory may hold; a longer one is
    refused. Not the engines' context: an episode that fills it ends with its last observation
    in the trajectory, past the context."""
    weight_bucket_bytes: int = 256 << 20
    """The most bytes of one bucket of the weight broadcast (transport/packing.py)."""

    def __post_init__(self) -> None:
        self.cores = tuple(self.cores)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


def _one_of(name: str, value: str, options) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {sorted(options)}, got {value!r}")


def _check_kwargs(name: str, fn, args: Mapping) -> None:
    params = inspect.signature(fn).parameters
    allowed = {p.name for p in params.values() if p.kind is p.KEYWORD_ONLY} - {"log_rho"}
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise ValueError(f"{name}: {unknown} are not arguments of {fn.__name__} ({sorted(allowed)})")
