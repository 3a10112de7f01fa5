"""The host's time per step in two parts: one per scheduler call (scheduling, preparing the inputs) and
one every step. A step run alone pays both; a multi-step window pays the first once and the second on
each of its steps; with windows of one step the split is their sum."""

import numpy as np
import pytest

from test_engine import NO_NETWORK, FixedCosts
from tokenpath import load_scenario, simulate
from tokenpath.compute import ComputeModel, load_chip, load_model
from tokenpath.config.assumptions import lookup
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.host_time import VLLM_V0_HOST_STEP_S, VLLM_V0_HOST_WINDOW_S, host_step_cost
from tokenpath.engine.loop import run_engine
from tokenpath.engine.spec import EngineSpec

WINDOW_S, STEP_S, PER_SEQUENCE_S = 2e-3, 0.5e-3, 10e-6
DECODE = (8, 8, 8 * 300, 8 * 300)  # a decode step of 8 sequences at 300 positions each


def _compute(**host):
    return ComputeModel(load_model("llama-3.1-8b"), load_chip("h100"), 1, "bf16", "bf16", **host)


def test_vllm_v0_reads_its_two_parts_from_the_registry():
    host = host_step_cost("vllm-v0")
    assert (host.window_s, host.step_s) == (VLLM_V0_HOST_WINDOW_S, VLLM_V0_HOST_STEP_S)
    assert (VLLM_V0_HOST_WINDOW_S, VLLM_V0_HOST_STEP_S) == (lookup("vllm_v0_host_window_s").value,
                                                           lookup("vllm_v0_host_step_s").value)
    # the other profiles' one constant is their time per scheduler call
    assert (host_step_cost("vllm-v1").window_s, host_step_cost("vllm-v1").step_s) == (lookup("host_step_s").value, 0)


@pytest.mark.parametrize("overlapped", [False, True])
def test_a_step_that_calls_the_scheduler_pays_both_parts_and_one_inside_a_window_the_step_part(overlapped):
    gpu = _compute()
    host = _compute(host_window_s=WINDOW_S, host_step_s=STEP_S, host_per_sequence_s=PER_SEQUENCE_S,
                    host_overlapped=overlapped)
    gpu_s = gpu.step_time_s(*DECODE)
    assert host.host_s(8) == pytest.approx(WINDOW_S + STEP_S + 8 * PER_SEQUENCE_S, rel=1e-12)
    assert host.host_s(8, scheduled=False) == pytest.approx(STEP_S + 8 * PER_SEQUENCE_S, rel=1e-12)
    for scheduled in (True, False):
        host_s = host.host_s(8, scheduled)
        expected = max(gpu_s, host_s) if overlapped else gpu_s + host_s
        assert host.step_time_s(*DECODE, scheduled=scheduled) == pytest.approx(expected, rel=1e-12)


def test_with_one_step_per_call_the_split_is_the_sum():
    split = _compute(host_window_s=WINDOW_S, host_step_s=STEP_S, host_per_sequence_s=PER_SEQUENCE_S)
    summed = _compute(host_window_s=WINDOW_S + STEP_S, host_per_sequence_s=PER_SEQUENCE_S)
    assert split.step_time_s(*DECODE) == pytest.approx(summed.step_time_s(*DECODE), rel=1e-12)


def _v0(window, scheduler_s, step_s=1e-3):
    """One request of a 10-token prompt and 9 tokens, alone on a vllm-v0 engine with `window`-step
    windows, each step `step_s` plus `scheduler_s` when it calls the scheduler."""
    spec = EngineSpec(scheduler="vllm-v0", chunked_prefill=False, num_scheduler_steps=window)
    return run_engine(np.zeros(1, np.int64), np.array([10]), np.array([9]),
                      FixedCosts(base_s=step_s, scheduler_s=scheduler_s), LastMile(NO_NETWORK), spec, 10**6)


def test_a_window_pays_the_part_per_scheduler_call_once_and_the_step_part_on_each_step():
    trace = _v0(4, 2e-3)
    # the prefill step is a window of its own; the 8 decode tokens take two windows of 4 steps
    assert list(trace.step_scheduled) == [1, 1, 0, 0, 0, 1, 0, 0, 0]
    assert list(trace.step_compute_ns) == [3_000_000, 3_000_000, 1_000_000, 1_000_000, 1_000_000,
                                           3_000_000, 1_000_000, 1_000_000, 1_000_000]
    assert trace.step_compute_ns[1:5].sum() == 2_000_000 + 4 * 1_000_000
    # the window's tokens leave when it ends
    assert trace.last_step_end_ns[0] == 3e6 + 2 * (3e6 + 3 * 1e6)


def test_in_windows_of_one_step_every_step_pays_the_sum():
    split, summed = _v0(1, 2e-3), _v0(1, 0.0, step_s=3e-3)
    assert list(split.step_scheduled) == [1] * 9
    assert np.array_equal(split.step_compute_ns, summed.step_compute_ns)
    assert np.array_equal(split.step_leave_ns, summed.step_leave_ns)


@pytest.mark.parametrize("window", [1, 4])
def test_the_simulation_charges_vllm_v0_s_parts_where_its_code_runs_them(window):
    """Twelve requests at once, of fixed lengths: the same steps under any host time. Raising the part
    per scheduler call lengthens the steps that call the scheduler by as much, the part every step
    every step."""
    base = {"model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1,
            "engine.scheduler": "vllm-v0", "engine.chunked_prefill": False,
            "engine.num_scheduler_steps": window, "workload.num_requests": 12, "workload.arrival.rate": "inf",
            "workload.input": {"kind": "fixed", "value": 100}, "workload.output": {"kind": "fixed", "value": 17}}
    runs = {name: simulate(load_scenario("typical", {**base, **extra})).traces[0] for name, extra in {
        "registry": {},
        "window": {"assumptions.vllm_v0_host_window_s": VLLM_V0_HOST_WINDOW_S + 1e-3},
        "step": {"assumptions.vllm_v0_host_step_s": VLLM_V0_HOST_STEP_S + 1e-3},
    }.items()}
    # the first request's prefill, the other eleven's (the front end passes them on one by one), then
    # 16 decode steps: each calls the scheduler, or each window of 4 calls it at its first
    for trace in runs.values():
        assert list(trace.step_tokens) == [100, 1100] + [12] * 16
        assert list(trace.step_scheduled) == [1, 1] + ([1] * 16 if window == 1 else [1, 0, 0, 0] * 4)
    registry = runs["registry"]
    longer_ns = {name: runs[name].step_compute_ns - registry.step_compute_ns for name in ("window", "step")}
    assert np.all(np.abs(longer_ns["window"] - registry.step_scheduled * 1_000_000) <= 1)
    assert np.all(np.abs(longer_ns["step"] - 1_000_000) <= 1)
