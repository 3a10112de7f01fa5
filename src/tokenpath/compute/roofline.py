"""Roofline time of one engine step on one chip of a tensor-parallel group.

Each op takes the larger of FLOPs / sustained FLOP/s and bytes / sustained HBM bandwidth, or for a
GEMM a blend of the two that is slower near the ridge point (`op_time_s`), plus the fixed cost of
each kernel it launches (efficiency.KERNEL_FIXED_S); a step is the sum of its ops plus the host's time
for the step (`host_window_s` when it calls the scheduler, `host_step_s` every step, and
`host_per_sequence_s` per sequence sampled: the engine's, passed in; with `host_overlapped` the host
prepares each step while the GPU runs the one before, so a step takes the longer of the two instead of
their sum),
plus its kernel launches when it does not replay a captured CUDA graph
(efficiency.EAGER_KERNEL_LAUNCH_S per kernel). Communication (the tensor-parallel
all-reduces) is not included: `allreduce_bytes` sizes the hidden state the engine's costs move
between chips.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tokenpath.compute import efficiency
from tokenpath.compute.chip import ChipSpec
from tokenpath.compute.gemm_efficiency import ShapeCurve, shape_table
from tokenpath.compute.model_spec import ModelSpec
from tokenpath.compute.ops import LinearOp, Mxfp4Layout, build_ops, kv_bytes_per_token_per_layer, kv_heads_per_chip
from tokenpath.compute.precision import PRECISION_BYTES, check_precision
from tokenpath.config.assumptions import DEFAULTS, Assumptions
from tokenpath.config.errors import DoesNotFit, UserError

__all__ = ["PRECISION_BYTES", "OpCost", "ComputeModel"]


@dataclass(frozen=True)
class OpCost:
    """One op's cost in one step, summed over its layers, on one chip."""

    name: str
    flops: float
    bytes: float
    time_s: float
    bound: str  # "compute" | "memory"


_DENSE_MLP_OPS = ("mlp_gate_up", "mlp_down")
"""An MoE model's dense-MLP layers' ops (ops._dense_mlp)."""
_MOE_OPS = ("moe_router", "moe_experts", "shared_experts")
"""An MoE model's expert layers' ops (ops._moe_router, _routed_experts, _shared_experts)."""


# Where the layers a pipeline's stage count does not divide go, one each (pipeline_stage_layers).
ExtraLayers = Literal["before_last", "last", "first"]


