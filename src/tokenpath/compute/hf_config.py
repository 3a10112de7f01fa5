"""A Hugging Face config.json read into a ModelSpec.

Each convention below is the one transformers' configuration_*.py and modeling_*.py use for that
family; a config whose structure is none of them (Mamba or linear-attention layers, an MoE layout
under other keys) is refused with the key that shows it, rather than read as something else.

MoE: the expert count is `num_local_experts` (Mixtral, Llama 4, gpt-oss, Granite, PhiMoE),
`n_routed_experts` (DeepSeek V2/V3, Kimi K2, GLM-4.5, dots.llm1) or `num_experts` (Qwen2-MoE,
Qwen3-MoE, OLMoE); each expert is `moe_intermediate_size` wide, or `intermediate_size` where there
is no such key (Mixtral, OLMoE, Llama 4, gpt-oss). Which layers have experts, as each family's
decoder layer decides:
- DeepSeek: `layer >= first_k_dense_replace and layer % moe_layer_freq == 0`;
- Qwen2/3-MoE: `layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0`;
- Llama 4: `layer in moe_layers`, by default every `interleave_moe_layer_step`-th layer;
- otherwise every layer.
Dense layers are `intermediate_size` wide (Llama 4: `intermediate_size_mlp`). Shared experts:
DeepSeek's `n_shared_experts` of the expert width, Qwen2-MoE's `shared_expert_intermediate_size`,
Granite's and MiniMax's `shared_intermediate_size`, and Llama 4's one shared expert of
`intermediate_size` (its modeling code adds it; the config has no key for it).

Sliding-window attention: `layer_types` where the config lists them ("sliding_attention" layers
attend `sliding_window` positions; Llama 4's "chunked_attention" layers at most
`attention_chunk_size`); else Qwen's `use_sliding_window` (layers from `max_window_layers` on slide);
else `sliding_window_pattern` p (every p-th layer is global, Gemma 3, Cohere2); else the family's
fixed pattern (Gemma 2 alternates, Gemma 3 is 5 local : 1 global, Cohere2 3 : 1); else, with a
`sliding_window`, every layer slides (Mistral 7B v0.1, Phi-3, Starcoder2).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenpath.compute.model_spec import ModelSpec
from tokenpath.config import files
from tokenpath.config.errors import UserError

# Keys whose presence (with a true value) means layers tokenpath does not model.
_UNMODELLED = {
    "hybrid_override_pattern": "Mamba layers (Nemotron-H)",
    "layers_block_type": "Mamba layers (Jamba, Zamba, Granite 4 hybrids)",
    "attn_layer_period": "Mamba layers between attention layers (Jamba)",
    "expert_layer_period": "experts on every k-th layer under Jamba's keys",
    "linear_attn_config": "linear-attention layers",
    "index_topk": "sparse attention over the top-k positions (DeepSeek V3.2)",
    "num_kv_shared_layers": "layers that share another layer's KV cache (Gemma 3n)",
    "ffn_config": "DBRX's nested MoE table",
    "attn_type_list": "lightning (linear) attention layers (MiniMax-Text-01)",
}
_UNMODELLED_PREFIXES = ("mamba_", "ssm_", "linear_")

# MoE keys read here, and MoE keys that change routing but not weights, FLOPs or bytes.
_MOE_KEYS = {
    "num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
    "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size", "moe_layer_freq",
    "moe_layers", "interleave_moe_layer_step",
}
_LAYER_KINDS = ("full_attention", "sliding_attention", "chunked_attention")

# The fields a multimodal wrapper's config holds for its language model, outside text_config.
_WRAPPER_KEYS = ("quantization_config", "tie_word_embeddings")

# Families whose modeling code fixes the local/global pattern when the config does not list it:
# every p-th layer (1-based) is global. transformers: Gemma2 `not bool(layer_idx % 2)` sliding,
# Gemma3TextConfig sliding_window_pattern = 6, Cohere2Config sliding_window_pattern = 4.
_FAMILY_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}
# Config classes that tie the LM head to the embeddings when config.json does not say (Gemma*Config,
# Cohere*Config: tie_word_embeddings=True; the others read here default to False).
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "cohere", "cohere2"}
# Llama4TextConfig: layers with RoPE use chunked attention, every no_rope_layer_interval-th has none.
_LLAMA4_NO_ROPE_INTERVAL = 4


# Where configs give their routed experts' count (Mixtral, DeepSeek, Qwen MoE), in the order read.
EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")


class _Config:
    """The config's fields, with errors that name the file and the key."""

    def __init__(self, path: Path, table: dict) -> None:
        self.path, self.table = path, table

    def error(self, message: str) -> UserError:
        return UserError(f"model config {self.path}: {message}")

    def has(self, key: str) -> bool:
        return self.table.get(key) not in (None, False, 0, [], "")

    def int(self, key: str, default: int = 0, required: bool = False) -> int:
        value = self.table.get(key)
        if value is None:
            if required:
                raise self.error(f"missing required field {key!r}; add it from the model's config.json "
                                 f"(or its config class's default)")
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.error(f"field {key!r} must be a whole number of 0 or more, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.table.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"field {key!r} must be true or false, got {value!r}")
        return value

    def text(self, key: str) -> str:
        value = self.table.get(key)
        return value if isinstance(value, str) else ""

    def kinds(self, key: str, layers: int) -> list:
        """A list of one entry per layer (layer_types, no_rope_layers), or a one-line error."""
        value = self.table.get(key)
        if not isinstance(value, list) or len(value) != layers:
            raise self.error(f"field {key!r} must list one entry for each of the {layers} layers "
                             f"(num_hidden_layers), got {value!r}")
        return value

    def layer_list(self, key: str, layers: int) -> list[int]:
        value = self.table.get(key) or []
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                   and 0 <= i < layers for i in value):
            raise self.error(f"field {key!r} must list layer numbers from 0 to {layers - 1}, got {value!r}")
        return value


