"""The scheduler profiles as data: one frozen `Profile` per engine, with every fact the simulation
reads from it.

The rest of the code reads a profile's fields and never compares its name: `engine/spec.py` takes
its defaults and checks the settings against it, `engine/host_time.py` its host, `engine/replica.py`
its batches, the reports and the CLI its assumptions and help. Adding a profile is one entry of
PROFILES here, plus its rules written out plainly in tests/reference_engine.py (the tests compare the
two).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from tokenpath.compute.model_spec import ModelSpec
from tokenpath.compute.ops import Mxfp4Layout
from tokenpath.compute.roofline import ExtraLayers
from tokenpath.engine.attention_dp_models import SGLANG_ATTENTION_DP_ARCHITECTURES
from tokenpath.engine.batch_limits import (
    BatchLimits,
    sglang_batch_limits,
    sglang_max_running_requests,
    sglang_speculative_max_running,
    trtllm_batch_limits,
    vllm_v0_batch_limits,
    vllm_v1_batch_limits,
)
from tokenpath.engine.cuda_graphs import (
    SGLANG_PREFILL_GRAPHS_OPTION_SINCE,
    TRTLLM_CUDA_GRAPH_MAX_BS,
    VLLM_V0_CUDA_GRAPH_MAX_BS,
    PromptStepShape,
    sglang_cuda_graph_max_bs,
    sglang_prefill_graph_tokens,
    trtllm_unpadded_graph_sizes,
)
from tokenpath.engine.draft_slots import DraftHold, sglang_draft_hold, vllm_draft_hold
from tokenpath.engine.eager_launches import (
    SGLANG_FUSED_MXFP4_MOE_CALLS,
    TRTLLM_PYTORCH,
    LayerKernels,
    vllm_compiled_fused_kernels,
)
from tokenpath.engine.expert_kernels import WeightOnlyExperts
from tokenpath.engine.kv_blocks import DEFAULT_BLOCK_SIZE, vllm_block_size
from tokenpath.engine.memory_share import (
    DEFAULT_UTILIZATION,
    KvMargin,
    ServerShape,
    sglang_drafter_in_pool,
    sglang_mem_fraction_static,
    vllm_gpu_memory_utilization,
    vllm_measured_kv_margin,
)
from tokenpath.engine.mla_weights import sglang_mla_absorbed_bf16, trtllm_mla_absorbed_bf16, vllm_mla_absorbed_bf16
from tokenpath.engine.mxfp4_weights import as_loaded, vllm_mxfp4_layout
from tokenpath.engine.release import release_at_least
from tokenpath.engine.sliding_pool import every_layer, sglang_sliding_pool_ratio
from tokenpath.engine.speculative import sglang_keeps_overlap, trtllm_keeps_overlap, vllm_keeps_async_scheduling
from tokenpath.engine.template_work import TemplateWork, no_template_work, vllm_template_work
from tokenpath.engine.tokenizer_batching import (
    no_tokenizer_batch_wait,
    no_tokenizer_thread,
    vllm_tokenizer_batch_wait_s,
    vllm_tokenizes_in_thread,
)

# Before v0.7.1, vLLM's DeepseekV2Attention (vllm/model_executor/models/deepseek_v2.py) expanded each
# token's latent into K and V per head, V zero-padded to the query-key head size, and cached those;
# v0.7.1 brought MLA ("Enhancing DeepSeek Models with MLA and FP8 Optimizations in vLLM", Neural Magic,
# 2025-02-04: against v0.7.0, ~10x the KV cache's tokens, 54,560 to 512,000 on 8 x H200).
VLLM_LATENT_ATTENTION_SINCE = "0.7.1"
# vLLM V1 schedules a step while the GPU runs the one before (its AsyncScheduler) by default from 0.14.0
# (vllm/config/scheduler.py: `async_scheduling` False in 0.13.0, None from 0.14.0, resolved to True in
# vllm/config/vllm.py unless a setting is incompatible, read in every release from 0.12.0 to 0.34.0 named
# in engine/speculative.py). 0.14.x turned it off with pipeline parallelism ("Async scheduling is not yet
# supported with pipeline_parallel_size > 1"), which 0.15.0 no longer does. Not modelled: releases before
# 0.34.0 turn it off under Ray's executor (only the mp, uni and external_launcher executors support it;
# 0.34.0's RayExecutorV2 is a MultiprocExecutor and keeps it), and every release for pooling models.
VLLM_ASYNC_SCHEDULING_SINCE = "0.14.0"
# vLLM V1 admits a waiting request only while the KV cache's free blocks hold its whole prompt (less its
# prefix hits), not only the first chunk it runs; refused, it waits and the loop admits none behind it,
# preempting nothing: `scheduler_reserve_full_isl`, True by default (vllm/config/scheduler.py), passed to
# kv_cache_manager.allocate_slots as `full_sequence_must_fit` on the waiting path (vllm/v1/core/sched/
# scheduler.py), "Prevents over-admission and KV cache thrashing with chunked prefill". Pull request 37307,
# merged after 0.18.0 (2026-03) and first released in 0.19.0 (2026-04-03). Before it, a prompt whose
# first chunk fit was admitted, and its later chunks could preempt it and others over and over.
VLLM_WHOLE_PROMPT_ADMISSION_SINCE = "0.19.0"
# vLLM's --api-server-count defaults to the data-parallel size from 0.15.0 (vllm/entrypoints/cli/serve.py,
# "Default api_server_count if not explicitly set": data_parallel_size_local); before, to 1
# (vllm/entrypoints/openai/cli_args.py, `default=1` in 0.14.0).
VLLM_API_SERVER_PER_REPLICA_SINCE = "0.15.0"
VLLM_ASYNC_SCHEDULING_WITH_PP_SINCE = "0.15.0"
# SGLang's overlapped loop leaves out of the batch it forms the requests whose result in flight finishes them
# by length (enable_skip_finishing_decode, `_reqs_finishing_inflight` in managers/scheduler.py: read in the
# wheels of 0.5.21, not yet, and of 0.5.22 and 0.5.23), so one left with nothing else runs no batch for them.
# (A request that ends at its end-of-sequence token still gets that batch; the simulation's requests end at
# their drawn lengths, as a benchmark's max_tokens ends them.)
SGLANG_SKIPS_FINISHING_DECODE_SINCE = "0.5.22"


def sglang_runs_finished_batch(release: str | None) -> bool:
    """Whether SGLang's overlapped loop in `release` runs the batch it formed for its finished requests."""
    return not release_at_least(release, SGLANG_SKIPS_FINISHING_DECODE_SINCE)

ApiServers = Literal["per-replica", "per-server"]


def vllm_api_servers(release: str | None) -> ApiServers:
    """vLLM V1's API-server processes by default in `release` (the newest where it states none)."""
    return "per-replica" if release_at_least(release, VLLM_API_SERVER_PER_REPLICA_SINCE) else "per-server"


# The registry's host times per kernel of an eager step, one a profile may pay (Profile.eager_host).
EagerHost = Literal["eager_host_per_kernel_s", "trtllm_eager_host_per_kernel_s"]


