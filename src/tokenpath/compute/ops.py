"""Model arithmetic: FLOPs and bytes of one engine step, per chip of a tensor-parallel group.

Each op is one row covering all the layers it occurs in, its FLOPs and bytes linear in the step's
arguments (tokens, logits, attention pairs, KV positions read, prompt chunks' cached context), except
routed-expert weights, which scale with the expected number of distinct experts the step's tokens touch.

Sharding follows the common tensor-parallel layout (Megatron-style, as in vLLM and SGLang): Q heads,
MLP and expert intermediates, and the vocabulary are split over `tp`; K/V heads are split while
there are at least `tp` of them and replicated otherwise; MLA's down-projections (q_a, kv_a), the
MoE router and the norms are replicated.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace

from tokenpath.compute.chip import ChipSpec
from tokenpath.compute.efficiency import ATTENTION_PRECISION, EMBEDDING_PRECISION
from tokenpath.compute.model_spec import ModelSpec
from tokenpath.compute.precision import FP4_SCALE_BLOCKS, PRECISION_BYTES, stored_bytes
from tokenpath.config.assumptions import DEFAULTS, Assumptions, default

LOGIT_BYTES = default("logit_bytes")
"""Logits are materialized in fp32 for sampling."""


@dataclass(frozen=True)
class LinearOp:
    """One op's per-chip cost, summed over its layers, as coefficients of the step's arguments."""

    name: str
    flops_per_s: float  # sustained rate its FLOPs run at
    flops_per_token: float = 0.0
    flops_per_logit: float = 0.0
    flops_per_pair: float = 0.0
    flops_per_kv_read: float = 0.0  # per KV position read (MLA's decode form beyond its prefill form)
    flops_per_chunk_context: float = 0.0  # per cached position before a prompt chunk (MLA decompresses it)
    overhead_pairs_per_token: float = 0.0  # time, not FLOPs: each token costs as many more decode pairs
    bytes_fixed: float = 0.0  # weights streamed once per step
    bytes_per_token: float = 0.0
    bytes_per_logit: float = 0.0
    bytes_per_kv_read: float = 0.0
    bytes_per_chunk_context: float = 0.0
    bytes_per_expert: float = 0.0  # x expected distinct routed experts touched per layer
    resident_bytes: float = 0.0  # weights it keeps in HBM
    kernels: float = 0.0  # kernels it launches per step, over all its layers
    # Of those, the GEMMs by weights (each costs the chip's gemm_fixed_s; the others efficiency.KERNEL_FIXED_S).
    gemm_kernels: float = 0.0
    gemm: bool = False  # a matrix multiply by weights: its time blends compute and memory (roofline.op_time_s)
    # One weight GEMM a layer, (N outputs, K inputs, precision) on each chip: its rate also depends on its
    # shape and the step's tokens (compute/gemm_efficiency.py). None: the rate alone.
    shape: tuple[float, float, str] | None = None
    # Runs on the chip that holds each sequence (attention data-parallel), not split over the chips:
    # evaluated at the busiest chip's share of the step (roofline.ComputeModel.step_time_s).
    per_sequence: bool = False

    def flops(self, num_tokens: float, num_logits: float, attn_pairs: float, kv_read_tokens: float,
              chunk_context_tokens: float = 0.0) -> float:
        return (self.flops_per_token * num_tokens + self.flops_per_logit * num_logits
                + self.flops_per_pair * attn_pairs + self.flops_per_kv_read * kv_read_tokens
                + self.flops_per_chunk_context * chunk_context_tokens)

    def compute_s(self, num_tokens: float, num_logits: float, attn_pairs: float, kv_read_tokens: float,
                  chunk_context_tokens: float = 0.0) -> float:
        """Its FLOPs at its sustained rate, plus its fixed work per token (in decode pairs, each of
        which is one pair and one position read)."""
        overhead = (self.flops_per_pair + self.flops_per_kv_read) * self.overhead_pairs_per_token * num_tokens
        flops = self.flops(num_tokens, num_logits, attn_pairs, kv_read_tokens, chunk_context_tokens)
        return (flops + overhead) / self.flops_per_s

    def bytes(self, num_tokens: float, num_logits: float, kv_read_tokens: float, experts_touched: float,
              chunk_context_tokens: float = 0.0) -> float:
        return (self.bytes_fixed + self.bytes_per_token * num_tokens + self.bytes_per_logit * num_logits
                + self.bytes_per_kv_read * kv_read_tokens + self.bytes_per_expert * experts_touched
                + self.bytes_per_chunk_context * chunk_context_tokens)


def kv_heads_per_chip(model: ModelSpec, tp: int) -> float:
    """K/V heads each rank holds: split while there are at least tp of them, else one replica each."""
    return model.num_kv_heads / tp if model.num_kv_heads >= tp else 1.0


def kv_bytes_per_token_per_layer(model: ModelSpec, tp: int, kv_precision: str, latent_attention: bool = True) -> float:
    """KV-cache bytes one token adds to one layer on one chip.

    GQA/MHA: K and V for the rank's kv heads. MLA: the compressed latent (kv_lora_rank) and the
    shared RoPE key (qk_rope_head_dim), replicated on every rank; run expanded (not
    `latent_attention`, _expanded_mla_projections), K and V of the rank's heads, each as wide as the
    query-key head (nope + rope).
    """
    kv_bytes = PRECISION_BYTES[kv_precision]
    if model.is_mla and latent_attention:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes
    if model.is_mla:
        return 2 * model.num_heads / tp * model.head_dim * kv_bytes
    return 2 * kv_heads_per_chip(model, tp) * model.head_dim * kv_bytes


def expert_gemm_fraction(width: float, block_scaled: bool, assumptions: Assumptions = DEFAULTS) -> float:
    """The fraction of the dense GEMM rate routed experts of `width` (an expert's intermediate width on
    one chip) reach where they are compute-bound; `block_scaled`: fp8 weights scaled per block."""
    fraction = width / (width + assumptions.value("expert_gemm_half_width"))
    if block_scaled:
        fraction *= assumptions.value("block_scaled_expert_gemm_ceiling")
    return fraction


@dataclass(frozen=True)
class Mxfp4Layout:
    """How an engine lays out an MXFP4 checkpoint's routed experts in memory: each expert GEMM's hidden and
    intermediate dimensions padded to multiples of `hidden_align` and `intermediate_align` (1: as loaded), and
    where it holds the scales twice, the loaded ones and its kernels' copy, the multiple the copy pads each
    GEMM's output dimension to (`scale_copy_align`; None: held once). engine/mxfp4_weights.py has each
    engine's, read from its loaders."""

    hidden_align: int = 1
    intermediate_align: int = 1
    scale_copy_align: int | None = None

    def padded(self, hidden: float, intermediate: float) -> tuple[float, float]:
        """An expert's hidden and intermediate widths as laid out."""
        return (math.ceil(hidden / self.hidden_align) * self.hidden_align,
                math.ceil(intermediate / self.intermediate_align) * self.intermediate_align)

    def copy_bytes(self, hidden: float, intermediate: float) -> float:
        """Bytes of one expert's scale copy in one layer, of its laid-out widths: its fused gate-and-up GEMM's
        (2 x intermediate outputs of hidden inputs) and its down GEMM's (hidden outputs of intermediate inputs), a
        byte per FP4_SCALE_BLOCKS["mxfp4"] inputs, each output dimension padded to `scale_copy_align`; 0 without."""
        align = self.scale_copy_align
        if align is None:
            return 0.0

        def aligned(width: float) -> float:
            return math.ceil(width / align) * align

        return (aligned(2 * intermediate) * hidden + aligned(hidden) * intermediate) / FP4_SCALE_BLOCKS["mxfp4"]