def read_hf_config(path: Path) -> ModelSpec:
    if not files.exists(path):
        files.check_path(path, "model config")
        raise UserError(f"model config {files.shown(path)}: file not found; give a catalog name (`tokenpath models`) "
                        f"or the path of a Hugging Face config.json")
    text = files.read_text(path, "model config")  # a regular file of bounded size
    try:
        table = json.loads(text)
    except RecursionError:
        raise UserError(f"model config {files.shown(path)}: cannot read it as JSON (nested too deep); give a "
                        "Hugging Face config.json") from None
    except ValueError as exc:  # invalid JSON, or an integer of more digits than Python converts
        raise UserError(f"model config {files.shown(path)}: cannot read it as JSON ({str(exc).split(';')[0]}); "
                        "give a Hugging Face config.json") from None
    if not isinstance(table, dict):
        raise UserError(f"model config {files.shown(path)}: expected a JSON object of config fields")
    name = path.parent.name or path.stem
    if isinstance(table.get("_name_or_path"), str) and table["_name_or_path"].strip():
        name = table["_name_or_path"].strip().rstrip("/").rsplit("/", 1)[-1][:200]
    architecture = _architecture(table)  # (a multimodal wrapper's: the class its engines load)
    if isinstance(table.get("text_config"), dict) and "hidden_size" not in table:
        # Multimodal wrappers keep the language model's shape in text_config, and its quantization and
        # tying on the wrapper (vLLM reads quantization_config from the top-level hf_config).
        table = {**{key: table[key] for key in _WRAPPER_KEYS if key in table}, **table["text_config"]}
    config = _Config(path, table)
    _refuse_unmodelled(config)

    layers = config.int("num_hidden_layers", required=True)
    heads = config.int("num_attention_heads", required=True)
    if heads == 0:
        raise config.error("'num_attention_heads' is 0; a model attends with one head or more: give the config's "
                           "value")
    mla = {key: config.int(key) for key in
           ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    if mla["kv_lora_rank"]:
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    elif heads == 0 or config.int("hidden_size", required=True) % heads:
        head_dim = config.int("head_dim", required=True)
    else:
        head_dim = config.int("head_dim", config.int("hidden_size") // heads)
    window, sliding_layers = _sliding(config, layers)
    shape = dict(
        name=name,
        hidden_size=config.int("hidden_size", required=True),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=config.int("num_key_value_heads", heads),
        head_dim=head_dim,
        vocab_size=config.int("vocab_size", required=True),
        tie_word_embeddings=config.flag("tie_word_embeddings", config.text("model_type") in _TIED_BY_DEFAULT),
        max_context=config.int("max_position_embeddings", required=True),
        sliding_window=window,
        sliding_layers=sliding_layers,
        fp8_block_scaled=_fp8_block_scaled(config),
        fp4_format=_fp4_format(config),
        architecture=architecture,
        mtp_layers=config.int("num_nextn_predict_layers", config.int("mtp_num_hidden_layers")),
        **_mlp(config, layers),
        **mla,
    )
    try:
        return ModelSpec(**shape)
    except UserError as error:  # a shape that does not hold together: name the file, not the model
        raise config.error(str(error).removeprefix(f"model {name}: ")) from None


def _architecture(table: dict) -> str:
    """The model class the config names (`architectures`, a list of one in Hugging Face's configs), or ""
    where it names none: engines map it to their model code."""
    names = table.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0].strip()[:200]
    return ""


def _fp8_block_scaled(config: _Config) -> bool:
    """Whether the checkpoint's fp8 weights are scaled per block: quantization_config's quant_method
    "fp8" with a weight_block_size (DeepSeek-V3: [128, 128])."""
    quantization = config.table.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "fp8":
        return False
    block = quantization.get("weight_block_size")
    if block is None:
        return False
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in block)):
        raise config.error(f"quantization_config.weight_block_size must be two positive whole numbers "
                           f"(rows, columns), got {block!r}")
    return True


