"""The learner's train step: FSDP2 policy, critic and reference model, one RL update (the
configuration is learner/config.py, the models learner/models.py, a rank's rows learner/rows.py,
its metrics learner/metrics.py).

Called by ``learner/worker.py`` (one ``LearnerWorker`` per rank). Every public method is
collective over the default process group, which the caller has initialised (gloo on CPU, nccl
on GPU): all ranks call it in the same order with the same arguments.

Invariants:
- every rank receives the same full list of trajectories. Quantities that need no model (GRPO
  advantages, staleness, scores) come from the whole batch; rank r owns the rows r::world and
  pads them with zero-mask dummy rows to ``max(ceil(n / world), num_minibatches)``, so every rank
  runs the same number of forward/backward passes (FSDP collectives) whatever ``n`` is; a
  mini-batch without policy tokens on any rank is skipped (no forward, no optimizer step);
- mini-batch j of a rank is the j-th of ``num_minibatches`` equal chunks of its rows. Each loss
  term is rescaled by (this rank's tokens / all ranks' tokens of the mini-batch) * world, so after
  FSDP averages the gradients they are those of the mini-batch's global token mean (or sequence
  mean, ``loss_args.agg``). When ``n % (world * num_minibatches) == 0`` the mini-batches are the
  same rows as in a single process, and training equals the single-process run up to rounding;
- token i's log-prob comes from the logits at position i - 1 divided by the sampling temperature,
  and values[:, i] is the critic's value of the prefix before token i (also read at i - 1);
  so the first token of a row is never a policy token;
- a vision-language policy (its config has a ``vision_config``) gets every forward's image
  inputs from its rows' images (learner/vision.py), the same for policy, critic and reference;
- dropout stays off (eval mode): before the first optimizer step, pi == pi_prox exactly (LoRA's
  adapter dropout, where set, is on in the training passes only);
- with ``lora`` (learner/lora.py) the policy and the critic's backbone carry adapters injected
  before sharding and only they (and the critic's head) train; no reference model is loaded:
  the reference is the policy with its adapters off; a publish is the adapter and its probe
  (transport/adapters.py), checkpoints hold the adapters and their optimizer states only, and
  the final model is a PEFT adapter directory;
- advantages are whitened over the policy tokens of the whole batch (sums all-reduced), those
  of turn_wise_gae over the batch's turn ends (one entry per turn, as VAGEN); returns =
  advantages + values, taken before whitening;
- metrics are identical on every rank: weighted means all-reduced over tokens (or steps); so is
  the entropy coefficient, which ``entropy_target`` adapts from the step's all-reduced entropy
  and checkpoints keep.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable import checkpoint as checkpoint_layer
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from learner import advantages, checkpoint, lora, losses
from learner.batch import Batch, collate, kl_penalty
from learner.config import ESTIMATORS, PARAM_DTYPES, TrainerConfig
from learner.metrics import (
    StepMetrics,
    add_masked_mean,
    batch_metrics,
    explained_variance,
    fresh_gap,
    global_moments,
    turn_starts,
    vtrace_metrics,
)
from learner.models import (
    Entry,
    ValueModel,
    chunk_positions,
    lazy_publish,
    load_model,
    state_entries,
    token_logprobs,
)
from learner.rows import Rows, count_units, longest_first, split_rows, take_rows
from learner.spans import TagSpans
from learner.value_norm import ValueNorm
from learner.vision import ImageInputs, is_vision_config
from transport import adapters
from transport.schema import Trajectory

SECTION_METRICS = frozenset({"policy/entropy_answer", "policy/entropy_reasoning",
                             "policy/behaviour_kl_answer", "policy/behaviour_kl_reasoning"})
"""Metrics of a part of the answers, left out of a step whose batch has no token of it."""


class Trainer:
    """FSDP2 models and optimizers of one learner rank; see the module docstring."""

    def __init__(self, cfg: TrainerConfig, *, device: torch.device | str = "cpu") -> None:
        from transformers import AutoConfig, AutoModel

        self.cfg, self.device = cfg, torch.device(device)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._mesh = init_device_mesh(self.device.type, (self.world,))
        self._mp = MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[cfg.param_dtype],
                                        reduce_dtype=torch.float32)
        self.hf_config = AutoConfig.from_pretrained(cfg.model_path)
        text_config = getattr(self.hf_config, "text_config", self.hf_config)
        pad = getattr(self.hf_config, "pad_token_id", None)
        pad = getattr(text_config, "pad_token_id", None) if pad is None else pad
        self.pad_id = 0 if pad is None else int(pad)
        # A vision-language model: its image processor turns trajectories' images into inputs.
        self.images = ImageInputs(cfg.model_path) if is_vision_config(self.hf_config) else None
        self.lora = cfg.lora_spec
        """LoRA: the policy and the critic's backbone train adapters only (learner/lora.py)."""
        self.policy = self._shard(self._adapted(load_model(self._policy_class(), cfg.model_path)))
        self.adapter_config = None if self.lora is None else lora.peft_config(self.lora, self.policy, cfg.model_path)
        """The adapter's ``adapter_config.json`` (with LoRA): every publish and the final model carry it."""
        self.vocab_size = int(self.policy.get_input_embeddings().num_embeddings)
        """The policy's embedding rows: every token id it trains on is below this."""
        self.logit_chunk = chunk_positions(self.vocab_size, cfg.logit_chunk_mib)
        """The most positions whose logits are computed at once (0: a micro-batch's, whole)."""
        self.optim = self._adamw(self.policy, cfg.lr)
        self.entropy_coef = cfg.entropy_coef  # adapted after each step when entropy_target is set
        self.steps_done = 0  # train steps, for critic_warmup (checkpointed)
        self.value_norm = ValueNorm() if cfg.value_norm else None
        self.critic = self.critic_optim = self.ref = None
        if cfg.has_critic:
            backbone = self._adapted(load_model(AutoModel, cfg.critic_path or cfg.model_path))
            self.critic = self._shard(ValueModel(backbone, seed=cfg.seed).eval())
            self.critic_optim = self._adamw(self.critic, cfg.critic_lr)
        if self.needs_ref and self.lora is None:  # with LoRA: the policy with its adapters off
            self.ref = self._shard(load_model(self._policy_class(), cfg.model_path).requires_grad_(False),
                                   trains=False)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        self.kl_spans = None  # kl_loss.tags: the policy tokens the KL loss acts on
        if cfg.kl_loss and cfg.kl_loss.get("tags"):
            self.kl_spans = TagSpans.from_tokenizer(tokenizer, cfg.kl_loss["tags"])
        # the answer apart from the rest (the reasoning): entropy and KL of each in the metrics
        self.answer_spans = TagSpans.from_tokenizer(tokenizer, ["answer"])
        self.probe_ids = lora.probe_ids(tokenizer).to(self.device)
        """An adapter publish's probe (transport/adapters.py)."""

    def _adapted(self, model: nn.Module) -> nn.Module:
        """``model`` with LoRA adapters injected (learner/lora.py), or as it is without LoRA."""
        return model if self.lora is None else lora.inject(model, self.lora, vision=self.images is not None)

    def _policy_class(self):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        return AutoModelForCausalLM if self.images is None else AutoModelForImageTextToText

    def _shard(self, model: nn.Module, *, trains: bool = True) -> nn.Module:
        """fully_shard each decoder layer (HF ``_no_split_modules``), then the root; a model that
        ``trains`` has its layers recomputed in the backward where ``activation_checkpointing``."""
        model.to(self.device)
        layers = set(getattr(model, "_no_split_modules", None) or ())
        for module in model.modules():
            if type(module).__name__ in layers:
                if trains and self.cfg.activation_checkpointing:
                    checkpoint_layer(module)  # composable: names and the state dict stay as they are
                fully_shard(module, mesh=self._mesh, mp_policy=self._mp)
        return fully_shard(model, mesh=self._mesh, mp_policy=self._mp)

    def _adamw(self, model: nn.Module, lr: float) -> torch.optim.Optimizer:
        """AdamW over the weights that train (with LoRA: the adapters, and the critic's head)."""
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                 weight_decay=self.cfg.weight_decay, eps=self.cfg.adam_eps)

    # --- the train step ---------------------------------------------------------------------

    def train_step(self, trajectories: list[Trajectory], version: int) -> dict[str, float]:
        """One update on ``trajectories`` (the same list on every rank) by the learner at
        ``version``; returns flat metrics, identical on every rank."""
        t0 = time.perf_counter()
        vision = None
        if any(t.images for t in trajectories):
            if self.images is None:
                raise ValueError(f"trajectories with images, but {self.cfg.model_path} is not a "
                                 "vision-language model")
            vision = self.images.encode(trajectories)
        batch, lengths, index, rows = self.rows(trajectories, vision)
        metrics = StepMetrics()
        rows = self._prepare(rows, batch, index, metrics, version)
        t1 = time.perf_counter()
        self._update(rows, metrics)
        self.steps_done += 1
        out = metrics.reduce(self.device) | batch_metrics(batch, lengths, version)
        # a batch without answers (or with nothing else) has no such part: no figure, not NaN
        out = {k: v for k, v in out.items() if not (k in SECTION_METRICS and math.isnan(v))}
        out["policy/entropy_coef"] = self.entropy_coef
        if self.cfg.entropy_target is not None and "policy/entropy" in out:  # same on every rank
            step = self.cfg.entropy_adapt_rate * (self.cfg.entropy_target - out["policy/entropy"])
            self.entropy_coef = min(max(self.entropy_coef + step, 0.0), 1.0)
        times = torch.tensor([t1 - t0, time.perf_counter() - t0], device=self.device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank's, the same on every rank
        return out | {"timing/prepare_s": float(times[0]), "timing/step_s": float(times[1])}

    def rows(self, trajectories: list[Trajectory], vision: list | None = None
             ) -> tuple[Batch, torch.Tensor, torch.Tensor, Rows]:
        """(the whole batch, each trajectory's length, this rank's row indices, its rows), the
        rows ordered for micro-batches: what ``train_step`` computes on."""
        batch = collate(trajectories, multi_turn_reward=self.cfg.multi_turn_reward,
                        pad_id=self.pad_id)
        if batch.loss_mask[:, 0].any():
            raise ValueError("a row starts with a policy token: there is no logit to score it")
        lengths = torch.tensor([len(t.token_ids) for t in trajectories])
        index = self._my_rows(len(trajectories))
        if self.cfg.micro_batch_size:  # micro-batches as narrow as their rows allow
            index = longest_first(index, lengths, self.cfg.num_minibatches)
        rows = take_rows(batch, lengths, index, self.pad_id, self.device, vision)
        return batch, lengths, index, rows

    def _my_rows(self, n: int) -> torch.Tensor:
        """Global row indices of this rank, -1 for dummy rows; the same count on every rank."""
        mine = list(range(self.rank, n, self.world))
        count = max(-(-n // self.world), self.cfg.num_minibatches)
        return torch.tensor(mine + [-1] * (count - len(mine)), dtype=torch.int64)

    @torch.no_grad()
    def policy_logprobs(self, token_ids: torch.Tensor, temperature: float | None = None) -> torch.Tensor:
        """log pi(token i | tokens < i) at the sampling temperature (or ``temperature``), 0 at
        i = 0. Shape: (B, L).

        Collective: every rank calls it (FSDP gathers the weights)."""
        t = self.cfg.temperature if temperature is None else temperature
        return token_logprobs(self.policy, token_ids.to(self.device), t, chunk=self.logit_chunk)[0]

    @torch.no_grad()
    def _prepare(self, rows: Rows, batch: Batch, index: torch.Tensor, metrics, version: int) -> Rows:
        """Proximal and reference log-probs, values, rewards, advantages and returns (the
        learner holds ``version``)."""
        shape = rows.batch.token_ids.shape
        logp_prox, values, logp_ref = (torch.zeros(shape, device=self.device) for _ in range(3))
        for part in self._chunks(shape[0]):
            chunk = rows.select(part)
            ids, inputs = chunk.batch.token_ids, self._inputs(chunk)
            n, temperature = ids.shape[1], self.cfg.temperature
            logp_prox[part, :n] = token_logprobs(self.policy, ids, temperature, inputs=inputs,
                                                 chunk=self.logit_chunk)[0]
            if self.critic is not None:
                values[part, :n] = self._values(ids, inputs)
            if self.needs_ref:
                logp_ref[part, :n] = self._ref_logprobs(ids, inputs)
        rows = replace(rows, logp_prox=logp_prox, values=values, logp_ref=logp_ref)
        mask = rows.batch.loss_mask
        # How far the actors' sampling distribution is from the learner's (staleness, numerics):
        # the k1 estimate of KL(behaviour || proximal) on the sampled policy tokens.
        behaviour = rows.batch.behaviour_logprobs
        add_masked_mean(metrics, "policy/behaviour_kl", behaviour - logp_prox, mask)
        answer = self.answer_spans.mask(rows.batch.token_ids, mask)
        add_masked_mean(metrics, "policy/behaviour_kl_answer", behaviour - logp_prox, answer)
        add_masked_mean(metrics, "policy/behaviour_kl_reasoning", behaviour - logp_prox, mask & ~answer)
        fresh_gap(metrics, behaviour - logp_prox, mask & (rows.batch.policy_version == version))
        rewards = rows.batch.token_rewards
        if self.cfg.kl_in_reward:
            rewards = kl_penalty(rows.batch, logp_ref, self.cfg.kl_in_reward["coef"])
            add_masked_mean(metrics, "ref/kl_in_reward", behaviour - logp_ref, mask)
        adv, returns = self._advantages(rows, rewards, batch, index)
        _, ((adv_mean, adv_sq),) = global_moments(mask, adv)  # before whitening
        metrics.exact["advantage/mean"] = adv_mean
        metrics.exact["advantage/std"] = math.sqrt(max(adv_sq - adv_mean * adv_mean, 0.0))
        if self.cfg.vtrace and self.cfg.estimator != "grpo":
            vtrace_metrics(metrics, torch.where(mask, logp_prox - behaviour, 0.0), mask, rows.batch.turn_end,
                           self.cfg.estimator_args.get("rho_clip", 1.0))
        if self.cfg.whiten_advantages:
            over = (advantages.turn_ends(mask, rows.batch.turn_end)
                    if self.cfg.estimator == "turn_wise_gae" else mask)
            adv = self._whiten(adv, mask, over)
        if self.critic is not None:
            metrics.exact["critic/explained_variance"] = explained_variance(values, returns, mask)
            # at each turn's first token: the value of the state the env just showed
            metrics.exact["critic/explained_variance_turn_start"] = explained_variance(
                values, returns, turn_starts(mask))
            if self.value_norm is not None:
                first = self.value_norm.stats is None
                self.value_norm.update(returns, mask, self.critic.head)
                metrics.exact["critic/return_mean"], _, metrics.exact["critic/return_std"] = self.value_norm.stats
                if first:  # the values were the fresh head's output as it is; the first statistics
                    # give it units (the head is not rescaled then): the value loss's old values in them
                    values = self.value_norm.denormalize(values)
        return replace(rows, advantages=adv, returns=returns, values=values, answer=answer)

    @property
    def needs_ref(self) -> bool:
        """The algorithm reads the reference policy's log-probs (a KL term)."""
        return bool(self.cfg.kl_in_reward or self.cfg.kl_loss)

    def _ref_logprobs(self, ids: torch.Tensor, inputs: dict) -> torch.Tensor:
        """The reference policy's log-probs: the frozen copy's, or with LoRA the policy's with
        its adapters off (the same weights: no second copy is loaded)."""
        if self.ref is not None:
            return token_logprobs(self.ref, ids, self.cfg.temperature, inputs=inputs, chunk=self.logit_chunk)[0]
        with lora.adapters_disabled(self.policy):
            return token_logprobs(self.policy, ids, self.cfg.temperature, inputs=inputs,
                                  chunk=self.logit_chunk)[0]

    def _inputs(self, rows: Rows) -> dict:
        """The models' image inputs for ``rows`` ({} for a text model or rows without images)."""
        if self.images is None or rows.vision is None:
            return {}
        return self.images.model_inputs(rows.vision, rows.batch.token_ids)

    def _values(self, ids: torch.Tensor, inputs: dict | None = None) -> torch.Tensor:
        """The critic's values in return units (value_norm: the head's output de-normalised)."""
        raw = self.critic(ids, **(inputs or {}))
        return raw if self.value_norm is None else self.value_norm.denormalize(raw)

    def _advantages(self, rows: Rows, rewards: torch.Tensor, batch: Batch, index: torch.Tensor):
        """(advantages, returns) of this rank's rows; returns is None for grpo."""
        cfg, mask = self.cfg, rows.batch.loss_mask
        if cfg.estimator == "grpo":
            # Episode scores from the whole batch; an in-reward KL penalty enters through each
            # row's sum of penalised token rewards (rows of other ranks arrive by all-reduce).
            scores = batch.scores.to(self.device, torch.float64)
            shift = torch.zeros_like(scores)
            real = (index >= 0).to(self.device)
            index = index.to(self.device)
            shift[index[real]] = (rewards - rows.batch.token_rewards).sum(-1)[real].double()
            dist.all_reduce(shift)
            per_row = advantages.grpo((scores + shift).float(), batch.group_ids.to(self.device),
                                      **cfg.estimator_args)
            return torch.where(mask, per_row[index.clamp(min=0)][:, None], 0.0), None
        log_rho = None
        if cfg.vtrace:
            log_rho = torch.where(mask, rows.logp_prox - rows.batch.behaviour_logprobs, 0.0)
        turn_end = () if cfg.estimator == "masked_gae" else (rows.batch.turn_end,)
        return ESTIMATORS[cfg.estimator](rewards, rows.values, mask, *turn_end, log_rho=log_rho,
                                         **cfg.estimator_args)

    def _whiten(self, x: torch.Tensor, mask: torch.Tensor, over: torch.Tensor,
                eps: float = 1e-8) -> torch.Tensor:
        """advantages.masked_whiten(x, mask, over=over) over all ranks' rows."""
        stats = torch.stack([torch.where(over, x, 0.0).sum().double(), over.sum().double()])
        dist.all_reduce(stats)
        mean = stats[0] / stats[1].clamp(min=1)
        sq = (torch.where(over, x - mean, 0.0).double() ** 2).sum()
        dist.all_reduce(sq)
        centred = torch.where(mask, x - mean, 0.0)
        return (centred * torch.rsqrt(sq / (stats[1] - 1).clamp(min=1) + eps)).to(x.dtype)

    def _update(self, rows: Rows, metrics: StepMetrics) -> None:
        """epochs x num_minibatches optimizer steps of the policy (and the critic)."""
        minibatches = split_rows(rows.batch.token_ids.shape[0], self.cfg.num_minibatches)
        totals = torch.tensor([count_units(rows.select(mb).batch.loss_mask, self.cfg.agg)
                               for mb in minibatches], dtype=torch.float64, device=self.device)
        dist.all_reduce(totals)
        train_policy = self.critic is None or self.steps_done >= self.cfg.critic_warmup
        if train_policy:
            lr = self.cfg.policy_lr(self.steps_done)
            for group in self.optim.param_groups:
                group["lr"] = lr
            metrics.add("optim/lr", lr)
        for _ in range(self.cfg.epochs):
            for mb, total in zip(minibatches, totals.tolist()):
                if total == 0:  # no policy token on any rank: no step (momentum would move weights)
                    continue
                for part in self._chunks(mb.stop - mb.start, start=mb.start):
                    micro = rows.select(part)
                    units = count_units(micro.batch.loss_mask, self.cfg.agg)
                    computed = micro.batch.token_ids.numel()
                    metrics.add("learner/padding", 1 - float(micro.lengths.sum()) / computed, computed)
                    scale = self.world * units / total
                    if train_policy:
                        self._policy_backward(micro, scale, units, metrics)
                    if self.critic is not None:
                        self._critic_backward(micro, scale, units, metrics)
                if train_policy:
                    metrics.add("optim/grad_norm", self._step(self.policy, self.optim))
                if self.critic is not None:
                    metrics.add("optim/critic_grad_norm", self._step(self.critic, self.critic_optim))

    def _policy_backward(self, rows: Rows, scale: float, units: int, metrics) -> None:
        cfg, b = self.cfg, rows.batch
        mask = b.loss_mask
        with lora.adapter_dropout(self.policy, self.lora is not None):
            logp, entropy = token_logprobs(self.policy, b.token_ids, cfg.temperature, entropy=True,
                                           entropy_grad=self.entropy_coef != 0, inputs=self._inputs(rows),
                                           chunk=self.logit_chunk)
        if cfg.loss == "ppo":
            loss, stats = losses.ppo_policy_loss(logp, rows.logp_prox, rows.advantages, mask, **cfg.loss_args)
        elif cfg.loss == "decoupled_ppo":
            loss, stats = losses.decoupled_ppo_loss(logp, rows.logp_prox, b.behaviour_logprobs,
                                                    rows.advantages, mask, **cfg.loss_args)
        else:
            loss, stats = losses.tis_policy_loss(logp, b.behaviour_logprobs, rows.advantages, mask,
                                                 **cfg.loss_args)
        if "approx_kl" not in stats:  # tis: report the same drift measure as the ppo losses
            d = (rows.logp_prox - logp).detach()
            stats["approx_kl"] = float(losses.aggregate(losses.kl_divergence(d, torch.zeros_like(d)), mask))
        ent_loss, ent_stats = losses.entropy_loss(entropy, mask, agg=cfg.agg)
        total = loss + self.entropy_coef * ent_loss
        if cfg.kl_loss:
            only = None if self.kl_spans is None else self.kl_spans.mask(b.token_ids, mask)
            kl, kl_stats = losses.kl_loss(logp, rows.logp_ref, mask, kind=cfg.kl_loss["kind"],
                                          agg=cfg.agg, only=only)
            total = total + cfg.kl_loss["coef"] * kl
            metrics.add("loss/kl", kl_stats["kl"], units)
        (total * scale).backward()
        metrics.add("loss/policy", float(loss.detach()), units)
        metrics.add("loss/entropy", float(ent_loss.detach()), units)
        metrics.add("policy/entropy", ent_stats["entropy"], units)
        if rows.answer is not None:
            add_masked_mean(metrics, "policy/entropy_answer", entropy.detach(), rows.answer)
            add_masked_mean(metrics, "policy/entropy_reasoning", entropy.detach(), mask & ~rows.answer)
        for key, value in stats.items():
            metrics.add(f"policy/{key}", value, units)

    def _critic_backward(self, rows: Rows, scale: float, units: int, metrics) -> None:
        """The value loss; with value_norm in normalised units (targets, old values and the clip
        range divided by the running std), where the head learns."""
        mask, old, target, clip = rows.batch.loss_mask, rows.values, rows.returns, self.cfg.value_clip
        if self.value_norm is not None and self.value_norm.stats is not None:
            old, target = self.value_norm.normalize(old), self.value_norm.normalize(target)
            clip = None if clip is None else clip / self.value_norm.std
        with lora.adapter_dropout(self.critic, self.lora is not None):
            values = self.critic(rows.batch.token_ids, **self._inputs(rows))
        loss, stats = losses.value_loss(values, old, target, mask, clip=clip, agg=self.cfg.agg)
        (self.cfg.value_coef * scale * loss).backward()
        metrics.add("loss/value", float(loss.detach()), units)
        metrics.add("critic/clip_frac", stats["clip_frac"], units)

    def _step(self, model: nn.Module, optim: torch.optim.Optimizer) -> float:
        """Clip, step, zero; a non-finite gradient norm (the same on every rank) skips the step."""
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if math.isfinite(norm):
            optim.step()
        optim.zero_grad(set_to_none=True)
        return norm

    def _chunks(self, count: int, start: int = 0) -> list[slice]:
        """Slices of ``count`` rows from ``start``, at most micro_batch_size rows each."""
        size = self.cfg.micro_batch_size or count
        return [slice(i, min(i + size, start + count)) for i in range(start, start + count, size)]

    # --- weights and checkpoints ------------------------------------------------------------

    def weights_for_publish(self) -> tuple[list, Iterator, dict[str, float]]:
        """``(specs, tensors, stats)``: learner/models.py's ``lazy_publish`` of what the engines
        need of the policy: its whole state; with LoRA the adapter alone, its config and the
        probe (transport/adapters.py), or with ``lora.merge`` the state with the adapter merged
        in. ``stats``: the publish's bytes, and for an adapter the probe's largest shift from
        the base model (a probe check tells base from adapter only beyond its tolerance).
        Collective: every rank calls it and reads the iterator to the end."""
        if self.lora is None:
            entries = state_entries(self.policy)
        elif self.lora.merge:
            entries = lora.merged_entries(self.policy, self.lora)
        else:
            entries = lora.adapter_entries(self.policy)
        stats = {"weights/bytes": float(sum(math.prod(e.shape) * e.dtype.itemsize for e in entries))}
        if self.lora is not None and not self.lora.merge:
            probe = self.policy_logprobs(self.probe_ids, temperature=1.0)[0, 1:]
            with lora.adapters_disabled(self.policy):
                base = self.policy_logprobs(self.probe_ids, temperature=1.0)[0, 1:]
            stats["weights/probe_shift"] = float((probe - base).abs().max())
            entries += [Entry(name, t.dtype, tuple(t.shape), lambda t=t: t)
                        for name, t in adapters.extras(self.adapter_config, self.probe_ids.cpu(), probe.cpu())]
        specs, tensors = lazy_publish(entries)
        return specs, tensors, stats

    def state_dict_for_publish(self) -> dict[str, torch.Tensor]:
        """The policy's full HF-named state dict on CPU on rank 0, {} elsewhere. Collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.policy, options=options)

    def _trainables(self):
        yield "policy", self.policy, self.optim
        if self.critic is not None:
            yield "critic", self.critic, self.critic_optim

    def save_checkpoint(self, path: str | Path, extra: dict) -> None:
        """Sharded models and optimizers (torch.distributed.checkpoint) under ``path/dcp``,
        ``extra`` (step, version, ...: plain JSON data) in ``path/extra.json`` by rank 0, and
        each rank's RNG states (torch, numpy, python: tensors and numbers) in
        ``path/rng-<rank>.pt``. Neither executes a pickle when loaded. Collective."""
        path = Path(path)
        checkpoint.save_trainables(list(self._trainables()), path / "dcp", frozen=self.lora is None)
        torch.save(checkpoint.rng_states(), path / f"rng-{self.rank}.pt")
        fingerprint = self.optimizer_fingerprint()
        if self.rank == 0:
            own = {"entropy_coef": self.entropy_coef, "steps_done": self.steps_done,
                   "value_stats": self.value_norm.stats if self.value_norm else None,
                   "optimizer_fingerprint": fingerprint}
            (path / "extra.json").write_text(json.dumps(dict(extra, _trainer=own)), encoding="utf-8")
        dist.barrier()  # extra.json exists on return, on every rank

    def load_checkpoint(self, path: str | Path) -> dict:
        """Restore what save_checkpoint wrote; returns its ``extra``, with
        ``optimizer_fingerprint`` as saved and ``optimizer_fingerprint_loaded`` as restored
        (equal when the optimizers came back). Collective."""
        path = Path(path)
        checkpoint.load_trainables(list(self._trainables()), path / "dcp", frozen=self.lora is None)
        checkpoint.set_rng_states(torch.load(path / f"rng-{self.rank}.pt", weights_only=True))
        extra = json.loads((path / "extra.json").read_text(encoding="utf-8"))
        own = extra.pop("_trainer")
        self.entropy_coef, self.steps_done = own["entropy_coef"], own["steps_done"]
        if self.value_norm is not None:
            stats = own.get("value_stats")
            self.value_norm.stats = None if stats is None else tuple(stats)
        return {**extra, "optimizer_fingerprint": own["optimizer_fingerprint"],
                "optimizer_fingerprint_loaded": self.optimizer_fingerprint()}

    def optimizer_fingerprint(self) -> list[float]:
        """learner/checkpoint.py's fingerprint of the policy's and critic's optimizers. Collective."""
        return checkpoint.optimizer_fingerprint((o for _, _, o in self._trainables()), self.device)

    def save_hf(self, path: str | Path) -> None:
        """The policy as a directory that transformers and vLLM load: learner/checkpoint.py's
        ``save_hf`` of its weights; with LoRA a PEFT adapter directory (its base: the model
        path), and with ``lora.save_merged`` also the merged model at ``<path>-merged``.
        Collective."""
        if self.lora is None:
            checkpoint.save_hf(self.state_dict_for_publish(), self.rank, self._policy_class(),
                               self.hf_config, self.cfg.model_path, path)
            return
        with torch.no_grad():
            tensors = {e.name: e.read().cpu() for e in lora.adapter_entries(self.policy)}
        if self.rank == 0:
            adapters.write_adapter(path, self.adapter_config, tensors)
            checkpoint.copy_model_files(self.cfg.model_path, path)
        dist.barrier()
        if self.lora.save_merged:
            with torch.no_grad():
                merged = {e.name: e.read().cpu() for e in lora.merged_entries(self.policy, self.lora)}
            checkpoint.save_hf(merged if self.rank == 0 else {}, self.rank, self._policy_class(),
                               self.hf_config, self.cfg.model_path, f"{path}-merged")