@dataclass(frozen=True)
class _Sharding:
    """What every op row of one deployment shares: the model, the chip, the split and the byte sizes."""

    model: ModelSpec
    chip: ChipSpec
    tp: int
    weight_precision: str
    kv_precision: str
    assumptions: Assumptions
    expert_precision: str  # the routed experts' weights (an MXFP4 checkpoint's, gpt-oss: the rest in bf16)
    latent_attention: bool  # an MLA model's attention in its latent space, or expanded per head
    weight_only_expert_time: float = 1.0  # the engine's multiple of the roofline for weight-only MXFP4 experts
    expert_parallel: bool = False  # routed experts placed whole on the chips (their GEMMs a whole expert wide)
    mla_absorbed_bf16: bool = False  # MLA's absorbed W_UK / W_UV kept as bf16 copies of a quantized kv_b_proj
    mxfp4_layout: Mxfp4Layout | None = None  # how the engine lays out MXFP4 routed experts (None: as loaded)
    expert_dispatch: bool = False  # with expert_parallel: a chip receives only the copies routed to its experts
    qkv_input_widths: int = 1  # hidden widths into the QKV projection (an EAGLE-3 head's: 2)

    @property
    def act(self) -> float:
        return self.assumptions.value("activation_bytes")

    @property
    def fp4_format(self) -> str:
        """The block-scaled format fp4 weights are in: the checkpoint's own, else the chip's."""
        return self.model.fp4_format or self.chip.fp4_format

    @property
    def weight_bytes(self) -> float:
        return stored_bytes(self.weight_precision, self.fp4_format)

    @property
    def embed_bytes(self) -> float:
        return PRECISION_BYTES[EMBEDDING_PRECISION]

    @property
    def gemm_rate(self) -> float:
        return self.chip.effective_flops(self.weight_precision)

    @property
    def attention_rate(self) -> float:
        """Attention's products' plateau rate: the chip's large-GEMM ceiling at ATTENTION_PRECISION times
        the attention plateau fraction (not the weight GEMMs' serving fraction)."""
        return self.chip.ceiling_flops(ATTENTION_PRECISION) * self.assumptions.value("attention_plateau_fraction")

    @property
    def bf16_rate(self) -> float:
        return self.chip.effective_flops(EMBEDDING_PRECISION)

    def quantizes_input(self, precision: str) -> bool:
        """Whether a GEMM of weights at `precision` quantizes its input first, by a kernel of its own: where the
        chip multiplies below 16 bits. A weight-only precision (fp8 on A100, fp4 on Hopper: vLLM's Marlin,
        gpt-oss's MXFP4 experts) takes the bf16 input as it is and dequantizes the weights inside the GEMM."""
        return PRECISION_BYTES[self.chip.compute_precision(precision)] < 2

    @property
    def quantize(self) -> int:
        """The input quantization kernels (0 or 1) before each of its GEMMs at the weights' precision."""
        return int(self.quantizes_input(self.weight_precision))

    def gemm(self, name: str, n_layers: int, params: float, in_width: float, out_width: float, *,
             extra_width: float = 0.0, bf16: bool = False, extra_kernels: int = 0, one_gemm: bool = True) -> LinearOp:
        """A linear layer applied to every token: 2 FLOPs per weight per token; its weights are read
        once per step, and each token's input, output (and `extra_width` fused elementwise traffic)
        once. Per layer it launches the GEMM, its input's quantization and `extra_kernels` more.
        `bf16`: its weights are in bf16 whatever the model's precision (an embedding-like layer's).
        `one_gemm`: it is one GEMM of `out_width` by `in_width` (its shape: LinearOp.shape)."""
        param_bytes = self.embed_bytes if bf16 else self.weight_bytes
        precision = EMBEDDING_PRECISION if bf16 else self.weight_precision
        return LinearOp(
            name, self.bf16_rate if bf16 else self.gemm_rate,
            flops_per_token=2.0 * params * n_layers,
            bytes_fixed=params * param_bytes * n_layers,
            bytes_per_token=(in_width + out_width + extra_width) * self.act * n_layers,
            resident_bytes=params * param_bytes * n_layers,
            kernels=(1 + (0 if bf16 else self.quantize) + extra_kernels) * n_layers,
            gemm_kernels=n_layers,
            gemm=True,
            shape=(out_width, in_width, precision) if one_gemm else None,
        )