@dataclass(frozen=True)
class Profile:
    """One engine's scheduler and the process around it."""

    engine: str        # the engine modelled, as its users name it
    description: str   # how it forms batches, with the code it follows
    # -- how a step's batch is composed
    # The [engine] setting that lets prompt chunks share steps with decodes: while it is false, prompts
    # run in steps of their own and the decoding sequences pause. None: they always share.
    prefills_alone_unless: Literal["chunked_prefill", "mixed_chunk"] | None
    # A prompt chunk cut to the token budget is whole tokens, or whole KV blocks.
    chunk_unit: Literal["token", "block"]
    # Whether it cuts a prompt longer than the step's budget left into chunks by default (`[engine]
    # chunked_prefill` otherwise); without, a prompt runs whole in one step.
    chunked_prefill: bool
    # Without chunked prefill, whether a prompt longer than the step's budget still runs whole, as the
    # first of its step (True: SGLang, whose later prompts must then be shorter than the budget left, not
    # up to it), or is refused (EngineSpec.step_bounds_prompts).
    long_prompt_alone: bool
    # -- admission
    kv_admissions: tuple[Literal["reserve", "on_demand"], ...]  # those it offers, its default first
    new_token_ratio: bool  # admits only while the cache keeps SGLang's headroom (engine/new_token_ratio.py)
    # With attention data-parallel, each rank's scheduler takes the step's token budget divided by the
    # ranks (SGLang: chunked_prefill_size // dp_size, arg_groups/parallel_hook.py; its max_running_requests
    # the replica's too, divided likewise), so one rank's prompt runs in chunks of that share; False: each
    # rank's scheduler has the engine's limits of its own (vLLM's data-parallel engine cores, TensorRT-LLM's
    # ranks: max_num_seqs and max_num_batched_tokens per rank).
    attention_dp_splits_budget: bool
    # Whether it takes max_num_batched_tokens below max_num_seqs, refusing only a budget under one decode's tokens
    # (TensorRT-LLM); False: the engine, or this model of it, refuses such limits (vLLM's SchedulerConfig).
    budget_below_running: bool
    # What a step does with the decoding sequences whose tokens (each one, or its drafts and one more) pass the
    # token budget, in their running order (engine/batch_limits.py): "run" them all (SGLang's decode batches,
    # which chunked_prefill_size does not bound); the first that would pass it and those after "wait" a step,
    # holding their KV (TensorRT-LLM's micro-batch scheduler); or that first one runs the budget left, its drafts
    # trimmed, and those after wait ("trim": vLLM V1's scheduler). No prompt runs beside a decode that waits.
    decodes_past_budget: Literal["run", "wait", "trim"]
    # With attention data-parallel, which rank a request goes to when it reaches the engine
    # (engine/queues.py, RankQueues): in turn, to the rank with the least load (4 x waiting + running), or
    # to the rank whose requests hold the fewest prompt tokens.
    attention_dp_routing: Literal["round_robin", "least_loaded", "fewest_tokens"]
    # Which models it runs with attention data-parallel: any, MoE models only (where the ranks share only the
    # expert layers, a dense model's ranks would share nothing: they are replicas of tp = 1), or none.
    attention_dp_models: Literal["any", "moe"] | None
    # ... and of them, only the model classes (ModelSpec.architecture) whose model code builds attention
    # data-parallel, where that is the model code's (engine/attention_dp_models.py); None: any class.
    attention_dp_architectures: frozenset[str] | None
    # With attention data-parallel, the ops it holds whole on every chip, each running them for its own
    # sequences, rather than split over the replica's tp (compute/ops.py): "embedding", "lm_head", and of an
    # MoE model "dense_mlp" (its dense layers), "shared_experts" and "moe_router".
    attention_dp_whole: frozenset[str]
    # More of them where its MoE layers' tokens go by all-to-all (deployment.moe_all_to_all).
    attention_dp_whole_all_to_all: frozenset[str]
    # Whether the data-parallel engines of one server share their expert layers, so that with expert parallel
    # they step together (vLLM); where they do not, each replica holds every expert over its own tp chips.
    data_parallel_shares_experts: bool
    # With expert parallel, whether it places only as many routed experts on each rank, so that the expert-parallel
    # size must divide them (False: the first E % ranks take one more, as vLLM does: compute/ops.py).
    expert_parallel_divides_experts: bool
    # With deployment.moe_all_to_all, whether its all-to-all dispatch needs more expert ranks than a token's
    # experts (TensorRT-LLM, which otherwise gathers and reduce-scatters the hidden states: engine/costs.py).
    all_to_all_needs_more_ranks_than_top_k: bool
    queue_policy: Literal["fcfs"]  # the order waiting requests are admitted in (engine/queues.py)
    # Where a preempted request waits to be admitted again: ahead of the queue (vLLM), or behind it (SGLang).
    preempted_requeue: Literal["front", "back"]
    # Which decoding sequence it preempts first when the KV cache runs out: the newest admitted, or the one
    # that has made the fewest tokens, then the one of the longest prompt, then the newest (SGLang).
    preempts_first: Literal["newest", "fewest_outputs"]
    # Whether, once a waiting request does not fit the KV cache (its headroom included), it admits none until a
    # running request leaves, finished or preempted (SGLang's batch_is_full), rather than trying every step.
    refusal_waits_for_a_leave: bool
    # Where set, the release from which it admits a waiting prompt only while the free KV blocks hold the
    # whole of it (less its prefix hits), not only its first chunk ("0": every release); None: the chunk's.
    whole_prompt_admission_since: str | None
    prefix_caching: bool  # its prefix cache is on by default (`[engine] prefix_caching` otherwise)
    # With prefix caching on, what a preempted request leaves cached, to find when admitted again
    # (engine/prefix_cache.py): every token it had computed, the tokens of its last prefill, or none.
    preempted_keeps: Literal["computed", "prefilled"] | None
    # -- the host (engine/host_time.py)
    # Its fixed host time: per scheduler call (scheduling, input preparation: every step, but once per
    # window under multi-step scheduling), and every step besides (None: no such part)
    host_window_assumption: Literal["host_step_s", "vllm_v0_host_window_s"]
    host_step_assumption: Literal["vllm_v0_host_step_s"] | None
    host_overlap: bool  # prepares a step while the GPU runs the one before, unless [engine] says
    # Where set, the release from which it does so by default (host_overlap before it): vLLM V1's async
    # scheduling (VLLM_ASYNC_SCHEDULING_SINCE)
    host_overlap_since: str | None
    # Where set, the release from which that default holds under pipeline parallelism too (before it, off
    # with pp > 1: sim/scenario.py applies it, knowing the deployment)
    host_overlap_with_pp_since: str | None
    # Whether, overlapped, the batch it forms while a step runs still decodes the sequences that step
    # finishes (it takes their outputs in after launching that batch), and it takes in no new request
    # before that batch has run: an engine left with nothing else to run runs it first, one more decode of
    # each, their tokens dropped (engine/replica.py, _run_finished_batch). False where its scheduler
    # leaves a request that has reached its max_tokens out of the next batch. Or by release.
    runs_finished_batch: bool | Callable[[str | None], bool]
    # The host time per kernel it pays for a step that replays no graph, its Python launching the kernels
    # one by one, unless [engine] eager_host says not (the registry's name; None: it launches them from
    # compiled code); the kernels a step of its model code runs, where that code fuses a layer differently
    # from compute/ops.py's count (engine/eager_launches.py; None: ops.py's), each with the GPU's fixed time
    # of a kernel and, eager, the host's launch (not where [engine] eager_host = false runs other code:
    # TensorRT-LLM's TensorRT engines); and where it runs MXFP4 routed experts natively as one fused op,
    # its calls for a MoE block's router and experts (None: ops.py's count); where its compiled code runs some
    # of ops.py's kernels inside others unless told to run eagerly (cuda_graphs = "none"), how many a step of a
    # model does in a release, given whether its linears are per-tensor fp8 (engine/eager_launches.py).
    eager_host: EagerHost | None
    layer_kernels: LayerKernels | None
    fused_mxfp4_moe_calls: int | None
    compiled_fusions: Callable[[ModelSpec, str | None, bool], int] | None
    # -- its kernels: the registry's multiple of the roofline its MXFP4 routed experts take where they run
    # weight-only (engine/expert_kernels.py)
    mxfp4_weight_only_experts: WeightOnlyExperts
    # -- CUDA graphs (engine/cuda_graphs.py), unless [engine] says
    cuda_graphs: Literal["all", "decode", "none"]
    # The largest step replayed as a graph: any size (None), a count, or a rule of the GPU's memory
    # in bytes, the tensor-parallel size and the release (engine.version).
    cuda_graph_max_bs: int | Callable[[float, int, str | None], int] | None
    # Whether a decode batch is padded up to the next size captured, unless [engine] cuda_graph_padding
    # says; and where it can run unpadded, the sizes it then captures up to the largest (None: it always
    # pads), any other size running eagerly.
    cuda_graph_padding: bool
    unpadded_graph_sizes: Callable[[int], frozenset[int]] | None
    # Where "decode" graphs leave its prompt steps eager but the engine also replays those up to a size: the
    # largest it replays on a server, as its release does or as [engine] prefill_cuda_graphs forces it
    # (None: none), and the first release that can; None: no such graphs, and no such setting.
    prefill_graphs: Callable[[PromptStepShape, bool | None], int | None] | None
    prefill_graphs_since: str | None
    # -- default limits, where [engine] leaves them out: what the engine picks for a GPU of its catalog
    # name and memory in bytes (None, None: a chip not known) in a release, engine/batch_limits.py
    batch_limits: Callable[[str | None, float | None, str | None], BatchLimits]
    # With speculative decoding on: the running requests it then defaults to in a release (None: its
    # limits as without), and whether its overlapped host stays overlapped with a drafter method in a
    # release, unless [engine] says (engine/speculative.py; None: a drafter leaves the host as it is)
    speculative_max_running: Callable[[str | None], int] | None
    speculative_overlap: Callable[[str, str | None], bool] | None
    # With speculative decoding on, what a running request's block table holds of its drafts' KV slots from step
    # to step, for a drafter method, its drafts a step and whether a step is scheduled before the one before it
    # returns (engine/draft_slots.py); None, or a rule that gives None: it frees the rejected drafts' slots
    # after each step.
    draft_hold: Callable[[str, int, bool], DraftHold | None] | None
    # Where the engine sets its running requests from its KV cache when not told (max_num_seqs left out):
    # the rule of a worker's pool tokens and the model's context length (engine/batch_limits.py).
    running_from_kv: Callable[[int, int], int] | None
    # -- its tensor-parallel all-reduces: whether NCCL may reduce in the NVLink switches (NVLS) where the
    # chips' domain has them (fabric/collectives.py), unless [engine] nccl_nvls says
    nccl_nvls: bool
    # -- the KV cache's precision under kv_cache_precision = "auto": fp8 when the weights are fp8 or
    # fp4, or the model's own bf16 whatever the weights
    fp8_kv_with_quantized_weights: bool
    # -- an MLA model's attention (compute/ops.py): the first release that runs it in the latent space
    # (weights absorbed, one latent per token cached); earlier releases expand each token's K and V over
    # the heads and cache those. None: every release, as far as read. Where the scenario states no
    # release, or none the model can read (engine/release.py), the newest release's form.
    latent_attention_since: str | None
    # Whether, on a chip of a generation, it keeps an MLA model's absorbed W_UK / W_UV as bf16 copies of a
    # quantized kv_b_proj, held beside it and streamed by decode steps (engine/mla_weights.py); else at the
    # checkpoint's precision.
    mla_absorbed_bf16: Callable[[str], bool]
    # How, on a chip of a generation and in a release, it lays out an MXFP4 checkpoint's routed experts in
    # memory: padded, its scales held twice (engine/mxfp4_weights.py; None: as loaded).
    mxfp4_layout: Callable[[str, str | None], Mxfp4Layout | None]
    # -- memory: its memory profile runs the sampler with top-k and top-p over a logit row per sequence, so
    # the KV cache gives up their temporaries (efficiency.SAMPLER_PROFILE_BYTES_PER_LOGIT), not the logits alone
    sampler_in_memory_profile: bool
    # What engine.gpu_memory_utilization's share covers (engine/memory_share.py): everything the engine
    # allocates, the KV cache taking what the weights, a step's activations and the runtime leave
    # ("all": vLLM's --gpu-memory-utilization), the weights and the KV pool ("weights_and_kv": SGLang's
    # --mem-fraction-static), or the memory left after the weights and a step ("free_memory": TensorRT-LLM's
    # free_gpu_memory_fraction); and the share where [engine] leaves it out, a number or a rule of the server.
    memory_share_covers: Literal["all", "weights_and_kv", "free_memory"]
    default_memory_share: float | Callable[[ServerShape], float]
    # Where a release sizes the KV cache from the memory it measures free after warmup instead, what it
    # keeps free beyond a step's activations, by release and chip generation (None: it does not).
    measured_kv_margin: Callable[[str | None, str], KvMargin | None] | None
    # With pipeline parallelism, whether one scheduler holds the replica's running requests over all its
    # batches in flight, capped together at max_num_seqs (vLLM V1's scheduler counts every running
    # request, those in flight too; SGLang's pp_max_micro_batch_size is max_running_requests // pp_size,
    # managers/scheduler.py 0.5.14; TensorRT-LLM's capacity scheduler counts the requests in flight), or
    # each batch has a scheduler and the whole max_num_seqs of its own (vLLM V0's virtual engines)
    pp_batches_share_running_cap: bool
    # Where a layer count pp does not divide puts its extra layers: on those before the last, which holds the
    # LM head (vLLM's get_pp_indices), on the last stages (SGLang's), or on the first (TensorRT-LLM's
    # Mapping.pp_layers); compute/roofline.py, pipeline_stage_layers
    pp_extra_layers: ExtraLayers
    # Whether a drafter's weights and KV cache come out of the target's KV pool, or its rule by release
    # (SGLang before 0.5.14 sized the pool first and took the drafter from its reserve: memory_share.py)
    drafter_in_pool: bool | Callable[[str | None], bool]
    # A sliding-window model's sliding layers in the KV pool (engine/sliding_pool.py): their tokens per
    # full-attention token, by release, chip generation and whether a drafter runs; None: the engine frees
    # the blocks out of the window (vLLM V1's hybrid KV-cache manager).
    sliding_pool_ratio: Callable[[str | None, str, bool, str], float] | None
    # Tokens a KV-cache block holds where [engine] leaves block_size out, or its rule by release
    # (engine/kv_blocks.py).
    default_block_size: int | Callable[[str | None], int]
    # -- the processes around the scheduler (delivery/frontend.py models them, sim/front_end.py lays them out)
    # API-server processes by default: one for each data-parallel replica, or one for the whole server
    # (`deployment.api_servers` sets the count). Every engine here parses requests, renders their chat
    # template and tokenizes them in its API server, and frames each chunk there.
    api_servers: ApiServers | Callable[[str | None], ApiServers]  # or by release
    detokenizes_in: Literal["engine", "api-server", "detokenizer"]  # "detokenizer": one process of its own
    # The registry's time per token of that process's output handling, where [delivery] does not set
    # detokenize_per_token: vLLM V1's measured output handler, vLLM V0's slower detokenizer, SGLang's
    # detokenizer process
    detokenize_assumption: Literal["detokenize_per_token_s", "vllm_v0_detokenize_per_token_s",
                                   "sglang_detokenize_per_token_s"]
    # The registry's time per token the API server spends on outputs another process detokenized, where
    # [delivery] does not set output_per_token: SGLang's TokenizerManager; None: none timed (0)
    output_assumption: Literal["sglang_output_per_token_s"] | None
    # Whether, with several tokens to an SSE event (`delivery.stream_interval`), the engine hands a request's
    # tokens to the processes after it only as its event closes, so they take each event's outputs once (at
    # their time per token above, timed with one token an event), not every token: its scheduler holds
    # them back. False: every token goes on, and the API server holds them back after its work on them.
    outputs_per_event: bool
    # The work its API server does per chat request on the template's source, besides rendering it, in a
    # release (engine/template_work.py): the registry's cost per character, or None
    template_work: Callable[[str | None], TemplateWork | None]
    # How long its API server holds a prompt for a tokenizer batch, in a release (engine/tokenizer_batching.py)
    tokenizer_batch_wait_s: Callable[[str | None], float]
    # Whether its API server tokenizes in a thread of its own, off its event loop, in a release (likewise)
    tokenizes_in_thread: Callable[[str | None], bool]
    # Whether a request's outputs that reach its API server before its stream has framed the ones before
    # are merged into one SSE event with them (delivery/frontend.py, FrontEnd._merged)
    merges_events: bool
    # -- where it is used beyond the simulation
    launched_with: Literal["vllm", "sglang", "trtllm"]  # the engine `tokenpath launch` starts for it (launch/)
    offered_as_lever: bool  # `tokenpath levers` tries switching to it
    measured_as: str | None  # the engine's name in the latency rows simulated with it (validate/latency.py)

    def pays(self, assumption: str) -> bool:
        """Whether this engine's host pays a host-time assumption of the registry: one of its fixed host
        parts, or the time per kernel of an eager step. Any other assumption: True."""
        if assumption in ("host_step_s", "vllm_v0_host_window_s", "vllm_v0_host_step_s"):
            return assumption in (self.host_window_assumption, self.host_step_assumption)
        if assumption in get_args(EagerHost):
            return assumption == self.eager_host
        return True

    def expert_parallel_refusal(self, num_experts: int, expert_ranks: int) -> str | None:
        """Why this engine would not place `num_experts` routed experts whole over `expert_ranks` chips; None: it
        would."""
        if self.expert_parallel_divides_experts and num_experts and num_experts % expert_ranks:
            return (f"{self.engine} places the same number of experts on every expert-parallel rank, so the ranks must "
                    f"divide the model's {num_experts} routed experts ({expert_ranks} here)")
        return None

    def all_to_all_refusal(self, expert_ranks: int, experts_per_token: int) -> str | None:
        """Why this engine would not dispatch a MoE layer's tokens by all-to-all over `expert_ranks` chips;
        None: it would."""
        if self.all_to_all_needs_more_ranks_than_top_k and expert_ranks <= experts_per_token:
            return (f"{self.engine} dispatches with all-to-all only over more expert ranks than a token's "
                    f"{experts_per_token} experts ({expert_ranks} here)")
        return None

    def attention_dp_refusal(self, moe: bool, architecture: str) -> str | None:
        """Why this engine does not run attention data-parallel for a model (MoE or not, of the model class
        `architecture`, "" where unknown); None: it does."""
        if self.attention_dp_models is None:
            return f"{self.engine} has no attention data-parallel"
        if self.attention_dp_models == "moe" and not moe:
            return (f"{self.engine} runs attention data-parallel for MoE models only: the ranks of a dense model "
                    "share no layer and are replicas of tp = 1")
        known = self.attention_dp_architectures
        if known is not None and architecture not in known:
            which = architecture or "a model whose config.json names no architectures"
            return (f"{self.engine}'s model code for {which} splits attention over the whole tensor-parallel "
                    "group, with no attention data-parallel (engine/attention_dp_models.py lists the classes "
                    "that have it, such as Qwen3ForCausalLM and DeepseekV3ForCausalLM)")
        return None


