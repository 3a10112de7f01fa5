"""The `[delivery]` table of a scenario: the path from sampled token ids to text at the client.

Defaults describe a common deployment: ids copied over PCIe Gen5, detokenized where the engine's
profile does it, one SSE event per token, a client 20 ms round trip away; the front end's costs per
request and per token are those of an engine's Python API server on a current x86 core.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from tokenpath.config.assumptions import default
from tokenpath.config.files import PathText
from tokenpath.config.units import MAX_COST_S, Bandwidth, Duration
from tokenpath.delivery.calibration import CalibratedServer
from tokenpath.delivery.frontend import PLACEMENTS, Placement

# PCIe Gen5 x16: 128 GB/s both directions together (the H200 SXM host link, nvidia.com/h200).
PCIE_GEN5_X16_PER_DIRECTION_BPS = default("host_link_bw_Bps")
# A small device-to-host cudaMemcpy (a few KB) costs about 10 us of latency on PCIe Gen5 hosts; an
# assumption, to be replaced by a measured calibration.
D2H_COPY_LATENCY_S = default("host_link_latency_s")
# vLLM V1's API server per streamed token before its chunk is built (its output handler: decoding the
# engine core's outputs, OutputProcessor.process_outputs, the Prometheus logger), timed with vLLM's own
# code by benchmarks/vllm_output_processor.py; the other engines' processes take it too.
DETOKENIZE_PER_TOKEN_S = default("detokenize_per_token_s")
# vLLM V0's detokenizer per token, in its engine's process (its Python detokenize_incrementally; vLLM issue
# 5206 timed 17-55 us), which the vllm-v0 profile takes in place of the above (Profile.detokenize_assumption).
VLLM_V0_DETOKENIZE_PER_TOKEN_S = default("vllm_v0_detokenize_per_token_s")
# SGLang's two processes per streamed token, timed with SGLang's own code by benchmarks/sglang_output_path.py:
# its DetokenizerManager's (decoding the scheduler's message, detokenizing, encoding the text's), which the
# prefill-first profile takes in place of detokenize_per_token, and its TokenizerManager's, the API server,
# receiving that text (`output_per_token`; Profile.output_assumption).
SGLANG_DETOKENIZE_PER_TOKEN_S = default("sglang_detokenize_per_token_s")
SGLANG_OUTPUT_PER_TOKEN_S = default("sglang_output_per_token_s")
# Building one streamed chunk as the engines' API servers do (vLLM's serving_chat.py and TensorRT-LLM's
# postprocess_handlers.py build a pydantic ChatCompletionStreamResponse per chunk and call
# model_dump_json), its SSE framing, and its writing through the engine's HTTP layer (FastAPI's
# StreamingResponse, uvicorn); `tokenpath calibrate delivery` measures both on this machine.
FRAME_PER_EVENT_S = default("frame_per_event_s")
# Share of tokens that show nothing visible when they arrive (not a whole UTF-8 character alone, so a later
# token completes it, or white space only), measured with delivery.visibility.invisible_fraction through
# the default tokenizer (Tekken) on the workload's own text: bench/data/corpus.txt, the English prose
# `bench` cuts its prompts from, where 15 of its 4,110 tokens are white space alone and none is silent
# (tests/test_delivery.py measures it again). Other text differs: 5.9% of the Chinese sample of
# delivery/sample_text.py, 11% of the code, 45% of the emoji-heavy one, 12.7% of all four samples
# together. Set it for the traffic at hand.
INVISIBLE_TOKEN_FRACTION = default("invisible_token_fraction")
# The front end's CPU time per request (delivery/frontend.py), before the engine sees it: its HTTP
# server's own work with the body parsed and validated (FastAPI under uvicorn) and the tokenized request
# handed to the engine's process; rendering the chat template; and tokenizing the prompt, per token.
# Their values and sources are the registry's (config/assumptions.py); `tokenpath calibrate delivery`
# measures them on this machine.
FRONTEND_PER_REQUEST_S = default("frontend_per_request_s")
CHAT_TEMPLATE_PER_REQUEST_S = default("chat_template_per_request_s")
TOKENIZE_PER_TOKEN_S = default("tokenize_per_token_s")

# A `[delivery]` table for measurements taken at the engine (published benchmarks whose client runs on
# the serving host): no network, and no host cost beyond the engine's own.
ENGINE_SIDE_DELIVERY = {
    "network_rtt": 0.0, "host_link_latency": 0.0, "frontend_per_request": 0.0, "chat_template_per_request": 0.0,
    "tokenize_per_token": 0.0, "tokenizer_batch_wait": 0.0, "detokenize_per_token": 0.0, "output_per_token": 0.0,
    "frame_per_event": 0.0, "event_overhead_bytes": 0, "bytes_per_token": 0.0, "request_overhead_bytes": 0,
}
# Bounds of the counts below, far beyond real ones: a server streams 1 to a few tens of tokens per SSE
# event (vLLM's and SGLang's --stream-interval default to 1); a chunk's JSON around its text is about
# 230 bytes and a request's HTTP headers and JSON a few kB; the longest tokens of common vocabularies
# are a few tens of bytes.
MAX_STREAM_INTERVAL = 4096
MAX_HOST_COST_S = MAX_COST_S  # host costs per step or token (the copy latency, detokenizing, framing)
MAX_OVERHEAD_BYTES = 2**20
MAX_BYTES_PER_TOKEN = 1024.0
# The most prompts a tokenizer batch holds: vLLM's AsyncMicrobatchTokenizer (max_batch_size) and SGLang's
# dynamic batch tokenizer (dynamic_batch_tokenizer_batch_size) both hold 32 (engine/tokenizer_batching.py);
# a scenario may state up to 2^16.
TOKENIZER_BATCH_MAX = 32
MAX_TOKENIZER_BATCH = 2**16


# The names `detokenize` took before it named processes: what each became.
_RENAMED_PLACEMENTS = {"inline": "engine", "async": "detokenizer"}


def _check_placement(value: object) -> object:
    if isinstance(value, str) and value in _RENAMED_PLACEMENTS:
        raise ValueError(f"{value!r} is now {_RENAMED_PLACEMENTS[value]!r}: detokenize names the process that "
                         f"detokenizes, one of {', '.join(PLACEMENTS)}")
    return value


class DeliverySpec(BaseModel):
    """Last-mile parameters. Times are per token or per event as named."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    host_link_bw: Bandwidth = Field(PCIE_GEN5_X16_PER_DIRECTION_BPS, description="device-to-host bandwidth")
    host_link_latency: Duration = Field(D2H_COPY_LATENCY_S, le=MAX_HOST_COST_S,
                                        description="latency of one device-to-host copy")
    detokenize: Annotated[Placement | None, BeforeValidator(_check_placement)] = Field(
        None, description="the process that detokenizes: engine (its steps wait for it), api-server (the front "
                          "end's processes), detokenizer (a process of its own); unset: the engine profile's"
    )
    detokenize_per_token: Duration = Field(DETOKENIZE_PER_TOKEN_S, le=MAX_HOST_COST_S,
                                           description="CPU time per token in the process that detokenizes")
    output_per_token: Duration = Field(
        0.0, le=MAX_HOST_COST_S,
        description="the API server's CPU time per token taking in outputs another process detokenized, before "
                    "building their chunks (SGLang's TokenizerManager); unset: the engine profile's")
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
        description="the front end's CPU time per request: its HTTP server's work, parsing and validating it, "
                    "the hand-off to the engine")
    chat_template_per_request: Duration = Field(
        CHAT_TEMPLATE_PER_REQUEST_S, le=MAX_HOST_COST_S,
        description="the front end's CPU time rendering a request's chat template (0: a cached or raw prompt)")
    chat_template_parse_per_request: Duration | None = Field(
        None, le=MAX_HOST_COST_S,
        description="the front end's CPU time per chat request reading the chat template's source besides "
                    "rendering it, as some engine releases do (engine/template_work.py); unset: the engine "
                    "release's cost for the model's template, 0 where chat_template_per_request is 0")
    tokenize_per_token: Duration = Field(
        TOKENIZE_PER_TOKEN_S, le=MAX_HOST_COST_S, description="the front end's CPU time per prompt token tokenized")
    tokenizer_batch_wait: Duration | None = Field(
        None, le=MAX_HOST_COST_S,
        description="how long the front end's tokenizer holds a batch of prompts open after its first prompt "
                    "comes, each request waiting for its batch to close (engine/tokenizer_batching.py); unset: "
                    "the engine release's (vLLM 0.10.0-0.23.0: 2 ms), 0: none")
    tokenizer_batch_max: int = Field(TOKENIZER_BATCH_MAX, ge=1, le=MAX_TOKENIZER_BATCH,
                                     description="the most prompts one tokenizer batch holds")
    calibration: PathText | None = Field(
        None,
        description="a file from `tokenpath calibrate delivery`: its measured host cost per event replaces "
                    "frame_per_event (and per token detokenize_per_token, with calibrated_server = serve), and "
                    "its cost per request (if measured) "
                    "frontend_per_request, chat_template_per_request and tokenize_per_token "
                    "(a relative path is read from the scenario's folder)",
    )
    calibrated_server: CalibratedServer = Field(
        "engine",
        description="whose front end the calibration prices: engine (FastAPI under uvicorn and the engine's "
                    "pydantic chunks, as vLLM and SGLang serve: the file's [engine_http] and [framing]) or serve "
                    "(tokenpath serve's aiohttp stack and own framer: [http] and the batch rows' framing)",
    )
