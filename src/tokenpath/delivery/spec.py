"""The `[delivery]` table of a scenario: the path from sampled token ids to text at the client.

Defaults describe a common deployment: ids copied over PCIe Gen5, detokenized inline by the engine's
own process (as a synchronous engine does), one SSE event per token, a client 20 ms round trip away.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenpath.config.assumptions import default
from tokenpath.config.files import PathText
from tokenpath.config.units import Bandwidth, Duration

# PCIe Gen5 x16: 128 GB/s both directions together (the H200 SXM host link, nvidia.com/h200).
PCIE_GEN5_X16_PER_DIRECTION_BPS = default("host_link_bw_Bps")
# A small device-to-host cudaMemcpy (a few KB) costs about 10 us of latency on PCIe Gen5 hosts; an
# assumption, to be replaced by a measured calibration.
D2H_COPY_LATENCY_S = default("host_link_latency_s")
# Reported cost of one incremental detokenize call in vLLM: 17-55 us (vLLM issue 5206); the low end.
DETOKENIZE_PER_TOKEN_S = default("detokenize_per_token_s")
# Building one SSE chunk with json.dumps of a dict: about 2.6 us on a current x86 core (measured; see
# `tokenpath calibrate delivery` for this machine's figure with the fast framer).
FRAME_PER_EVENT_S = default("frame_per_event_s")
# Share of tokens that show nothing when they arrive (not a whole UTF-8 character alone, so a later token
# completes it), measured with delivery.visibility.invisible_fraction through the default tokenizer
# (Tekken) on the workload's own text: bench/data/corpus.txt, the English prose `bench` cuts its prompts
# from, where none of its 4,110 tokens is silent (tests/test_delivery.py measures it again). Other text
# differs: 4.9% of the Chinese sample of delivery/sample_text.py, 36% of the emoji-heavy one, 7.1% of all
# four samples together. Set it for the traffic at hand.
INVISIBLE_TOKEN_FRACTION = default("invisible_token_fraction")
# A server's front end: the time from a request's arrival to the engine seeing it (HTTP and JSON
# parsing, tokenization, the hand-off to the engine's process). 0 by default, as in the measurements
# the model is validated on (taken at the engine); `tokenpath calibrate engine` fits it for a server,
# where it is a few ms (tokenpath serve: HTTP plus its tokenizer's 10 MB/s, serve/app.py).
FRONTEND_PER_REQUEST_S = default("frontend_per_request_s")

# A `[delivery]` table for measurements taken at the engine (published benchmarks whose client runs on
# the serving host): no network, and no host cost beyond the engine's own.
ENGINE_SIDE_DELIVERY = {
    "network_rtt": 0.0, "host_link_latency": 0.0, "frontend_per_request": 0.0, "detokenize_per_token": 0.0,
    "frame_per_event": 0.0, "event_overhead_bytes": 0, "bytes_per_token": 0.0, "request_overhead_bytes": 0,
}
# Bounds of the counts below, far beyond real ones: a server streams 1 to a few tens of tokens per SSE
# event (vLLM's and SGLang's --stream-interval default to 1); a chunk's JSON around its text is about
# 230 bytes and a request's HTTP headers and JSON a few kB; the longest tokens of common vocabularies
# are a few tens of bytes.
MAX_STREAM_INTERVAL = 4096
# Host costs paid per engine step or per token (the copy latency, detokenizing, framing) add up over a
# run, so they are held to 1 s, 10^4 x the largest reported (55 us per token, vLLM issue 5206).
MAX_HOST_COST_S = 1.0
MAX_OVERHEAD_BYTES = 2**20
MAX_BYTES_PER_TOKEN = 1024.0


class DeliverySpec(BaseModel):
    """Last-mile parameters. Times are per token or per event as named."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    host_link_bw: Bandwidth = Field(PCIE_GEN5_X16_PER_DIRECTION_BPS, description="device-to-host bandwidth")
    host_link_latency: Duration = Field(D2H_COPY_LATENCY_S, le=MAX_HOST_COST_S,
                                        description="latency of one device-to-host copy")
    detokenize: Literal["inline", "async"] = Field(
        "inline", description="inline blocks the next engine step; async overlaps it in another worker"
    )
    detokenize_per_token: Duration = Field(DETOKENIZE_PER_TOKEN_S, le=MAX_HOST_COST_S)
    frame_per_event: Duration = Field(FRAME_PER_EVENT_S, le=MAX_HOST_COST_S)
    stream_interval: int = Field(1, ge=1, le=MAX_STREAM_INTERVAL,
                                 description="tokens per SSE event (the first token is sent at once)")
    network_rtt: Duration = Field(20e-3, description="client round trip; each direction costs half")
    network_bw: Bandwidth = Field(12.5e6, description="client link bandwidth (100 Mb/s)")
    event_overhead_bytes: int = Field(230, ge=0, le=MAX_OVERHEAD_BYTES,
                                      description="bytes of one chat-completion SSE chunk around its text")
    bytes_per_token: float = Field(4.0, ge=0, le=MAX_BYTES_PER_TOKEN, allow_inf_nan=False,
                                   description="average UTF-8 bytes of text per token")
    request_overhead_bytes: int = Field(400, ge=0, le=MAX_OVERHEAD_BYTES,
                                        description="bytes of an HTTP request around its prompt")
    invisible_token_fraction: float = Field(INVISIBLE_TOKEN_FRACTION, ge=0, lt=1)
    frontend_per_request: Duration = Field(
        FRONTEND_PER_REQUEST_S, le=MAX_HOST_COST_S,
        description="the server's front end per request, before the engine sees it (HTTP, tokenization)")
    calibration: PathText | None = Field(
        None,
        description="a file from `tokenpath calibrate delivery`: its measured host cost per step and per token "
                    "replaces detokenize_per_token and frame_per_event "
                    "(a relative path is read from the scenario's folder)",
    )
