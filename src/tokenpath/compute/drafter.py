"""What a speculative-decoding drafter runs on the chip each step, and its cost (the methods:
engine/speculative.py).

In vLLM V1 (vllm/v1/spec_decode/eagle.py, `EagleProposer.propose`) the drafter's first pass runs over
every token the target's step ran, the prompt chunks and the verified positions (it needs the
target's hidden states at each), and samples a draft for each sequence; each further pass runs over
one token a sequence. With k drafts a step: one pass of the step's shape, then k - 1 passes of one
token for each sequence that samples. The drafter's model:

- "mtp": one decoder layer of the target's own shape (DeepSeek-V3's MTP module is an MLA and MoE layer,
  num_nextn_predict_layers = 1), with the target's precision, its `eh_proj` (2h -> h) and an LM head;
- "eagle", "eagle3": one dense decoder layer at the target's width and attention shape (bf16, as the
  published heads ship) after an input projection `fc` (2h -> h for EAGLE; 3h -> h for EAGLE-3, over
  three of the target's hidden states, run once a step: `combine_hidden_states` before the first pass),
  EAGLE-3's layer taking the token's embedding beside the hidden state into its QKV projection (2h in),
  with an LM head over the target's vocabulary (EAGLE) or EAGLE-3's 32,000-token draft vocabulary;
- "draft_model": the named model, whole, at the target's precision and tensor-parallel size (vLLM's
  default draft_tensor_parallel_size);
- "ngram": none (a lookup on the host, not modelled as time).

Every pass runs the drafter's embedding lookup and LM head, but the engines give EAGLE and MTP drafters
the target's own embedding and, where the drafter has none of its own, its LM head, holding those weights
once (`shared_with_target`). The drafter's own weights and its KV cache take HBM the target's KV cache
would otherwise hold (`ComputeModel.kv_capacity_tokens`'s `drafter`). Its passes replay CUDA graphs and
take no host time of their own (they run inside the target's step).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from tokenpath.compute.chip import ChipSpec
from tokenpath.compute.model_spec import ModelSpec
from tokenpath.compute.roofline import ComputeModel

# The draft vocabulary of EAGLE-3 heads (`draft_vocab_size` of the published Llama 3.1 and 3.3 heads,
# e.g. huggingface.co/yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json).
EAGLE3_DRAFT_VOCAB = 32_000

# Hidden-width inputs of the drafter's input projection (compute/ops.py, _input_projection).
INPUT_PROJECTION = {"eagle": 2, "eagle3": 3, "mtp": 2}
# Methods whose input projection runs in the first pass of a step only (`drafter_compute`'s `later_pass`).
PROJECTION_ONCE_A_STEP = frozenset({"eagle3"})
# Hidden widths into the drafter layer's QKV projection: EAGLE-3's takes the token's embedding and the
# hidden state side by side (ops.build_ops, `qkv_input_widths`); the others' one.
QKV_INPUT_WIDTHS = {"eagle3": 2}


def shared_with_target(method: str, mtp_head_shared: bool = True, pp: int = 1) -> frozenset[str]:
    """The drafter's ops (compute/ops.py names) whose weights are the target's. `mtp_head_shared`: whether
    the engine gives an MTP drafter the target's LM head (engine/speculative.py, `mtp_head_shared`); `pp`:
    the target's pipeline stages.

    vLLM (vllm/v1/spec_decode/eagle.py, `EagleProposer.load_model`, read in 0.14.0, 0.15.1 and 0.16.0): an
    EAGLE or EAGLE-3 head takes the target's embed_tokens when its checkpoint has none or the same weights
    (the published heads are trained on the target's frozen embedding), and the target's lm_head likewise:
    EAGLE's draft model has no lm_head of its own (llama_eagle.py, `EagleLlamaForCausalLM`), EAGLE-3's is
    its own over the draft vocabulary (llama_eagle3.py, `Eagle3LlamaForCausalLM.lm_head`, loaded from the
    checkpoint with its d2t map). An MTP model always takes the target's embed_tokens; its LM head as
    `mtp_head_shared` says. The embedding is shared only without pipeline parallelism
    (`get_pp_group().world_size == 1`).
    SGLang (0.5.23: python/sglang/srt/speculative/eagle_worker_v2.py, `init_lm_head`): EAGLE and NEXTN (its
    MTP) drafts get the target's embedding and LM head (`set_embed_and_head`, models/llama.py and
    deepseek_v2.py, which free the draft's own), EAGLE-3 the embedding only (`set_embed`); a pipeline stage
    without the target's embedding loads the draft's own (speculative/pp_draft_embedding.py,
    `resolve_draft_embed_and_head`). A draft model shares nothing."""
    if method in ("ngram", "draft_model"):
        return frozenset()
    shared = {"embedding"} if pp == 1 else set()
    if method == "eagle" or (method == "mtp" and mtp_head_shared):
        shared.add("lm_head")
    return frozenset(shared)


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


def drafter_compute(target: ModelSpec, method: str, chip: ChipSpec, tp: int, target_precision: str,
                    kv_precision: str, mtp_head_shared: bool = True, pp: int = 1, draft: ModelSpec | None = None,
                    later_pass: bool = False, **kwargs) -> ComputeModel | None:
    """The drafter of `method` on each chip of a tensor-parallel group of `tp` (None: ngram, no GPU work):
    its model (`drafter_model`) at its precision, with its input projection and without the weights it
    shares with the target (`shared_with_target`, with `mtp_head_shared` and the target's `pp`).
    `later_pass`: the model of the passes after the first, EAGLE-3's without its fc (run once a step,
    vllm/v1/spec_decode/eagle.py `EagleProposer.propose`: `combine_hidden_states` before the first pass).
    `kwargs`: ComputeModel's others (assumptions, latent_attention, mla_absorbed_bf16, gemm_kernels_of)."""
    model = drafter_model(target, method, draft)
    if model is None:
        return None
    projection = 0 if later_pass and method in PROJECTION_ONCE_A_STEP else INPUT_PROJECTION.get(method, 0)
    return ComputeModel(model, chip, tp, drafter_precision(method, target_precision), kv_precision,
                        input_projection=projection, shared_weights=shared_with_target(method, mtp_head_shared, pp),
                        qkv_input_widths=QKV_INPUT_WIDTHS.get(method, 1), **kwargs)


class DraftCost:
    """The drafter's time in one step: a pass of the step's shape, then `drafts` - 1 passes of one token
    for each sequence that samples, on `later` where those differ from the first (None: `compute`). The
    first pass runs over every token of the step, a chunk of a prompt that samples nothing too: it writes
    the drafter's own KV cache at those positions, which its later drafts read (vLLM's GPU model runner
    proposes drafts on every step whose tokens fit the drafter, `propose_draft_token_ids`, discarding a
    partial prompt's; SGLang's EAGLE worker runs `forward_draft_extend` on each extend batch)."""

    def __init__(self, compute: ComputeModel, drafts: int, later: ComputeModel | None = None,
                 all_reduce_s: Callable[[float], float] | None = None) -> None:
        """`all_reduce_s`: an all-reduce of that many bytes over the drafter's tensor-parallel group (the
        fabric's, sim/deployment.py): each pass all-reduces its layers' outputs as the target's layers do
        (its attention's and its MLP's, row-parallel); None where tp is 1."""
        self.compute, self.drafts = compute, drafts
        self.later = compute if later is None else later
        self._all_reduce_s = all_reduce_s
        self._all_reduces = compute.allreduces_per_layer * compute.model.num_layers if compute.tp > 1 else 0
        # (each step asks for a pass's or two: its sizes repeat, as the target's traffic's do: engine/costs.py)
        self._collectives_s = functools.lru_cache(maxsize=65536)(self._collectives_uncached_s)

    def _collectives_uncached_s(self, num_tokens: int) -> float:
        """One pass's all-reduces over `num_tokens` tokens."""
        if not self._all_reduces or self._all_reduce_s is None:
            return 0.0
        return self._all_reduces * self._all_reduce_s(self.compute.allreduce_bytes(num_tokens))

    def step_s(self, num_tokens: int, sequences: int, attn_pairs: float, kv_read_tokens: float,
               chunk_context_tokens: float) -> float:
        """`num_tokens`, `attn_pairs`, `kv_read_tokens` and `chunk_context_tokens` as the target's step
        ran them; `sequences`: those that sample (and get drafts)."""
        if not num_tokens:
            return 0.0
        first = (self.compute.step_time_s(num_tokens, sequences, attn_pairs, kv_read_tokens, chunk_context_tokens)
                 + self._collectives_s(num_tokens))
        if not sequences:  # prompt chunks alone: their positions written, nothing drafted
            return first
        # Each later pass: one query a sequence, attending its whole context (about the step's reads).
        return first + (self.drafts - 1) * (self.later.step_time_s(sequences, sequences, kv_read_tokens,
                                                                    kv_read_tokens) + self._collectives_s(sequences))
