"""Reading Hugging Face config.json files: every MoE and sliding-window convention in use, against the
published parameter counts of real models, and refusing what cannot be read.

The fixtures copy the fields of each model's config.json on the Hugging Face Hub that shape the model
(routing-only fields, token ids and RoPE settings left out)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.compute import load_chip, load_model
from tokenpath.compute.hf_config import read_hf_config
from tokenpath.compute.roofline import ComputeModel
from tokenpath.config.errors import UserError

QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
    "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}
QWEN2_57B_A14B = {  # Qwen/Qwen2-57B-A14B
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "decoder_sparse_step": 1,
    "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "moe_intermediate_size": 2560, "num_attention_heads": 28, "num_experts": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "shared_expert_intermediate_size": 20480,
    "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}
OLMOE_1B_7B = {  # allenai/OLMoE-1B-7B-0924
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024,
    "max_position_embeddings": 4096, "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 16, "num_key_value_heads": 16, "tie_word_embeddings": False, "vocab_size": 50304,
}
DEEPSEEK_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "first_k_dense_replace": 1,
    "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_routed_experts": 64, "n_shared_experts": 2,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False,
    "v_head_dim": 128, "vocab_size": 102400,
}
LLAMA4_SCOUT = {  # meta-llama/Llama-4-Scout-17B-16E (the language model sits under text_config)
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "tie_word_embeddings": False,
    "text_config": {
        "model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128, "hidden_size": 5120,
        "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "max_position_embeddings": 262144, "moe_layers": list(range(48)), "no_rope_layers": [1, 1, 1, 0] * 12,
        "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "num_local_experts": 16, "vocab_size": 202048,
    },
}
GPT_OSS_120B = {  # openai/gpt-oss-120b
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "experts_per_token": 4, "head_dim": 64,
    "hidden_size": 2880, "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "num_local_experts": 128, "sliding_window": 128, "tie_word_embeddings": False,
    "vocab_size": 201088,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
}
MISTRAL_7B_V01 = {  # mistralai/Mistral-7B-v0.1
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000,
}
GEMMA2_9B = {  # google/gemma-2-9b (no tie_word_embeddings: Gemma2Config ties them)
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 42,
    "num_key_value_heads": 8, "sliding_window": 4096, "vocab_size": 256000,
}
GEMMA3_27B = {  # google/gemma-3-27b-it's text_config, with the class defaults it leaves out filled in
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
        "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 62,
        "num_key_value_heads": 16, "sliding_window": 1024, "sliding_window_pattern": 6, "vocab_size": 262208,
    },
}


def read(tmp_path, config: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return load_model(str(path))


@pytest.mark.parametrize(
    ("config", "total", "active"),
    [
        (QWEN3_30B_A3B, 30.5e9, 3.3e9),      # Qwen3 model card: 30.5B total, 3.3B activated
        (QWEN2_57B_A14B, 57.4e9, 14.2e9),    # Qwen2 report: 57B total, 14B activated
        (OLMOE_1B_7B, 6.9e9, 1.3e9),         # OLMoE paper: 6.9B total, 1.3B active
        (DEEPSEEK_V2_LITE, 15.7e9, None),    # DeepSeek-V2 paper: 15.7B total
        (LLAMA4_SCOUT, 109e9, 17e9),         # Meta: 109B total (with its vision encoder), 17B active
        (GPT_OSS_120B, 116.83e9, None),      # gpt-oss model card: 116.83B total
    ],
)
def test_moe_configs_match_published_totals(tmp_path, config, total, active):
    model = read(tmp_path, config)
    assert model.is_moe
    assert model.params_total() == pytest.approx(total, rel=0.02)
    if active is not None:
        assert model.params_active_per_token() == pytest.approx(active, rel=0.02)


def test_qwen3_30b_a3b_weighs_57_gib_in_bf16(tmp_path):
    """The issue's case: it was read as dense, 6.2 GiB of weights."""
    model = read(tmp_path, QWEN3_30B_A3B)
    assert (model.num_experts, model.experts_per_token, model.moe_intermediate_size) == (128, 8, 768)
    compute = ComputeModel(model, load_chip("h100"), 1, "bf16", "bf16")
    assert compute.weight_bytes_per_chip / 2**30 == pytest.approx(56.9, rel=0.02)


