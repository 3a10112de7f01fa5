"""Request send times."""

from __future__ import annotations

import math

import numpy as np

from tokenpath.workload.spec import ArrivalSpec


def arrival_times_s(spec: ArrivalSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` non-decreasing send times in seconds (float64), the first at 0.

    gamma: gaps with shape `burstiness` and scale 1 / (rate * burstiness), as vLLM bench draws them;
    one gap is drawn per request and request i + 1 waits the gap drawn after request i.
    """
    if n < 0:
        raise ValueError(f"cannot draw {n} arrival times")
    if n == 0 or math.isinf(spec.rate):
        return np.zeros(n, dtype=np.float64)
    if spec.pattern == "constant":
        return np.arange(n, dtype=np.float64) / spec.rate
    gaps_s = rng.gamma(shape=spec.burstiness, scale=1.0 / (spec.rate * spec.burstiness), size=n)
    return np.concatenate(([0.0], np.cumsum(gaps_s[:-1])))
