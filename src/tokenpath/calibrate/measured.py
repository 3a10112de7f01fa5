"""What one measured phase gives the engine fit: its requests as the server saw them and the two
figures the fit reproduces, with the statistic each is.

Every reader of a measurement makes one: `tokenpath bench` results (calibrate/probe.py), a
`vllm bench serve`, SGLang `bench_serving` or guidellm result (calibrate/formats.py), a published
latency row (validate/calibrated.py). The same statistic of a simulated run of the same requests
is what the fit compares with them (`statistics_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tokenpath.config.errors import UserError
from tokenpath.sim.run import Run, itl_gaps_ns
from tokenpath.workload import Requests


@dataclass(frozen=True)
class Statistic:
    """Which figures a phase reports: TTFT's mean or median over requests, and the decode metric's:
    "tpot", (E2E - TTFT) / (tokens - 1) per request, or "itl", every gap between streamed tokens."""

    ttft: Literal["median", "mean"] = "median"
    decode: Literal["median", "mean"] = "median"
    decode_metric: Literal["tpot", "itl"] = "tpot"

    def keys(self) -> tuple[str, str]:
        """The names of the two figures in a calibration file: ttft_p50_s, tpot_p50_s for medians."""
        def short(stat: str) -> str:
            return "p50" if stat == "median" else stat
        return f"ttft_{short(self.ttft)}_s", f"{self.decode_metric}_{short(self.decode)}_s"


MEDIANS = Statistic()


@dataclass(frozen=True)
class Measured:
    """What one phase measured: its requests as the server saw them and its TTFT and decode figures
    (`statistic`) over the `counted` ones (not warm-up).

    `sent`: the requests' arrival times are when the client sent each (relative to the phase's
    first), so a closed loop's waits are in them; else they are when the client meant to send each
    (a Poisson draw, or every one at 0) and at most `concurrency` were outstanding at once, so a
    replay caps them the same way."""

    name: str
    requests: Requests
    counted: np.ndarray  # bool, per request of `requests`
    ttft_s: float
    decode_s: float
    results: str
    concurrency: int | None = None
    rate: float = math.inf
    statistic: Statistic = MEDIANS
    sent: bool = True

    def replay_concurrency(self) -> int | None:
        """The concurrency cap a replay applies: none where the arrival times are the measured sends."""
        return None if self.sent else self.concurrency

    def describe(self) -> dict[str, object]:
        ttft_key, decode_key = self.statistic.keys()
        return {"phase": self.name, "results": self.results, "requests": int(self.counted.sum()),
                "input_tokens_mean": float(self.requests.input_tokens.mean()),
                "output_tokens_mean": float(self.requests.output_tokens.mean()),
                "concurrency": self.concurrency or 0, "rate_per_s": "inf" if math.isinf(self.rate) else self.rate,
                ttft_key: self.ttft_s, decode_key: self.decode_s}


def _reduce(values: np.ndarray, stat: str) -> float:
    if not len(values):
        return math.nan
    return float(np.mean(values)) if stat == "mean" else float(np.median(values))


def statistics_s(run: Run, counted: np.ndarray, statistic: Statistic = MEDIANS) -> tuple[float, float]:
    """A run's TTFT and decode figure (seconds) over its counted, completed requests, as `statistic`
    says (TPOT: those with 2+ tokens; ITL: every gap between their tokens' arrivals)."""
    counted = counted & run.completed
    ttft_s = _reduce(run.ttft_ns[counted] / 1e9, statistic.ttft)
    if statistic.decode_metric == "itl":
        if run.token_client_ns is None:
            raise UserError("its ITL needs every token's time, which a run this large does not keep; give it "
                            "fewer requests or state its TPOT")
        gaps_ns = itl_gaps_ns(run.token_client_ns, run.token_offsets, ~counted)
        return ttft_s, _reduce(gaps_ns / 1e9, statistic.decode)
    several = counted & (run.output_tokens > 1)
    return ttft_s, _reduce(run.tpot_ns()[several] / 1e9, statistic.decode)