QWEN3_14B = {  # Qwen/Qwen3-14B
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "vocab_size": 151936, "tie_word_embeddings": False,
}


@pytest.mark.parametrize("config, name", [(QWEN3_30B_A3B, "qwen3-30b-a3b"), (GPT_OSS_120B, "gpt-oss-120b"),
                                          (QWEN3_14B, "qwen3-14b")])
def test_the_catalog_entry_is_what_its_config_reads_as(tmp_path, config, name):
    assert dataclasses.replace(read(tmp_path, config), name=name) == load_model(name)


def test_gpt_oss_active_parameters_as_its_model_card_counts_them(tmp_path):
    """The card's 5.13B active counts the unembedding but not the embedding lookup."""
    model = read(tmp_path, GPT_OSS_120B)
    assert model.params_active_per_token() - 201088 * 2880 == pytest.approx(5.13e9, rel=0.02)


def test_shared_experts_of_each_family(tmp_path):
    assert read(tmp_path, QWEN2_57B_A14B).shared_intermediate_size == 20480
    assert read(tmp_path, DEEPSEEK_V2_LITE).shared_intermediate_size == 2 * 1408
    assert read(tmp_path, LLAMA4_SCOUT).shared_intermediate_size == 8192  # one expert-wide shared MLP, no key
    assert read(tmp_path, QWEN3_30B_A3B).shared_intermediate_size == 0
    assert read(tmp_path, OLMOE_1B_7B).shared_intermediate_size == 0


@pytest.mark.parametrize(
    ("config", "changes", "dense"),
    [
        (DEEPSEEK_V2_LITE, {}, 1),                                          # first_k_dense_replace
        (DEEPSEEK_V2_LITE, {"moe_layer_freq": 2}, 1 + 13),                  # and only even layers from there
        (QWEN3_30B_A3B, {"decoder_sparse_step": 2}, 24),                    # (layer + 1) % 2 == 0
        (QWEN3_30B_A3B, {"mlp_only_layers": [0, 47]}, 2),
        (QWEN3_30B_A3B, {"decoder_sparse_step": 2, "mlp_only_layers": [0, 1]}, 25),
        (OLMOE_1B_7B, {}, 0),
        (LLAMA4_SCOUT, {}, 0),
    ],
)
def test_which_layers_have_experts(tmp_path, config, changes, dense):
    assert read(tmp_path, {**config, **changes}).dense_mlp_layers == dense


def test_llama4_maverick_interleaves_dense_layers_of_their_own_width(tmp_path):
    text = {k: v for k, v in LLAMA4_SCOUT["text_config"].items() if k != "moe_layers"}
    model = read(tmp_path, {**LLAMA4_SCOUT, "text_config": {**text, "interleave_moe_layer_step": 2,
                                                            "num_local_experts": 128}})
    assert (model.dense_mlp_layers, model.intermediate_size, model.moe_intermediate_size) == (24, 16384, 8192)
    assert model.params_total() == pytest.approx(400e9, rel=0.02)        # Meta: 400B total
    assert model.params_active_per_token() == pytest.approx(17e9, rel=0.02)


