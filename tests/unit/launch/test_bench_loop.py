"""tests/benchmarks/bench_loop.cpu_per_step: CPU seconds per step by column, by hand."""

import pytest

from tests.benchmarks.bench_loop import cpu_per_step


def test_cpu_per_step_groups_kinds_into_columns_and_divides_by_steps():
    first = {"cpu/LearnerWorker_s": 10.0, "cpu/EngineCore_s": 1.0, "cpu/VLLM::Worker_s": 5.0,
             "cpu/raylet_s": 2.0, "step": 1, "timing/step_s": 9.9}
    last = {"cpu/LearnerWorker_s": 18.0, "cpu/EngineCore_s": 2.0, "cpu/VLLM::Worker_s": 11.0,
            "cpu/InferenceActor_s": 0.8, "cpu/raylet_s": 2.4, "cpu/envs.worker_s": 0.4, "step": 5,
            "timing/step_s": 1.0}
    got = cpu_per_step(first, last, 4)
    # learner 8 / 4; vLLM (1 + 6) / 4; the actor appeared after the first row: 0.8 / 4;
    # the rest: raylet 0.4 and an env worker 0.4, / 4.
    assert got == pytest.approx({"learner": 2.0, "vllm": 1.75, "actor": 0.2, "rest": 0.2})