def _fp4_format(config: _Config) -> str:
    """The block-scaled fp4 format of the checkpoint's weights, if any: quantization_config's quant_method
    "mxfp4" (gpt-oss), or "modelopt" with quant_algo "NVFP4" (NVIDIA's checkpoints); else ""."""
    quantization = config.table.get("quantization_config")
    if not isinstance(quantization, dict):
        return ""
    if quantization.get("quant_method") == "mxfp4":
        return "mxfp4"
    if quantization.get("quant_method") == "modelopt" and quantization.get("quant_algo") == "NVFP4":
        return "nvfp4"
    return ""


def _refuse_unmodelled(config: _Config) -> None:
    for key, value in config.table.items():
        if not config.has(key):
            continue
        if key in _UNMODELLED:
            raise config.error(f"{key!r} describes {_UNMODELLED[key]}, which tokenpath does not model; "
                               f"use a model of attention and MLP or MoE layers")
        if key.startswith(_UNMODELLED_PREFIXES):
            raise config.error(f"{key!r} belongs to Mamba or linear-attention layers, which tokenpath does not "
                               f"model; use a model of attention and MLP or MoE layers")
        if ("expert" in key or key.startswith("moe_")) and key not in _MOE_KEYS:
            raise config.error(f"{key!r} = {value!r} is an MoE setting tokenpath does not read, so the layout of "
                               f"the experts is unknown; describe the model in a catalog entry instead")
    kinds = config.table.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list):
            raise config.error(f"field 'layer_types' must list each layer's kind, got {kinds!r}")
        unknown = [kind for kind in kinds if kind not in _LAYER_KINDS]
        if unknown:
            raise config.error(f"'layer_types' has {unknown[0]!r} layers, which tokenpath does not model; "
                               f"it reads {', '.join(_LAYER_KINDS)}")


