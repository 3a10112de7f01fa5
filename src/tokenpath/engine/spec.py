"""The `[engine]` table: the serving engine's batching limits, as vLLM names them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Bounds far beyond any serving engine (vLLM's defaults are 256-1024 sequences and 2,048-16,384 tokens
# per step; TensorRT-LLM's largest published batch is 4,096 sequences and 23,552 tokens), which keep
# the per-step bookkeeping within memory.
MAX_NUM_SEQS = 2**20
MAX_STEP_TOKENS = 2**24
# vLLM's KV-cache block sizes run from 1 to 256 tokens; SGLang's page size is 1 to 64.
MAX_BLOCK_SIZE = 4096


class EngineSpec(BaseModel):
    """Continuous-batching limits, and which steps replay a captured CUDA graph.

    Defaults are what vLLM's OpenAI server picks on a GPU with at least 70 GiB that is not an A100
    (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): 1024 sequences, 8192 tokens per step.
    CUDA graphs: by default every step pays no per-kernel launch cost. vLLM V1 replays captured graphs
    for steps of up to 512 tokens (its max_cudagraph_capture_size), decode-only or mixed; its larger
    steps run long kernels that hide their launches. `cuda_graphs = "none"` is an eager engine (vLLM
    --enforce-eager), whose every step pays compute.efficiency.EAGER_KERNEL_LAUNCH_S per kernel.
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
                           "every sequence decodes one token: SGLang, TensorRT-LLM, vLLM V0) or none (eager)")
    cuda_graph_max_tokens: int | None = Field(
        None, ge=0, le=MAX_STEP_TOKENS, description="largest step, in tokens, that replays a captured graph (unset: any size)")

    @model_validator(mode="after")
    def _budget_covers_every_sequence(self) -> EngineSpec:
        # vLLM refuses this too: every running sequence must be able to decode in every step.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}); raise max_num_batched_tokens or lower max_num_seqs"
            )
        return self
