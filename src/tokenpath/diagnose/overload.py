"""Whether a run was overloaded: offered more than it could serve, so work piled up through it.

A continuous-batching engine shows overload two ways. Either requests wait for admission (a queue: TTFT
climbs through the run), or every request is admitted and the batch grows (TPOT and E2E climb while the
backlog of requests in the system grows). Both are read from what the client saw, so the same rule judges
simulated and measured runs, at any run length. A run is overloaded when it shows any of:

- queued: first tokens came at a rate OVERLOAD_RATE_RATIO times below the send rate;
- latency climbed: the last quarter of sends waited TREND_RATIO times as long as the first quarter did
  for a first token (a queue for admission), or for the whole answer (a queue after the first token, such
  as KV caches waiting for the links to a decode replica);
- served below offered in its steady part: once the system had time to fill, requests finished at a
  lower rate than they were sent, so the backlog grew by more than BACKLOG_GROWTH of the requests sent
  then. A stable system holds its backlog (Little's law: arrival rate x time in system); an overloaded
  one gains (offered - served) / offered of each new request. The count's own noise is allowed for: a
  stable run's growth has a standard deviation of about sqrt(2 x backlog) / sends, and the growth must
  clear the threshold by two of them.

The steady part starts one fill time (the FILL_QUANTILE of the run's E2Es) after the first send and
needs the sends to go on for WATCH_FILLS of a fill time more. A shorter run cannot tell a batch that is
still filling from one that never stops growing, so its verdict rests on the first two signs alone and
says it is tentative (`confident` is False). Those two hold in short runs: a stable run's late requests
meet a fuller batch, which lengthens their TTFT a little (0.9-1.7x measured below) and, as the batch
drains after the last send, shortens their E2E (measured 0.69-1.37x over the runs below, 50 to 2,000
requests; 6.3x where KV caches queue for 50 MB/s links to a decode replica).

Measured on the default scenario (Llama-3.1-70B FP8, TP8 on H200; every request sent at once, it serves
43.7 req/s), 2,000 requests unless said, as (growth after filling, TTFT trend): 35 req/s 0.02 and 1.09
(seed 2: -0.04 and 0.91; burstiness 0.5: 0.04 and 1.43); 36.5 req/s, 1,000 requests, seeds 0 and 1: 0.12
and 1.40, -0.01 and 1.18; 40 req/s 0.05 and 1.21; 45 req/s 0.21 and 1.55, overloaded (8,000 requests:
0.07 and 1.75, served 44.0 req/s). Llama-3.1-8B on one H100 (60.2 req/s at once), 1,000 requests: 45
req/s 0.03 and 1.11; 50 req/s 0.09 and 1.18; 60 req/s 0.19 and 1.67, overloaded. Within a few percent
of capacity a finite run is still filling when it ends, the verdict there a judgement either way: the
runs at 36.5 req/s (seed 0) and the 8B's at 50 req/s end still filling (below), and the run at 45 req/s,
overloaded over 2,000 requests, is still filling over 8,000.

A stable run can also end before it settles: near capacity the batch takes minutes to reach the size
where it serves what it is offered, and until then every request meets a smaller batch, with shorter
steps, than the load will hold. Its latencies are a transient's, too short, and nothing else in the run
says so. The run is still filling when, after it filled once, its backlog grew by more than
SETTLING_GROWTH of the requests sent (with the same allowance for noise) but not enough to call it
overloaded: the summary's `load.settled` is then false and the bottleneck line says so. Llama-2-70B FP8
as MLPerf Inference v4.1's H100 server ran it (four TP2 replicas on 8 x H100, 75 req/s, TensorRT-LLM at
its default admission; max batch 1024; closed/NVIDIA/configs/llama2-70b/Server/__init__.py,
H100_SXM_80GB_TP2x4, of github.com/mlcommons/inference_results_v4.1; assumed here: an FP8 KV cache and
prompts of 300 tokens on average; 290 out, as its run's tokens per sample): 6,000 requests grew the
backlog by 13% of the sends after filling, with a mean TPOT of 64 ms; 40,000 requests by 1.8%, 101 ms;
180,000 (the run's 2,400 s), 111 ms (the submission's measured mean,
closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/
llama2-70b-99.9/Server/performance/run_1/mlperf_log_summary.txt: 155 ms at 74.4 req/s, 21,606 tokens/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpath.config.units import format_number

OVERLOAD_RATE_RATIO = 1.2
TREND_RATIO = 2.0
BACKLOG_GROWTH = 0.15
# A stable run whose backlog grew by more than this share of its sends after it filled was still filling.
SETTLING_GROWTH = 0.05
FILL_QUANTILE = 0.9
WATCH_FILLS = 0.5
# Fewer completed requests than this leave no quarter to compare.
MIN_TREND_REQUESTS = 8
# What marks a run still filling, or overloaded, where runs are ranked or listed (levers, a sweep's
# Pareto frontier), and the footnote that says so.
FILLING_MARK = "~"
FILLING_NOTE = (f"{FILLING_MARK} still filling when its sends stopped (load.settled): its latencies are a "
                "transient's and read low; run more requests")
OVERLOAD_MARK = "!"
OVERLOAD_NOTE = (f"{OVERLOAD_MARK} overloaded (load.overloaded): its latencies are a growing queue's, as long as "
                 "the run made them")
SHORT_MARK = "?"
SHORT_NOTE = (f"{SHORT_MARK} too short to watch (load.confidence low, load.settled null): sent over less than a "
              "fill time and a half, it cannot tell a batch still filling from one growing without end, so its "
              "latencies may be a transient's; run more requests")


def still_filling(settled: bool | None, overloaded: bool) -> bool:
    """Whether a run's summary (its `load.settled` and `load.overloaded`) says it was stable but still
    filling when its sends stopped."""
    return settled is False and not overloaded


def too_short(overloaded: bool, confidence: str | None) -> bool:
    """Whether a run's summary (its `load.overloaded` and `load.confidence`) says it was too short to watch
    a steady part and showed no overload: it may have been still filling, or overloaded unseen. (A run
    that shows overload in a short run is marked overloaded; a summary without `confidence` is neither.)"""
    return confidence == "low" and not overloaded


def load_marks(settled: bool | None, overloaded: bool, confidence: str | None = None) -> str:
    """The marks (with a leading space each) of a run by its summary's `load.settled`, `load.overloaded`
    and `load.confidence`; empty for a run long enough to watch that was neither overloaded nor still
    filling."""
    return (f" {OVERLOAD_MARK}" if overloaded else "") + (f" {FILLING_MARK}" if still_filling(settled, overloaded)
                                                         else "") + \
        (f" {SHORT_MARK}" if too_short(overloaded, confidence) else "")


def load_notes(runs: list[tuple[bool | None, bool, str | None]]) -> list[str]:
    """The footnotes of the marks that some of `runs` ((settled, overloaded, confidence) each) carry."""
    return ([OVERLOAD_NOTE] if any(run[1] for run in runs) else []) + \
        ([FILLING_NOTE] if any(still_filling(*run[:2]) for run in runs) else []) + \
        ([SHORT_NOTE] if any(too_short(*run[1:]) for run in runs) else [])


def verdict_line(load: dict[str, Any]) -> str | None:
    """What a run's summary (its `load` document) says to print of its load where no bottleneck line
    says it (a measured run's text and page): overloaded, with its signs, or still filling; None for a run
    that was neither."""
    if load["overloaded"]:
        return f"overloaded: {', '.join(load['signs'])}" + (f" ({load['caveat']})" if load.get("caveat") else "")
    if still_filling(load.get("settled"), False):
        return load["caveat"]
    return None


@dataclass(frozen=True)
class Load:
    """What a run was offered and what it served, and how its latency and backlog moved through it."""

    offered_per_s: float        # requests sent per second, first send to last (inf: all at once)
    admitted_per_s: float       # first tokens per second, first to last
    served_per_s: float         # requests finished per second, first finish to last
    span_e2es: float = math.inf  # the sends' span in median E2Es
    ttft_trend: float | None = None  # median TTFT of the last quarter of sends / the first quarter's
    e2e_trend: float | None = None   # the same of E2E
    steady: Steady | None = None     # the run after it filled; None when too short to watch one

    @property
    def confident(self) -> bool:
        """Long enough that a steady state could form and be watched."""
        return self.steady is not None

    def signs(self) -> list[str]:
        """Each sign of overload this run shows, in words; empty when it shows none."""
        found = []
        if self.offered_per_s > OVERLOAD_RATE_RATIO * self.admitted_per_s:
            found.append(f"first tokens came at {format_number(self.admitted_per_s)} req/s")
        for name, trend in (("TTFT", self.ttft_trend), ("E2E", self.e2e_trend)):
            if trend is not None and trend > TREND_RATIO:
                found.append(f"{name} grew {trend:.1f}x from the first quarter of requests to the last")
        if self.steady is not None and self.steady.growing:
            found.append(f"after it filled, it served {format_number(self.steady.served_per_s)} of "
                         f"{format_number(self.steady.offered_per_s)} req/s offered")
        return found

    @property
    def overloaded(self) -> bool:
        return bool(self.signs())

    @property
    def settled(self) -> bool | None:
        """False when the backlog still grew after the run filled (overloaded, or still filling when its
        sends stopped, its latencies then a transient's); None when it was too short to watch."""
        return None if self.steady is None else self.steady.settled

    @property
    def filling(self) -> bool:
        """Not settled, and not overloaded: the batch was still filling when the sends stopped."""
        return still_filling(self.settled, self.overloaded)

    def document(self) -> dict[str, Any]:
        steady = self.steady
        return {"offered_requests_per_s": self.offered_per_s if math.isfinite(self.offered_per_s) else None,
                "served_requests_per_s": self.served_per_s, "overloaded": self.overloaded,
                "confidence": "high" if self.confident else "low",
                "span_e2es": self.span_e2es if math.isfinite(self.span_e2es) else None,
                "ttft_trend": self.ttft_trend, "e2e_trend": self.e2e_trend,
                "steady_offered_requests_per_s": None if steady is None else steady.offered_per_s,
                "steady_served_requests_per_s": None if steady is None else steady.served_per_s,
                "backlog_growth": None if steady is None else steady.growth, "settled": self.settled,
                "signs": self.signs(), "caveat": self.caveat() or None}

    def caveat(self) -> str:
        """For a short run, why its verdict is tentative; for one still filling, why its latencies read
        low; empty otherwise."""
        if self.steady is None:
            return (f"a short run, sent over {self.span_e2es:.1f} median E2Es: overload judged by admission and "
                    "latency trends only")
        if self.filling:
            return (f"still filling: after it filled once, its backlog grew by {self.steady.growth:.0%} of the "
                    "requests sent, so its latencies are a transient's and read low; run more requests")
        return ""


@dataclass(frozen=True)
class Steady:
    """The sends after the system filled: how many were sent and finished, and the backlog they met."""

    span_s: float
    sent: int
    finished: int
    backlog_at_start: int

    @property
    def offered_per_s(self) -> float:
        return self.sent / self.span_s

    @property
    def served_per_s(self) -> float:
        return self.finished / self.span_s

    @property
    def growth(self) -> float:
        """How much the backlog grew, as a share of the sends."""
        return (self.sent - self.finished) / self.sent

    @property
    def noise(self) -> float:
        """The standard deviation of a stable run's growth: its backlog's count varies by about
        sqrt(2 x backlog)."""
        return math.sqrt(2.0 * max(self.backlog_at_start, 1)) / self.sent

    @property
    def growing(self) -> bool:
        """The backlog grew by more than BACKLOG_GROWTH of the sends, and by two standard deviations of a
        stable run's count more."""
        return self.growth > BACKLOG_GROWTH + 2.0 * self.noise

    @property
    def settled(self) -> bool:
        """The backlog grew by at most SETTLING_GROWTH of the sends, allowing two standard deviations."""
        return self.growth <= SETTLING_GROWTH + 2.0 * self.noise


def load_of(sent_ns: np.ndarray, ttft_ns: np.ndarray, e2e_ns: np.ndarray, completed: np.ndarray,
            held: np.ndarray | None = None) -> Load:
    """The load facts of a run from each request's send time, TTFT and E2E (of completed requests).
    `held` (bool, per request): the server held its prompt before the run (prefixes.py's `warm`), so its
    first token came without its prefill, sooner than the load made it: left out of the TTFT trend, which
    would read a warm cache's first requests as a queue that formed after them."""
    order = np.argsort(sent_ns[completed], kind="stable")
    sent, ttft, e2e = (values[completed][order] for values in (sent_ns, ttft_ns, e2e_ns))
    alike_ttft = ttft if held is None else ttft[~held[completed][order]]
    if len(sent) < 2:
        return Load(0.0, 0.0, 0.0, 0.0)  # (sent over no time at all)

    def rate(times_ns: np.ndarray) -> float:
        span_s = float(times_ns.max() - times_ns.min()) / 1e9
        return (len(times_ns) - 1) / span_s if span_s > 0 else math.inf

    median_e2e_ns = float(np.median(e2e))
    span_e2es = float(sent[-1] - sent[0]) / median_e2e_ns if median_e2e_ns > 0 else math.inf
    return Load(rate(sent), rate(sent + ttft), rate(sent + e2e), span_e2es, _trend(alike_ttft), _trend(e2e),
                _steady(sent, e2e))


def _trend(latency_ns: np.ndarray) -> float | None:
    """Median latency of the last quarter of requests (in send order) over the first quarter's."""
    if len(latency_ns) < MIN_TREND_REQUESTS:
        return None
    quarter = len(latency_ns) // 4
    first = float(np.median(latency_ns[:quarter]))
    return float(np.median(latency_ns[-quarter:])) / first if first > 0 else None


def _steady(sent_ns: np.ndarray, e2e_ns: np.ndarray) -> Steady | None:
    """The sends from one fill time after the first to the last (sent_ns sorted), when they last at least
    WATCH_FILLS of a fill time more; the fill time is the FILL_QUANTILE of the E2Es."""
    if len(sent_ns) < MIN_TREND_REQUESTS:
        return None
    fill_ns = float(np.quantile(e2e_ns, FILL_QUANTILE))
    start_ns, end_ns = int(sent_ns[0] + fill_ns), int(sent_ns[-1])
    if end_ns - start_ns < WATCH_FILLS * fill_ns or fill_ns <= 0:
        return None
    finished = np.sort(sent_ns + e2e_ns)

    def count(times_ns: np.ndarray, until_ns: int) -> int:
        return int(np.searchsorted(times_ns, until_ns, side="right"))

    sent = count(sent_ns, end_ns) - count(sent_ns, start_ns)
    if sent == 0:
        return None
    done = count(finished, end_ns) - count(finished, start_ns)
    backlog = count(sent_ns, start_ns) - count(finished, start_ns)
    return Steady((end_ns - start_ns) / 1e9, sent, done, backlog)