@pytest.mark.parametrize(
    ("config", "window", "sliding"),
    [
        (MISTRAL_7B_V01, 4096, 32),         # every layer
        (GEMMA2_9B, 4096, 21),              # alternating, fixed by Gemma 2's modeling code
        (GEMMA3_27B, 1024, 52),             # 5 local : 1 global
        (GPT_OSS_120B, 128, 18),            # layer_types
        (LLAMA4_SCOUT, 8192, 36),           # chunked attention on the RoPE layers
        ({**QWEN2_57B_A14B, "use_sliding_window": True}, 0, 0),  # window as long as the context: full
        ({**QWEN3_30B_A3B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28}, 4096, 20),
        (QWEN3_30B_A3B, 0, 0),
        ({**GEMMA3_27B["text_config"], "sliding_window_pattern": 2}, 1024, 31),
        ({**GEMMA3_27B["text_config"], "layer_types": ["sliding_attention"] * 60 + ["full_attention"] * 2},
         1024, 60),
    ],
)
def test_sliding_window_layers(tmp_path, config, window, sliding):
    model = read(tmp_path, config)
    assert (model.sliding_window, model.sliding_layers) == (window, sliding)


def test_gemma_ties_embeddings_unless_told(tmp_path):
    assert read(tmp_path, GEMMA2_9B).tie_word_embeddings
    assert read(tmp_path, GEMMA2_9B).params_total() == pytest.approx(9.24e9, rel=0.01)
    assert not read(tmp_path, {**GEMMA2_9B, "tie_word_embeddings": False}).tie_word_embeddings
    assert not read(tmp_path, MISTRAL_7B_V01).tie_word_embeddings


FP8_BLOCKS = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


@pytest.mark.parametrize(("quantization", "block_scaled"), [
    (FP8_BLOCKS, True),                                                     # DeepSeek-V3, Qwen3 FP8
    ({"activation_scheme": "dynamic", "quant_method": "fp8"}, False),       # per-tensor fp8
    ({"quant_method": "compressed-tensors", "weight_block_size": [128, 128]}, False),
    (None, False),
])
def test_fp8_weights_scaled_per_block_are_read_from_the_quantization_config(tmp_path, quantization, block_scaled):
    config = {**DEEPSEEK_V2_LITE, **({"quantization_config": quantization} if quantization else {})}
    assert read(tmp_path, config).fp8_block_scaled is block_scaled


@pytest.mark.parametrize(("quantization", "fp4_format"), [
    ({"quant_method": "mxfp4"}, "mxfp4"),                                   # gpt-oss
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),         # NVIDIA's FP4 checkpoints
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, ""),
    (FP8_BLOCKS, ""),
    (None, ""),
])
def test_an_fp4_checkpoints_format_is_read_from_the_quantization_config(tmp_path, quantization, fp4_format):
    config = {**DEEPSEEK_V2_LITE, **({"quantization_config": quantization} if quantization else {})}
    assert read(tmp_path, config).fp4_format == fp4_format


@pytest.mark.parametrize(("fields", "mtp_layers"), [
    ({"num_nextn_predict_layers": 1}, 1),   # DeepSeek-V3, GLM-4.5, MiMo
    ({"mtp_num_hidden_layers": 1}, 1),      # Qwen3-Next
    ({"num_nextn_predict_layers": 0}, 0),
    ({}, 0),
])
def test_a_checkpoints_multi_token_prediction_layers_are_read(tmp_path, fields, mtp_layers):
    assert read(tmp_path, {**DEEPSEEK_V2_LITE, **fields}).mtp_layers == mtp_layers


