"""The layers of what users feel first: each request's TTFT and TTFV split into queue, compute, traffic
and delivery, and its time per output token after the first (TPOT) as what remains of its E2E split.

The split of TTFT follows the request: its upload (delivery) until the engine has it, the wait for its
first step (queue), the engine's steps until its first token leaves (compute, traffic, and the host time
that blocks steps, which is delivery, in the run's proportions of step time), and the first event's
trip to the client (delivery). TTFV adds the steps that made its invisible leading tokens. The parts of
each request sum to its TTFT and TTFV exactly.
"""

from __future__ import annotations

import numpy as np

PARTS = ("queue", "compute", "traffic", "delivery")


def felt_parts_s(sent_ns: np.ndarray, upload_ns: np.ndarray, prefill_start_ns: np.ndarray,
                 ttft_engine_ns: np.ndarray, ttft_ns: np.ndarray, ttfv_ns: np.ndarray,
                 e2e_parts_ns: dict[str, np.ndarray], output_tokens: np.ndarray,
                 step_mix: dict[str, float]) -> dict[str, dict[str, float]]:
    """Mean seconds per part of "ttft", "ttfv" and "tpot" (per token after the first) over the given
    requests (completed ones). `step_mix` is the share of step time that is compute, traffic and
    delivery (host blocking); `e2e_parts_ns` each request's E2E attribution."""
    if not len(sent_ns):
        return {}
    mix = np.array([step_mix.get(part, 0.0) for part in PARTS])
    at_engine_ns = sent_ns + upload_ns
    first_leave_ns = sent_ns + ttft_engine_ns
    started_ns = np.where(prefill_start_ns >= 0, np.maximum(prefill_start_ns, at_engine_ns), at_engine_ns)
    started_ns = np.minimum(started_ns, first_leave_ns)
    queue_ns = started_ns - at_engine_ns
    engine_ns = first_leave_ns - started_ns
    ttft = np.outer(engine_ns, mix)
    ttft[:, 0] += queue_ns
    ttft[:, 3] += ttft_ns - queue_ns - engine_ns  # upload and the first event's trip
    ttfv = ttft + np.outer(ttfv_ns - ttft_ns, mix)
    multi = output_tokens > 1
    e2e = np.stack([e2e_parts_ns[part] for part in PARTS], axis=1)
    tpot = (e2e[multi] - ttft[multi]) / (output_tokens[multi, None] - 1)

    def means(rows: np.ndarray) -> dict[str, float]:
        values = rows.mean(axis=0) / 1e9 if len(rows) else np.zeros(len(PARTS))
        return {part: max(0.0, float(value)) for part, value in zip(PARTS, values)}

    return {"ttft": means(ttft), "ttfv": means(ttfv), "tpot": means(tpot)}
