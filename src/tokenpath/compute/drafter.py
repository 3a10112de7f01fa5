"""What a speculative-decoding drafter runs on the chip each step, and its cost (the methods:
engine/speculative.py).

In vLLM V1 (vllm/v1/spec_decode/eagle.py, `EagleProposer.propose`) the drafter's first pass runs over
every token the target's step ran, the prompt chunks and the verified positions (it needs the
target's hidden states at each), and samples a draft for each sequence; each further pass runs over
one token a sequence. With k drafts a step: one pass of the step's shape, then k - 1 passes of one
token for each sequence that samples. The drafter's model:

- "mtp": one decoder layer of the target's own shape (DeepSeek-V3's MTP module is an MLA and MoE layer,
  num_nextn_predict_layers = 1), with the target's precision and its LM head;
- "eagle", "eagle3": one dense decoder layer at the target's width and attention shape (bf16, as the
  published heads ship), with an LM head over the target's vocabulary (EAGLE) or EAGLE-3's 32,000-token
  draft vocabulary;
- "draft_model": the named model, whole, at the target's precision and tensor-parallel size (vLLM's
  default draft_tensor_parallel_size);
- "ngram": none (a lookup on the host, not modelled as time).

The drafter's weights and its own KV cache take HBM the target's KV cache would otherwise hold
(`ComputeModel.kv_capacity_tokens`'s `drafter`). Its passes replay CUDA graphs and take no host time of
their own (they run inside the target's step).
"""

from __future__ import annotations

import dataclasses

from tokenpath.compute.model_spec import ModelSpec
from tokenpath.compute.roofline import ComputeModel

# The draft vocabulary of EAGLE-3 heads (`draft_vocab_size` of the published Llama 3.1 and 3.3 heads,
# e.g. huggingface.co/yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json).
EAGLE3_DRAFT_VOCAB = 32_000


def drafter_model(target: ModelSpec, method: str, draft: ModelSpec | None = None) -> ModelSpec | None:
    """The model the drafter of `method` runs (None: ngram, no GPU work); `draft`: the loaded draft_model."""
    if method == "ngram":
        return None
    if method == "draft_model":
        if draft is None:
            raise ValueError("method draft_model: pass the loaded draft model")
        return draft
    one_layer = {"num_layers": 1, "sliding_window": 0, "sliding_layers": 0}
    if method == "mtp":
        # The MTP layer is one of the model's own kind: MoE where the model's later layers are.
        return dataclasses.replace(target, name=f"{target.name} MTP layer", dense_mlp_layers=0, **one_layer)
    dense = {"num_experts": 0, "experts_per_token": 0, "moe_intermediate_size": 0, "shared_intermediate_size": 0,
             "dense_mlp_layers": 0, "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0,
             "qk_rope_head_dim": 0, "v_head_dim": 0, "fp8_block_scaled": False}
    vocab = EAGLE3_DRAFT_VOCAB if method == "eagle3" else target.vocab_size
    intermediate = target.intermediate_size or target.moe_intermediate_size
    return dataclasses.replace(target, name=f"{target.name} {method} head", vocab_size=vocab,
                               intermediate_size=intermediate, **one_layer, **dense)


def drafter_precision(method: str, target_precision: str) -> str:
    """EAGLE heads are published in bf16; the MTP layer and a draft model run at the target's precision."""
    return "bf16" if method in ("eagle", "eagle3") else target_precision


class DraftCost:
    """The drafter's time in one step: a pass of the step's shape, then `drafts` - 1 passes of one token
    for each sequence that samples."""

    def __init__(self, compute: ComputeModel, drafts: int) -> None:
        self.compute, self.drafts = compute, drafts

    def step_s(self, num_tokens: int, sequences: int, attn_pairs: float, kv_read_tokens: float,
               chunk_context_tokens: float) -> float:
        """`num_tokens`, `attn_pairs`, `kv_read_tokens` and `chunk_context_tokens` as the target's step
        ran them; `sequences`: those that sample (and get drafts)."""
        if not sequences:
            return 0.0
        step = self.compute.step_time_s
        first = step(num_tokens, sequences, attn_pairs, kv_read_tokens, chunk_context_tokens)
        # Each later pass: one query a sequence, attending its whole context (about the step's reads).
        return first + (self.drafts - 1) * step(sequences, sequences, kv_read_tokens, kv_read_tokens)
