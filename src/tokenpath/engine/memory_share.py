"""The share of a GPU's memory an engine's KV cache is cut from, where the scenario does not set
`engine.gpu_memory_utilization`, and what that share covers (Profile.memory_share_covers).

vLLM's `--gpu-memory-utilization` covers everything the engine allocates: its memory profile runs a
step, and the KV cache takes what the weights, that step's activations and the rest leave of the share
(compute/roofline.ComputeModel.kv_capacity_tokens). Left unset it is 0.9 through 0.19.1 and 0.92 from
0.20.0 (vllm/config/cache.py, CacheConfig.gpu_memory_utilization, read in the wheels of 0.11.0 to 0.34.0).
From 0.34.0 V1 sizes its cache on CUDA and ROCm from the memory it measures free after warmup and CUDA
graph capture, its "extensible KV cache" (VllmConfig._resolve_extensible_kv_cache turns it on unless a
setting rules it out; vllm/v1/worker/extensible_kv_cache.py, measure_kv_cache_bytes): the unset share is
then 1.0 (CacheConfig.resolved_gpu_memory_utilization), and the cache takes the memory left free less a
step's activations and a margin of max(1 GiB, 0.75 x those activations), 3 GiB at least on ROCm; a share
the scenario sets caps it (`vllm_measured_kv_margin`). vLLM V0 kept 0.9.

TensorRT-LLM's `kv_cache_config.free_gpu_memory_fraction` (0.9 by default) is a share of what is left:
it loads the weights, runs a profiling step of max_num_tokens, and gives the KV cache that share of the
memory free beyond the step's peak (tensorrt_llm/_torch/pyexecutor/_util.py, KvCacheCreator.
_cal_max_memory: `available_kv_mem = (total_gpu_memory - peak_memory + allocated_bytes) * fraction`).

SGLang's `--mem-fraction-static` covers the weights and the KV pool only: the activations and the CUDA
graphs live in the rest. Its pool is the memory free after loading the weights less (1 - fraction) of
the memory free before (python/sglang/srt/model_executor/model_runner.py, `profile_max_num_token`:
`rest_memory = available_gpu_memory - total_gpu_memory * (1 - self.mem_fraction_static)`), and it runs
no step first. Left unset, the fraction is a rule of the GPU's memory as nvidia-smi reports it (MiB)
and the server's settings, a rule each generation of releases rewrote
(python/sglang/srt/server_args.py, read in each release's wheel on PyPI):

- 0.2.9 to 0.4.5: a table by tensor-parallel size (tp >= 16, 8, 4, 2, else), TP8's 0.83 until 0.3.5,
  0.82 in 0.3.6, 0.81 from 0.4.0. Earlier releases are read with 0.2.9's table.
- 0.4.6: that table on GPUs of at most 81,920 MiB; above, all but 13 GiB.
- 0.4.7: the table by tp x pp on GPUs of at most 81,920 MiB, 0.88 above; then 0.79 above 180,000 MB,
  and above 96 GiB the least of 0.88 + 48 GiB x 0.12 / memory and all but 18 GiB (20 with a drafter);
  at most 96 GiB a drafter takes 5%.
- 0.4.8 to 0.5.3rc0: all but a reserve by memory tier (9.5 + tp x pp / 2 GiB under 90 GiB, 12 +
  tp x pp / 2 under 160 GiB, 32 GiB above; 2.8 + tp x pp / 10 GiB under 35 GiB), 2 GiB more with a
  drafter (6 with a draft model), 4 GiB more with DP attention.
- 0.5.3 on (pull request 10975, `_handle_gpu_memory_settings`): all but 512 MiB + 1.5 MiB per token of
  the prefill chunk (at least 2,048) + 2 MiB per sequence of the largest decode graph + tp x pp / 8
  GiB, plus, with DP attention, 3 MiB per graph sequence per attention rank (4.5 above 300 sequences);
  at least 10 GiB on GPUs above 60 GiB; then 2 GiB more for an EAGLE or MTP drafter, 6 for a draft
  model, none for n-gram. The fraction is rounded to three decimals. Where prompt steps replay graphs
  (engine/cuda_graphs.py), 0.5.8 on adds 8 MiB per prompt-step size captured before the 10 GiB floor, an
  MLA model 1.5 GiB instead from 0.5.10 (`len(piecewise_cuda_graph_tokens) * 8`, then
  arg_groups/memory_hook.py's `reserve_for_graph_mb`); 0.5.4 to 0.5.7, whose prompt graphs are opt-in,
  reserved for them otherwise, which is not modelled, nor later releases' DeepEP buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tokenpath.engine.platforms import runs_cuda, runs_rocm
from tokenpath.engine.release import release_at_least

MIB = 2**20
# What a profile's share covers (Profile.memory_share_covers), as reports say it after the share.
SHARE_COVERS = {"all": "of HBM for everything", "weights_and_kv": "of HBM for weights and KV cache",
                "free_memory": "of the memory the weights and a step leave"}
# vLLM's --gpu-memory-utilization default before 0.20.0 (vllm/engine/arg_utils.py, EngineArgs.
# gpu_memory_utilization), V0's, and TensorRT-LLM's free_gpu_memory_fraction; V1's by release below.
DEFAULT_UTILIZATION = 0.9
VLLM_UTILIZATION_0_92_SINCE = "0.20.0"
VLLM_UTILIZATION_0_92 = 0.92
VLLM_MEASURED_KV_SINCE = "0.34.0"
# measure_kv_cache_bytes's margin: the larger of a floor (KV_CACHE_MARGIN_FLOOR_BYTES: 1 GiB, 3 on ROCm)
# and a share of the step's activations (KV_CACHE_MARGIN_FRACTION).
VLLM_MEASURED_KV_MARGIN_FLOOR_BYTES = 2**30
VLLM_MEASURED_KV_MARGIN_FLOOR_BYTES_ROCM = 3 * 2**30
VLLM_MEASURED_KV_MARGIN_FRACTION = 0.75

# SGLang's fractions by tensor-parallel size before 0.4.8: (the release each table arrived in, the
# fraction at tp >= 16, 8, 4, 2 and below).
_SGLANG_TP_TABLES = (
    ("0.2.9", (0.79, 0.83, 0.85, 0.87, 0.88)),
    ("0.3.6", (0.79, 0.82, 0.85, 0.87, 0.88)),
    ("0.4.0", (0.79, 0.81, 0.85, 0.87, 0.88)),
)
# The drafters' reserves of 0.4.8 on, by tokenpath's speculative method (SGLang's STANDALONE is a draft
# model, NGRAM drafts from the prompt and has none; EAGLE, EAGLE3 and NEXTN take 2 GiB, 4 GiB from 0.5.10:
# server_args.py). From 0.5.14 there is none: the drafter's weights and KV are counted in the pool itself
# (model_runner_kv_cache_mixin.py, "draft weights are now counted"; sglang_drafter_in_pool).
_SGLANG_DRAFTER_RESERVE_MIB = {"draft_model": 6 * 1024, "ngram": 0}
_SGLANG_DRAFTER_DEFAULT_MIB = 2 * 1024
_SGLANG_DRAFTER_DEFAULT_MIB_0_5_10 = 4 * 1024
SGLANG_DRAFTER_IN_POOL_SINCE = "0.5.14"
# Its reserve for prompt-step graphs (the module's docstring): per size captured, and an MLA model's.
_SGLANG_PREFILL_GRAPH_MIB = 8
_SGLANG_MLA_PREFILL_GRAPHS_MIB = 1.5 * 1024


@dataclass(frozen=True)
class ServerShape:
    """What an engine's default memory share is a rule of."""

    release: str | None         # engine.version, as engine/release.py reads it
    hbm_bytes: float            # one GPU's memory
    tp: int
    pp: int
    prefill_chunk_tokens: int   # the token budget of a prompt step (SGLang's chunked_prefill_size)
    graph_max_seqs: int         # the largest decode batch captured as a graph (SGLang's cuda_graph_max_bs)
    attention_dp: bool
    drafter: str | None         # the speculative method, or None
    prefill_graphs: int = 0     # prompt-step sizes captured as graphs (engine/cuda_graphs.py), 0: none
    mla: bool = False           # the model's attention is latent (SGLang's MLA backend)
    generation: str = ""        # the chip's generation (engine/platforms.py), "": not known


