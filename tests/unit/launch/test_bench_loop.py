"""tests/benchmarks/bench_loop.cpu_per_step: CPU seconds per step by column, by hand."""

import pytest

from tests.benchmarks.bench_loop import cpu_per_step, overlap_bound, step_phases


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


def test_the_overlap_bound_takes_the_longer_phase_step_by_step():
    # Sync on a core each: step 1 trains the critic alone (0.5 s, shorter than its 1 s rollout),
    # step 2 trains both (2 s). Overlapped, the steps take 1 and 2 s: 1.5 s, not max(1, 1.25).
    bound = {"phases": [(1.0, 0.5), (1.0, 2.0)]}
    unbound = {"phases": [(0.75, 0.25), (0.75, 1.25)], "traj_per_s": 4.0}  # 1.5 s a step
    asyn = {"traj_per_s": 3.6}
    got = overlap_bound(unbound, bound, asyn)
    assert got["best async step s"] == "1.50"
    assert got["best async / sync"] == "1.00x"  # (0.75 + 0.75) / 1.5
    assert got["async / sync"] == "0.90x" and got["of the best"] == "0.90"


def test_step_phases_split_each_step_from_the_rows():
    rows = [{"time_s": 10.0, "timing/step_s": 1.0},
            {"time_s": 13.0, "timing/step_s": 1.5, "weights/push_s": 0.1, "timing/wait_batch_s": 0.2},
            {"time_s": 15.0, "timing/step_s": 1.0, "weights/push_s": 0.1}]
    got = step_phases(rows)
    assert [x for pair in got for x in pair] == pytest.approx([3.0 - 1.6 - 0.2, 1.6, 2.0 - 1.1, 1.1])