def _mlp(config: _Config, layers: int) -> dict[str, int]:
    """The dense MLP and MoE fields of ModelSpec."""
    experts = next((count for key in EXPERT_COUNT_KEYS if (count := config.int(key))), 0)
    intermediate = config.int("intermediate_size", required=True)
    if not experts:
        if config.has("num_experts_per_tok"):
            given = next((key for key in EXPERT_COUNT_KEYS if config.table.get(key) is not None), None)
            if given is not None:  # (given as 0)
                raise config.error(f"'num_experts_per_tok' is set but {given!r} is 0; give the expert count, or "
                                   "remove num_experts_per_tok for a dense model")
            raise config.error("'num_experts_per_tok' is set but no expert count (num_local_experts, "
                               "n_routed_experts or num_experts); add the count")
        return {"intermediate_size": intermediate}
    if config.has("moe_layers"):
        moe = set(config.layer_list("moe_layers", layers))
    else:
        dense_below = config.int("first_k_dense_replace")
        freq = config.int("moe_layer_freq", 1) or 1
        step = config.int("decoder_sparse_step", 1) or 1
        interleave = config.int("interleave_moe_layer_step", 1) or 1
        dense_listed = set(config.layer_list("mlp_only_layers", layers))
        moe = {i for i in range(layers) if i >= dense_below and i % freq == 0 and (i + 1) % step == 0
               and (i + 1) % interleave == 0 and i not in dense_listed}
    expert_width = config.int("moe_intermediate_size", intermediate)
    llama4 = config.text("model_type").startswith("llama4")
    shared = (config.int("n_shared_experts") * expert_width + config.int("shared_expert_intermediate_size")
              + config.int("shared_intermediate_size") + (expert_width if llama4 else 0))
    return {
        "intermediate_size": config.int("intermediate_size_mlp", intermediate),
        "num_experts": experts,
        "experts_per_token": config.int("num_experts_per_tok", required=True),
        "moe_intermediate_size": expert_width,
        "shared_intermediate_size": shared,
        "dense_mlp_layers": layers - len(moe),
    }


def _sliding(config: _Config, layers: int) -> tuple[int, int]:
    """(window, layers that use it); (0, 0) without sliding-window attention."""
    kinds = config.kinds("layer_types", layers) if config.table.get("layer_types") is not None else None
    if kinds is None and config.int("attention_chunk_size"):  # Llama 4 before its configs listed layer_types
        if config.table.get("no_rope_layers"):
            rope = config.kinds("no_rope_layers", layers)
        else:
            interval = config.int("no_rope_layer_interval", _LLAMA4_NO_ROPE_INTERVAL) or _LLAMA4_NO_ROPE_INTERVAL
            rope = [int((i + 1) % interval != 0) for i in range(layers)]
        kinds = ["chunked_attention" if uses_rope else "full_attention" for uses_rope in rope]
    if kinds is not None:
        sliding, chunked = kinds.count("sliding_attention"), kinds.count("chunked_attention")
        if sliding and chunked:
            raise config.error("'layer_types' mixes sliding_attention and chunked_attention layers, which "
                               "tokenpath does not model together")
        if chunked:
            window, count = config.int("attention_chunk_size", required=True), chunked
        else:
            window, count = (config.int("sliding_window", required=True), sliding) if sliding else (0, 0)
    else:
        window = config.int("sliding_window")
        if "use_sliding_window" in config.table:  # Qwen2 / Qwen3 and their MoE versions
            slides = config.flag("use_sliding_window", False)
            count = max(0, layers - config.int("max_window_layers", required=slides)) if slides else 0
        else:
            pattern = config.int("sliding_window_pattern") or _FAMILY_PATTERN.get(config.text("model_type"), 0)
            count = sum(1 for i in range(layers) if (i + 1) % pattern) if pattern else layers
    if window == 0 or count == 0 or window >= config.int("max_position_embeddings", required=True):
        return 0, 0  # a window as long as the context is full attention
    return window, count
