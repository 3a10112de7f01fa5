"""The `[engine]` table: the serving engine's batching limits, as vLLM names them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineSpec(BaseModel):
    """Continuous-batching limits.

    Defaults are what vLLM's OpenAI server picks on a GPU with at least 70 GiB that is not an A100
    (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): 1024 sequences, 8192 tokens per step.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int = Field(1024, ge=1, description="most sequences in one step")
    max_num_batched_tokens: int = Field(8192, ge=1, description="most tokens (prefill + decode) in one step")
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block")
    chunked_prefill: bool = Field(True, description="split long prompts across steps within the token budget")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of HBM the engine may use")

    @model_validator(mode="after")
    def _budget_covers_every_sequence(self) -> EngineSpec:
        # vLLM refuses this too: every running sequence must be able to decode in every step.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}); raise max_num_batched_tokens or lower max_num_seqs"
            )
        return self
