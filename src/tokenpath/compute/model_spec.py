"""A decoder-only transformer's shape (ModelSpec), whichever source it is read from: the catalog or a
Hugging Face config.json (model.py, hf_config.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenpath.compute.precision import FP4_SCALE_BLOCKS
from tokenpath.config.errors import UserError, quoted

# Every dimension of a model fits a signed 32-bit int, as in Hugging Face configs; the largest real
# ones (vocabularies, context lengths) are about 2^18 to 2^24.
MAX_DIMENSION = 2**31 - 1


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a Llama-style decoder: RMSNorm, SwiGLU MLP or MoE, GQA or MLA attention, optionally
    sliding-window attention on some layers.

    MoE fields are zero for dense models, MLA fields zero for models with standard attention. For MLA
    `head_dim` is the query/key head width (qk_nope_head_dim + qk_rope_head_dim). An MoE model's
    `dense_mlp_layers` have a dense MLP of `intermediate_size` instead of experts, wherever they sit;
    `shared_intermediate_size` is the summed width of the shared experts every token runs (DeepSeek's
    n_shared_experts x moe_intermediate_size, Qwen2-MoE's shared_expert_intermediate_size).
    `sliding_layers` of the layers attend only the last `sliding_window` positions.
    `fp8_block_scaled`: its fp8 checkpoint scales weights per block (`weight_block_size` in the
    config's quantization_config, DeepSeek-V3's 128 x 128), which slows its routed experts' grouped
    GEMMs (efficiency.BLOCK_SCALED_EXPERT_GEMM_CEILING) when it runs in fp8. `fp4_format`: the
    block-scaled format of its own fp4 checkpoint (gpt-oss's MXFP4: quantization_config's quant_method),
    whose scales its fp4 weights carry on any chip; empty where it ships none, and the chip's format
    applies (ChipSpec.fp4_format). `architecture`: the model class its config.json names (`architectures`),
    which the engines' model registries map to their model code (some features, such as SGLang's attention
    data-parallel, exist in some of that code only); empty where unknown. `mtp_layers`: the
    multi-token-prediction layers its checkpoint ships (num_nextn_predict_layers, Qwen3-Next's
    mtp_num_hidden_layers), which an "mtp" drafter runs (engine/speculative.py); 0 where it has none.
    Biases are not modelled.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_context: int
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    dense_mlp_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0
    fp8_block_scaled: bool = False
    fp4_format: str = ""
    architecture: str = ""
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "int" and (not isinstance(value, int) or isinstance(value, bool)
                                        or not 0 <= value <= MAX_DIMENSION):
                raise UserError(f"model {self.name}: {field.name} must be a whole number from 0 to {MAX_DIMENSION}, "
                                f"got {quoted(value)}")
        for name in ("tie_word_embeddings", "fp8_block_scaled"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"model {self.name}: {name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.architecture, str):
            raise UserError(f"model {self.name}: architecture must be a model class name such as "
                            f"\"LlamaForCausalLM\", got {quoted(self.architecture)}")
        if self.fp4_format and self.fp4_format not in FP4_SCALE_BLOCKS:
            raise UserError(f"model {self.name}: fp4_format must be one of {', '.join(FP4_SCALE_BLOCKS)}, "
                            f"got {quoted(self.fp4_format)}")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                     "max_context"):
            if getattr(self, name) == 0:
                raise UserError(f"model {self.name}: {name} must be positive")
        # Grouped-query attention: each KV head serves a whole group of query heads.
        if not self.is_mla and (self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads):
            raise UserError(f"model {self.name}: {self.num_kv_heads} KV heads (num_key_value_heads) must divide "
                            f"the {self.num_heads} attention heads (num_attention_heads)")
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise UserError(f"model {self.name}: experts_per_token must be between 1 and num_experts "
                                f"({self.num_experts}), got {self.experts_per_token}")
            if self.moe_intermediate_size == 0:
                raise UserError(f"model {self.name}: an MoE model needs moe_intermediate_size > 0")
            if self.dense_mlp_layers > self.num_layers:
                raise UserError(f"model {self.name}: dense_mlp_layers ({self.dense_mlp_layers}) "
                                f"exceeds num_layers ({self.num_layers})")
        elif self.shared_intermediate_size or self.dense_mlp_layers:
            raise UserError(f"model {self.name}: shared_intermediate_size and dense_mlp_layers need num_experts > 0")
        if self.dense_layers and self.intermediate_size == 0:
            raise UserError(f"model {self.name}: intermediate_size must be positive for its dense MLP layers")
        if self.kv_lora_rank and (self.qk_rope_head_dim == 0 or self.qk_nope_head_dim == 0 or self.v_head_dim == 0):
            raise UserError(f"model {self.name}: an MLA model needs qk_nope_head_dim, qk_rope_head_dim and "
                            f"v_head_dim > 0")
        if self.sliding_layers > self.num_layers:
            raise UserError(f"model {self.name}: sliding_layers ({self.sliding_layers}) exceeds num_layers "
                            f"({self.num_layers})")
        if bool(self.sliding_layers) != bool(self.sliding_window):
            raise UserError(f"model {self.name}: sliding_window and sliding_layers go together: set both > 0 "
                            f"(got {self.sliding_window} and {self.sliding_layers}), or neither")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: all of them, or an MoE model's dense_mlp_layers."""
        return self.dense_mlp_layers if self.is_moe else self.num_layers

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_mlp_layers if self.is_moe else 0

    @property
    def sliding_fraction(self) -> float:
        """Share of the layers with sliding-window attention."""
        return self.sliding_layers / self.num_layers

    # Parameter counts, per layer and whole-model. Norm weights are counted; biases are not.

    def attention_params(self) -> int:
        """Weights of one attention block (projections and, for MLA, its two latent norms)."""
        h = self.hidden_size
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_dim
            else:
                q = h * self.num_heads * qk_dim
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * h
            return q + kv_a + kv_b + o
        q_and_o = 2 * h * self.num_heads * self.head_dim
        return q_and_o + 2 * h * self.num_kv_heads * self.head_dim

    def mlp_params(self, intermediate_size: int) -> int:
        """Weights of one SwiGLU MLP (gate, up, down)."""
        return 3 * self.hidden_size * intermediate_size

    def _params(self, routed_experts: int) -> int:
        h = self.hidden_size
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * h
        dense = self.dense_layers * self.mlp_params(self.intermediate_size)
        moe_layer = (routed_experts * self.mlp_params(self.moe_intermediate_size)
                     + self.mlp_params(self.shared_intermediate_size))
        moe = self.moe_layers * (moe_layer + h * self.num_experts)  # + router
        return embeddings + norms + self.num_layers * self.attention_params() + dense + moe

    def params_total(self) -> int:
        return self._params(self.num_experts)

    def params_active_per_token(self) -> int:
        """All weights less the routed experts a token does not use (embeddings and LM head included)."""
        return self._params(self.experts_per_token)
