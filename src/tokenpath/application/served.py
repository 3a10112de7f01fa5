"""The `served` table of an `embed` or `rerank` stage: the stage runs a model of its own instead of taking
a drawn latency (docs/application.md, "Stages served by a model").

It says which model (`params`, e.g. "560M", or a catalog `model`), at what `precision`, on what (`on`:
"cpu" with `cores`, a catalog chip, or "shared": the LLM's own GPU), how many requests one batch takes
(`max_batch`, on a chip or the shared GPU), and the tokens of a request: an embedder's `tokens` (unset:
the question, the workload's input), a reranker's `documents` pairs of `document_tokens` each plus the
query (`query_tokens`; unset: the question).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator
from pydantic_core import PydanticCustomError

from tokenpath.config.errors import UserError, quoted
from tokenpath.workload.spec import MAX_TOKENS

_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
# Parameters of a served model: an embedder or reranker has millions to a few billions; beyond a
# trillion the number is a typo.
MAX_PARAMS = 1e12
# Requests in one batch, and CPU cores serving a stage: beyond these a table has gone wrong.
MAX_BATCH = 65_536
MAX_CORES = 65_536
# Documents one reranker request scores.
MAX_DOCUMENTS = 10_000
SHARED = "shared"
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_PARAMS = re.compile(r"^\s*(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>[kKMBGT]?)\s*$")


def _invalid(reason: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_served", "{reason}", {"reason": reason})


def _parse_params(value: object) -> float:
    """'560M', '1.5B', '22M' or a number -> parameters."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _invalid(f"params: {quoted(value)} is not a count; write e.g. \"560M\" or \"1.5B\"")
    if isinstance(value, str):
        match = _PARAMS.match(value)
        if match is None:
            raise _invalid(f"params: cannot read {quoted(value)}; write a number and k, M or B, e.g. \"560M\"")
        number = float(match["num"]) * _SCALE[match["unit"]]
    else:
        number = float(value)
    if not 1 <= number <= MAX_PARAMS:
        raise _invalid(f"params: {quoted(value)} is out of range; a model has from 1 to 1T parameters")
    return number


def shown_params(params: float) -> str:
    """Parameters as a string `params` reads back exactly ("560M", "1.5B")."""
    for unit in ("B", "M", "k"):
        text = f"{params / _SCALE[unit]:.15g}{unit}"
        if params >= _SCALE[unit] and _parse_params(text) == params:
            return text
    return repr(params)


Params = Annotated[float, BeforeValidator(_parse_params), PlainSerializer(shown_params, when_used="json")]


class ServedSpec(BaseModel):
    """A model serving a stage, where it runs, and the tokens of one request."""

    model_config = _CONFIG

    params: Params | None = None
    model: str | None = Field(None, min_length=1, max_length=200)
    precision: Literal["bf16", "fp16", "fp8", "fp4"] = "bf16"
    on: str = Field(min_length=1, max_length=200)
    cores: int | None = Field(None, ge=1, le=MAX_CORES)
    max_batch: int | None = Field(None, ge=1, le=MAX_BATCH)
    tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    documents: int | None = Field(None, ge=1, le=MAX_DOCUMENTS)
    document_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    query_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _check(self) -> ServedSpec:
        if (self.params is None) == (self.model is None):
            raise _invalid("give the model's size as params (e.g. \"560M\") or a catalog model, not "
                           + ("both" if self.params is not None else "neither"))
        if self.model is not None:
            _catalog_params(self.model)  # an unknown name is an error here
        if self.on == "cpu":
            if self.cores is None:
                raise _invalid("on = \"cpu\" needs cores, the CPU cores serving the stage, e.g. cores = 16")
            if self.max_batch is not None:
                raise _invalid("on = \"cpu\": each core serves one request at a time; remove max_batch")
        else:
            if self.cores is not None:
                raise _invalid(f"on = {self.on!r}: cores are for on = \"cpu\"; remove cores")
            if self.on != SHARED:
                _check_chip(self.on, self.size, self.precision)
        if self.documents is not None and self.document_tokens is not None:
            tokens = self.documents * (self.document_tokens + (self.query_tokens or 0))
            if tokens > MAX_TOKENS:
                what = "documents x (document_tokens + query_tokens)" if self.query_tokens else \
                    "documents x document_tokens"
                raise _invalid(f"{what} is {tokens:,} tokens a request, more than {MAX_TOKENS:,}; lower documents "
                               "or document_tokens")
        return self

    @property
    def size(self) -> float:
        """Its parameters."""
        return self.params if self.params is not None else _catalog_params(self.model)

    @property
    def batch(self) -> int:
        return self.max_batch or 1


def _catalog_params(name: str) -> float:
    from tokenpath.catalog import MODELS_FILE, lookup
    from tokenpath.compute.model import load_model

    try:
        canonical, _ = lookup(MODELS_FILE, name, "model", "models")
    except UserError as error:
        raise _invalid(f"model: {error}") from None
    return float(load_model(canonical).params_total())


def _check_chip(name: str, params: float, precision: str) -> None:
    """`name` is a catalog chip, and one of it holds the model's weights at `precision`."""
    from tokenpath.catalog import CHIPS_FILE, lookup
    from tokenpath.compute.chip import load_chip
    from tokenpath.compute.precision import stored_bytes

    try:
        lookup(CHIPS_FILE, name, "chip", "chips")
    except UserError as error:
        raise _invalid(f"on: {error} Or use \"cpu\" (with cores) or \"shared\" (the deployment's GPU)") from None
    chip = load_chip(name)
    weights = params * stored_bytes(precision, chip.fp4_format)
    if weights > chip.hbm_bytes:
        raise _invalid(f"on: the model's weights ({weights / 2**30:,.1f} GiB at {precision}) do not fit in one "
                       f"{chip.name}'s {chip.hbm_bytes / 2**30:,.0f} GiB; use a smaller model or precision, or a "
                       "chip with more memory")
