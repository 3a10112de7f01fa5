"""Model shapes: parameter counts against published totals, and reading Hugging Face config.json files."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tokenpath.compute import load_model
from tokenpath.config.errors import UserError


@pytest.mark.parametrize(
    ("name", "total", "active", "rel"),
    [
        ("llama-3.1-8b", 8.03e9, None, 0.01),
        ("llama-3.1-70b", 70.6e9, None, 0.01),
        ("llama-3.1-405b", 405.8e9, None, 0.01),
        ("llama-2-7b", 6.74e9, None, 0.01),
        ("mixtral-8x7b", 46.7e9, 12.9e9, 0.02),
        ("deepseek-v3", 671e9, 37e9, 0.02),
        # Qwen3's model cards (huggingface.co/Qwen/<model> README, "Number of Parameters").
        ("qwen3-8b", 8.2e9, None, 0.02),
        ("qwen3-32b", 32.8e9, None, 0.02),
        ("qwen3-235b-a22b", 235e9, 22e9, 0.02),
    ],
)
def test_parameter_counts_match_published_totals(name, total, active, rel):
    model = load_model(name)
    assert model.params_total() == pytest.approx(total, rel=rel)
    if active is None:
        assert model.params_active_per_token() == model.params_total()
    else:
        assert model.params_active_per_token() == pytest.approx(active, rel=rel)


def test_llama_8b_parameters_closed_form():
    h, layers, inter, vocab = 4096, 32, 14336, 128256
    attention = 2 * h * h + 2 * h * 1024
    expected = 2 * vocab * h + layers * (attention + 3 * h * inter + 2 * h) + h
    assert load_model("llama-3.1-8b").params_total() == expected


def test_model_kinds():
    assert not load_model("llama-3.1-70b").is_moe
    assert load_model("mixtral-8x7b").is_moe and not load_model("mixtral-8x7b").is_mla
    ds = load_model("deepseek-v3")
    assert ds.is_moe and ds.is_mla and ds.dense_layers == 3 and ds.moe_layers == 58


LLAMA_31_8B_CONFIG = {
    "_name_or_path": "meta-llama/Llama-3.1-8B",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}

DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "first_k_dense_replace": 3,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "tie_word_embeddings": False,
    "topk_group": 4,
    "v_head_dim": 128,
    "vocab_size": 129280,
}


@pytest.mark.parametrize(
    ("config", "catalog_name"),
    [(LLAMA_31_8B_CONFIG, "llama-3.1-8b"), (MIXTRAL_CONFIG, "mixtral-8x7b"), (DEEPSEEK_V3_CONFIG, "deepseek-v3")],
)
def test_hf_config_equals_catalog_entry(tmp_path, config, catalog_name):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    loaded = load_model(str(path))
    assert dataclasses.replace(loaded, name=catalog_name) == load_model(catalog_name)
    assert load_model(str(tmp_path)) == loaded  # a folder holding config.json


def test_hf_config_name_comes_from_name_or_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B_CONFIG))
    assert load_model(str(path)).name == "Llama-3.1-8B"


def test_hf_config_missing_field_names_file_and_field(tmp_path):
    config = dict(LLAMA_31_8B_CONFIG)
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config\.json: missing required field 'num_hidden_layers'"):
        load_model(str(path))


def test_hf_config_defaults_kv_heads_and_head_dim(tmp_path):
    config = {k: v for k, v in LLAMA_31_8B_CONFIG.items() if k != "num_key_value_heads"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = load_model(str(path))
    assert model.num_kv_heads == 32 and model.head_dim == 128


def test_hf_config_bad_json_and_missing_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(UserError, match="cannot read it as JSON"):
        load_model(str(path))
    with pytest.raises(UserError, match="file not found"):
        load_model(str(tmp_path / "nope.json"))


def test_hf_config_wrong_type_is_a_user_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_31_8B_CONFIG, "hidden_size": "4096"}))
    with pytest.raises(UserError, match="'hidden_size' must be a whole number"):
        load_model(str(path))


def test_fp8_block_scaling_is_true_or_false():
    deepseek = load_model("deepseek-v3")
    assert deepseek.fp8_block_scaled and not load_model("llama-3.1-70b").fp8_block_scaled
    with pytest.raises(UserError, match="deepseek-v3: fp8_block_scaled must be true or false, got 'yes'"):
        dataclasses.replace(deepseek, fp8_block_scaled="yes")
