"""The memory a run of a workload needs, estimated once its lengths are drawn and before its prefix keys
(which can outgrow everything else: a session's turn names every turn before it) are built."""

from __future__ import annotations

from tokenpath.config import memory

# What the peak memory (max RSS) of `tokenpath simulate --workers 1` on the typical scenario grows by,
# from runs of two or three sizes (rounded up here):
# - per request: 200k and 1M requests 0.29 and 0.89 GB (their times, not their tokens'): 0.76 kB;
# - per output token while every token's time is kept (runs of up to memory.KEEP_TOKENS_LIMIT output
#   tokens): 20k and 100k requests of 150 tokens 0.18 and 0.66 GB: 5.9 kB a request, 35 B a token
#   beyond the request's own;
# - per prefix segment: 50k requests in sessions of 1, 100 and 200 turns of 50 + 50 tokens (0.1M, 5.1M
#   and 10.1M segments) 0.26, 0.69 and 1.24 GB: 87 to 110 B a segment.
REQUEST_BYTES = 1000
TOKEN_BYTES = 40
SEGMENT_BYTES = 120


def run_bytes(requests: int, output_tokens: int, segments: int) -> int:
    """About the peak memory of simulating `requests` requests with `output_tokens` output tokens in
    all and `segments` prefix segments."""
    kept_tokens = output_tokens if output_tokens <= memory.KEEP_TOKENS_LIMIT else 0
    return requests * REQUEST_BYTES + kept_tokens * TOKEN_BYTES + segments * SEGMENT_BYTES


def require_memory(requests: int, output_tokens: int, segments: int, segments_key: str | None = None,
                   segments_are: str = "") -> None:
    """Refuse a workload whose run would need more memory than is available, naming
    `workload.num_requests`, or `segments_key` where its prefix segments (`segments_are` says what
    they are) take most of it."""
    if segments_key is not None and segments * SEGMENT_BYTES > requests * REQUEST_BYTES:
        what = f"{segments_key}: {requests:,} requests with {segments:,} prefix segments ({segments_are})"
        fix = f"lower {segments_key} or workload.num_requests"
    else:
        what, fix = f"workload.num_requests: {requests:,} requests", "lower workload.num_requests"
    memory.require(run_bytes(requests, output_tokens, segments), what, fix)