def pipeline_stage_layers(layers: int, pp: int, extra: ExtraLayers = "before_last") -> list[int]:
    """The layers of each of `pp` pipeline stages: a pp-th each, and the remainder one each to the stages
    before the last, from the last but one back, as vLLM partitions them (vllm/distributed/utils.py,
    get_pp_indices: the last holds the LM head); to the last stages ("last"), as SGLang does
    (srt/distributed/utils.py, get_pp_indices); or to the first ones ("first"), as TensorRT-LLM does
    (tensorrt_llm/mapping.py, `pp_layers`: torch.tensor_split of the layers)."""
    partitions = [layers // pp] * pp
    for i in range(layers % pp):
        partitions[i if extra == "first" else -1 - i if extra == "last" else -2 - i] += 1
    return partitions


class ComputeModel:
    """Per-chip step cost of `model` sharded `tp` ways on `chip`.

    Step arguments, for one engine step of a continuous-batching engine:
    num_tokens: tokens processed (decode tokens + prefill-chunk tokens), the M of every GEMM;
    num_logits: sequences that sample a token (LM-head rows);
    attn_pairs: sum over sequences of (query, attended key) pairs, q*p + q*(q+1)/2 for a causal
      chunk of q tokens after p cached ones, the context length for a decode token;
    kv_read_tokens: sum over sequences of KV positions read from HBM (p + q for a chunk);
    chunk_context_tokens: sum over the step's prompt chunks of the positions already cached before
      each (p: earlier chunks of the prompt, prefix-cache hits), which MLA's prefill decompresses.

    Sliding-window attention (model.sliding_layers of the layers attend the last model.sliding_window
    = W positions) caps both per sequence: a query attends at most W keys, and a chunk of q tokens
    reads at most W - 1 + q positions. The step sees only the sums over its sequences, so a sliding
    layer's pairs are taken as min(attn_pairs, W * num_tokens) and its reads as
    min(kv_read_tokens, (W - 1) * sequences + num_tokens), with sequences = num_logits, plus one when
    the step has more tokens than logits (at most one sequence is part-way through its prompt). Each
    sum of minima is at most the minimum of the sums, so this is an upper bound on the sliding layers'
    work: exact when every sequence in the step is within its window (a full-attention cost) or when
    every query is past it (decode of long contexts, W per token), and high when short and long
    sequences share a step. Full-attention layers take the sums as they are.

    CUDA graphs (the engine's `cuda_graphs` and `cuda_graph_max_tokens`): "all" captures every step of
    up to `cuda_graph_max_tokens` tokens (None: any size), "decode" only those where every sequence
    decodes one token (num_tokens == num_logits), "none" no step; `cuda_graph_sizes`, where the engine
    pads no batch, the only step sizes captured (None: every size up to the limit);
    `prefill_graph_max_tokens`, where "decode" graphs leave prompt steps eager, the largest step holding a
    prompt that replays a graph all the same (SGLang's prompt-step graphs, engine/cuda_graphs.py; None:
    none). A step that replays
    no graph adds to its kernels, per kernel, its launch gap, and waits for a host that launches them one by one at
    `host_eager_per_kernel_s` each (engine/host_time.py; 0: none): the launch queue of launch_wait_s.
    `engine_kernels`: how many kernels a step runs, where its engine's model code fuses a layer into other
    kernels than the ops count (engine/eager_launches.py); None: the ops' count. The GEMMs stay the ops'
    and the other kernels' fixed times are scaled to the engine's count (`fixed_s`); an eager step's host
    launches that many. `fused_kernels`: where the engine's compiled code runs some of the ops' kernels
    inside others (engine/eager_launches.py), how many a step does; the ops' count less these is the engine's.
    `fused_mxfp4_moe_calls`: where the engine runs MXFP4 routed experts as one fused op on a chip with FP4
    tensor cores, its host's calls for each MoE block's router and experts, in place of those ops' kernels
    (engine/eager_launches.py); None: the ops' count.

    Expert parallelism (`expert_parallel`) places whole routed experts on the `tp` chips, 1/tp of them each:
    a chip's expert FLOPs, weights and the expert bytes a step reads are those of tensor parallelism on
    average, and their grouped GEMMs are as wide as whole experts (ops.build_ops); where tp does not divide
    the experts, those of the busiest chip, which holds ceil(E / tp) of them. `expert_dispatch` (with it:
    the scenario's moe_all_to_all, DeepEP) sends each chip only the token copies routed to its experts, so
    their activations are those copies' (ops._routed_experts).

    `mla_absorbed_bf16`: the engine keeps an MLA model's absorbed W_UK / W_UV as bf16 copies of a quantized
    kv_b_proj, held beside it and streamed in its place (engine/mla_weights.py, ops.build_ops).
    `mxfp4_layout`: how the engine lays out MXFP4 routed experts in memory (ops.Mxfp4Layout, engine/
    mxfp4_weights.py; None: as loaded).

    A speculative-decoding drafter (compute/drafter.py) adds its `input_projection` (ops.build_ops) and
    names in `shared_weights` the ops whose weights it takes from the target (the embedding, the LM head):
    they cost their time and streamed bytes as any op, and none of the drafter's resident bytes.

    `assumptions`: the run's (config/assumptions.py; a scenario's overrides and calibrations), handed in
    by whoever builds the model (sim/deployment.py); the registry's values when none are given.
    """

    def __init__(self, model: ModelSpec, chip: ChipSpec, tp: int, weight_precision: str, kv_precision: str,
                 pp: int = 1, cuda_graphs: str = "all", cuda_graph_max_tokens: int | None = None,
                 cuda_graph_sizes: frozenset[int] | None = None, prefill_graph_max_tokens: int | None = None,
                 host_window_s: float = 0.0, host_step_s: float = 0.0,
                 host_per_sequence_s: float = 0.0, host_overlapped: bool = False, host_eager_per_kernel_s: float = 0.0,
                 engine_kernels: float | None = None, fused_kernels: int = 0,
                 fused_mxfp4_moe_calls: int | None = None,
                 assumptions: Assumptions = DEFAULTS, expert_precision: str | None = None, attention_dp: bool = False,
                 latent_attention: bool = True, weight_only_expert_time: float = 1.0,
                 input_projection: int = 0, shared_weights: frozenset[str] = frozenset(),
                 attention_dp_whole: frozenset[str] = frozenset(), pp_extra_layers: ExtraLayers = "before_last",
                 expert_parallel: bool = False, gemm_kernels_of: str | None = None,
                 mla_absorbed_bf16: bool = False, mxfp4_layout: Mxfp4Layout | None = None,
                 expert_dispatch: bool = False, qkv_input_widths: int = 1):
        _check_tp(model, tp)
        if isinstance(pp, bool) or not isinstance(pp, int) or not 1 <= pp <= model.num_layers:
            raise UserError(f"pp must be a whole number from 1 to {model.name}'s {model.num_layers} layers, got {pp!r}")
        self.model = model
        self.chip = chip
        self.tp = tp
        # Pipeline stages hold their layers (pipeline_stage_layers): memory per chip is the largest stage's;
        # one step still crosses every layer.
        self.pp = pp
        self.stage_layers = pipeline_stage_layers(model.num_layers, pp, pp_extra_layers)
        self.weight_precision = check_precision(weight_precision, "weight_precision")
        self.kv_precision = check_precision(kv_precision, "kv_precision")
        # The routed experts' weights where they differ from the rest (None: weight_precision).
        self.expert_precision = None if expert_precision is None else check_precision(expert_precision,
                                                                                     "expert_precision")
        # Attention data-parallel over the tp chips (ops.build_ops): each chip holds its sequences' whole KV,
        # and a layer's two all-reduces (after attention, after the MLP) become one all-gather before the
        # MLP and one reduce-scatter after it, one all-reduce's traffic.
        self.attention_dp = attention_dp and tp > 1
        self.allreduces_per_layer = 1 if self.attention_dp else 2
        # An MoE model's dense layers that each chip runs whole for its own sequences (ops.build_ops,
        # `attention_dp_whole`'s "dense_mlp") have no collective at all.
        self.rank_local_layers = (model.dense_layers if self.attention_dp and model.is_moe
                                  and "dense_mlp" in attention_dp_whole else 0)
        # An MLA model's attention in its latent space, or expanded per head as older releases ran it (ops.build_ops).
        self.latent_attention = latent_attention
        self.ops: list[LinearOp] = build_ops(model, chip, tp, weight_precision, kv_precision, assumptions,
                                             self.expert_precision, self.attention_dp, latent_attention,
                                             weight_only_expert_time, input_projection, attention_dp_whole,
                                             expert_parallel, mla_absorbed_bf16, mxfp4_layout, expert_dispatch,
                                             qkv_input_widths)
        # A drafter's ops whose weights are the target's (compute/drafter.py): they run and stream those
        # weights as before, but hold none of their own.
        unknown = shared_weights - {op.name for op in self.ops}
        if unknown:
            raise ValueError(f"shared_weights: no op named {', '.join(sorted(unknown))}")
        self.ops = [dataclasses.replace(op, resident_bytes=0.0) if op.name in shared_weights else op
                    for op in self.ops]
        # Whose measured GEMM tables give the weight GEMMs' efficiency by shape: vllm, sglang or trtllm (_compile).
        self.gemm_kernels_of = gemm_kernels_of
        self.weight_bytes_per_chip: float = self._stage_weight_bytes(pp)
        per_layer = kv_bytes_per_token_per_layer(model, 1 if self.attention_dp else tp, kv_precision, latent_attention)
        # A token of a sequence still within every window holds KV in every layer; a sliding layer
        # keeps only the last sliding_window tokens of each sequence.
        largest = max(self.stage_layers)
        self.kv_bytes_per_token_per_chip: float = per_layer * largest
        self.sliding_kv_bytes_per_token_per_chip: float = per_layer * model.sliding_layers * largest / model.num_layers
        self._window = model.sliding_window
        self._sliding_fraction = model.sliding_fraction
        self.host_window_s = host_window_s  # a step that calls the scheduler (engine/host_time.py)
        self.host_step_s = host_step_s
        self.host_per_sequence_s = host_per_sequence_s
        self.host_overlapped = host_overlapped
        if cuda_graphs not in ("all", "decode", "none"):
            raise UserError(f"cuda_graphs must be all, decode or none, got {cuda_graphs!r}")
        self._graph_max_tokens = -1 if cuda_graphs == "none" else (
            cuda_graph_max_tokens if cuda_graph_max_tokens is not None else math.inf)
        self._graphs_decode_only = cuda_graphs == "decode"
        self._graph_sizes = None if cuda_graphs == "none" else cuda_graph_sizes
        self.prefill_graph_max_tokens = None if cuda_graphs == "none" else prefill_graph_max_tokens
        self._every_step_captured = (self._graph_max_tokens == math.inf and not self._graphs_decode_only
                                     and self._graph_sizes is None)
        # Every op's kernels, and each layer's all-reduces when tensor-parallel, on each step's path.
        self.kernels_per_step: float = sum(op.kernels for op in self.ops) + (
            self.allreduces_per_layer * (model.num_layers - self.rank_local_layers) if tp > 1 else 0)
        # The assumptions this model uses, read once here: a built model keeps its run's values.
        self.kernel_fixed_s = chip.kernel_fixed_s
        self.gemm_fixed_s = chip.gemm_fixed_s
        self.gemm_overlap_norm = assumptions.value("gemm_overlap_norm")
        self._activation_bytes = assumptions.value("activation_bytes")
        self._reserved_logit_rows = assumptions.value("reserved_logit_rows")
        self._runtime_reserve_bytes = assumptions.value("runtime_reserve_bytes")
        self._logit_bytes = assumptions.value("logit_bytes")
        # The kernels a step runs (the engine's count, where its model code fuses its own way), and of those
        # besides the GEMMs, their share of the ops' (fixed_s).
        kernels = self.kernels_per_step - fused_kernels if engine_kernels is None else engine_kernels
        self._other_kernels_share = 1.0
        if engine_kernels is not None or fused_kernels:
            gemms = sum(op.gemm_kernels for op in self.ops)
            others = sum(op.kernels - op.gemm_kernels for op in self.ops)
            engine_others = others - fused_kernels if engine_kernels is None else engine_kernels - gemms
            self._other_kernels_share = max(engine_others, 0.0) / others
        # An eager step: every kernel's launch gap, on the GPU, and the host's launches, queued ahead of it.
        self.host_eager_per_kernel_s = host_eager_per_kernel_s
        self.eager_gap_s: float = kernels * assumptions.value("eager_kernel_launch_s")
        launched = kernels
        if fused_mxfp4_moe_calls is not None and self.native_mxfp4_experts:
            launched += fused_mxfp4_moe_calls * model.moe_layers - sum(
                op.kernels for op in self.ops if op.name in ("moe_router", "moe_experts"))
        self.host_launch_s: float = launched * host_eager_per_kernel_s
        # Whether how far ahead of the GPU the host starts launching a step (launch_wait_s's `ahead_s`) can
        # change its time: some step launches its kernels eagerly, and each launch costs the host time.
        self.host_lead_matters = not self._every_step_captured and self.host_launch_s > 0.0
        # A stage's layers, launched in turn: the launch queue's period (launch_wait_s).
        self._layers_per_stage = largest
        self._compile()

    @property
    def native_mxfp4_experts(self) -> bool:
        """Whether the routed experts are MXFP4 weights the chip multiplies on its FP4 tensor cores."""
        fp4_format = self.model.fp4_format or self.chip.fp4_format
        experts = self.expert_precision or self.weight_precision
        return (self.model.is_moe and experts == "fp4" and fp4_format == "mxfp4"
                and not self.chip.is_weight_only("fp4"))

    @property
    def heads_per_chip(self) -> float:
        return self.model.num_heads / self.tp

    @property
    def kv_heads_per_chip(self) -> float:
        if self.model.is_mla:
            return 1.0 if self.latent_attention else self.heads_per_chip
        return kv_heads_per_chip(self.model, self.tp)

    # -- memory ------------------------------------------------------------------------------------

    def activation_reserve_bytes(self, max_batched_tokens: int, max_num_seqs: int | None = None,
                                 sampler_bytes_per_logit: float | None = None) -> float:
        """Peak activation workspace of a forward pass over `max_batched_tokens` tokens, plus runtime.

        Live at the widest point of a layer, per token at bf16: the hidden state and residual plus the
        widest intermediate (QKV or MLA projections, MLP gate_up output and its activated half, or the
        routed experts' intermediates); plus the logits of the rows one step samples, one per sequence
        up to `max_num_seqs` (vLLM profiles its sampler so: gpu_model_runner.profile_run samples
        min(max_num_batched_tokens, max_num_seqs) rows; without a cap, efficiency.RESERVED_LOGIT_ROWS);
        plus efficiency.RUNTIME_RESERVE_BYTES (context, comm buffers, CUDA graphs).

        The logits are the chip's share of the vocabulary in fp32, the LM head's output, unless the
        engine profiles its sampler (`sampler_bytes_per_logit`: efficiency.SAMPLER_PROFILE_BYTES_PER_LOGIT).
        That sampler runs over the whole vocabulary on a chip: vLLM V1 all-gathers the logits to every
        rank (LogitsProcessor._gather_logits; Platform.use_all_gather is true under V1) and each samples,
        and V0 gathers them to its driver rank, the one with the least room.
        """
        if max_batched_tokens < 0:
            raise UserError(f"max_batched_tokens must be >= 0, got {max_batched_tokens}")
        m, tp = self.model, self.tp
        h = m.hidden_size
        heads = self.heads_per_chip
        if m.is_mla and self.latent_attention:  # q_a output, then per head the q_b output and the query
            # mapped into the latent space
            widths = [m.q_lora_rank + heads * (m.head_dim + m.kv_lora_rank + m.qk_rope_head_dim)]
        elif m.is_mla:  # q_a output, then per head the query, K and padded V
            widths = [m.q_lora_rank + 3 * heads * m.head_dim]
        else:
            widths = [(heads + 2 * self.kv_heads_per_chip) * m.head_dim]
        if m.dense_layers:
            widths.append(3 * m.intermediate_size / tp)
        if m.is_moe:  # router logits, each routed copy's input and intermediates, shared experts
            widths.append(m.num_experts + m.experts_per_token * (h + 3 * m.moe_intermediate_size / tp)
                          + 3 * m.shared_intermediate_size / tp)
        per_token = (2 * h + max(widths)) * self._activation_bytes
        logit_rows = min(max_batched_tokens, max_num_seqs or self._reserved_logit_rows)
        if sampler_bytes_per_logit:
            logits = logit_rows * m.vocab_size * sampler_bytes_per_logit
        else:
            logits = logit_rows * m.vocab_size / tp * self._logit_bytes
        return max_batched_tokens * per_token + logits + self._runtime_reserve_bytes

    def kv_cache_bytes_per_chip(self, tokens: int) -> float:
        """KV-cache bytes one sequence of `tokens` tokens holds on one chip (its sliding layers only
        the last sliding_window tokens)."""
        sliding = self.sliding_kv_bytes_per_token_per_chip
        full = self.kv_bytes_per_token_per_chip - sliding
        return full * tokens + sliding * min(tokens, self._window)

    def kv_capacity_tokens(self, gpu_memory_utilization: float, max_batched_tokens: int,
                           max_num_seqs: int | None = None, drafter: ComputeModel | None = None,
                           sampler_bytes_per_logit: float | None = None,
                           share_covers: Literal["all", "weights_and_kv", "free_memory"] = "all",
                           measured_margin: tuple[float, float] | None = None,
                           sliding_pool_ratio: float | None = None, block_size: int | None = None,
                           batches_share_running_cap: bool = False, held_bytes: float = 0.0) -> int:
        """KV-cache tokens that fit in the memory the engine's share leaves them, over the KV bytes per token.
        What the share `gpu_memory_utilization` covers (`share_covers`, engine/memory_share.py):
        - "all" (vLLM): everything, so the cache takes hbm x utilization - weights - activations;
        - "weights_and_kv" (SGLang's mem_fraction_static): the weights and the pool alone, the activations
          living outside it: utilization x (hbm - efficiency.RUNTIME_RESERVE_BYTES) - weights, the share of
          the memory free when the engine measures it, its context and communicators already made;
        - "free_memory" (TensorRT-LLM's free_gpu_memory_fraction): a share of what is left once the
          weights are loaded and a step of max_batched_tokens has run, (hbm - weights - activations) x
          utilization.
        An engine that sizes its cache from the memory it measures free after warmup ("all" with a
        `measured_margin` of (floor bytes, fraction), vLLM from 0.34.0) keeps free beyond the activations
        the larger of the floor and that fraction of the step's activations: the cache takes hbm - margin -
        weights - activations, the share capping it, not setting it.
        A speculative-decoding `drafter` (compute/drafter.py) adds its weights to the weights and its KV
        bytes to every token's. With attention data-parallel, each of the tp chips holds its own
        sequences' KV, its sliding layers' windows included: the replica holds tp times a chip's tokens.
        `max_num_seqs` (the sequences one chip's scheduler runs: a rank's under attention data-parallel)
        and `sampler_bytes_per_logit` size the logits' share of the activations (activation_reserve_bytes).

        With sliding-window layers a sequence of L tokens holds full x L + sliding x min(L, window)
        bytes, which one count of tokens cannot say exactly. The capacity is the larger of two bounds
        that never overcommit memory: every token charged to every layer (exact while sequences are
        shorter than the window), and, with at most `max_num_seqs` sequences a scheduler step (pp times
        that in flight, each of the pp batches in flight capped on its own, but `max_num_seqs` in all where
        one scheduler caps them together: `batches_share_running_cap`, Profile.pp_batches_share_running_cap),
        their sliding layers set aside whole (window tokens each) and the rest charged to the full-attention
        layers alone (exact when that many sequences run, all past the window).
        vLLM's hybrid KV-cache manager frees the blocks that fall out of a window, as the second bound
        assumes. An engine that sizes its sliding layers' pool at `sliding_pool_ratio` of the full layers'
        tokens instead (SGLang: engine/sliding_pool.py; 1 where every layer holds every token) holds
        free / (full + ratio x sliding) tokens.
        `held_bytes`: memory another process holds on the chip before the engine starts (an application's
        vector index: sim/deployment.py). SGLang and TensorRT-LLM size from the memory they find free, so their
        share is of what it leaves, and so does an engine that sizes from what it measures free after warmup;
        vLLM's share of the whole chip otherwise, and it refuses to start where less is free (gpu_worker.py:
        "Free memory on device ... is less than desired GPU memory utilization").
        `block_size`: the engine's KV block, in tokens, where its pool frees a window's blocks whole (vLLM V1's
        SlidingWindowManager.remove_skipped_blocks keeps every block holding one of the last window - 1 tokens
        and the new one's): a sequence past the window then holds up to ceil((window - 1) / block) + 1 blocks
        (144 tokens of a 128-token window in 16-token blocks, 192 in 64-token ones), not the window.
        """
        if not 0 < gpu_memory_utilization <= 1:
            raise UserError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}; "
                            f"e.g. 0.9")
        hbm, share = self.chip.hbm_bytes, gpu_memory_utilization
        if share_covers == "all" and measured_margin is None and held_bytes > hbm * (1 - share):
            raise DoesNotFit(f"{held_bytes / 2**30:.3g} GiB held on the {self.chip.name} beside the engine leave "
                             f"{(hbm - held_bytes) / 2**30:.3g} GiB free, less than the {share:g} of its "
                             f"{hbm / 2**30:.3g} GiB the engine takes (gpu_memory_utilization), and it refuses to "
                             f"start; lower engine.gpu_memory_utilization to {1 - held_bytes / hbm:.2f} or less")
        if share_covers != "all":
            hbm -= held_bytes  # (the memory the engine finds free)
        weights = self.weight_bytes_per_chip
        per_token = self.kv_bytes_per_token_per_chip
        if drafter is not None:
            weights += drafter.weight_bytes_per_chip
            per_token += drafter.kv_bytes_per_token_per_chip
        activations = 0.0
        if share_covers == "weights_and_kv":
            budget = (hbm - self._runtime_reserve_bytes) * share
            free = budget - weights
        else:
            activations = self.activation_reserve_bytes(max_batched_tokens, max_num_seqs, sampler_bytes_per_logit)
            budget = hbm * share if share_covers == "all" else hbm
            if measured_margin is not None:
                floor_bytes, fraction = measured_margin
                step = activations - self._runtime_reserve_bytes  # the step's own activations, the runtime apart
                budget = min(budget, hbm - held_bytes - max(floor_bytes, fraction * step))
            free = budget - weights - activations
            if share_covers == "free_memory":
                free *= share
        if free < per_token:
            where = f"{self.chip.name}'s {hbm / 2**30:.3g} GiB HBM"
            what = (f"{weights / 2**30:.1f} GiB of weights per chip at {self.weight_precision}, "
                    f"tp={self.tp}, pp={self.pp}")
            if drafter is not None:
                what += f", the drafter's {drafter.weight_bytes_per_chip / 2**30:.1f} GiB included"
            if weights >= hbm:
                raise DoesNotFit(f"model {self.model.name} ({what}) does not fit in {where}; "
                                f"raise --tp or use a lower precision")
            if share_covers == "weights_and_kv":
                raise DoesNotFit(f"model {self.model.name} ({what}) leaves no room for KV cache in {where} at "
                                f"gpu_memory_utilization={share:.3g}, the share for weights and KV cache; raise "
                                f"--tp, use a lower precision or raise engine.gpu_memory_utilization")
            if weights >= budget:  # it fits the chip, not the share of it the engine takes
                raise DoesNotFit(f"model {self.model.name} ({what}) does not fit in the {budget / 2**30:.3g} GiB the "
                                f"engine takes of {where} (gpu_memory_utilization={share:g}); raise "
                                "engine.gpu_memory_utilization, raise --tp or use a lower precision")
            raise DoesNotFit(f"model {self.model.name} ({what}, plus {activations / 2**30:.1f} GiB of activation "
                            f"workspace) leaves no room for KV cache in {where} at gpu_memory_utilization="
                            f"{share:g}; raise --tp, use a lower precision or lower max_batched_tokens")
        tokens = free // per_token
        sliding = self.sliding_kv_bytes_per_token_per_chip
        if sliding and sliding_pool_ratio is not None:
            tokens = free // (per_token - sliding + sliding_pool_ratio * sliding)
        elif sliding and max_num_seqs:
            # each stage holds the sequences of every batch in flight
            in_flight = max_num_seqs if batches_share_running_cap else max_num_seqs * self.pp
            held = self._window if not block_size else (-(-(self._window - 1) // block_size) + 1) * block_size
            windows = in_flight * held * sliding
            full = per_token - sliding
            if free > windows:  # with every layer sliding, each sequence may reach the model's context
                tokens = max(tokens, (free - windows) // full if full else in_flight * self.model.max_context)
        # under attention data-parallel each chip holds the KV of its own sequences only
        return int(tokens) * (self.tp if self.attention_dp else 1)

    # -- communication -----------------------------------------------------------------------------

    def allreduce_bytes(self, num_tokens: int) -> float:
        """Bytes of one tensor-parallel all-reduce of the hidden state (bf16)."""
        return num_tokens * self.model.hidden_size * self._activation_bytes

    # -- time ----------------------------------------------------------------------------------------

    def experts_touched(self, num_tokens: float) -> float:
        """Expected distinct routed experts per layer hit by `num_tokens` tokens, routed uniformly at random
        to top-k of E: E * (1 - (1 - k/E)^T)."""
        if not self.model.is_moe:
            return 0.0
        return self._num_experts * (1.0 - self._expert_miss ** num_tokens)

    def _stage_weight_bytes(self, pp: int) -> float:
        """The weights a chip of the heaviest pipeline stage holds: its layers' (pipeline_stage_layers), and
        the embedding on the first stage, the LM head on the last (a tied one there as a copy of the
        embedding: vLLM's models/llama.py builds embed_tokens on the last rank too)."""
        resident = {op.name: op.resident_bytes for op in self.ops}
        total = sum(resident.values())
        if pp == 1:
            return total
        model = self.model
        embedding, head = resident.get("embedding", 0.0), resident.get("lm_head", 0.0)
        # An MoE model's dense-MLP layers weigh far less than its expert layers and come first
        # (DeepSeek's first_k_dense_replace), so the first stage holds them, not a share of each stage.
        # ModelSpec keeps their count alone: an interleaving model's (Llama 4 Maverick's) are taken as first too.
        dense = sum(resident.get(name, 0.0) for name in _DENSE_MLP_OPS) if model.is_moe else 0.0
        moe = sum(resident.get(name, 0.0) for name in _MOE_OPS)
        per_layer = (total - embedding - head - dense - moe) / model.num_layers
        per_dense = dense / model.dense_mlp_layers if dense else 0.0
        per_moe = moe / model.moe_layers if moe else 0.0
        ends = [0.0] * pp
        ends[0], ends[-1] = embedding, embedding if model.tie_word_embeddings else head
        stages, first = [], 0
        for layers, end in zip(self.stage_layers, ends):
            dense_here = max(0, min(first + layers, model.dense_mlp_layers) - first) if model.is_moe else 0
            stages.append(layers * per_layer + dense_here * per_dense + (layers - dense_here) * per_moe + end)
            first += layers
        return max(stages)

    def attention_aggregates(self, num_tokens: int, num_logits: int, attn_pairs: float,
                             kv_read_tokens: float, sequences: int | None = None) -> tuple[float, float]:
        """(attn_pairs, kv_read_tokens) averaged over the layers, the sliding layers' capped at their
        window (see the class docstring: an upper bound, exact at either extreme). `sequences`: the
        sequences sampled, where they are not the LM head's rows (speculative decoding's verify steps)."""
        window = self._window
        if not window:
            return attn_pairs, kv_read_tokens
        share = self._sliding_fraction
        pairs_cap = window * num_tokens
        if attn_pairs > pairs_cap:
            attn_pairs -= share * (attn_pairs - pairs_cap)
        sequences = (num_logits if sequences is None else sequences) + (num_tokens > num_logits)
        read_cap = (window - 1) * sequences + num_tokens
        if kv_read_tokens > read_cap:
            kv_read_tokens -= share * (kv_read_tokens - read_cap)
        return attn_pairs, kv_read_tokens

    def fixed_s(self, op: LinearOp) -> float:
        """An op's kernels' fixed time per step, on top of their work: each weight GEMM's the chip's
        gemm_fixed_s, every other kernel's efficiency.KERNEL_FIXED_S, as many of those as the engine's
        model code runs (`engine_kernels` or `fused_kernels`: the ops' other kernels scaled to its count)."""
        return (op.gemm_kernels * self.gemm_fixed_s
                + (op.kernels - op.gemm_kernels) * self.kernel_fixed_s * self._other_kernels_share)

    def step_ops(self, num_tokens: int, num_logits: int, attn_pairs: float, kv_read_tokens: float,
                 chunk_context_tokens: float = 0.0) -> list[OpCost]:
        """Every op's FLOPs, bytes and roofline time in this step (the rows of an --explain table)."""
        attn_pairs, kv_read_tokens = self.attention_aggregates(num_tokens, num_logits, attn_pairs, kv_read_tokens)
        touched = self.experts_touched(num_tokens)
        bw = self.chip.effective_hbm_bw_Bps
        share, chip_logits = self.busiest_chip_share(num_tokens, num_logits)
        whole = (num_tokens, num_logits, attn_pairs, kv_read_tokens)
        on_chip = (num_tokens * share, chip_logits, attn_pairs * share, kv_read_tokens * share)
        costs = []
        for op in self.ops:
            step = on_chip if op.per_sequence else whole
            flops = op.flops(*step, chunk_context_tokens)
            nbytes = op.bytes(step[0], step[1], step[3], touched, chunk_context_tokens)
            compute_s, memory_s = self._op_compute_s(op, *step, chunk_context_tokens), nbytes / bw
            work_s = op_time_s(compute_s, memory_s, op.gemm, self.gemm_overlap_norm)
            fixed_s = self.fixed_s(op)
            bound = "fixed" if fixed_s > work_s else "compute" if compute_s > memory_s else "memory"
            costs.append(OpCost(op.name, flops, nbytes, work_s + fixed_s, bound))
        return costs

    def step_parts_s(self, num_tokens: int, num_logits: int, attn_pairs: float, kv_read_tokens: float,
                     chunk_context_tokens: float, traffic_s: float, ahead_s: float, scheduled: bool,
                     sequences: int | None = None) -> tuple[list[OpCost], float, float]:
        """A step's time in step_time_s's parts, from its trace row (`traffic_s` of collectives, the host
        `ahead_s` ahead as it began; `sequences` as step_time_s takes it): its kernels (step_ops), what
        launching them adds (launch_s: nothing where a graph is replayed) and the host's own time (host_s)
        where the step waits on it (overlapped, only what the kernels and launches do not hide)."""
        ops = self.step_ops(num_tokens, num_logits, attn_pairs, kv_read_tokens, chunk_context_tokens)
        kernels_s = math.fsum(op.time_s for op in ops)
        launch_s = self.launch_s(num_tokens, num_logits, kernels_s, traffic_s, ahead_s, sequences)
        host_s = self.host_s(num_logits if sequences is None else sequences, scheduled)
        if self.host_overlapped:
            host_s = max(0.0, host_s - kernels_s - launch_s)
        return ops, launch_s, host_s

    def graph_policy(self) -> str:
        """Which steps replay a captured CUDA graph, in words (for reports)."""
        if self._graph_max_tokens < 0:
            return "no CUDA graphs"
        steps = "decode steps" if self._graphs_decode_only else "steps"
        unit = ("sequences" if self._graphs_decode_only else "tokens") + (" a rank" if self.attention_dp else "")
        if self._graph_max_tokens == math.inf:
            policy = f"CUDA graphs for all {steps}"
        elif self._graph_sizes is not None:
            policy = f"CUDA graphs for {steps} of {_sizes_text(self._graph_sizes)} {unit} (unpadded)"
        else:
            policy = f"CUDA graphs for {steps} of up to {int(self._graph_max_tokens)} {unit}"
        if self.prefill_graph_max_tokens is not None:
            policy += f", and prompt steps of up to {self.prefill_graph_max_tokens} tokens"
        return policy

    def eager(self, num_tokens: int, num_logits: int, sequences: int | None = None) -> bool:
        """Whether the step launches its kernels one by one: it replays no captured CUDA graph. Decode
        graphs are sized in sequences (SGLang's cuda_graph_max_bs, TensorRT-LLM's and vLLM V0's batch
        sizes; a speculative verify step's graph holds its drafts: SGLang's cuda_graph_runner.py
        num_tokens_per_bs, TensorRT-LLM's DecodingCUDAGraphRunner), so a verify step of `sequences`
        sequences is matched by them, not by its tokens; vLLM V1's graphs are sized in tokens."""
        if num_tokens != num_logits and self.prefill_graph_max_tokens is not None:
            return num_tokens > self.prefill_graph_max_tokens
        size = sequences if sequences is not None and self._graphs_decode_only else num_tokens
        if self.attention_dp:  # each rank replays a graph of its own batch; the busiest holds an even share
            size = -(-size // self.tp)
        return (size > self._graph_max_tokens or (self._graphs_decode_only and num_tokens != num_logits)
                or (self._graph_sizes is not None and size not in self._graph_sizes))

    def launch_s(self, num_tokens: int, num_logits: int, kernels_s: float = 0.0, traffic_s: float = 0.0,
                 ahead_s: float = 0.0, sequences: int | None = None) -> float:
        """What launching a step's kernels (`kernels_s` of them, `traffic_s` of collectives between them)
        adds to them: nothing when it replays a CUDA graph; eagerly, every kernel's launch gap and the
        time the GPU waits on the host's launches (launch_wait_s, the host `ahead_s` ahead)."""
        if not self.eager(num_tokens, num_logits, sequences):
            return 0.0
        return self.eager_gap_s + self.launch_wait_s(kernels_s + self.eager_gap_s + traffic_s, ahead_s)

    def launch_wait_s(self, gpu_s: float, ahead_s: float = 0.0) -> float:
        """How much longer than `gpu_s` of GPU work (kernels, their gaps, collectives) an eager step
        lasts, its host launching the kernels one by one at host_eager_per_kernel_s each
        (launch_queue_s). Pipeline stages launch their own layers once their input arrives, so a step's
        stages add up, and the bound holds for the whole step with the layers of a stage.

        `ahead_s`: how long before the GPU is free the host began launching: an overlapped host
        (SGLang's event_loop_overlap) launches a step while the GPU runs the one before, so that much
        of the launches is done before the step's first kernel can run (host_busy_s)."""
        if self.host_launch_s == 0.0:
            return 0.0
        launches_s = self.host_launch_s - ahead_s if self.host_launch_s > ahead_s else 0.0
        return launch_queue_s(gpu_s, launches_s, self._layers_per_stage) - gpu_s

    def host_busy_s(self, num_tokens: int, num_logits: int, scheduled: bool = True,
                    sequences: int | None = None) -> float:
        """The host's own time in a step: its host_s and, run eagerly, its launches. An overlapped host
        has the rest of the step to launch the next one's kernels (launch_wait_s's `ahead_s`); this
        step's host_s stands in for the next one's scheduling, which comes first. `sequences`: the
        sequences sampled, where they are not the LM head's rows (speculative decoding's verify steps)."""
        eager = self.eager(num_tokens, num_logits, sequences)
        return self.host_s(num_logits if sequences is None else sequences, scheduled) + (
            self.host_launch_s if eager else 0.0)

    def host_s(self, sequences: int, scheduled: bool = True) -> float:
        """The host's time for a step that samples `sequences` sequences (a request's work in the
        scheduler's loops, vLLM's update_from_output per request: not per draft token); `scheduled`: it
        calls the scheduler (every step but those of a multi-step window after its first). With attention
        data-parallel each rank's scheduler works on its own sequences, side by side: the busiest's share."""
        if self.attention_dp:
            sequences = -(-sequences // self.tp)
        return (self.host_window_s if scheduled else 0.0) + self.host_step_s + self.host_per_sequence_s * sequences

    def step_time_s(self, num_tokens: int, num_logits: int, attn_pairs: float, kv_read_tokens: float,
                    chunk_context_tokens: float = 0.0, scheduled: bool = True, traffic_s: float = 0.0,
                    ahead_s: float = 0.0, prompt_on_busiest: float | None = None,
                    sequences: int | None = None) -> float:
        """The step's kernels (step_ops' times), what launching them adds (launch_s, given the step's
        `traffic_s` of collectives between them and the host `ahead_s` ahead of the GPU), plus host_s (or,
        overlapped, the larger of the two). `prompt_on_busiest`: with attention data-parallel, the prompt
        tokens of the chip that holds the most (busiest_chip_share). `sequences`: the sequences sampled,
        where they are not the LM head's rows (a speculative verify step's are its drafts and one more).

        Runs once per engine step, so the ops that depend on num_tokens alone are summed once per
        distinct num_tokens and kept, those on num_logits alone likewise; only the few others
        (attention, routed experts, MLA's kv_b_proj) are evaluated every step, from coefficients
        precomputed in _compile. `scheduled`: the step calls the scheduler, so its host pays
        host_window_s (every step but those of a multi-step window after its first).
        """
        t, n = num_tokens, num_logits
        total = self._tokens_s.get(t)
        if total is None:
            total = self._tokens_s[t] = self._kernels_fixed_s + self._sum_s(self._token_ops, t, 0)
        logits_s = self._logits_s.get(n)
        if logits_s is None:
            logits_s = self._logits_s[n] = self._sum_s(self._logit_ops, 0, n)
        total += logits_s
        if self._window:
            attn_pairs, kv_read_tokens = self.attention_aggregates(t, n, attn_pairs, kv_read_tokens, sequences)
        touched = 0.0
        if self._num_experts:
            touched = self._num_experts * (1.0 - self._expert_miss ** t)
        c = chunk_context_tokens
        total += self._sum_coefficients_s(self._other_ops, t, n, attn_pairs, kv_read_tokens, touched, c)
        if self._chip_ops:
            share, chip_logits = self.busiest_chip_share(t, n, prompt_on_busiest)
            total += self._sum_coefficients_s(self._chip_ops, t * share, chip_logits, attn_pairs * share,
                                              kv_read_tokens * share, touched, c)
        if not self._every_step_captured:
            total += self.launch_s(t, n, total, traffic_s, ahead_s, sequences)
        host_s = self.host_s(n if sequences is None else sequences, scheduled)
        if self.host_overlapped:
            return total if total > host_s else host_s
        return total + host_s

    def decode_steps_s(self, sequences: int, attn_pairs: np.ndarray, kv_read_tokens: np.ndarray) -> np.ndarray | None:
        """step_time_s of a run of decode steps of `sequences` sequences each (a token and a logit each, the
        scheduler called, no prompt), one step per element of `attn_pairs` and `kv_read_tokens` (int64
        arrays): the same arithmetic in the same order, element by element, so each equals step_time_s's
        float exactly. None where a step's time depends on more than these (attention data-parallel, eager
        launches, which wait on the host's lead)."""
        t = n = sequences
        if self._chip_ops or self.attention_dp or (not self._every_step_captured and self.eager(t, n)):
            return None
        if self._window:  # (each step's aggregates as step_time_s takes them)
            capped = [self.attention_aggregates(t, n, p, k) for p, k in zip(attn_pairs.tolist(),
                                                                            kv_read_tokens.tolist())]
            attn_pairs, kv_read_tokens = (np.array(column, np.float64) for column in zip(*capped))
        self.step_time_s(t, n, 0, 0)  # (fills the caches of the ops on num_tokens and num_logits alone)
        total = self._tokens_s[t] + self._logits_s[n]
        touched = self._num_experts * (1.0 - self._expert_miss ** t) if self._num_experts else 0.0
        ops_s = np.zeros(len(attn_pairs))
        for ft, fl, fp, fk, fc, b0, bt, bl, bk, be, bc, gemm in self._other_ops:  # (_sum_coefficients_s's, c = 0)
            compute_s = ft * t + fl * n + fp * attn_pairs + fk * kv_read_tokens + fc * 0
            memory_s = b0 + bt * t + bl * n + bk * kv_read_tokens + be * touched + bc * 0
            if gemm:
                ops_s += np.array([op_time_s(c, m, True, self.gemm_overlap_norm)
                                   for c, m in zip(compute_s.tolist(), memory_s.tolist())])
            else:
                ops_s += np.maximum(compute_s, memory_s)
        total = total + ops_s
        host_s = self.host_s(n)
        if self.host_overlapped:
            return np.maximum(total, host_s)
        return total + host_s

    def _sum_coefficients_s(self, ops: tuple, t: float, n: float, attn_pairs: float, kv_read_tokens: float,
                            touched: float, c: float) -> float:
        """The time of ops compiled as coefficients (_compile) at one step's arguments."""
        total = 0.0
        for ft, fl, fp, fk, fc, b0, bt, bl, bk, be, bc, gemm in ops:
            compute_s = ft * t + fl * n + fp * attn_pairs + fk * kv_read_tokens + fc * c
            memory_s = b0 + bt * t + bl * n + bk * kv_read_tokens + be * touched + bc * c
            if gemm:
                total += op_time_s(compute_s, memory_s, True, self.gemm_overlap_norm)
            else:  # op_time_s's max, inline: this runs every step
                total += compute_s if compute_s > memory_s else memory_s
        return total

    def busiest_chip_share(self, num_tokens: float, num_logits: float,
                           prompt_on_busiest: float | None = None) -> tuple[float, float]:
        """With attention data-parallel, the busiest chip's share of a step's tokens, pairs and KV reads,
        and the sequences it samples: each prompt's tokens on the one chip that holds it, the sequences
        that sample spread evenly (SGLang's schedulers, one a chip, pad their batches to the largest).
        `prompt_on_busiest`: the prompt tokens of the chip that holds the most (the engine knows which
        prompt each chip holds: engine/replica.py); None: every prompt token of the step (the tokens
        that do not sample) on one chip."""
        if num_tokens <= 0:
            return 0.0, 0.0
        prompt = max(num_tokens - num_logits, 0.0)
        if prompt_on_busiest is not None and prompt_on_busiest < prompt:
            prompt = prompt_on_busiest
        chip_logits = float(-(-num_logits // self.tp))
        return (prompt + chip_logits) / num_tokens, chip_logits

    def _op_compute_s(self, op: LinearOp, num_tokens: float, num_logits: float, attn_pairs: float,
                      kv_read_tokens: float, chunk_context_tokens: float = 0.0) -> float:
        """An op's compute time; a weight GEMM's at its efficiency for its shape and M, the step's tokens
        (the LM head's: its logits)."""
        compute_s = op.compute_s(num_tokens, num_logits, attn_pairs, kv_read_tokens, chunk_context_tokens)
        curve = self._shape_curves.get(id(op))
        if curve is None:
            return compute_s
        return compute_s / curve.at(num_tokens if op.flops_per_token else num_logits)

    def _sum_s(self, ops: list[LinearOp], num_tokens: int, num_logits: int) -> float:
        bw = self.chip.effective_hbm_bw_Bps
        return math.fsum(op_time_s(self._op_compute_s(op, num_tokens, num_logits, 0.0, 0.0),
                                   op.bytes(num_tokens, num_logits, 0.0, 0.0) / bw, op.gemm,
                                   self.gemm_overlap_norm) for op in ops)

    def _compile(self) -> None:
        """Sort the ops for step_time_s: those that depend on num_tokens alone, those on num_logits
        alone (the LM head), and the others as coefficients in seconds."""
        bw = self.chip.effective_hbm_bw_Bps
        self._token_ops, self._logit_ops, other_ops, chip_ops = [], [], [], []
        for op in self.ops:
            rate = op.flops_per_s
            per_token = op.flops_per_token + (op.flops_per_pair + op.flops_per_kv_read) * op.overhead_pairs_per_token
            coeffs = (per_token / rate, op.flops_per_logit / rate, op.flops_per_pair / rate,
                      op.flops_per_kv_read / rate, op.flops_per_chunk_context / rate, op.bytes_fixed / bw,
                      op.bytes_per_token / bw, op.bytes_per_logit / bw, op.bytes_per_kv_read / bw,
                      op.bytes_per_expert / bw, op.bytes_per_chunk_context / bw)
            ft, fl, fp, fk, fc, b0, bt, bl, bk, be, bc = coeffs
            if op.per_sequence:  # evaluated at the busiest chip's share of each step (step_time_s)
                chip_ops.append((*coeffs, op.gemm))
            elif fl == fp == fk == fc == bl == bk == be == bc == 0.0:
                self._token_ops.append(op)
            elif ft == fp == fk == fc == bt == bk == be == bc == 0.0:
                self._logit_ops.append(op)
            else:
                other_ops.append((*coeffs, op.gemm))
        self._other_ops = tuple(other_ops)
        self._chip_ops = tuple(chip_ops)
        # Each weight GEMM's efficiency by the step's tokens, for its shape, from the measured table of the
        # engine's GEMM kernels (compute/gemm_efficiency.py): the ops summed once per distinct tokens or logits;
        # those compiled as coefficients (kv_b_proj's cached context, an attention data-parallel rank's share)
        # run at the rate.
        # (Keyed by id: an op is held in self.ops as long as the model, and its dataclass hash hashes every field.)
        self._shape_curves: dict[int, ShapeCurve] = {}
        for op in (*self._token_ops, *self._logit_ops):
            table = (None if op.shape is None or self.gemm_kernels_of is None
                     else shape_table(self.chip.name, self.gemm_kernels_of, op.shape[2]))
            if table is not None:
                self._shape_curves[id(op)] = table.curve(op.shape[0], op.shape[1])
        # Every kernel's fixed cost, the same in every step: added once, with the ops of num_tokens.
        self._kernels_fixed_s = math.fsum(self.fixed_s(op) for op in self.ops)
        self._tokens_s: dict[int, float] = {}
        self._logits_s: dict[int, float] = {}
        m = self.model
        self._num_experts = float(m.num_experts)
        self._expert_miss = 1.0 - m.experts_per_token / m.num_experts if m.is_moe else 1.0


def _sizes_text(sizes: frozenset[int]) -> str:
    """Sizes as runs: "1-32, 64 and 128"."""
    runs: list[list[int]] = []
    for size in sorted(sizes):
        if runs and size == runs[-1][-1] + 1:
            runs[-1].append(size)
        else:
            runs.append([size])
    parts = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def launch_queue_s(gpu_s: float, launches_s: float, layers: float) -> float:
    """When a step ends whose kernels take `gpu_s` on the GPU and `launches_s` for the host to launch,
    over `layers` alike layers.

    The host runs ahead of the GPU, queueing kernels while long ones run, so the GPU waits only when
    the launches fall behind: kernels k = 1..N, kernel k launched at k*h and taking g_k, end at the
    max-plus bound max over k of (k*h + g_k + ... + g_N). Over L alike layers of G/L on the GPU and H/L
    of launches each, that is the longer of G and H plus at most one layer of the shorter (the first
    layer's launches before the GPU is busy, or the last layer's kernels after the host is done); the
    bound here. So a small model's short kernels wait on their launches (a step of H), and a large
    model's long ones hide them (a step of G), with one host time per kernel for both."""
    longer, shorter = (gpu_s, launches_s) if gpu_s > launches_s else (launches_s, gpu_s)
    return longer + shorter / layers


def op_time_s(compute_s: float, memory_s: float, gemm: bool, p: float = efficiency.GEMM_OVERLAP_NORM) -> float:
    """An op's time from its compute and memory times: their p-norm for a GEMM (p: the model's
    gemm_overlap_norm assumption), the larger of the two for anything else."""
    longer = compute_s if compute_s > memory_s else memory_s
    if not gemm or longer == 0.0 or p == math.inf:
        return longer
    return longer * ((compute_s / longer) ** p + (memory_s / longer) ** p) ** (1.0 / p)


def _check_tp(model: ModelSpec, tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise UserError(f"tp must be a whole number >= 1, got {tp!r}")
    if model.num_heads % tp:
        raise UserError(f"tp={tp} does not divide the {model.num_heads} attention heads of {model.name}; "
                        f"use a --tp that divides {model.num_heads}")
    kv = model.num_kv_heads
    if not model.is_mla and (kv % tp if kv >= tp else tp % kv):
        raise UserError(f"tp={tp} cannot shard the {kv} KV heads of {model.name} (tp must divide them or be "
                        f"a multiple of them); use a --tp such as {min(kv, model.num_heads)}")
