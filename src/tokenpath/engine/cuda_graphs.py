"""The engines' own limits on the steps they replay as captured CUDA graphs, which the scheduler
profiles (engine/profiles.py) take when the scenario does not say, and SGLang's prefill chunk, which
its releases set by the same rule.

The engines of the prefill-first and vllm-v0 profiles capture decode batches only: SGLang's
CudaGraphRunner replays a graph when the batch is decode-or-idle
(python/sglang/srt/model_executor/cuda_graph_runner.py, can_run), vLLM V0 captured decode batches
(vllm/worker/model_runner.py, _BATCH_SIZES_TO_CAPTURE), and both run prompt steps (and V0 its mixed
chunked-prefill steps) eagerly, SGLang until its prompt-step graphs (below). Decode batches above a size
run eagerly too. vLLM V0 captured up to 256, its default max_num_seqs. vLLM V1 replays every step at any
size.

Each of them pads a batch up to the next size it captured, except TensorRT-LLM's PyTorch backend by
default: its CudaGraphConfig leaves enable_padding False and captures decode batches of 1 to 32, 64 and
128 sequences (TorchLlmArgs.validate_cuda_graph_config: `max_batch_size or 128`;
CudaGraphConfig._generate_cuda_graph_batch_sizes, tensorrt_llm/llmapi/llm_args.py), and a decode batch of
any other size runs eagerly (PyTorchModelEngine._maybe_get_cuda_graph returns no graph for a size not
captured, tensorrt_llm/_torch/pyexecutor/model_engine.py).

SGLang's largest captured decode batch and its chunked_prefill_size follow the GPU's memory (nvidia-smi's
MiB), and each generation of releases set them its own way (server_args.py and cuda_graph_runner.py,
`get_batch_sizes_to_capture`, read in each release's wheel):
- before 0.4.6: up to 160 sequences on GPUs of 25 GB or more (cuda_graph_max_bs 160; below, 8 at
  tp < 4 and 80 above); chunks of 8,192 tokens (2,048 below 25 GB);
- 0.4.6: up to 256 on GPUs above 81,920 MiB;
- 0.4.7: up to 256 above 96 GiB and 512 above 180,000 MiB; chunks of 16,384 above 180,000 MiB;
- 0.4.8 to 0.5.3rc0: up to 256 above 90 GiB and 512 above 160,000 MiB (8 at tp < 4 and 80 above under
  35 GiB); chunks of 2,048 under 35 GiB, 8,192 under 160 GiB, 16,384 above;
- 0.5.3 on (sgl-project/sglang pull request 10372, `_handle_gpu_memory_settings`): the tiers below, by
  memory and tp.
Where a scenario states no release, the newest rule.

SGLang replays its prompt steps as graphs too, on NVIDIA GPUs, from 0.5.10: "piecewise" graphs (0.5.10
to 0.5.14; opt-in with --enable-piecewise-cuda-graph from 0.5.4), then "breakable" ones (0.5.15 on,
`default_prefill_backend`, model_executor/cuda_graph_config.py), each a graph of the layers' kernels
broken around the attention op, which runs between the pieces. The prompt step's other kernels are not
launched one by one from Python. A step of up to a number of tokens replays, a longer one runs eagerly:
the prefill chunk (chunked_prefill_size), for an MLA model 2,048 tokens (0.5.8 to 0.5.22; in 0.5.23
8,192, or the chunk where smaller), and 4,096 before 0.5.7 (`piecewise_cuda_graph_max_tokens`, then
`cuda_graph_config.prefill.max_bs`). Each release turns it off by default for some servers (server_args.py
`_handle_piecewise_cuda_graph`, then the breakable rules of arg_groups/cuda_graph_hook.py, read in the
wheel of every release from 0.5.10 to 0.5.23):
- on ROCm (MI300X) and every platform but CUDA;
- pipeline parallelism: 0.5.10 to 0.5.14, and from 0.5.19;
- DP attention: 0.5.10 to 0.5.16;
- speculative decoding: 0.5.10 (and 0.5.10.post1) only;
- an MLA model: 0.5.15 to 0.5.17; and from 0.5.15, DeepSeek-V3's architecture (the catalog's MLA models)
  on Blackwell, whose default attention backend there, trtllm_mla, would fall back to FlashAttention
  for the prompt inside a graph (`_disable_prefill_cuda_graph_for_deepseek_trtllm_mla`);
- and settings the scenario does not express (torch.compile, LoRA, multimodal models, expert all-to-all
  backends, context parallelism, a few architectures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenpath.engine.memory_share import MIB
from tokenpath.engine.platforms import runs_cuda
from tokenpath.engine.release import release_at_least

# SGLang's defaults by the GPU's memory from 0.5.3 (ServerArgs._handle_gpu_memory_settings): (the memory
# below which a tier applies, in GiB, as server_args.py compares MiB; its chunked_prefill_size; its
# cuda_graph_max_bs at tp < 4 and at tp >= 4). Its comments name the GPUs of each tier. The chunked
# prefill size is the profile's token budget (engine/batch_limits.py).
SGLANG_GPU_MEMORY_TIERS = (
    (20, 2048, (8, 8)),             # T4, 4080
    (35, 2048, (24, 80)),           # A10, 4090, 5090
    (60, 4096, (32, 160)),          # A100 40 GB, L40
    (90, 8192, (256, 512)),         # H100, A100 80 GB
    (160, 8192, (256, 512)),        # H20, H200
    (math.inf, 16384, (512, 512)),  # B200, MI300X
)
SGLANG_TIERS_SINCE = "0.5.3"
# Before 0.5.3: the decode batches captured on a GPU of 25 GB (35 GiB from 0.4.8) or more, and the larger
# batches captured above a memory (MiB), by the release that brought each rule.
SGLANG_GRAPH_BATCH = 160
_SGLANG_LARGER_GRAPHS = (
    ("0.4.8", ((90 * 1024, 256), (160_000, 512))),
    ("0.4.7", ((96 * 1024, 256), (180_000, 512))),
    ("0.4.6", ((81_920, 256),)),
)


def sglang_defaults(hbm_bytes: float, tp: int, release: str | None) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, largest captured decode batch) on a GPU of `hbm_bytes` at `tp`,
    in the release `release` states (the module's docstring)."""
    if release_at_least(release, SGLANG_TIERS_SINCE):
        chunk, (small_tp, large_tp) = next((chunk, sizes) for below_gib, chunk, sizes in SGLANG_GPU_MEMORY_TIERS
                                           if hbm_bytes < below_gib * 2**30)
        return chunk, small_tp if tp < 4 else large_tp
    mib = hbm_bytes / MIB
    small_gpu_mib = 35 * 1024 if release_at_least(release, "0.4.8") else 25_000
    if mib < small_gpu_mib:
        return 2048, 8 if tp < 4 else 80
    graphs = SGLANG_GRAPH_BATCH
    larger = next((rules for since, rules in _SGLANG_LARGER_GRAPHS if release_at_least(release, since)), ())
    for above_mib, batch in larger:
        if mib > above_mib:
            graphs = batch
    if release_at_least(release, "0.4.8"):
        chunk = 8192 if mib < 160 * 1024 else 16384
    elif release_at_least(release, "0.4.7"):
        chunk = 16384 if mib > 180_000 else 8192
    else:
        chunk = 8192
    return chunk, graphs


