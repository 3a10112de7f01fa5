"""A decoder-only transformer's shape, from the embedded catalog or a Hugging Face config.json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from tokenpath import catalog, files
from tokenpath.errors import UserError, quoted

# Every dimension of a model fits a signed 32-bit int, as in Hugging Face configs; the largest real
# ones (vocabularies, context lengths) are about 2^18 to 2^24.
MAX_DIMENSION = 2**31 - 1


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a Llama-style decoder: RMSNorm, SwiGLU MLP or MoE, GQA or MLA attention.

    MoE fields are zero for dense models, MLA fields zero for models with standard attention. For MLA
    `head_dim` is the query/key head width (qk_nope_head_dim + qk_rope_head_dim). Biases are not
    modelled.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_context: int
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "int" and (not isinstance(value, int) or isinstance(value, bool)
                                        or not 0 <= value <= MAX_DIMENSION):
                raise UserError(f"model {self.name}: {field.name} must be a whole number from 0 to {MAX_DIMENSION}, "
                                f"got {quoted(value)}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise UserError(f"model {self.name}: tie_word_embeddings must be true or false, "
                            f"got {self.tie_word_embeddings!r}")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                     "max_context"):
            if getattr(self, name) == 0:
                raise UserError(f"model {self.name}: {name} must be positive")
        # Grouped-query attention: each KV head serves a whole group of query heads.
        if not self.is_mla and (self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads):
            raise UserError(f"model {self.name}: {self.num_kv_heads} KV heads (num_key_value_heads) must divide "
                            f"the {self.num_heads} attention heads (num_attention_heads)")
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise UserError(f"model {self.name}: experts_per_token must be between 1 and num_experts "
                                f"({self.num_experts}), got {self.experts_per_token}")
            if self.moe_intermediate_size == 0:
                raise UserError(f"model {self.name}: an MoE model needs moe_intermediate_size > 0")
            if self.first_dense_layers > self.num_layers:
                raise UserError(f"model {self.name}: first_dense_layers ({self.first_dense_layers}) "
                                f"exceeds num_layers ({self.num_layers})")
        if self.dense_layers and self.intermediate_size == 0:
            raise UserError(f"model {self.name}: intermediate_size must be positive for its dense MLP layers")
        if self.kv_lora_rank and (self.qk_rope_head_dim == 0 or self.qk_nope_head_dim == 0 or self.v_head_dim == 0):
            raise UserError(f"model {self.name}: an MLA model needs qk_nope_head_dim, qk_rope_head_dim and "
                            f"v_head_dim > 0")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: all of them, or an MoE model's first_dense_layers."""
        return self.first_dense_layers if self.is_moe else self.num_layers

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    # Parameter counts, per layer and whole-model. Norm weights are counted; biases are not.

    def attention_params(self) -> int:
        """Weights of one attention block (projections and, for MLA, its two latent norms)."""
        h = self.hidden_size
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_dim
            else:
                q = h * self.num_heads * qk_dim
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * h
            return q + kv_a + kv_b + o
        q_and_o = 2 * h * self.num_heads * self.head_dim
        return q_and_o + 2 * h * self.num_kv_heads * self.head_dim

    def mlp_params(self, intermediate_size: int) -> int:
        """Weights of one SwiGLU MLP (gate, up, down)."""
        return 3 * self.hidden_size * intermediate_size

    def _params(self, routed_experts: int) -> int:
        h = self.hidden_size
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * h
        dense = self.dense_layers * self.mlp_params(self.intermediate_size)
        moe_layer = (routed_experts + self.num_shared_experts) * self.mlp_params(self.moe_intermediate_size)
        moe = self.moe_layers * (moe_layer + h * self.num_experts)  # + router
        return embeddings + norms + self.num_layers * self.attention_params() + dense + moe

    def params_total(self) -> int:
        return self._params(self.num_experts)

    def params_active_per_token(self) -> int:
        """All weights less the routed experts a token does not use (embeddings and LM head included)."""
        return self._params(self.experts_per_token)


