"""The engines' own limits on the steps they replay as captured CUDA graphs, which the scheduler
profiles (engine/profiles.py) take when the scenario does not say.

The engines of the prefill-first and vllm-v0 profiles capture decode batches only: SGLang's
CudaGraphRunner replays a graph when the batch is decode-or-idle
(python/sglang/srt/model_executor/cuda_graph_runner.py, can_run), vLLM V0 captured decode batches
(vllm/worker/model_runner.py, _BATCH_SIZES_TO_CAPTURE), and both run prompt steps (and V0 its mixed
chunked-prefill steps) eagerly. Decode batches above a size run eagerly too: SGLang's
`cuda_graph_max_bs` defaults by the GPU's memory and the tensor-parallel size, the table below
(python/sglang/srt/server_args.py since sgl-project/sglang pull request 10372, September 2025; its
releases before then captured up to 160 on GPUs of 25 GB or more, so a scenario reproducing one of
those sets `cuda_graph_max_tokens = 160`). vLLM V0 captured up to 256, its default max_num_seqs.
vLLM V1 and TensorRT-LLM replay every step at any size.
"""

from __future__ import annotations

import math

# SGLang's defaults by the GPU's memory (ServerArgs._handle_gpu_memory_settings): (the memory below
# which a tier applies, in GiB, as server_args.py compares MiB; its chunked_prefill_size; its
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


def sglang_memory_tier(hbm_bytes: float) -> tuple[int, tuple[int, int]]:
    """SGLang's chunked_prefill_size and cuda_graph_max_bs pair for a GPU of `hbm_bytes`."""
    return next((chunk, sizes) for below_gib, chunk, sizes in SGLANG_GPU_MEMORY_TIERS if hbm_bytes < below_gib * 2**30)


def sglang_cuda_graph_max_bs(hbm_bytes: float, tp: int) -> int:
    """SGLang's default largest decode batch replayed as a graph, on a GPU of `hbm_bytes` at `tp`."""
    small_tp, large_tp = sglang_memory_tier(hbm_bytes)[1]
    return small_tp if tp < 4 else large_tp


# vLLM V0's captured decode batches: 1, 2, 4 and multiples of 8 up to 256 (vllm/worker/model_runner.py,
# _BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 * i for i in range(1, 33)]).
VLLM_V0_CUDA_GRAPH_MAX_BS = 256

