"""Runs of decode steps taken at once (engine/replica.py's `decode_run`) give every step and every request
exactly as the steps taken one by one do."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario, simulate
from tokenpath.delivery.frontend import _starts_in_turn
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.replica import Replica
from tokenpath.sim.deployment import build_deployment

# The three profiles' loops (SGLang's prefill-first overlapped, with its new-token ratio; vLLM V1's;
# TensorRT-LLM's reserving one), each layout of the front end, closed loops of long answers and open arrivals
# that cut the runs short, a sliding window's layers, sessions whose turns share their conversation's prefix.
CASES = {
    "vllm-v1 api-server c1": {"engine.scheduler": "vllm-v1", "delivery.detokenize": "api-server",
                              "workload.max_concurrency": 1},
    "vllm-v1 engine c4": {"engine.scheduler": "vllm-v1", "delivery.detokenize": "engine",
                          "workload.max_concurrency": 4},
    "sglang detokenizer c1": {"engine.scheduler": "prefill-first", "delivery.detokenize": "detokenizer",
                              "workload.max_concurrency": 1},
    "sglang detokenizer c8": {"engine.scheduler": "prefill-first", "delivery.detokenize": "detokenizer",
                              "workload.max_concurrency": 8},
    "trtllm api-server c2": {"engine.scheduler": "trtllm", "delivery.detokenize": "api-server",
                             "workload.max_concurrency": 2},
    "vllm-v1 detokenizer 3 req/s": {"engine.scheduler": "vllm-v1", "delivery.detokenize": "detokenizer",
                                    "workload.arrival.rate": 3.0},
    "sglang api-server 3 req/s": {"engine.scheduler": "prefill-first", "delivery.detokenize": "api-server",
                                  "workload.arrival.rate": 3.0},
    "gpt-oss sglang c2": {"model.name": "gpt-oss-120b", "engine.scheduler": "prefill-first",
                          "workload.max_concurrency": 2},
    "sessions": {"workload.sessions": {"turns": 3, "think_time": "1 s"}, "workload.arrival.rate": 1.0},
}
# Requests queued behind a full engine, which no decode step can admit (Replica._admits_none): every sequence slot
# taken; the cache's blocks all reserved (TensorRT-LLM); a refusal that waits for a running request to leave (SGLang).
ONE_H200 = {"deployment.chip": "h200", "deployment.tp": 1, "deployment.chips": 1, "model.precision": "bf16",
            "workload.output": {"kind": "normal", "mean": 800, "sd": 100}}
QUEUED = {
    "vllm-v1 every slot taken": {"engine.scheduler": "vllm-v1", "engine.max_num_seqs": 4},
    "trtllm every block reserved": {**ONE_H200, "engine.scheduler": "trtllm", "engine.gpu_memory_utilization": 0.9},
    "sglang refused": {**ONE_H200, "engine.scheduler": "prefill-first", "engine.gpu_memory_utilization": 0.99},
}


def _scenario(overrides):
    return load_scenario("typical", {
        "deployment.tp": 8, "workload.num_requests": 24, "workload.input": {"kind": "fixed", "value": 300},
        "workload.output": {"kind": "normal", "mean": 400, "sd": 100}, "workload.arrival.rate": "inf",
        **overrides})


def _counted(monkeypatch):
    """Count the steps that runs took and those `step` took."""
    counts = {"run": 0, "step": 0, "queued": 0}
    run, step = Replica.decode_run, Replica.step

    def counted_run(self):
        before = self.num_steps
        ran = run(self)
        counts["run"] += self.num_steps - before
        if self.waiting:  # (a run leaves the queue as it found it)
            counts["queued"] += self.num_steps - before
        return ran

    def counted_step(self):
        counts["step"] += 1
        return step(self)

    monkeypatch.setattr(Replica, "decode_run", counted_run)
    monkeypatch.setattr(Replica, "step", counted_step)
    return counts


@pytest.mark.parametrize("case", [*CASES, *QUEUED])
def test_runs_of_decode_steps_give_every_step_and_request_as_one_by_one(case, monkeypatch):
    scenario = _scenario({**CASES, **QUEUED}[case])
    counts = _counted(monkeypatch)
    at_once = simulate(scenario)
    # most steps of these loads only decode, and runs took them; with requests queued where the case queues them
    assert counts["run"] > 2 * counts["step"], counts
    assert (counts["queued"] > 0) == (case in QUEUED), counts
    monkeypatch.setattr(Replica, "decode_run", lambda self: False)
    one_by_one = simulate(scenario)
    for a, b in zip(at_once.traces, one_by_one.traces, strict=True):  # every step's row, every request's sums
        for name, values in vars(b).items():
            if isinstance(values, np.ndarray):
                assert np.array_equal(values, getattr(a, name)), name
            else:
                assert values == getattr(a, name), name
    for name, values in vars(one_by_one.run).items():
        if isinstance(values, np.ndarray):
            assert np.array_equal(values, getattr(at_once.run, name)), name


def test_a_run_stops_before_a_request_reaches_the_server(monkeypatch):
    """Poisson arrivals at 3 req/s through the front end: runs end where a request comes, and the steps
    that see one are taken one by one."""
    counts = _counted(monkeypatch)
    simulated = simulate(_scenario(CASES["vllm-v1 detokenizer 3 req/s"]))
    assert counts["step"] >= 24 and counts["run"] > 0
    assert sum(len(t.step_start_ns) for t in simulated.traces) == counts["run"] + counts["step"]


@pytest.mark.parametrize("model", ["llama-3.1-70b", "deepseek-v3", "gpt-oss-120b"])
def test_a_compute_model_times_a_run_of_decode_steps_as_it_times_each(model):
    """A dense model; MLA and routed experts (GEMMs among the ops timed every step); a sliding window's
    layers (their attention capped at the window)."""
    deployment = build_deployment(load_scenario("typical", {"model.name": model, "deployment.tp": 8}))
    compute = deployment.costs.compute
    pairs = np.array([1, 999, 12_345, 2_000_001, 31_337_000], np.int64)
    for sequences in (1, 7, 64):
        times = compute.decode_steps_s(sequences, pairs, pairs)
        assert times is not None
        each = [compute.step_time_s(sequences, sequences, int(p), int(p)) for p in pairs]
        assert times.tolist() == each  # the same floats, bit for bit


@pytest.mark.parametrize("layout", ["api-server", "engine", "detokenizer"])
@pytest.mark.parametrize("front_end", [True, False])
def test_the_last_mile_accounts_a_run_of_steps_as_it_accounts_each(layout, front_end):
    scenario = load_scenario("typical", {"delivery.detokenize": layout})
    deployment = build_deployment(scenario)
    gpu_end_ns = np.array([1_000, 5_000, 5_200, 9_000_000, 9_010_000, 9_010_001], np.int64)

    def last_mile():
        return LastMile(scenario.resolved_delivery(), deployment.front_end, model_front_end=front_end)

    step_by_step, at_once = last_mile(), last_mile()
    for one in (step_by_step, at_once):  # a busy front end first: the run's first steps queue behind it
        one.on_step(900, 4000, 4000)
    expected = [step_by_step.on_step(int(t), 32, 32) for t in gpu_end_ns]
    blocking_ns = at_once.steps_blocking_ns(32, 32)
    leave_ns, queue_ns, work_ns = at_once.on_steps(gpu_end_ns, 32, 32)
    assert [(blocking_ns, *values) for values in zip(leave_ns.tolist(), queue_ns.tolist(), work_ns.tolist())] \
        == expected
    assert at_once.busy_ns() == step_by_step.busy_ns()
    if front_end:
        assert queue_ns[0] > 0  # (the case the closed form's running maximum is for)
        assert vars(at_once.front_end) == vars(step_by_step.front_end)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=40), st.integers(0, 200_000), st.integers(0, 5_000))
def test_jobs_taken_in_turn_start_as_one_by_one(gaps, free_ns, work_ns):
    ready_ns = np.cumsum(np.array(gaps, np.int64))
    starts, free = [], free_ns
    for ready in ready_ns.tolist():
        start = max(ready, free)
        starts.append(start)
        free = start + work_ns
    assert _starts_in_turn(ready_ns, free_ns, work_ns).tolist() == starts
