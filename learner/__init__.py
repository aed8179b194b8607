"""Learner: advantage estimators and losses (pure), batches, the trajectory buffer, the FSDP model
and train step, checkpoints, and one rank's worker process. Imports transport only; never actors
or envs."""
