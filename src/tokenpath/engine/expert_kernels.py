"""How long each engine's routed-expert kernels take where it runs MXFP4 weights weight-only, as a
multiple of the roofline time compute/roofline.py gives them.

An MXFP4 checkpoint's experts (gpt-oss's) run natively on a chip with FP4 tensor cores (Blackwell); on
Hopper the engines dequantize the weights to bf16 inside the grouped GEMM (`w4a16`: vLLM's and
SGLang's Triton MXFP4 kernels, TensorRT-LLM's). NVIDIA's AIConfigurator measured each engine's MoE
kernels per release (`aiconfigurator-core`, `systems/data/<chip>/moe/<engine>/<version>/
moe_perf.parquet`, `w4a16_mxfp4`): at the decode batches of serving (8 to 1,024 tokens) on H100 and H200,
at tensor-parallel sizes 1 to 8, the experts take these multiples of the model's roofline time, beyond
their kernels' fixed time (benchmarks/aiconfigurator_mxfp4.py, the median over the tables of each
table's median): vLLM 1.73 (0.19.0 and 0.24.0, 1.30 to 2.14), SGLang 4.42 (0.5.14, 4.18 to 4.57),
TensorRT-LLM 1.67 (1.3.0rc10 and rc20, H200 at TP1 only). The bf16 and block-scaled fp8 experts of the
same tables read 0.5 to 1.5 times the model's time: the weight-only MXFP4 path is the one the roofline
misses.

The multiple is applied on Hopper alone (`MEASURED_GENERATIONS`), to MXFP4 experts run weight-only:
- no table measures an Ampere chip's or AMD's MXFP4 kernels (vLLM's Marlin on A100 is another kernel),
  so there the roofline stands;
- on B200, where the experts run natively (`w4a8_mxfp4_mxfp8`), SGLang's tables read 1.25 to 2.0 and
  TensorRT-LLM's 1.07, and the project's B200 rows (SGLang 0.5.6, gpt-oss-120b at TP8) already measure
  faster than the model: not applied.
Releases older than the tables take their figure: nothing measures 2025's releases' kernels apart.
"""

from __future__ import annotations

from typing import Literal

from tokenpath.config.assumptions import assumed, default

WeightOnlyExperts = Literal["vllm_mxfp4_weight_only_expert_time", "sglang_mxfp4_weight_only_expert_time",
                            "trtllm_mxfp4_weight_only_expert_time"]

VLLM_MXFP4_WEIGHT_ONLY_EXPERT_TIME = default("vllm_mxfp4_weight_only_expert_time")
SGLANG_MXFP4_WEIGHT_ONLY_EXPERT_TIME = default("sglang_mxfp4_weight_only_expert_time")
TRTLLM_MXFP4_WEIGHT_ONLY_EXPERT_TIME = default("trtllm_mxfp4_weight_only_expert_time")

# The chip generations whose weight-only MXFP4 expert kernels a table measures (catalog/chips.toml's generation).
MEASURED_GENERATIONS = ("Hopper",)


def weight_only_expert_time(work: WeightOnlyExperts, generation: str) -> float:
    """The multiple of the roofline an engine's weight-only MXFP4 experts take on a chip of `generation`
    (the run's value of its registry figure where a table measured that generation, else 1)."""
    if generation not in MEASURED_GENERATIONS:
        return 1.0
    return {"vllm_mxfp4_weight_only_expert_time": assumed("vllm_mxfp4_weight_only_expert_time",
                                                          VLLM_MXFP4_WEIGHT_ONLY_EXPERT_TIME),
            "sglang_mxfp4_weight_only_expert_time": assumed("sglang_mxfp4_weight_only_expert_time",
                                                            SGLANG_MXFP4_WEIGHT_ONLY_EXPERT_TIME),
            "trtllm_mxfp4_weight_only_expert_time": assumed("trtllm_mxfp4_weight_only_expert_time",
                                                            TRTLLM_MXFP4_WEIGHT_ONLY_EXPERT_TIME)}[work]