def sglang_cuda_graph_max_bs(hbm_bytes: float, tp: int, release: str | None = None) -> int:
    """SGLang's default largest decode batch replayed as a graph, on a GPU of `hbm_bytes` at `tp`."""
    return sglang_defaults(hbm_bytes, tp, release)[1]


# vLLM V0's captured decode batches: 1, 2, 4 and multiples of 8 up to 256 (vllm/worker/model_runner.py,
# _BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 * i for i in range(1, 33)]).
VLLM_V0_CUDA_GRAPH_MAX_BS = 256


# TensorRT-LLM's largest captured decode batch where its cuda_graph_config states none (TorchLlmArgs).
TRTLLM_CUDA_GRAPH_MAX_BS = 128


def trtllm_unpadded_graph_sizes(max_bs: int) -> frozenset[int]:
    """The decode batch sizes TensorRT-LLM captures up to `max_bs` without padding, as
    CudaGraphConfig._generate_cuda_graph_batch_sizes(max_bs, enable_padding=False) lists them: 1 to 31,
    32, 64, 128, the powers of two from 256 below `max_bs`, and `max_bs` itself (none for 0)."""
    if max_bs < 1:
        return frozenset()
    sizes = [*range(1, 32), 32, 64, 128, *(2**i for i in range(8, math.ceil(math.log2(max_bs))))]
    return frozenset({size for size in sizes if size <= max_bs} | {max_bs})


