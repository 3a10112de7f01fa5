"""The `[engine]` table: the serving engine's batching limits, as vLLM names them, and its scheduler profile."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokenpath.engine.cuda_graphs import default_graphs

# Bounds far beyond any serving engine (vLLM's defaults are 256-1024 sequences and 2,048-16,384 tokens
# per step; TensorRT-LLM's largest published batch is 4,096 sequences and 23,552 tokens), which keep
# the per-step bookkeeping within memory.
MAX_NUM_SEQS = 2**20
MAX_STEP_TOKENS = 2**24
# vLLM's KV-cache block sizes run from 1 to 256 tokens; SGLang's page size is 1 to 64.
MAX_BLOCK_SIZE = 4096

Scheduler = Literal["vllm-v1", "vllm-v0", "prefill-first", "trtllm"]
VLLM_V0_MAX_NUM_SEQS = 256

SCHEDULERS: dict[str, str] = {
    "vllm-v1": """vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py), the default. Every step, the
    running sequences first, in admission order: each decoding one takes a token, the prompt in
    progress the rest of the token budget; then waiting sequences, first come first served, while
    the step has room (sequences, tokens, KV blocks), a long prompt cut to the budget (chunked
    prefill). Prompt chunks and decodes share each step. Blocks are taken as sequences grow; when
    they run out, the newest running sequences are preempted and recomputed later.""",
    "vllm-v0": """vLLM's V0 engine (releases before 0.8, or VLLM_USE_V1=0): its scheduler as prefill-first
    forms batches without `chunked_prefill` (vllm/core/scheduler.py, _schedule_default) and as vllm-v1
    does with it (_schedule_chunked_prefill: the running decodes first, then prompt chunks within the
    budget); CUDA graphs for decode batches of up to 256 sequences; and its host's time in every
    step's path (engine/host_time.py: V0 schedules, prepares inputs and samples synchronously, and
    launches eager steps op by op from Python). `num_scheduler_steps` > 1 is its multi-step
    scheduling (below), without chunked prefill. Unset, `max_num_seqs` is V0's default, 256; the other
    limits keep this table's defaults (V0 turned chunked prefill on, with a 512-token budget, for models
    of over 32k tokens of context: state it). Not modelled: its 1% free-block watermark.""",
    "prefill-first": """SGLang's default (scheduler.py, get_next_batch_to_run), whose batches vLLM V0 forms
    too without chunked prefill (vllm/core/scheduler.py, _schedule_default; vllm-v0 adds V0's host,
    and admits without the headroom below). When waiting prompts can be admitted the
    step is a prefill batch of its own: as many waiting prompts as fit the token budget, the free
    sequences and the free KV blocks; decoding sequences pause (they do not take part, and that
    time counts as queue for them). Otherwise the step decodes every running sequence. With
    `chunked_prefill` the token budget is SGLang's chunked_prefill_size: a longer prompt is split
    over several prefill steps, run back to back. `mixed_chunk` is SGLang's --enable-mixed-chunk:
    the decodes join the prefill step (the batch is then formed as vllm-v1 forms it).
    `num_scheduler_steps` > 1 is vLLM V0's multi-step scheduling (below). A waiting prompt is admitted
    only while the cache also has room for a share of the running requests' outputs still to come,
    SGLang's new_token_ratio (engine/new_token_ratio.py), so an overloaded engine rarely has to retract
    and recompute. Not modelled: SGLang's separate max_prefill_tokens.""",
    "trtllm": """TensorRT-LLM's in-flight batching (cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp
    and microBatchScheduler.cpp). The capacity scheduler admits requests first come first served:
    with `kv_admission = "reserve"` (GUARANTEED_NO_EVICT, TensorRT-LLM's default) only while the
    request's whole KV cache, prompt and output (TensorRT-LLM reserves for max_tokens, which
    benchmarks set to the output length), fits in the blocks no running request has reserved, so no
    request is ever preempted; with "on_demand" (MAX_UTILIZATION) blocks are taken as
    sequences grow and the newest are paused (recomputed) when they run out, as in vLLM. The
    micro-batch scheduler puts the generation requests first, one token each, then contexts within
    max_num_tokens (`max_num_batched_tokens`): whole without chunked context, and with it cut to the
    budget left, rounded down to whole KV blocks (its chunkUnitSize is the tokens per block).
    Approximated: after a cut chunk no other context joins the step (TensorRT-LLM lets one whose
    whole rest fits in the leftover, under a block); MAX_UTILIZATION pauses the newest started
    request, which here waits at the front of the queue as in vLLM.""",
}