PROFILES: dict[str, Profile] = {
    "vllm-v1": Profile(
        engine="vLLM V1",
        description="""vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py), the default. Every step, the
    running sequences first, in admission order: each decoding one takes a token (and its drafts, the
    budget's end trimming them, those after waiting), the prompt in progress the rest of the token
    budget; then waiting sequences, first come first served, while the step has room (sequences,
    tokens, KV blocks), a long prompt cut to the budget (chunked prefill). Prompt chunks and decodes
    share each step. Blocks are taken as sequences grow; when they run out, the newest running
    sequences are preempted and recomputed later.""",
        prefills_alone_unless=None,
        chunk_unit="token",
        chunked_prefill=True,  # on by default in V1 (vllm/engine/arg_utils.py)
        # Without it V1 refuses to start with max_num_batched_tokens below max_model_len
        # (vllm/config/scheduler.py, SchedulerConfig._verify_args).
        long_prompt_alone=False,
        kv_admissions=("on_demand",),
        new_token_ratio=False,
        attention_dp_splits_budget=False,
        budget_below_running=False,  # SchedulerConfig refuses max_num_batched_tokens < max_num_seqs
        decodes_past_budget="trim",  # Scheduler.schedule (engine/batch_limits.py)
        # DPLBAsyncMPClient.get_core_engine_for_request (vllm/v1/engine/core_client.py): the engine core of
        # least waiting x 4 + running, from the coordinator's counts (published every 100 ms) plus its own sends.
        attention_dp_routing="least_loaded",
        # Its data-parallel engines share only the expert layers: "the expert layers form a (DP x TP) sized
        # tensor parallel group" (docs/serving/data_parallel_deployment.md); every other layer is each engine's
        # own, tensor-parallel over its own tp (1 here: deepseek_v2.py's DeepseekV2MLP, shared experts, gate,
        # VocabParallelEmbedding and ParallelLMHead on the engine's TP group).
        attention_dp_models="moe",
        attention_dp_architectures=None,
        attention_dp_whole=frozenset({"embedding", "lm_head", "dense_mlp", "shared_experts", "moe_router"}),
        attention_dp_whole_all_to_all=frozenset(),
        # --enable-expert-parallel: the experts over --data-parallel-size x --tensor-parallel-size, the engines'
        # forward passes aligned (docs/serving/data_parallel_deployment.md)
        data_parallel_shares_experts=True,
        # determine_expert_map (vllm/model_executor/layers/fused_moe/layer.py) gives the first E % ranks one more
        expert_parallel_divides_experts=False,
        all_to_all_needs_more_ranks_than_top_k=False,
        queue_policy="fcfs",
        preempted_requeue="front",  # vllm/v1/core/sched/scheduler.py, _preempt_request: waiting.prepend_request
        preempts_first="newest",  # the last of its running list (vllm/v1/core/sched/scheduler.py: self.running.pop())
        refusal_waits_for_a_leave=False,
        whole_prompt_admission_since=VLLM_WHOLE_PROMPT_ADMISSION_SINCE,
        prefix_caching=True,  # automatic prefix caching, on by default in V1
        # _preempt_request frees its blocks, which keep their hashes, and zeroes num_computed_tokens; the
        # waiting loop looks it up again as a new request (get_computed_blocks, vllm/v1/core/sched/scheduler.py).
        preempted_keeps="computed",
        host_window_assumption="host_step_s",
        host_step_assumption=None,
        # V1's engine core prepared each step after the one before until its async scheduling (an opt-in
        # --async-scheduling before) became the default in 0.14.0 (vllm/config/vllm.py: async_scheduling None
        # resolves to True unless a setting is incompatible; with a drafter, speculative_overlap below).
        host_overlap=False,
        host_overlap_since=VLLM_ASYNC_SCHEDULING_SINCE,
        host_overlap_with_pp_since=VLLM_ASYNC_SCHEDULING_WITH_PP_SINCE,
        # Async scheduling: "Avoid scheduling an extra step when we are sure that the previous step has
        # reached request.max_tokens" (Scheduler.schedule, vllm/v1/core/sched/scheduler.py).
        runs_finished_batch=False,
        # vLLM V1 compiles its model with torch.compile by default (fused kernels, a Python call per
        # compiled piece): no host time per kernel is measured, so none.
        eager_host=None,
        layer_kernels=None,
        fused_mxfp4_moe_calls=None,
        compiled_fusions=vllm_compiled_fused_kernels,  # its Inductor-fused fp8 quantizations
        mxfp4_weight_only_experts="vllm_mxfp4_weight_only_expert_time",
        # V1 replays captured graphs for steps of up to its max_cudagraph_capture_size (512 tokens),
        # decode-only or mixed; its larger steps run long kernels that hide their launches.
        cuda_graphs="all",
        cuda_graph_max_bs=None,
        cuda_graph_padding=True,
        unpadded_graph_sizes=None,
        prefill_graphs=None,
        prefill_graphs_since=None,
        nccl_nvls=True,  # NCCL's default (no NCCL_NVLS_ENABLE set by vLLM, as far as read)
        batch_limits=vllm_v1_batch_limits,
        speculative_max_running=None,
        speculative_overlap=vllm_keeps_async_scheduling,
        # Every verify token's slot and num_lookahead_tokens more, kept until the request ends (engine/draft_slots.py).
        draft_hold=vllm_draft_hold,
        running_from_kv=None,
        fp8_kv_with_quantized_weights=False,  # --kv-cache-dtype auto keeps the activations' bf16
        latent_attention_since=VLLM_LATENT_ATTENTION_SINCE,
        mla_absorbed_bf16=vllm_mla_absorbed_bf16,
        mxfp4_layout=vllm_mxfp4_layout,
        # gpu_model_runner.profile_run, then _dummy_sampler_run: top_p 0.9, top_k the vocabulary less one
        sampler_in_memory_profile=True,
        memory_share_covers="all",
        default_memory_share=vllm_gpu_memory_utilization,  # 0.9, 0.92 from 0.20.0, 1.0 where measured
        measured_kv_margin=vllm_measured_kv_margin,  # from 0.34.0 on CUDA and ROCm (engine/memory_share.py)
        drafter_in_pool=True,
        pp_batches_share_running_cap=True,
        pp_extra_layers="before_last",
        sliding_pool_ratio=None,  # its hybrid KV-cache manager frees the blocks out of a window
        default_block_size=vllm_block_size,  # 16, 64 from 0.34.0
        # The OpenAI API server runs apart from the engine core (vllm/v1/engine/core_client.py): each
        # API-server process renders the chat template and tokenizes (AsyncLLM's InputProcessor) and
        # detokenizes and checks stop strings (OutputProcessor, vllm/v1/engine/output_processor.py and
        # detokenizer.py), then builds each chunk (entrypoints/openai/serving_chat.py). --api-server-count
        # defaults to the data-parallel size from 0.15.0, to one before (vllm_api_servers).
        api_servers=vllm_api_servers,
        detokenizes_in="api-server",
        detokenize_assumption="detokenize_per_token_s",
        output_assumption=None,  # its output handler is the detokenizing process's time above
        # Its engine core sends every step's tokens; the API server's OutputProcessor detokenizes each and
        # holds them back to the stream interval after (RequestState.make_request_output in
        # vllm/v1/engine/output_processor.py).
        outputs_per_event=False,
        template_work=vllm_template_work,
        tokenizer_batch_wait_s=vllm_tokenizer_batch_wait_s,
        tokenizes_in_thread=vllm_tokenizes_in_thread,
        # AsyncLLM.generate takes every output its request's queue holds and yields them as one (0.7.3, 0.8.0:
        # "Coalesce any additional queued outputs"), later its RequestOutputCollector merges them ("merged if
        # the producer gets ahead of the consumer", vllm/v1/engine/output_processor.py, 0.8.3 on); each yield
        # is one chunk of serving_chat's stream
        merges_events=True,
        launched_with="vllm",
        offered_as_lever=True,
        measured_as="vllm",
    ),
    "vllm-v0": Profile(
        engine="vLLM V0",
        description="""vLLM's V0 engine (releases before 0.8, or VLLM_USE_V1=0): its scheduler as prefill-first
    forms batches without `chunked_prefill` (vllm/core/scheduler.py, _schedule_default) and as vllm-v1
    does with it (_schedule_chunked_prefill: the running decodes first, then prompt chunks within the
    budget); CUDA graphs for decode batches of up to 256 sequences; and its host's time in every
    step's path (engine/host_time.py: V0 schedules, prepares inputs and samples synchronously, and
    launches eager steps op by op from Python), a part per scheduler call and a part every step.
    `num_scheduler_steps` > 1 is its multi-step
    scheduling (MULTI_STEP below), without chunked prefill. Unset, `max_num_seqs` is V0's default, 256; the
    other limits keep the [engine] table's defaults (V0 turned chunked prefill on, with a 512-token
    budget, for models of over 32k tokens of context: state it). Not modelled: its 1% free-block
    watermark.""",
        prefills_alone_unless="chunked_prefill",
        chunk_unit="token",
        chunked_prefill=True,  # kept as the [engine] table had it; V0 itself chose by the context (above)
        # Without it a prompt above min(max_model_len, max_num_batched_tokens) is ignored with a warning
        # (vllm/core/scheduler.py, _schedule_prefills: prompt_limit, FINISHED_IGNORED).
        long_prompt_alone=False,
        kv_admissions=("on_demand",),
        new_token_ratio=False,
        attention_dp_splits_budget=False,
        budget_below_running=False,  # (as V1's)
        decodes_past_budget="run",  # (its speculative decoding is not read here; without it the budget covers all)
        attention_dp_routing="least_loaded",  # (unused: it has no attention data-parallel)
        attention_dp_models=None,  # V0 has no data-parallel engine cores (V1's, above)
        attention_dp_architectures=None,
        attention_dp_whole=frozenset(),
        attention_dp_whole_all_to_all=frozenset(),
        data_parallel_shares_experts=False,  # V0 has no data-parallel engines: a server per replica
        expert_parallel_divides_experts=False,  # (as V1's: its fused MoE layer's expert map)
        all_to_all_needs_more_ranks_than_top_k=False,
        queue_policy="fcfs",
        preempted_requeue="front",  # vllm/core/scheduler.py, _schedule_default: waiting.extendleft(preempted)
        preempts_first="newest",  # the last of its running queue (_schedule_running: running_queue.pop())
        refusal_waits_for_a_leave=False,
        # Its block manager admits a prompt only where its whole prompt's blocks are free (vllm/core/
        # block_manager.py, SelfAttnBlockSpaceManager.can_allocate, AllocStatus.LATER stops _schedule_prefills)
        # and allocate() takes them all then; modelled as the check, its later chunks' blocks taken as they run.
        whole_prompt_admission_since="0",
        prefix_caching=False,  # V0's enable_prefix_caching defaulted to False (vllm/engine/arg_utils.py)
        # With --enable-prefix-caching, a freed block keeps its content hash in the evictor
        # (vllm/core/block/prefix_caching_block.py) and a recomputed sequence's blocks are found by it.
        preempted_keeps="computed",
        host_window_assumption="vllm_v0_host_window_s",
        host_step_assumption="vllm_v0_host_step_s",
        host_overlap=False,
        host_overlap_since=None,
        host_overlap_with_pp_since=None,
        runs_finished_batch=False,  # (not overlapped)
        eager_host="eager_host_per_kernel_s",  # its model code runs op by op in Python when no graph is replayed
        layer_kernels=None,
        fused_mxfp4_moe_calls=None,
        compiled_fusions=None,
        mxfp4_weight_only_experts="vllm_mxfp4_weight_only_expert_time",
        # V0 captured decode batches (vllm/worker/model_runner.py) and ran prompt steps, and its mixed
        # chunked-prefill steps, eagerly.
        cuda_graphs="decode",
        cuda_graph_max_bs=VLLM_V0_CUDA_GRAPH_MAX_BS,
        cuda_graph_padding=True,
        unpadded_graph_sizes=None,
        prefill_graphs=None,
        prefill_graphs_since=None,
        nccl_nvls=True,  # NCCL's default (no NCCL_NVLS_ENABLE set by vLLM, as far as read)
        batch_limits=vllm_v0_batch_limits,
        speculative_max_running=None,
        speculative_overlap=None,
        draft_hold=None,  # V0's speculative decoding is not read here
        running_from_kv=None,
        fp8_kv_with_quantized_weights=False,
        latent_attention_since=VLLM_LATENT_ATTENTION_SINCE,
        mla_absorbed_bf16=vllm_mla_absorbed_bf16,
        mxfp4_layout=as_loaded,
        sampler_in_memory_profile=True,  # model_runner.profile_run: SamplingParams(top_p=0.99, top_k=vocab_size - 1)
        memory_share_covers="all",
        default_memory_share=DEFAULT_UTILIZATION,
        measured_kv_margin=None,
        drafter_in_pool=True,
        pp_batches_share_running_cap=False,
        pp_extra_layers="before_last",
        sliding_pool_ratio=every_layer,  # no hybrid manager: a sliding layer holds every token
        default_block_size=DEFAULT_BLOCK_SIZE,
        # The OpenAI API server ran apart from the engine (MQLLMEngine, vllm/engine/multiprocessing,
        # since 0.6, PR 6883: "request validation, tokenization, and JSON formatting" there); the engine
        # detokenized in its own step loop (vllm/engine/output_processor/, vllm/transformers_utils/
        # detokenizer.py; PR 7402, moving it to the front end, was closed unmerged). V0 had no data
        # parallelism: a replica is a server of its own.
        api_servers="per-replica",
        detokenizes_in="engine",
        detokenize_assumption="vllm_v0_detokenize_per_token_s",
        # Its API server unpickled the engine's RequestOutputs (vllm/engine/multiprocessing/client.py): untimed
        output_assumption=None,
        outputs_per_event=False,  # (V0 had no stream interval; its engine detokenized every token)
        template_work=vllm_template_work,
        tokenizer_batch_wait_s=vllm_tokenizer_batch_wait_s,
        tokenizes_in_thread=vllm_tokenizes_in_thread,
        merges_events=False,  # (V0's streams are not read here)
        launched_with="vllm",
        offered_as_lever=False,  # a release to reproduce (its latency rows), not a change to make
        measured_as=None,        # rows pick it by their engine_settings
    ),
    "prefill-first": Profile(
        engine="SGLang",
        description="""SGLang's default (scheduler.py, get_next_batch_to_run), whose batches vLLM V0 forms
    too without chunked prefill (vllm/core/scheduler.py, _schedule_default; vllm-v0 adds V0's host,
    and admits without the headroom below). When waiting prompts can be admitted the
    step is a prefill batch of its own: as many waiting prompts as fit the token budget, the free
    sequences and the free KV blocks; decoding sequences pause (they do not take part, and that
    time counts as queue for them). Otherwise the step decodes every running sequence. With
    `chunked_prefill` the token budget is SGLang's chunked_prefill_size: a longer prompt is split
    over several prefill steps, run back to back. `mixed_chunk` is SGLang's --enable-mixed-chunk:
    the decodes join the prefill step (the batch is then formed as vllm-v1 forms it).
    `num_scheduler_steps` > 1 is vLLM V0's multi-step scheduling (MULTI_STEP below). A waiting prompt
    is admitted only while the cache also has room for a share of the running requests' outputs still
    to come, SGLang's new_token_ratio (engine/new_token_ratio.py), so an overloaded engine rarely has
    to retract and recompute. The token budget is also SGLang's max_prefill_tokens (tokenpath's launch
    sets both from max_num_batched_tokens): without chunked prefill a longer prompt runs whole, the first
    of its step (long_prompt_alone), and a prompt after the first joins only below the budget left.""",
        prefills_alone_unless="mixed_chunk",
        chunk_unit="token",
        chunked_prefill=True,  # chunked_prefill_size > 0 by default (server_args.py)
        # With --chunked-prefill-size -1 the PrefillAdder admits the step's first prompt above its input cap
        # (max_prefill_tokens, which launch/sglang.py sets from max_num_batched_tokens) whole: "Without chunking,
        # allow the first request even above the input cap" (managers/schedule_policy.py, 0.5.23,
        # _select_prefill_admission); the others wait for a step with room, one after the first only while its
        # tokens are fewer than the cap left (`input_tokens >= self.rem_input_tokens` stops the adder).
        long_prompt_alone=True,
        kv_admissions=("on_demand",),
        new_token_ratio=True,
        attention_dp_splits_budget=True,
        budget_below_running=False,  # not read here: refused
        decodes_past_budget="run",  # a decode batch runs every running request (get_next_batch_to_run)
        # The data-parallel controller's default load_balance_method (managers/data_parallel_controller.py,
        # round_robin_scheduler).
        attention_dp_routing="round_robin",
        # For MLA models and standard attention alike (docs/advanced_features/dp_dpa_smg_guide.md), where the
        # model's file builds its attention over the attention-TP group.
        attention_dp_models="any",
        attention_dp_architectures=SGLANG_ATTENTION_DP_ARCHITECTURES,
        # The embedding: deepseek_v2.py builds it over the attention-TP group (get_embedding_tp_kwargs), whole
        # under full attention DP; its LM head stays split unless --enable-dp-lm-head.
        attention_dp_whole=frozenset({"embedding"}),
        # Its shared experts at tp 1 with an all-to-all backend (deepseek_v2.py, _shared_expert_use_tp1:
        # "Disable TP for shared experts for A2A ... paths"); its dense MLPs stay tensor-parallel unless
        # --moe-dense-tp-size 1 (layer_boundary/layout.py, is_dense_ffn_fully_dp).
        attention_dp_whole_all_to_all=frozenset({"shared_experts"}),
        # --ep-size divides --tp-size: each replica's experts over its own tp chips (launch/sglang.py)
        data_parallel_shares_experts=False,
        # FusedMoE.__init__ (python/sglang/srt/layers/moe/fused_moe_triton/layer.py): "assert num_experts %
        # self.moe_ep_size == 0", then num_experts // moe_ep_size local experts each
        expert_parallel_divides_experts=True,
        all_to_all_needs_more_ranks_than_top_k=False,
        queue_policy="fcfs",
        # update_running_batch puts the retracted requests, as retract_decode took them, at the back of the
        # waiting queue (scheduler.py, _add_request_to_queue: waiting_queue.append), which FCFS does not sort
        # (schedule_policy.py, calc_priority): read in 0.5.6 and 0.5.23.
        preempted_requeue="back",
        # retract_decode (schedule_batch.py) sorts the running requests by (len(output_ids),
        # -len(origin_input_ids)), keeps the most, and retracts from the other end (0.5.23 always; 0.5.6 kept
        # the batch's order under speculative decoding).
        preempts_first="fewest_outputs",
        # A NO_TOKEN from its PrefillAdder sets running_batch.batch_is_full, and get_new_batch_prefill then
        # returns at once until a request leaves the running batch (filter_batch, retract_decode) or it is
        # empty (scheduler.py, read in 0.5.6 and 0.5.23).
        refusal_waits_for_a_leave=True,
        whole_prompt_admission_since=None,  # (its new-token ratio's headroom counts the whole prompt already)
        prefix_caching=True,  # RadixAttention, unless --disable-radix-cache
        # retract_decode (sglang/srt/managers/schedule_batch.py) frees a request's tokens past
        # len(req.prefix_indices), those its prefill put in the radix tree (cache_unfinished_req), and
        # unlocks them: its prompt (and a prompt in progress, its chunks) stays cached.
        preempted_keeps="prefilled",
        host_window_assumption="host_step_s",
        host_step_assumption=None,
        host_overlap=True,  # the zero-overhead batch scheduler, since v0.4 (event_loop_overlap)
        host_overlap_since=None,
        host_overlap_with_pp_since=None,
        # event_loop_overlap (managers/scheduler.py) forms and launches batch N+1 before it processes batch N's
        # results, which finish its requests, and receives requests only at the top of its next pass, after
        # waiting for N+1's; N+1 decodes the finished ones once more and process_batch_result_decode drops that
        # token ("Free the one extra delayed token", scheduler_output_processor_mixin.py): read in 0.5.6 to
        # 0.5.21. From 0.5.22 it leaves out of N+1 the requests N's result finishes by length (sglang_runs_
        # finished_batch).
        runs_finished_batch=sglang_runs_finished_batch,
        eager_host="eager_host_per_kernel_s",  # calibrated on SGLang (engine/host_time.py)
        layer_kernels=None,
        fused_mxfp4_moe_calls=SGLANG_FUSED_MXFP4_MOE_CALLS,
        compiled_fusions=None,
        mxfp4_weight_only_experts="sglang_mxfp4_weight_only_expert_time",
        # SGLang's CudaGraphRunner replays decode-or-idle batches only, up to its cuda_graph_max_bs
        # for the GPU's memory and tp, and from 0.5.10 its prompt steps up to the prefill chunk on NVIDIA
        # GPUs, as piecewise, then breakable, graphs (engine/cuda_graphs.py).
        cuda_graphs="decode",
        cuda_graph_max_bs=sglang_cuda_graph_max_bs,
        cuda_graph_padding=True,
        unpadded_graph_sizes=None,
        prefill_graphs=sglang_prefill_graph_tokens,
        prefill_graphs_since=SGLANG_PREFILL_GRAPHS_OPTION_SINCE,
        # SGLang sets NCCL_NVLS_ENABLE=0 unless --enable-nccl-nvls or --enable-symm-mem (or the variable
        # is set already): sglang/srt/entrypoints/engine.py, _set_envs_and_config, since "Disable
        # NCCL_NVLS by default" (sgl-project/sglang PR 631), read in 0.5.23. Its large all-reduces
        # (prompt steps, above its custom all-reduce's size) run NCCL's ring or tree.
        nccl_nvls=False,
        batch_limits=sglang_batch_limits,  # its chunked_prefill_size by the GPU's memory
        # With a drafter SGLang caps its running requests (engine/batch_limits.py) and, before 0.5.11 or
        # with n-gram drafts, turns its overlap scheduler off (engine/speculative.py).
        speculative_max_running=sglang_speculative_max_running,
        speculative_overlap=sglang_keeps_overlap,
        # Its V1 worker frees a verify step's rejected slots; its V2 worker, with the overlap scheduler, keeps its
        # committed tokens and 2 x alloc_len_per_decode more until the request ends (engine/draft_slots.py).
        draft_hold=sglang_draft_hold,
        running_from_kv=sglang_max_running_requests,
        fp8_kv_with_quantized_weights=False,  # --kv-cache-dtype auto keeps the activations' bf16
        # Weight absorption came with v0.3 ("SGLang v0.3 Release: 7x Faster DeepSeek MLA", lmsys.org,
        # 2024-09-04); what the releases before it cached is not read here.
        latent_attention_since=None,
        mla_absorbed_bf16=sglang_mla_absorbed_bf16,
        mxfp4_layout=as_loaded,
        # SGLang sizes its KV pool by mem_fraction_static of the GPU (model_runner.profile_max_num_token), no
        # sampler run in it.
        sampler_in_memory_profile=False,
        memory_share_covers="weights_and_kv",
        default_memory_share=sglang_mem_fraction_static,
        measured_kv_margin=None,
        drafter_in_pool=sglang_drafter_in_pool,
        pp_batches_share_running_cap=True,
        pp_extra_layers="last",
        sliding_pool_ratio=sglang_sliding_pool_ratio,
        default_block_size=DEFAULT_BLOCK_SIZE,
        # The HTTP server's process tokenizes and builds the chunks (sglang/srt/managers/
        # tokenizer_manager.py; "The HTTP server, Engine, and TokenizerManager all run in the main
        # process", srt/entrypoints/http_server.py); the scheduler runs in a process of its own and a
        # third detokenizes (sglang/srt/managers/detokenizer_manager.py). One of each for the whole
        # server, its --dp-size replicas included (server_args.py: tokenizer_worker_num = 1,
        # detokenizer_worker_num = 1).
        api_servers="per-server",
        detokenizes_in="detokenizer",
        # Each process's time per token, timed with SGLang's own code (benchmarks/sglang_output_path.py)
        detokenize_assumption="sglang_detokenize_per_token_s",
        output_assumption="sglang_output_per_token_s",
        # Its scheduler sends a streamed request's tokens to the detokenizer only when its stream interval
        # closes an event, finished or not (len(output_ids) % stream_interval == 1 with an interval above
        # one: stream_output_generation in srt/managers/scheduler_output_processor_mixin.py).
        outputs_per_event=True,
        template_work=no_template_work,
        tokenizer_batch_wait_s=no_tokenizer_batch_wait,
        tokenizes_in_thread=no_tokenizer_thread,
        # The TokenizerManager's _wait_one_response streams a request's latest output (its text so far) once it
        # wakes, `state.out_list[-1]`, and drops the rest of the list
        merges_events=True,
        launched_with="sglang",
        offered_as_lever=True,
        measured_as="sglang",
    ),
    "trtllm": Profile(
        engine="TensorRT-LLM",
        description="""TensorRT-LLM's in-flight batching (cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp
    and microBatchScheduler.cpp). The capacity scheduler admits requests first come first served:
    with `kv_admission = "reserve"` (GUARANTEED_NO_EVICT, TensorRT-LLM's default) only while the
    request's whole KV cache, prompt and output (TensorRT-LLM reserves for max_tokens, which
    benchmarks set to the output length), fits in the blocks no running request has reserved, so no
    request is ever preempted; with "on_demand" (MAX_UTILIZATION) blocks are taken as
    sequences grow and the newest are paused (recomputed) when they run out, as in vLLM. The
    micro-batch scheduler puts the generation requests first, one token each (and their drafts), then
    contexts within max_num_tokens (`max_num_batched_tokens`): whole without chunked context, and with it
    cut to the budget left, rounded down to whole KV blocks (its chunkUnitSize is the tokens per block);
    generation requests past max_num_tokens wait, holding their KV, and no context joins them.
    Approximated: after a cut chunk no other context joins the step (TensorRT-LLM lets one whose
    whole rest fits in the leftover, under a block); MAX_UTILIZATION pauses the newest started
    request, which here waits at the front of the queue as in vLLM.""",
        prefills_alone_unless=None,
        # A chunk that is not the prompt's rest is whole KV blocks (trtGptModelInflightBatching.cpp).
        chunk_unit="block",
        # trtllm-serve passes enable_chunked_prefill=False unless --enable_chunked_prefill
        # (tensorrt_llm/commands/serve.py, get_llm_args; the LLM API's default too, llmapi/llm_args.py)
        chunked_prefill=False,
        # Without chunked context a prompt above max_num_tokens is refused (tensorrt_llm/llmapi/llm.py,
        # _check_arguments: "should not exceed max_num_tokens").
        long_prompt_alone=False,
        kv_admissions=("reserve", "on_demand"),
        new_token_ratio=False,
        attention_dp_splits_budget=False,
        # MicroBatchScheduler stops at max_num_tokens (engine/batch_limits.py)
        budget_below_running=True,
        decodes_past_budget="wait",
        # _balance_requests_across_ranks (tensorrt_llm/_torch/pyexecutor/executor_request_queue.py; request_utils.py
        # in later releases): a heap of the ranks by their active requests' tokens, then their count, then index.
        attention_dp_routing="fewest_tokens",
        attention_dp_models="any",  # a dense model's MLP stays tensor-parallel (docs/features/parallel-strategy.md)
        # Its Attention module runs whole on each rank under enable_attention_dp, whatever the model
        # (tensorrt_llm/_torch/modules/attention.py).
        attention_dp_architectures=None,
        # The embedding (tensorrt_llm/_torch/models/: LlamaModel's and Qwen3MoEModel's embed_tokens unsharded under
        # enable_attention_dp, "we cannot do all_reduce since the problem size of different ranks are different";
        # DeepseekV3Model's always) and the LM head (modeling_utils.py: an unsharded LMHead under
        # enable_attention_dp unless enable_lm_head_tp_in_adp; a tied model's shares the embedding's weight, which
        # it asserts has the same TP size); of DeepSeek-V3 (modeling_deepseekv3.py), the dense layers' MLP ("If
        # using attention DP, the MLP also uses DP instead of TP", _compute_mlp_tp_size), the shared experts
        # (_compute_shared_expert_tp_size) and the gate, on each rank's own hidden states.
        attention_dp_whole=frozenset({"embedding", "lm_head", "dense_mlp", "shared_experts", "moe_router"}),
        attention_dp_whole_all_to_all=frozenset(),
        # --ep_size within a trtllm-serve, one per replica (launch/trtllm.py)
        data_parallel_shares_experts=False,
        # WideEPMoE.__init__ (tensorrt_llm/_torch/modules/fused_moe/fused_moe_wide_ep.py): "assert num_experts %
        # self.ep_size == 0" without a load balancer; CutlassFusedMoE.__init__ (fused_moe_cutlass.py) places
        # num_experts // ep_size on each rank
        expert_parallel_divides_experts=True,
        # WideEPMoE.select_alltoall_method_type (tensorrt_llm/_torch/modules/fused_moe/fused_moe_wide_ep.py):
        # NotEnabled while moe_ep_size <= top_k, then MNNVL where the NVLink domain spans nodes
        all_to_all_needs_more_ranks_than_top_k=True,
        queue_policy="fcfs",
        preempted_requeue="front",  # (approximated as vLLM: the description above)
        preempts_first="newest",
        refusal_waits_for_a_leave=False,
        # (GUARANTEED_NO_EVICT reserves a request's whole KV cache; what MAX_UTILIZATION asks of a chunked
        # context's later chunks is not read)
        whole_prompt_admission_since=None,
        prefix_caching=True,  # KvCacheConfig.enable_block_reuse defaults to True
        preempted_keeps=None,  # what a paused request leaves for its KV cache reuse is not read here
        host_window_assumption="host_step_s",
        host_step_assumption=None,
        host_overlap=True,  # the PyTorch backend's overlap scheduler, on by default
        host_overlap_since=None,
        host_overlap_with_pp_since=None,
        # Overlapped, a request that will complete in the step being formed moves to GENERATION_TO_COMPLETE
        # (will_complete_next_iteration, tensorrt_llm/_torch/pyexecutor/py_executor.py) and is not scheduled
        # again.
        runs_finished_batch=False,
        # Its PyTorch backend, trtllm-serve's default since 1.0, runs a step that holds a prompt eagerly,
        # a layer's fused custom ops launched from Python (engine/eager_launches.py), graph or not about half
        # the kernels ops.py counts; its TensorRT engines (NIM's, and every release before 1.0) launch from
        # C++ and their kernels are not those of that code: `[engine] eager_host = false`.
        eager_host="trtllm_eager_host_per_kernel_s",
        layer_kernels=TRTLLM_PYTORCH,
        fused_mxfp4_moe_calls=None,  # TRTLLM_PYTORCH counts its fused MoE op's kernels
        compiled_fusions=None,
        mxfp4_weight_only_experts="trtllm_mxfp4_weight_only_expert_time",
        # The PyTorch backend replays a graph only for a batch without a prompt
        # (ScheduledRequests.can_run_cuda_graph, tensorrt_llm/_torch/pyexecutor/scheduler.py), and by
        # default only of the sizes it captured, unpadded (engine/cuda_graphs.py).
        cuda_graphs="decode",
        cuda_graph_max_bs=TRTLLM_CUDA_GRAPH_MAX_BS,
        cuda_graph_padding=False,
        unpadded_graph_sizes=trtllm_unpadded_graph_sizes,
        prefill_graphs=None,
        prefill_graphs_since=None,
        nccl_nvls=True,  # NCCL's default (no NCCL_NVLS_ENABLE set by TensorRT-LLM, as far as read)
        batch_limits=trtllm_batch_limits,  # trtllm-serve's: 2048 requests, 8192 tokens a step
        speculative_max_running=None,
        speculative_overlap=trtllm_keeps_overlap,
        draft_hold=None,  # it rewinds a request's rejected drafts after each step (engine/draft_slots.py)
        running_from_kv=None,
        # Its fp8 and NVFP4 checkpoints (ModelOpt) quantize the KV cache to fp8.
        fp8_kv_with_quantized_weights=True,
        latent_attention_since=None,  # not read here
        mla_absorbed_bf16=trtllm_mla_absorbed_bf16,
        mxfp4_layout=as_loaded,
        # TensorRT-LLM's KV cache takes a fraction of the memory free after the engine's own buffers, its
        # logits' among them; no sampler run.
        sampler_in_memory_profile=False,
        # KvCacheCreator._cal_max_memory (tensorrt_llm/_torch/pyexecutor/_util.py): available_kv_mem =
        # (total_gpu_memory - peak_memory + allocated_bytes) x fraction, the peak of a profiling step of
        # max_num_tokens; kv_cache_config.free_gpu_memory_fraction defaults to 0.9.
        memory_share_covers="free_memory",
        default_memory_share=DEFAULT_UTILIZATION,
        measured_kv_margin=None,
        drafter_in_pool=True,
        pp_batches_share_running_cap=True,
        pp_extra_layers="first",
        sliding_pool_ratio=None,  # its per-window pools are not read here: as vLLM V1's
        default_block_size=DEFAULT_BLOCK_SIZE,
        # trtllm-serve's OpenAI server (tensorrt_llm/serve/openai_server.py) runs apart from the
        # executor's workers: it renders the chat template, tokenizes, and detokenizes and builds each
        # chunk in its own process by default (serve/postprocess_handlers.py; with
        # --num_postprocess_workers > 0, default 0, in a pool of postprocess processes). One server per
        # replica (num_serve_frontends defaults to 1).
        api_servers="per-replica",
        detokenizes_in="api-server",
        # Its own method is not timed: vLLM V1's stands in, its detokenizer the same DecodeStream below
        # TLLM_STREAM_INTERVAL_THRESHOLD (tensorrt_llm/llmapi/tokenizer.py, hf_decode_incrementally)
        detokenize_assumption="detokenize_per_token_s",
        output_assumption=None,  # within the detokenizing process's time, as vLLM V1's
        # Its executor makes a request's response at its first token, every stream_interval-th step and
        # its last (PyExecutor._handle_responses, tensorrt_llm/_torch/pyexecutor/py_executor.py).
        outputs_per_event=True,
        template_work=no_template_work,
        tokenizer_batch_wait_s=no_tokenizer_batch_wait,
        tokenizes_in_thread=no_tokenizer_thread,
        merges_events=False,  # (trtllm-serve's streams are not read here)
        launched_with="trtllm",
        offered_as_lever=True,
        measured_as="trtllm",
    ),
}