# SGLang's prompt-step graphs (the module's docstring): the release with the option, the release that
# turned it on by default, and the largest step replayed before 0.5.7 and for an MLA model from 0.5.8.
SGLANG_PREFILL_GRAPHS_OPTION_SINCE = "0.5.4"
SGLANG_PREFILL_GRAPHS_DEFAULT_SINCE = "0.5.10"
SGLANG_PREFILL_GRAPH_OPT_IN_TOKENS = 4096
SGLANG_MLA_PREFILL_GRAPH_TOKENS = 2048
SGLANG_MLA_PREFILL_GRAPH_TOKENS_0_5_23 = 8192


@dataclass(frozen=True)
class PromptStepShape:
    """What an engine's rule for replaying its prompt steps as graphs reads of the server."""

    release: str | None   # engine.version, as engine/release.py reads it
    budget_tokens: int    # the engine's token budget a step (SGLang's chunked_prefill_size)
    mla: bool             # the model's attention is latent (SGLang's MLA backend)
    generation: str       # the chip's generation (catalog/chips.toml)
    pp: int
    attention_dp: bool
    speculative: bool     # a drafter runs


def sglang_prefill_graph_tokens(shape: PromptStepShape, setting: bool | None) -> int | None:
    """The largest prompt step SGLang replays as a graph on `shape`'s server (None: none), as its release
    does by default (`setting` None), or as `[engine] prefill_cuda_graphs` forces it (True: on, as
    --enforce-piecewise-cuda-graph or an explicit prefill backend skips the rules; False: off)."""
    if setting is False or (setting is None and not _sglang_prefill_graphs_by_default(shape)):
        return None
    release = shape.release
    if shape.mla and release_at_least(release, "0.5.23"):
        return min(SGLANG_MLA_PREFILL_GRAPH_TOKENS_0_5_23, shape.budget_tokens)
    if shape.mla and release_at_least(release, "0.5.8"):
        return SGLANG_MLA_PREFILL_GRAPH_TOKENS
    return shape.budget_tokens if release_at_least(release, "0.5.7") else SGLANG_PREFILL_GRAPH_OPT_IN_TOKENS


def _sglang_prefill_graphs_by_default(shape: PromptStepShape) -> bool:
    release = shape.release
    if not release_at_least(release, SGLANG_PREFILL_GRAPHS_DEFAULT_SINCE) or not runs_cuda(shape.generation):
        return False
    breakable = release_at_least(release, "0.5.15")
    if shape.pp > 1 and (not breakable or release_at_least(release, "0.5.19")):
        return False
    if shape.attention_dp and not release_at_least(release, "0.5.17"):
        return False
    if shape.speculative and not release_at_least(release, "0.5.11"):
        return False
    mla_off = not release_at_least(release, "0.5.18") or shape.generation == "Blackwell"  # trtllm_mla there
    return not (shape.mla and breakable and mla_off)


def sglang_prefill_capture_sizes(max_tokens: int) -> list[int]:
    """The prompt-step sizes SGLang captures up to `max_tokens` (server_args.py
    `_generate_piecewise_cuda_graph_tokens`, then arg_groups/cuda_graph_hook.py
    `generate_prefill_cuda_graph_batch_sizes`): a step pads up to the next."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [size for size in sizes if size <= max_tokens]