def build_ops(model: ModelSpec, chip: ChipSpec, tp: int, weight_precision: str, kv_precision: str,
              assumptions: Assumptions = DEFAULTS,
              expert_precision: str | None = None, attention_dp: bool = False,
              latent_attention: bool = True, weight_only_expert_time: float = 1.0,
              input_projection: int = 0, attention_dp_whole: frozenset[str] = frozenset(),
              expert_parallel: bool = False, mla_absorbed_bf16: bool = False,
              mxfp4_layout: Mxfp4Layout | None = None, expert_dispatch: bool = False,
              qkv_input_widths: int = 1) -> list[LinearOp]:
    """The op rows of one step, in execution order, for `model` sharded `tp` ways on `chip`.

    `expert_parallel` places routed experts whole, 1/tp of them per chip (roofline.ComputeModel): their
    FLOPs, weights and bytes a step reads per chip are those of tensor parallelism on average (the busiest
    chip's, where tp does not divide the experts: expert_parallel_busiest_share), and their grouped GEMMs
    are as wide as a whole expert. `assumptions`: a run's (the registry's by default).
    `expert_precision`: the routed experts' weights, where they differ from the others' (None: the same).

    `attention_dp`: attention runs data-parallel over the `tp` chips (SGLang's --attn-dp-size, TensorRT-LLM's
    enable_attention_dp): each chip holds every head's weights and runs attention for the sequences it
    holds, so its ops are those of one chip (`per_sequence`: ComputeModel evaluates them at the busiest
    chip's share of each step); the MLP and MoE layers stay tensor- (or expert-) parallel.

    `latent_attention`: an MLA model's attention runs in its latent space (_mla_projections), as
    today's engines run it, or expanded per head (_expanded_mla_projections), as older releases did
    (engine/profiles.py's latent_attention_since).

    `weight_only_expert_time`: the multiple of their roofline time the engine's routed experts take when
    they are MXFP4 weights the chip runs weight-only (engine/expert_kernels.py; 1: the roofline).

    `input_projection`: a drafter's projection of `input_projection` hidden-width inputs down to one
    before its layer (_input_projection; 0: none).

    `mla_absorbed_bf16`: the engine keeps an MLA model's absorbed W_UK / W_UV as bf16 copies of a quantized
    kv_b_proj (engine/mla_weights.py; _mla_projections).

    `mxfp4_layout`: how the engine lays out MXFP4 routed experts in memory (Mxfp4Layout, engine/mxfp4_weights.py;
    None: as loaded).

    `expert_dispatch`: with `expert_parallel`, each token's routed copies go by all-to-all to the chips holding
    their experts (DeepEP), so a chip's experts read and write only those copies' activations (_routed_experts).

    `qkv_input_widths`: hidden widths into a (GQA) layer's QKV projection: an EAGLE-3 head's layer takes the
    token's embedding and the hidden state side by side (vLLM's llama_eagle3.py, `qkv_input_size = 2 *
    self.hidden_size` for its layer 0; SGLang's llama_eagle3.py likewise)."""
    s = _Sharding(model, chip, tp, weight_precision, kv_precision, assumptions,
                  expert_precision or weight_precision, latent_attention, weight_only_expert_time, expert_parallel,
                  mla_absorbed_bf16, mxfp4_layout, expert_dispatch, qkv_input_widths)
    data_parallel = attention_dp and tp > 1
    whole = dataclasses.replace(s, tp=1)

    def own(ops: list[LinearOp]) -> list[LinearOp]:
        """Ops each chip runs whole for its own sequences (ComputeModel: at the busiest chip's share)."""
        return [dataclasses.replace(op, per_sequence=True) for op in ops]

    # Under attention data-parallel an engine may also hold other ops whole on every chip (`attention_dp_whole`,
    # engine/profiles.py): the embedding, the LM head (its chip's sequences' logits), and an MoE model's dense
    # layers, shared experts and router, which then need no collective (ComputeModel.rank_local_layers).
    local = attention_dp_whole if data_parallel else frozenset()
    moe_local = local if model.is_moe else frozenset()
    embedding_tp = 1 if "embedding" in local else tp
    head = own([_lm_head(whole)])[0] if "lm_head" in local else _lm_head(s)
    embedding, *norms = _embedding_and_norms(s, embedding_tp, data_parallel)
    if data_parallel:
        # A rank normalizes its own tokens into attention, MLA's latents and the final norm; the norm before
        # the MLP runs where the MLP's input is: the rank's own tokens where what follows it runs there (its
        # router, shared experts or dense MLP: vLLM's and TensorRT-LLM's layers, which dispatch after it), all
        # the ranks' tokens where they are gathered first (SGLang's LayerCommunicator.prepare_mlp).
        rank_norms, mlp_norms = norms
        mlp_own = bool(moe_local & {"dense_mlp", "moe_router", "shared_experts"})
        norms = [*own([rank_norms]), *(own([mlp_norms]) if mlp_own else [mlp_norms])]
    return [embedding, *norms, *_input_projection(s, input_projection),
            *(own(_attention(whole)) if data_parallel else _attention(s)),
            *(own(_dense_mlp(whole)) if "dense_mlp" in moe_local else _dense_mlp(s)),
            *(own(_moe_router(s)) if "moe_router" in moe_local else _moe_router(s)), *_routed_experts(s),
            *(own(_shared_experts(whole)) if "shared_experts" in moe_local else _shared_experts(s)), head]


