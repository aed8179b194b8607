"""Learner: advantage estimators and losses (pure), and later the FSDP model, train step,
trajectory buffer and worker process. Imports transport only; never actors or envs."""
