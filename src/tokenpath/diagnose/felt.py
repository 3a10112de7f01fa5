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
# With an application around the model call (docs/application.md): its stages before the call are part of
# TTFT and TTFV; those after the model's last token are part of E2E only, not of the stream's TPOT.
APPLICATION = "application"


def felt_parts_s(sent_ns: np.ndarray, upload_ns: np.ndarray, prefill_start_ns: np.ndarray,
                 ttft_engine_ns: np.ndarray, ttft_ns: np.ndarray, ttfv_ns: np.ndarray,
                 e2e_parts_ns: dict[str, np.ndarray], output_tokens: np.ndarray,
                 step_mix: dict[str, float], model_sent_ns: np.ndarray | None = None,
                 application_before_ns: np.ndarray | None = None,
                 earlier_calls_ns: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, float]]:
    """Mean seconds per part of "ttft", "ttfv" and "tpot" (per token after the first) over the given
    requests (completed ones). `step_mix` is the share of step time that is compute, traffic and
    delivery (host blocking); `e2e_parts_ns` each request's E2E attribution. With an application
    (`e2e_parts_ns` holds "application"): `model_sent_ns`, when each model call was sent, and
    `application_before_ns`, the stages' time before it; the rest of that wait is queue (a concurrency
    cap holding the call back), but for `earlier_calls_ns` (an agent loop: each layer's time in the
    calls before the last, the call whose answer the user reads), which stays in its layers."""
    if not len(sent_ns):
        return {}
    parts = PARTS + ((APPLICATION,) if APPLICATION in e2e_parts_ns else ())
    mix = np.array([step_mix.get(part, 0.0) for part in parts])
    call_ns = sent_ns if model_sent_ns is None else model_sent_ns
    before_ns = np.zeros(len(sent_ns), np.int64) if application_before_ns is None else application_before_ns
    at_engine_ns = call_ns + upload_ns
    first_leave_ns = sent_ns + ttft_engine_ns
    started_ns = np.where(prefill_start_ns >= 0, np.maximum(prefill_start_ns, at_engine_ns), at_engine_ns)
    started_ns = np.minimum(started_ns, first_leave_ns)
    earlier = np.zeros((len(sent_ns), len(parts)), np.int64)
    for k, part in enumerate(PARTS if earlier_calls_ns is not None else ()):
        earlier[:, k] = earlier_calls_ns[part]
    earlier_ns = earlier.sum(axis=1)
    queue_ns = started_ns - at_engine_ns + (call_ns - sent_ns - before_ns - earlier_ns)
    engine_ns = first_leave_ns - started_ns
    ttft = np.outer(engine_ns, mix) + earlier
    ttft[:, 0] += queue_ns
    ttft[:, 3] += ttft_ns - queue_ns - engine_ns - before_ns - earlier_ns  # upload and the first event's trip
    if APPLICATION in parts:
        ttft[:, 4] += before_ns
    ttfv = ttft + np.outer(ttfv_ns - ttft_ns, mix)
    multi = output_tokens > 1
    e2e = np.stack([e2e_parts_ns[part] for part in parts], axis=1)
    if APPLICATION in parts:  # the stages after the model's last token are no part of the stream
        e2e[:, 4] = before_ns
    tpot = (e2e[multi] - ttft[multi]) / (output_tokens[multi, None] - 1)

    def means(rows: np.ndarray) -> dict[str, float]:
        values = rows.mean(axis=0) / 1e9 if len(rows) else np.zeros(len(parts))
        return {part: max(0.0, float(value)) for part, value in zip(parts, values)}

    return {"ttft": means(ttft), "ttfv": means(ttfv), "tpot": means(tpot)}