def _input_projection(s: _Sharding, inputs: int) -> list[LinearOp]:
    """A drafter's linear layer from `inputs` x hidden to hidden, unsharded and in bf16 on every chip: EAGLE's
    `fc` over the token's embedding and the target's hidden state (2h -> h; vLLM's llama_eagle.py,
    `LlamaModel.fc`, a ReplicatedLinear), EAGLE-3's over three of the target's layers' hidden states
    (3h -> h; llama_eagle3.py, `LlamaModel.fc`), the MTP module's `eh_proj` (2h -> h; deepseek_mtp.py,
    `DeepSeekMultiTokenPredictorLayer.eh_proj`, an nn.Linear; SGLang's deepseek_nextn.py likewise)."""
    if not inputs:
        return []
    h = s.model.hidden_size
    return [s.gemm("input_proj", 1, inputs * h * h, inputs * h, h, bf16=True)]


def _embedding_and_norms(s: _Sharding, embedding_tp: int, split: bool = False) -> list[LinearOp]:
    """The embedding, its table split over `embedding_tp` chips, and the layers' norms: one op, or (`split`)
    two, "norms" (into attention, MLA's latents, the final one, with each layer's closing residual add) and
    "mlp_norms" (each layer's norm before its MLP)."""
    model, h, layers, act = s.model, s.model.hidden_size, s.model.num_layers, s.act
    embedding = LinearOp(
        "embedding", s.bf16_rate,
        bytes_per_token=h * s.embed_bytes / embedding_tp + h * act,  # this rank's share of the rows, full output
        resident_bytes=model.vocab_size / embedding_tp * h * s.embed_bytes,
        kernels=1,
    )
    # Fused residual-add + RMSNorm: reads input and residual, writes both. Two per layer and a final
    # one; MLA adds plain norms on its q and kv latents. Kernels: the two norms and the residual add
    # closing each layer, the final norm, and MLA's latent norms.
    latent_width = (model.q_lora_rank + model.kv_lora_rank) * layers if model.is_mla else 0
    latent_kernels = (1 + bool(model.q_lora_rank)) * layers if model.is_mla else 0
    if not split:
        return [embedding, _norms(s, "norms", 2 * layers + 1, 3 * layers + 1 + latent_kernels, latent_width)]
    return [embedding, _norms(s, "norms", layers + 1, 2 * layers + 1 + latent_kernels, latent_width),
            _norms(s, "mlp_norms", layers, layers)]