DEFAULT_PROFILE = "vllm-v1"

# Each engine name of the latency rows -> the profile its runs are simulated with.
MEASURED_ENGINES = {p.measured_as: name for name, p in PROFILES.items() if p.measured_as}

MULTI_STEP = """Multi-step scheduling (vLLM V0 --num-scheduler-steps k, with scheduler = "vllm-v0" or
"prefill-first", prompts in steps of their own):
the scheduler runs at window starts only. A prefill step is a window of its own; otherwise the
running sequences decode for k steps as one fixed batch, their KV blocks for all k steps taken at
the window's start (vLLM allocates k - 1 lookahead slots). New requests are admitted only at window
starts. The host's time per scheduler call (scheduling, preparing the inputs) is paid by a window's
first step only; its time every step (the engine's step loop, the sampler, the outputs' copy to
Python) by each step (engine/host_time.py). The window's tokens leave the server together when its
last step ends (vLLM processes a window's outputs after its last step); a sequence that samples its
last token mid-window stays in the batch until the window ends (the GPU keeps computing it, its
extra tokens are dropped, vLLM issue 10890) and frees its slot then; for that request the wait counts
as delivery."""


def listed(names: list[str], last: str = "or") -> str:
    """Names as prose: "a", "a or b", "a, b or c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def names_where(test: Callable[[Profile], bool]) -> list[str]:
    """The names of the profiles that pass `test`."""
    return [name for name, profile in PROFILES.items() if test(profile)]


def profiles_where(test: Callable[[Profile], bool], last: str = "and") -> str:
    """The names of the profiles that pass `test`, as prose: help text that stays true as profiles come."""
    return listed(names_where(test), last)


def choices() -> str:
    """Every profile with its engine: the scheduler's help (which adds the default)."""
    return listed([f"{name} ({profile.engine})" for name, profile in PROFILES.items()])
