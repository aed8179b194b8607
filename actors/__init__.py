"""Inference actors: a vLLM engine playing many multi-turn episodes against env worker pools.

Imports envs and transport only. ``episode`` builds one episode's tokens (token in, token out);
``actor`` runs many of them at once on an AsyncLLM and applies weight updates in flight;
``vllm_extension`` receives the learner's broadcast inside the vLLM worker.
"""
