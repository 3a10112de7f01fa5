"""A model by name: from the embedded catalog, or any Hugging Face config.json (hf_config.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tokenpath import catalog
from tokenpath.compute.hf_config import read_hf_config
from tokenpath.compute.model_spec import ModelSpec
from tokenpath.config import files
from tokenpath.config.errors import UserError

# Keys of a models.toml entry that describe the entry, not the shape: its citation, other names, and the
# checkpoint `tokenpath launch` serves (launch/model_id.py) and the length of its chat template
# (delivery/chat_template.chat_template_chars).
CATALOG_ONLY_KEYS = ("source", "aliases", "hf_id", "hf_precision", "hf_expert_precision", "hf_chat_template_chars")

# A catalog checkpoint's weights are bf16 unless its entry says (models.toml `hf_precision`).
CHECKPOINT_PRECISION = "bf16"


def list_models() -> list[str]:
    """Canonical names of the catalog's models, in catalog order."""
    return catalog.entry_names(catalog.MODELS_FILE)


def checkpoint_precision(name: str) -> tuple[str, str | None]:
    """The precision a catalog model's published checkpoint stores its weights in, and its routed experts'
    where they differ (models.toml `hf_precision` and `hf_expert_precision`; None: the same)."""
    _, entry = catalog.lookup(catalog.MODELS_FILE, name, "model", "models")
    return entry.get("hf_precision", CHECKPOINT_PRECISION), entry.get("hf_expert_precision")


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
        return read_hf_config(path)
    canonical, table = catalog.lookup(catalog.MODELS_FILE, name_or_path, "model", "models")
    for key in CATALOG_ONLY_KEYS:
        table.pop(key, None)
    known = {f.name for f in dataclasses.fields(ModelSpec)} - {"name"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise UserError(f"catalog models.toml [{canonical}]: unknown key {unknown[0]!r}; "
                        f"use one of {', '.join(sorted(known))}")
    try:
        return ModelSpec(name=canonical, **table)
    except TypeError as exc:  # a required field is missing
        raise UserError(f"catalog models.toml [{canonical}]: {exc}") from None