def _norms(s: _Sharding, name: str, norms: int, kernels: int, latent_width: float = 0.0) -> LinearOp:
    """`norms` fused residual-add + RMSNorms of the hidden width, and plain norms over `latent_width`."""
    h, act = s.model.hidden_size, s.act
    return LinearOp(name, s.bf16_rate, bytes_fixed=(norms * h + latent_width) * act,
                    bytes_per_token=(4 * norms * h + 2 * latent_width) * act,
                    resident_bytes=(norms * h + latent_width) * act, kernels=kernels)


@dataclass(frozen=True)
class _AttentionWidths:
    """Per head: the decode form's score and value widths, the prompt form's, the K/V each new token
    writes (over the rank's heads) and the output projection's input width."""

    qk: float
    pv: float
    prefill_qk: float
    prefill_pv: float
    new_kv: float
    o_in: float


def _attention(s: _Sharding) -> list[LinearOp]:
    """The projections into attention, attention itself and the output projection."""
    model, layers, act = s.model, s.model.num_layers, s.act
    heads = model.num_heads / s.tp
    if model.is_mla:
        projections, widths = _mla_projections(s) if s.latent_attention else _expanded_mla_projections(s)
    else:
        projections, widths = _gqa_projection(s)
    kv_layer = kv_bytes_per_token_per_layer(model, s.tp, s.kv_precision, s.latent_attention)
    # Attention: QK^T and PV, 2 FLOPs per multiply-add, per head and (query, key) pair; reads the
    # cached KV of every position attended, reads each new token's q and K/V, writes its output and
    # its KV-cache entry. Kernels: RoPE, the KV-cache write, attention over the KV split in parts
    # (FlashAttention's split-KV decode, as vLLM and SGLang run it), and the combine of the parts.
    # A pair costs the prompt form's widths and each position read adds the decode form's excess
    # (_mla_projections says why).
    prefill_width = widths.prefill_qk + widths.prefill_pv
    attention = LinearOp(
        "attention", s.attention_rate,
        flops_per_pair=2.0 * heads * prefill_width * layers,
        flops_per_kv_read=2.0 * heads * (widths.qk + widths.pv - prefill_width) * layers,
        overhead_pairs_per_token=s.assumptions.value("attention_query_overhead_pairs"),
        bytes_per_token=(kv_layer + (heads * (widths.qk + widths.pv) + widths.new_kv) * act) * layers,
        bytes_per_kv_read=kv_layer * layers,
        kernels=4 * layers,
    )
    o_proj = s.gemm("o_proj", layers, widths.o_in * model.hidden_size, widths.o_in, model.hidden_size)
    return [*projections, attention, o_proj]