MULTI_STEP = """Multi-step scheduling (vLLM V0 --num-scheduler-steps k, with scheduler = "vllm-v0" or
"prefill-first", prompts in steps of their own):
the scheduler runs at window starts only. A prefill step is a window of its own; otherwise the
running sequences decode for k steps as one fixed batch, their KV blocks for all k steps taken at
the window's start (vLLM allocates k - 1 lookahead slots). New requests are admitted only at window
starts. The window's tokens leave the server together when its last step ends (vLLM processes a
window's outputs after its last step); a sequence that samples its last token mid-window stays in
the batch until the window ends (the GPU keeps computing it, its extra tokens are dropped, vLLM
issue 10890) and frees its slot then; for that request the wait counts as delivery."""


class EngineSpec(BaseModel):
    """Continuous-batching limits, the scheduler profile, and which steps replay a captured CUDA graph.

    Defaults are what vLLM's OpenAI server picks on a GPU with at least 70 GiB that is not an A100
    (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): 1024 sequences, 8192 tokens per step.
    CUDA graphs: by default every step of vllm-v1 and trtllm pays no per-kernel launch cost. vLLM V1
    replays captured graphs for steps of up to 512 tokens (its max_cudagraph_capture_size),
    decode-only or mixed; its larger steps run long kernels that hide their launches. prefill-first
    replays decode batches up to SGLang's default size only (engine/cuda_graphs.py). `cuda_graphs =
    "none"` is an eager engine (vLLM --enforce-eager), whose every step pays
    compute.efficiency.EAGER_KERNEL_LAUNCH_S per kernel.
    Scheduler profiles: see SCHEDULERS and MULTI_STEP above.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_num_seqs: int = Field(1024, ge=1, le=MAX_NUM_SEQS, description="most sequences in one step")
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_STEP_TOKENS,
                                        description="most tokens (prefill + decode) in one step")
    block_size: int = Field(16, ge=1, le=MAX_BLOCK_SIZE, description="tokens per KV-cache block")
    chunked_prefill: bool = Field(True, description="split long prompts across steps within the token budget")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of HBM the engine may use")
    cuda_graphs: Literal["all", "decode", "none"] = Field(
        "all", description="steps that replay a captured CUDA graph: all (vLLM V1), decode (only steps where "
                           "every sequence decodes one token: SGLang, TensorRT-LLM, vLLM V0) or none (eager) "
                           "(unset: the profile's: decode under prefill-first and vllm-v0, all otherwise)")
    cuda_graph_max_tokens: int | None = Field(
        None, ge=0, le=MAX_STEP_TOKENS,
        description="largest step, in tokens, that replays a captured graph (unset: the profile's: under "
                    "prefill-first SGLang's default cuda_graph_max_bs for the chip's memory and tp, "
                    "under vllm-v0 256, engine/cuda_graphs.py; any size otherwise)")
    scheduler: Scheduler = Field(
        "vllm-v1", description="the engine's profile: vllm-v1 (prompt chunks mixed with decodes), vllm-v0 (vLLM's "
                               "V0 engine: its host in every step's path), prefill-first (SGLang: prompts in steps of "
                               "their own) or trtllm")
    mixed_chunk: bool = Field(
        False, description="prefill-first only: decodes join the prefill steps (SGLang --enable-mixed-chunk)")
    kv_admission: Literal["reserve", "on_demand"] = Field(
        "on_demand", description="trtllm: reserve each request's whole KV cache at admission (GUARANTEED_NO_EVICT, "
                                 "the default there) or take blocks as it grows (MAX_UTILIZATION, as vLLM)")
    host_overlap: bool | None = Field(
        None, description="the host prepares each step while the GPU runs the one before, so a step takes the "
                          "longer of the two and a busy engine's batch is formed when the step before starts "
                          "(unset: the profile's: prefill-first and trtllm yes, vllm-v1 no)")
    prefix_caching: bool = Field(
        True, description="keep the KV blocks of shared prompt prefixes and reuse them (vLLM V1's automatic "
                          "prefix caching, on by default; SGLang's RadixAttention; TensorRT-LLM's KV cache reuse): "
                          "see docs/prefix-caching.md")
    num_scheduler_steps: int = Field(
        1, ge=1, le=1024, description="vllm-v0 without chunked prefill, or prefill-first: decode steps per "
                                   "scheduler call (vLLM V0 --num-scheduler-steps)")

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # TensorRT-LLM reserves by default; the other engines take blocks on demand.
        if "kv_admission" not in data:
            data = {**data, "kv_admission": "reserve" if data.get("scheduler") == "trtllm" else "on_demand"}
        if "cuda_graphs" not in data:
            data = {**data, "cuda_graphs": default_graphs(data.get("scheduler", "vllm-v1"))}
        # vLLM V0 ran at most 256 sequences by default (EngineArgs.max_num_seqs before V1's defaults).
        if data.get("scheduler") == "vllm-v0" and "max_num_seqs" not in data:
            data = {**data, "max_num_seqs": VLLM_V0_MAX_NUM_SEQS}
        return data

    @model_validator(mode="after")
    def _budget_covers_every_sequence(self) -> EngineSpec:
        # vLLM refuses this too: every running sequence must be able to decode in every step.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}); raise max_num_batched_tokens or lower max_num_seqs"
            )
        return self

    @model_validator(mode="after")
    def _settings_fit_the_profile(self) -> EngineSpec:
        if self.mixed_chunk and self.scheduler != "prefill-first":
            raise ValueError(f"mixed_chunk applies to scheduler = \"prefill-first\" only ({self.scheduler} always "
                             "runs decodes beside prompt chunks); remove mixed_chunk")
        if self.mixed_chunk and not self.chunked_prefill:
            raise ValueError("mixed_chunk needs chunked_prefill = true (SGLang mixes decodes into chunked prefill "
                             "steps only); set chunked_prefill = true or mixed_chunk = false")
        if self.kv_admission == "reserve" and self.scheduler != "trtllm":
            raise ValueError("kv_admission = \"reserve\" is TensorRT-LLM's GUARANTEED_NO_EVICT; use "
                             "scheduler = \"trtllm\" or kv_admission = \"on_demand\"")
        if self.num_scheduler_steps > 1 and not self.prefills_alone:
            engine = {"vllm-v1": "vLLM V1 has", "trtllm": "TensorRT-LLM has", "vllm-v0": "chunked prefill has"}.get(
                self.scheduler, "mixed chunks have")
            raise ValueError(f"num_scheduler_steps > 1 is vLLM V0's multi-step scheduling and {engine} none here; "
                             "use scheduler = \"vllm-v0\" with chunked_prefill = false, or num_scheduler_steps = 1")
        return self

    @property
    def prefills_alone(self) -> bool:
        """Whether prompts run in steps of their own while the decoding sequences pause: prefill-first
        without mixed chunks, and vLLM V0 without chunked prefill."""
        if self.scheduler == "prefill-first":
            return not self.mixed_chunk
        return self.scheduler == "vllm-v0" and not self.chunked_prefill