class KvMargin(NamedTuple):
    """What an engine that sizes its KV cache from memory it measures keeps free beyond a step's
    activations: the larger of `floor_bytes` and `fraction` of those activations."""

    floor_bytes: float
    fraction: float


def vllm_measured_kv_margin(release: str | None, generation: str) -> KvMargin | None:
    """vLLM V1's margin where `release` sizes its KV cache from measured memory on a chip of
    `generation`, or None where it sizes it from its share (the module's docstring)."""
    if not release_at_least(release, VLLM_MEASURED_KV_SINCE) or not (runs_cuda(generation) or runs_rocm(generation)):
        return None
    floor = VLLM_MEASURED_KV_MARGIN_FLOOR_BYTES_ROCM if runs_rocm(generation) else VLLM_MEASURED_KV_MARGIN_FLOOR_BYTES
    return KvMargin(floor, VLLM_MEASURED_KV_MARGIN_FRACTION)


def vllm_gpu_memory_utilization(shape: ServerShape) -> float:
    """vLLM V1's --gpu-memory-utilization when left unset, in the release `shape` states on its chip."""
    if vllm_measured_kv_margin(shape.release, shape.generation) is not None:
        return 1.0
    raised = release_at_least(shape.release, VLLM_UTILIZATION_0_92_SINCE)
    return VLLM_UTILIZATION_0_92 if raised else DEFAULT_UTILIZATION