def _gqa_projection(s: _Sharding) -> tuple[list[LinearOp], _AttentionWidths]:
    model, h = s.model, s.model.hidden_size * s.qkv_input_widths
    d, heads, kv_heads = model.head_dim, model.num_heads / s.tp, kv_heads_per_chip(model, s.tp)
    qkv = s.gemm("qkv_proj", model.num_layers, h * (heads + 2 * kv_heads) * d, h, (heads + 2 * kv_heads) * d)
    return [qkv], _AttentionWidths(d, d, d, d, 2 * kv_heads * d, heads * d)


def _mla_projections(s: _Sharding) -> tuple[list[LinearOp], _AttentionWidths]:
    """Multi-head latent attention (DeepSeek V2/V3): queries through an optional low-rank q_a/q_b,
    keys and values compressed to one latent per token (kv_a) and expanded by kv_b.

    Decode attention runs in the latent space: scores over rank + rope, values over rank. Prompt tokens
    attend as multi-head attention over K/V decompressed from the latent (scores over nope + rope,
    values over v), as vLLM's and SGLang's MLA backends run prefill: 3.4x fewer FLOPs per pair for
    DeepSeek-V3. The step gives only sums, so a pair costs the MHA width and each position read adds
    the latent form's excess: exact for decode tokens (one read per pair), and for a prompt chunk of q
    tokens after p, whose q*p + q(q+1)/2 pairs read p + q positions, nearly all MHA."""
    model, layers, act = s.model, s.model.num_layers, s.act
    rank, nope, rope, v = model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    heads = model.num_heads / s.tp
    ops = _mla_queries_and_latent(s)
    # Absorbed form (decode): W_UK maps q_nope into the latent space and W_UV maps the latent
    # attention output back to v_head_dim; together 2 FLOPs per kv_b weight per token. Prefill
    # form: each prompt token's latent is decompressed to its K_nope and V, the same 2 FLOPs per
    # weight; and so is every position already cached before a prompt chunk (an earlier chunk,
    # a prefix-cache hit), as vLLM's MLA prefill does over the chunk's context: it reads their
    # cached latents and writes K_nope and V for its attention to read.
    kv_b_params = rank * heads * (nope + v)
    kv_b = s.gemm("kv_b_proj", layers, kv_b_params, heads * (nope + rank), heads * (rank + v))
    latent_bytes = rank * PRECISION_BYTES[s.kv_precision]
    kv_b = replace(kv_b, flops_per_chunk_context=2.0 * kv_b_params * layers,
                   bytes_per_chunk_context=(latent_bytes + heads * (nope + v) * act) * layers)
    if s.mla_absorbed_bf16 and s.weight_bytes < act:
        # W_UK / W_UV dequantized into copies in the activations' dtype (engine/mla_weights.py): held beside
        # kv_b_proj, which prompt tokens still run, and streamed in its place, as decode steps read them (a
        # step of prompts alone reads the quantized kv_b_proj instead, in a compute-bound step).
        copies_bytes = kv_b_params * act * layers
        kv_b = replace(kv_b, bytes_fixed=copies_bytes, resident_bytes=kv_b.resident_bytes + copies_bytes)
    ops.append(kv_b)
    return ops, _AttentionWidths(rank + rope, rank, nope + rope, v, rank + rope, heads * v)


