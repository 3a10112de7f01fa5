"""Request send times."""

from __future__ import annotations

import math

import numpy as np

from tokenpath.workload.spec import ArrivalSpec


def arrival_times_s(spec: ArrivalSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` non-decreasing send times in seconds (float64), the first at 0.

    gamma: a renewal process at `rate`: gaps with shape `burstiness` and scale 1 / (rate * burstiness)
    (the gaps vLLM bench draws), one per request, request i + 1 sent the gap drawn after request i.
    vLLM's client then departs from the process (vllm 0.27.1, vllm/benchmarks/serve.py, get_request):
    it sends request i at the sum of the first i + 1 gaps, so the first request waits one gap, and
    rescales those sums so the last send lands at exactly n / rate. Here the first send is at 0 and the
    gaps are kept as drawn, so the span of n sends varies from seed to seed around (n - 1) / rate
    (relative sd 1 / sqrt((n - 1) burstiness)): tokenpath's `rate` is the process's, vLLM's the run's.
    """
    if n < 0:
        raise ValueError(f"cannot draw {n} arrival times")
    if n == 0 or math.isinf(spec.rate):
        return np.zeros(n, dtype=np.float64)
    if spec.pattern == "constant":
        return np.arange(n, dtype=np.float64) / spec.rate
    gaps_s = rng.gamma(shape=spec.burstiness, scale=1.0 / (spec.rate * spec.burstiness), size=n)
    return np.concatenate(([0.0], np.cumsum(gaps_s[:-1])))


def vllm_send_times_s(spec: ArrivalSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` send times as vLLM's `bench serve` schedules a run of `spec` (a gamma process; vllm/benchmarks/
    serve.py, `get_request`): request i at the sum of the first i + 1 gaps, rescaled so the last send
    lands at exactly n / rate (arrival_times_s's docstring). For a run whose result file keeps no send times."""
    if n <= 0 or math.isinf(spec.rate):
        return np.zeros(max(n, 0), dtype=np.float64)
    sums_s = np.cumsum(rng.gamma(shape=spec.burstiness, scale=1.0 / (spec.rate * spec.burstiness), size=n))
    return sums_s * (n / spec.rate / sums_s[-1])