def list_models() -> list[str]:
    """Canonical names of the catalog's models, in catalog order."""
    return catalog.entry_names(catalog.MODELS_FILE)


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name or alias, or any Hugging Face config.json (a file, or a folder holding one)."""
    files.check_path(name_or_path, "model")
    try:
        path = Path(name_or_path).expanduser()
    except RuntimeError:  # '~someone' of no such user
        path = Path(name_or_path)
    if files.exists(path) and path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or files.is_file(path):
        return _from_hf_config(path)
    canonical, table = catalog.lookup(catalog.MODELS_FILE, name_or_path, "model", "models")
    table.pop("source")
    table.pop("aliases", None)
    known = {f.name for f in dataclasses.fields(ModelSpec)} - {"name"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise UserError(f"catalog models.toml [{canonical}]: unknown key {unknown[0]!r}; "
                        f"use one of {', '.join(sorted(known))}")
    try:
        return ModelSpec(name=canonical, **table)
    except TypeError as exc:  # a required field is missing
        raise UserError(f"catalog models.toml [{canonical}]: {exc}") from None


def _from_hf_config(path: Path) -> ModelSpec:
    if not files.exists(path):
        files.check_path(path, "model config")
        raise UserError(f"model config {files.shown(path)}: file not found; give a catalog name (`tokenpath models`) "
                        f"or the path of a Hugging Face config.json")
    text = files.read_text(path, "model config")
    try:
        config = json.loads(text)
    except RecursionError:
        raise UserError(f"model config {files.shown(path)}: cannot read it as JSON (nested too deep); give a "
                        "Hugging Face config.json") from None
    except ValueError as exc:  # invalid JSON, or an integer of more digits than Python converts
        raise UserError(f"model config {files.shown(path)}: cannot read it as JSON ({str(exc).split(';')[0]}); "
                        "give a Hugging Face config.json") from None
    if not isinstance(config, dict):
        raise UserError(f"model config {path}: expected a JSON object of config fields")
    if isinstance(config.get("text_config"), dict) and "hidden_size" not in config:
        config = config["text_config"]  # multimodal wrappers keep the language model's shape here

    def get(key: str, default: object = None, required: bool = False) -> object:
        value = config.get(key)
        if value is None:
            if required:
                raise UserError(f"model config {path}: missing required field {key!r}; "
                                f"add it from the model's config.json")
            return default
        return value

    def get_int(key: str, default: int = 0, required: bool = False) -> int:
        value = get(key, default, required)
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(f"model config {path}: field {key!r} must be a whole number, got {quoted(value)}")
        return value

    def get_bool(key: str) -> bool:
        value = get(key, False)
        if not isinstance(value, bool):
            raise UserError(f"model config {path}: field {key!r} must be true or false, got {quoted(value)}")
        return value

    hidden = get_int("hidden_size", required=True)
    heads = get_int("num_attention_heads", required=True)
    experts = get_int("num_local_experts") or get_int("n_routed_experts")
    if config.get("moe_layer_freq", 1) != 1:
        raise UserError(f"model config {path}: moe_layer_freq={quoted(config['moe_layer_freq'])} is not supported; "
                        f"only every layer after first_k_dense_replace being MoE is")
    mla = {
        "q_lora_rank": get_int("q_lora_rank"),
        "kv_lora_rank": get_int("kv_lora_rank"),
        "qk_nope_head_dim": get_int("qk_nope_head_dim"),
        "qk_rope_head_dim": get_int("qk_rope_head_dim"),
        "v_head_dim": get_int("v_head_dim"),
    }
    if mla["kv_lora_rank"]:
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    else:
        if heads == 0 or hidden % heads:
            head_dim = get_int("head_dim", required=True)
        else:
            head_dim = get_int("head_dim", hidden // heads)
    intermediate = get_int("intermediate_size", required=True)
    moe = {}
    if experts:
        moe = {
            "num_experts": experts,
            "experts_per_token": get_int("num_experts_per_tok", required=True),
            # Mixtral's experts are full-width MLPs and its config has no moe_intermediate_size.
            "moe_intermediate_size": get_int("moe_intermediate_size", intermediate),
            "num_shared_experts": get_int("n_shared_experts"),
            "first_dense_layers": get_int("first_k_dense_replace"),
        }
    name = path.parent.name or path.stem
    if isinstance(config.get("_name_or_path"), str) and config["_name_or_path"].strip():
        name = config["_name_or_path"].strip().rstrip("/").rsplit("/", 1)[-1][:200]
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=get_int("num_hidden_layers", required=True),
        num_heads=heads,
        num_kv_heads=get_int("num_key_value_heads", heads),
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=get_int("vocab_size", required=True),
        tie_word_embeddings=get_bool("tie_word_embeddings"),
        max_context=get_int("max_position_embeddings", required=True),
        **moe,
        **mla,
    )