def _expanded_mla_projections(s: _Sharding) -> tuple[list[LinearOp], _AttentionWidths]:
    """MLA run as multi-head attention, as vLLM did before v0.7.1 (DeepseekV2Attention,
    vllm/model_executor/models/deepseek_v2.py): kv_b expands each new token's latent into K_nope and V
    for every head, its RoPE key is repeated over the heads, and V is zero-padded to the query-key
    width (nope + rope) so that one attention head size serves K and V. The KV cache holds those K
    and V (kv_bytes_per_token_per_layer), and every pair, prompt or decode, costs the padded widths;
    nothing cached is decompressed again."""
    model, layers = s.model, s.model.num_layers
    rank, nope, v, width = model.kv_lora_rank, model.qk_nope_head_dim, model.v_head_dim, model.head_dim
    heads = model.num_heads / s.tp
    kv_b = s.gemm("kv_b_proj", layers, rank * heads * (nope + v), rank, heads * (nope + v))
    return ([*_mla_queries_and_latent(s), kv_b],
            _AttentionWidths(width, width, width, width, 2 * heads * width, heads * v))


def _mla_queries_and_latent(s: _Sharding) -> list[LinearOp]:
    """MLA's query projections (through the low-rank q_a/q_b where the model has them) and kv_a, which
    compresses each token's keys and values into its latent and RoPE key: the same in either form."""
    model, h, layers = s.model, s.model.hidden_size, s.model.num_layers
    rank, nope, rope = model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim
    heads = model.num_heads / s.tp
    if model.q_lora_rank:
        q_rank = model.q_lora_rank
        queries = [s.gemm("q_a_proj", layers, h * q_rank, h, q_rank),
                   s.gemm("q_b_proj", layers, q_rank * heads * (nope + rope), q_rank, heads * (nope + rope))]
    else:
        queries = [s.gemm("q_proj", layers, h * heads * (nope + rope), h, heads * (nope + rope))]
    return [*queries, s.gemm("kv_a_proj", layers, h * (rank + rope), h, rank + rope)]


def _dense_mlp(s: _Sharding) -> list[LinearOp]:
    model, h = s.model, s.model.hidden_size
    if not model.dense_layers:
        return []
    inter = model.intermediate_size / s.tp
    # SiLU(gate) * up is fused after gate_up: reads 2 x inter, writes inter.
    return [s.gemm("mlp_gate_up", model.dense_layers, 2 * h * inter, h, 2 * inter, extra_width=3 * inter,
                   extra_kernels=1),  # the activation
            s.gemm("mlp_down", model.dense_layers, inter * h, inter, h)]


def expert_layer_kernels(quantized_inputs: bool) -> int:
    """Kernels of one layer's routed experts: align and permute the copies, grouped gate_up, activation,
    grouped down, combine; and, where the chip multiplies the weights below 16 bits, the two inputs'
    quantization (_Sharding.quantizes_input)."""
    return 5 + 2 * quantized_inputs