@pytest.mark.parametrize("block", [[128], [0, 128], "128x128", [128.0, 128], [True, 128]])
def test_a_block_size_that_is_not_two_positive_whole_numbers_is_refused(tmp_path, block):
    with pytest.raises(UserError, match="config.json: quantization_config.weight_block_size must be two positive"):
        read(tmp_path, {**DEEPSEEK_V2_LITE, "quantization_config": {**FP8_BLOCKS, "weight_block_size": block}})


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({**QWEN3_30B_A3B, "layer_types": ["linear_attention", "full_attention"] * 24}, "layer_types"),  # Qwen3-Next
        ({**MISTRAL_7B_V01, "attn_layer_period": 8, "num_experts": 16}, "attn_layer_period"),         # Jamba
        ({**MISTRAL_7B_V01, "hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern"),            # Nemotron-H
        ({**MISTRAL_7B_V01, "mamba_d_state": 16}, "mamba_d_state"),
        ({**MISTRAL_7B_V01, "moe_num_experts": 64, "moe_k": 6}, "moe_num_experts"),                     # Ernie 4.5
        ({**QWEN3_30B_A3B, "moe_topk": [8] * 48}, "moe_topk"),                                         # Hunyuan
        ({**QWEN3_30B_A3B, "num_shared_experts": 1}, "num_shared_experts"),                            # Bailing
        ({**MISTRAL_7B_V01, "num_experts_per_tok": 2}, "num_experts_per_tok"),
        ({**MISTRAL_7B_V01, "num_experts_per_tok": 2, "num_local_experts": 0}, "num_local_experts"),
        ({**MISTRAL_7B_V01, "num_attention_heads": 0}, "num_attention_heads"),
        ({**DEEPSEEK_V2_LITE, "index_topk": 2048}, "index_topk"),                                      # V3.2
        ({**GPT_OSS_120B, "layer_types": ["sliding_attention"] * 35}, "layer_types"),
    ],
)
def test_unreadable_structure_is_refused_naming_the_key(tmp_path, config, key):
    with pytest.raises(UserError, match=f"config.json: .*'{key}'") as error:
        read(tmp_path, config)
    assert "\n" not in str(error.value)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 200) | st.floats(allow_nan=False)
                     | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                     max_leaves=8)
_KEYS = sorted({key for config in (QWEN3_30B_A3B, QWEN2_57B_A14B, DEEPSEEK_V2_LITE, GPT_OSS_120B, GEMMA2_9B)
                for key in config} | {"moe_layers", "no_rope_layers", "attention_chunk_size", "sliding_window_pattern",
                                      "quantization_config"})


@settings(max_examples=150, deadline=None)
@given(base=st.sampled_from([QWEN3_30B_A3B, DEEPSEEK_V2_LITE, GPT_OSS_120B, LLAMA4_SCOUT["text_config"], GEMMA2_9B]),
       changes=st.dictionaries(st.sampled_from(_KEYS), _JSON | st.integers(0, 64), max_size=3))
def test_any_config_reads_or_is_refused_in_one_line(tmp_path_factory, base, changes):
    path = tmp_path_factory.mktemp("config") / "config.json"
    path.write_text(json.dumps({**base, **changes}))
    try:
        model = read_hf_config(path)
    except UserError as error:
        assert "\n" not in str(error) and str(path) in str(error)
    else:
        assert model.moe_layers + model.dense_layers >= model.num_layers
        assert model.sliding_layers <= model.num_layers
        names = {**base, **changes}.get("architectures")  # the model class: its first name, if a string
        named = isinstance(names, list) and names and isinstance(names[0], str)
        assert model.architecture == (names[0].strip() if named else "")


def test_a_multimodal_wrappers_quantization_and_tying_reach_its_language_model(tmp_path):
    # Qwen3-VL FP8 and NVFP4 checkpoints, Gemma-3: the wrapper holds quantization_config and
    # tie_word_embeddings beside text_config; text_config's own value wins where it has one.
    wrapper = {"model_type": "llama4", "text_config": LLAMA4_SCOUT["text_config"], "quantization_config": FP8_BLOCKS}
    assert read(tmp_path, wrapper).fp8_block_scaled
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    assert read(tmp_path, {**wrapper, "quantization_config": nvfp4}).fp4_format == "nvfp4"
    untied = {**LLAMA4_SCOUT["text_config"], "tie_word_embeddings": False}
    assert read(tmp_path, {**wrapper, "tie_word_embeddings": True}).tie_word_embeddings
    assert not read(tmp_path, {**wrapper, "tie_word_embeddings": True, "text_config": untied}).tie_word_embeddings