def sglang_mem_fraction_static(shape: ServerShape) -> float:
    """SGLang's --mem-fraction-static when left unset, for the release `shape` states (the module's
    docstring gives each generation's rule)."""
    gpu_mib = shape.hbm_bytes / MIB
    parallel = shape.tp * shape.pp
    if not release_at_least(shape.release, "0.4.6"):
        return _sglang_tp_table(shape.release, shape.tp)
    if not release_at_least(shape.release, "0.4.7"):
        return _sglang_tp_table(shape.release, shape.tp) if gpu_mib <= 81920 else (gpu_mib - 13 * 1024) / gpu_mib
    if not release_at_least(shape.release, "0.4.8"):
        fraction = _sglang_tp_table(shape.release, parallel) if gpu_mib <= 81920 else 0.88
        if gpu_mib > 180_000:
            return 0.79
        if gpu_mib > 96 * 1024:
            reserve = (20 if shape.drafter else 18) * 1024
            return min(fraction + 48 * 1024 * (1 - fraction) / gpu_mib, (gpu_mib - reserve) / gpu_mib)
        return fraction * 0.95 if shape.drafter else fraction
    if not release_at_least(shape.release, "0.5.3"):
        return round((gpu_mib - _sglang_tier_reserve_mib(shape, gpu_mib)) / gpu_mib, 3)
    return round((gpu_mib - _sglang_formula_reserve_mib(shape, gpu_mib)) / gpu_mib, 3)


def _sglang_tp_table(release: str | None, size: int) -> float:
    """The fraction at `size` (tp, or tp x pp in 0.4.7) in the release's table, 0.2.9's before it."""
    table = _SGLANG_TP_TABLES[0][1]
    for since, fractions in _SGLANG_TP_TABLES[1:]:
        if release_at_least(release, since):
            table = fractions
    at_least = (16, 8, 4, 2)
    return next((fraction for bound, fraction in zip(at_least, table) if size >= bound), table[-1])


def _sglang_tier_reserve_mib(shape: ServerShape, gpu_mib: float) -> float:
    """0.4.8 to 0.5.3rc0: the reserve by the GPU's memory tier."""
    parallel = shape.tp * shape.pp
    if gpu_mib < 35 * 1024:
        reserve = (2.8 + parallel / 10) * 1024
    elif gpu_mib < 90 * 1024:
        reserve = (9.5 + parallel / 2) * 1024
    elif gpu_mib < 160 * 1024:
        reserve = (12 + parallel / 2) * 1024
    else:
        reserve = 32 * 1024
    if shape.drafter:
        reserve += 6 * 1024 if shape.drafter == "draft_model" else 2 * 1024
    if shape.attention_dp:
        reserve += 4 * 1024
    return reserve


def _sglang_formula_reserve_mib(shape: ServerShape, gpu_mib: float) -> float:
    """0.5.3 on: the reserve from the prefill chunk and the decode graphs."""
    reserve = 512 + max(shape.prefill_chunk_tokens, 2048) * 1.5 + shape.graph_max_seqs * 2
    reserve += shape.tp * shape.pp / 8 * 1024
    if shape.attention_dp:  # SGLang's dp_size is the attention ranks: tp here (deployment.attention_dp)
        reserve += shape.graph_max_seqs * shape.tp * 3
        if shape.graph_max_seqs > 300:
            reserve += shape.graph_max_seqs * shape.tp * 1.5
    if shape.prefill_graphs and release_at_least(shape.release, "0.5.8"):
        mla = shape.mla and release_at_least(shape.release, "0.5.10")
        reserve += _SGLANG_MLA_PREFILL_GRAPHS_MIB if mla else shape.prefill_graphs * _SGLANG_PREFILL_GRAPH_MIB
    if gpu_mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    if shape.drafter and not sglang_drafter_in_pool(shape.release):
        eagle = _SGLANG_DRAFTER_DEFAULT_MIB_0_5_10 if release_at_least(shape.release, "0.5.10") else \
            _SGLANG_DRAFTER_DEFAULT_MIB
        reserve += _SGLANG_DRAFTER_RESERVE_MIB.get(shape.drafter, eagle)
    return reserve


def sglang_drafter_in_pool(release: str | None) -> bool:
    """Whether SGLang's KV pool holds the drafter's weights and KV cache beside the target's: from 0.5.14,
    which loads the drafter before sizing the pools; before, the target's pool was sized first and the
    drafter took its memory out of the reserve (_sglang_formula_reserve_mib)."""
    return release_at_least(release, SGLANG_DRAFTER_IN_POOL_SINCE)