def expert_parallel_busiest_share(num_experts: int, tp: int) -> float:
    """The routed experts the busiest of `tp` chips holds under expert parallelism, over the average E / tp:
    ceil(E / tp) whole experts (its weights, and the tokens routed to them, at uniform routing)."""
    return -(-num_experts // tp) * tp / num_experts


def _moe_router(s: _Sharding) -> list[LinearOp]:
    """The router of an MoE model's layers: its weights whole on every chip, and the top-k selection."""
    model, h = s.model, s.model.hidden_size
    if not model.is_moe:
        return []
    return [s.gemm("moe_router", model.moe_layers, h * model.num_experts, h, model.num_experts,
                   bf16=True, extra_kernels=1)]  # top-k selection


def _routed_experts(s: _Sharding) -> list[LinearOp]:
    """The routed experts' grouped GEMMs."""
    model, h = s.model, s.model.hidden_size
    if not model.is_moe:
        return []
    moe_layers = model.moe_layers
    inter = model.moe_intermediate_size / s.tp
    # Placed whole, the busiest chip holds ceil(E / tp) experts (vLLM's determine_expert_map gives the first
    # E % tp ranks one more) and runs the tokens routed to them: that many of the average E / tp.
    busiest = expert_parallel_busiest_share(model.num_experts, s.tp) if s.expert_parallel else 1.0
    expert_params = 3 * h * inter * busiest  # this chip's share of each expert, on average over the experts
    # Per routed copy of a token: gather h, gate_up out 2I, activation 2I in + I out, down in I,
    # out h. Under tensor parallelism, and expert parallelism without a dispatch (every chip holds every
    # token, as after an all-gather: vLLM's fused_moe with an expert_map still writes each copy routed
    # elsewhere, as zeros), a chip handles every copy; dispatched, only the busiest / tp of them routed to
    # its experts, each a whole expert wide.
    width = model.moe_intermediate_size if s.expert_parallel else inter
    dispatched = s.expert_parallel and s.expert_dispatch
    copies = model.experts_per_token * busiest / (s.tp if dispatched else 1)
    copy_bytes = 2 * h + 6 * (width if dispatched else inter)
    precision = s.expert_precision
    expert_bytes = stored_bytes(precision, s.fp4_format)
    # Block scaling slows the fp8 tensor-core kernels; a chip that runs fp8 weight-only does not use them.
    block_scaled = model.fp8_block_scaled and s.chip.compute_precision(precision) == "fp8"
    # MXFP4 weights dequantized inside the GEMM take the engine's multiple of the roofline: the op's rate
    # divided by it and its streamed bytes times it (its resident weights stay), so its time is times it.
    slow = s.weight_only_expert_time if precision in s.chip.weight_only and s.fp4_format == "mxfp4" else 1.0
    flops = 2.0 * model.experts_per_token * expert_params * moe_layers
    streamed = expert_params * expert_bytes * moe_layers
    resident = model.num_experts * expert_params * expert_bytes * moe_layers
    layout = s.mxfp4_layout if precision == "fp4" and s.fp4_format == "mxfp4" else None
    if layout is not None:
        # Padded, each GEMM holds (and, where no measured multiple of its kernels' time stands for them, runs)
        # the padded shape; the scales' copy is held, not streamed (the kernels read it alone).
        hidden, intermediate = layout.padded(h, width)
        grown = hidden * intermediate / (h * width)
        resident = resident * grown + model.num_experts * busiest * moe_layers * layout.copy_bytes(
            hidden, intermediate) * inter / width  # (this chip's share of an expert's)
        if slow == 1.0:
            flops, streamed = flops * grown, streamed * grown
    return [LinearOp(
        "moe_experts",
        s.chip.effective_flops(precision) * expert_gemm_fraction(width, block_scaled, s.assumptions) / slow,
        flops_per_token=flops,
        bytes_per_token=copies * copy_bytes * s.act * moe_layers * slow,
        bytes_per_expert=streamed * slow,
        resident_bytes=resident,
        kernels=expert_layer_kernels(s.quantizes_input(precision)) * moe_layers,
        gemm=True,
    )]


def _shared_experts(s: _Sharding) -> list[LinearOp]:
    """An MoE model's shared experts, where it has them: a gated MLP every token runs."""
    model, h = s.model, s.model.hidden_size
    if not model.is_moe or not model.shared_intermediate_size:
        return []
    shared = model.shared_intermediate_size / s.tp
    return [s.gemm("shared_experts", model.moe_layers, 3 * h * shared, h, h, extra_width=6 * shared,
                   extra_kernels=2 + s.quantize, one_gemm=False)]  # activation, down GEMM and its quantization


def _lm_head(s: _Sharding) -> LinearOp:
    model, h = s.model, s.model.hidden_size
    vocab_per_chip = model.vocab_size / s.tp
    return LinearOp(
        "lm_head", s.bf16_rate,
        flops_per_logit=2.0 * h * vocab_per_chip,
        bytes_fixed=vocab_per_chip * h * s.embed_bytes,
        bytes_per_logit=h * s.act + vocab_per_chip * s.assumptions.value("logit_bytes"),
        resident_bytes=0.0 if model.tie_word_embeddings else vocab_per_chip * h * s.embed_bytes,
        kernels=1,
        gemm_kernels=1,
        gemm=True,
    )
