"""Which models an engine can run with attention data-parallel, where its model code decides.

SGLang builds attention data-parallel into each model's file: a model's attention splits its heads over
the attention-TP group (`get_parallel().attn_tp_size`: `--tp-size` over `--attn-dp-size`, which replaces
`--dp-size` with `--enable-dp-attention`) only where that file says so. Read in the sglang 0.5.23 wheel
(sglang/srt/models/): the files whose attention divides its heads by `attn_tp_size`, and the classes each
registers (`EntryClass`), a Hugging Face config's `architectures`. Llama's (llama.py: LlamaForCausalLM,
also Phi-3's and InternLM3's), Mistral's, Mixtral's (mixtral.py) and Qwen2's (qwen2.py) split their heads
over the whole TP group (`get_parallel().tp_size`), so their ranks would each hold a share of every
sequence's heads while running batches of their own; server_args.py checks no model before starting.
vLLM's data-parallel engines and TensorRT-LLM's ranks run any model's attention whole (engine/profiles.py).
"""

from __future__ import annotations

SGLANG_ATTENTION_DP_ARCHITECTURES = frozenset({
    "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",  # bailing_moe.py
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",  # deepseek_v2.py
    "DeepseekV4ForCausalLM",  # deepseek_v4.py
    "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM",  # exaone_moe.py
    "FalconH1ForCausalLM",  # falcon_h1.py
    "Glm4MoeForCausalLM", "GlmMoeDsaForCausalLM",  # glm4_moe.py
    "GptOssForCausalLM",  # gpt_oss.py
    "IQuestQ1ForCausalLM",  # iquest_q1.py
    "KimiK3LinearForCausalLM",  # kimi_k3.py
    "KimiLinearForCausalLM",  # kimi_linear.py
    "LagunaForCausalLM",  # laguna.py
    "Llama4ForCausalLM",  # llama4.py
    "MellumForCausalLM",  # mellum.py
    "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM",  # mimo_v2.py
    "MiniMaxM2ForCausalLM",  # minimax_m2.py
    "MiniMaxM3SparseForCausalLM",  # minimax_m3.py
    "PhiMoEForCausalLM",  # phimoe.py
    "Qwen2MoeForCausalLM",  # qwen2_moe.py
    "Qwen3ForCausalLM",  # qwen3.py
    "Qwen3MoeForCausalLM",  # qwen3_moe.py
    "Qwen3NextForCausalLM",  # qwen3_next.py
    "SarvamMLAForCausalLM", "SarvamMoEForCausalLM",  # sarvam_moe.py
    "SDARForCausalLM",  # sdar.py
    "SDARMoeForCausalLM",  # sdar_moe.py
    "Spark2_5ForCausalLM",  # spark2_5.py
    "Step3p5ForCausalLM",  # step3p5.py
    "XllmForCausalLM", "K2HorizonForCausalLM",  # xllm.py
    "ZayaForCausalLM",  # zaya.py
})
