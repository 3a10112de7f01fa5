"""How an engine's KV pool holds the layers of a sliding-window model (gpt-oss: every other layer attends
the last 128 positions), as a share of the tokens the full-attention layers hold.

vLLM V1's hybrid KV-cache manager frees the blocks that fall out of a window, so its sliding layers hold
a window per sequence (compute/roofline.ComputeModel.kv_capacity_tokens' second bound): no ratio here.

SGLang sizes two pools instead: the full-attention layers' tokens and, beside them, the sliding layers'
at `--swa-full-tokens-ratio` of those (0.8 by default), each token of the pool costing
full + ratio x sliding bytes (model_executor/pool_configurator.py, the hybrid pool's cell size, in
0.5.23); with `disable_hybrid_swa_memory` every layer holds every token (a ratio of 1). For gpt-oss
(server_args.py, the GptOssForCausalLM branch, read in each release's wheel on PyPI):
- up to 0.5.7 hybrid memory is always off;
- 0.5.8 and 0.5.9 turn it off with the trtllm_mha attention backend, the default on Blackwell
  (sm100), and with speculative decoding;
- from 0.5.10 it stays on.
SGLang sizes the split pool only for the architectures it lists as hybrid (configs/model_config.py,
`is_hybrid_swa_model`, and its SWA_SINK_ARCHS, in 0.5.23: gpt-oss, Llama 4, Gemma 4 and a few others,
`SGLANG_HYBRID_SWA_ARCHITECTURES`); every other sliding-window model (Mistral 7B v0.1, Gemma 2 and 3,
whose model overrides also set disable_hybrid_swa_memory, Phi-3, Cohere 2) holds every token in every
layer. Before 0.5.23 the list was not read here; its rule is taken as 0.5.23's.
"""

from __future__ import annotations

from tokenpath.engine.release import release_at_least

SGLANG_SWA_FULL_TOKENS_RATIO = 0.8
"""SGLang's --swa-full-tokens-ratio default (server_args.py, swa_full_tokens_ratio = 0.8, 0.5.x)."""


# The model classes SGLang 0.5.23 gives a hybrid sliding-window pool (configs/model_config.py:
# is_hybrid_swa_model's hybrid_swa_archs and SWA_SINK_ARCHS; a config may also opt in, `is_hybrid_swa`).
SGLANG_HYBRID_SWA_ARCHITECTURES = frozenset({
    "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "Llama4ForConditionalGeneration",
    "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Step3p5ForCausalLM", "MellumForCausalLM",
    "LagunaForCausalLM", "DeepseekV4ForCausalLM",
})


def sglang_sliding_pool_ratio(release: str | None, generation: str, speculative: bool, architecture: str) -> float:
    """The sliding layers' tokens per full-attention token in SGLang's KV pool for a model of
    `architecture` (1: every layer holds every token)."""
    if architecture not in SGLANG_HYBRID_SWA_ARCHITECTURES:
        return 1.0
    if architecture == "GptOssForCausalLM":
        if not release_at_least(release, "0.5.8"):
            return 1.0
        if not release_at_least(release, "0.5.10") and (generation == "Blackwell" or speculative):
            return 1.0
    return SGLANG_SWA_FULL_TOKENS_RATIO


def every_layer(release: str | None, generation: str, speculative: bool, architecture: str) -> float:
    """An engine without a hybrid pool (vLLM V0): every layer holds every token."""
    return 1.0
