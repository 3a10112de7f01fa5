"""A file of published latency rows, checked: the shipped `catalog/validation/latency.toml`, or a user's
own measurements in the same form (`tokenpath validate --latency-rows FILE`).

Each `[[rows]]` table states one measurement and how it was taken: the deployment (`engine`,
`engine_settings` as `[engine]` keys, `model`, `precision`, `expert_precision`, `kv_cache_precision`,
`chip`, `tp`), the workload (`lengths` with its sizes, `arrival` with its rate or concurrency, the
request count or `window`), the path its client took (`endpoint`, and `network_rtt_ms` for a client on
another host), and the measured TTFT and TPOT or ITL with the statistic the source reported.
validate/latency.py simulates it the same way. A row that cannot be read is refused with one line
naming the row and the field.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.engine.profiles import MEASURED_ENGINES

Stat = Literal["mean", "median"]
# Bounds far beyond real ones: a chat template adds tens of tokens (a long default system prompt, a few
# hundred); a client's round trip across the world is a few hundred milliseconds.
MAX_TEMPLATE_TOKENS = 100_000
MAX_NETWORK_RTT_MS = 10_000.0


class LatencyRow(BaseModel):
    """One published measurement of latency under load."""

    model_config = ConfigDict(extra="forbid", strict=True)

    source: str
    engine: Literal[tuple(MEASURED_ENGINES)]  # type: ignore[valid-type]  # an engine a profile is measured as
    engine_version: str = ""
    engine_settings: dict[str, Any] = Field(default_factory=dict)
    model: str
    precision: str
    expert_precision: str | None = None  # an MoE's routed experts', where they differ (the scenario's [model] key)
    kv_cache_precision: Literal["auto", "bf16", "fp8"] = "auto"  # as the scenario's [model] key (--kv-cache-dtype)
    chip: str
    tp: int = Field(ge=1)
    # the deployment's other [deployment] keys: pipeline stages, experts over every chip (their tokens
    # dispatched by all-to-alls: DeepEP), attention data-parallel over the tp chips (one replica of tp x pp chips)
    pp: int = Field(1, ge=1)
    expert_parallel: bool = False
    moe_all_to_all: bool = False
    attention_dp: bool = False
    # with engine_settings' speculative table: the chance a draft is accepted (the scenario's workload key)
    draft_acceptance: float | None = Field(None, ge=0, le=1)
    lengths: Literal["fixed", "uniform", "sharegpt", "sglang_random"]
    input_len: int | None = Field(None, ge=1)
    output_len: int | None = Field(None, ge=1)
    input_mean: float | None = Field(None, gt=0)
    output_mean: float | None = Field(None, gt=0)
    input_max: int | None = Field(None, ge=1)   # as the source states it (the means set the simulated lengths)
    output_max: int | None = Field(None, ge=1)
    input_min: int | None = Field(None, ge=1)   # uniform lengths drawn from min to max (default: from 1)
    output_min: int | None = Field(None, ge=1)
    arrival: Literal["poisson", "concurrency", "all_at_once"]
    rate: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, ge=1)
    num_requests: int | None = Field(None, ge=1)
    window: Literal["whole", "steady", "profiling_phase"]
    requests_per_slot: int | None = Field(None, ge=1)
    # how many of the run's first prompts the server held cached when it began, its earlier runs having sent
    # them (validate/client_draws.py; with lengths = "sglang_random" the client's warm-up holds the first);
    # lengths drawn rather than replayed: every prompt (num_requests), the same prompts sent again
    cached_prompts: int | None = Field(None, ge=1)
    # How the source's client reached the model (validate/latency.row_delivery): "completions" (its
    # completions or native generate endpoint, through the server's front end), "chat" (its chat endpoint:
    # the template rendered too, and `chat_template_tokens` added to each prompt, which the row's lengths
    # leave out as the client counted them) or "engine" (measured inside the server, no front end); a client
    # on another host states its round trip.
    endpoint: Literal["completions", "chat", "engine"] = "completions"
    chat_template_tokens: int = Field(0, ge=0, le=MAX_TEMPLATE_TOKENS)
    network_rtt_ms: float = Field(0.0, ge=0, le=MAX_NETWORK_RTT_MS)
    ttft_ms: float = Field(gt=0)
    ttft_stat: Stat
    decode_ms: float = Field(gt=0)
    decode_metric: Literal["itl", "tpot"]
    decode_stat: Stat
    # other figures the source gives, for the record; of them, throughput_tokens_per_s (output tokens/s)
    # is compared, for the bands file's throughput errors (sim/bands.py)
    also: dict[str, Any] = Field(default_factory=dict)
    # The command the source's client ran: its source's `client` (read_latency_rows) where the row states none.
    # validate/latency.py reads how it counted ITL from it.
    client: str = ""
    calibration: bool = False                          # the row sets a constant: left out of the medians
    id: str = ""

    @model_validator(mode="after")
    def _complete(self) -> LatencyRow:
        needs = {"fixed": ("input_len", "output_len"), "uniform": ("input_mean", "output_mean"),
                 "sharegpt": ("input_mean", "output_mean"),
                 "sglang_random": ("input_len", "output_len", "input_mean", "output_mean", "num_requests"),
                 }[self.lengths]
        needs += {"poisson": ("rate",), "concurrency": ("concurrency",), "all_at_once": ()}[self.arrival]
        needs += ("num_requests",) if self.window == "whole" else ("concurrency",)
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"needs {missing[0]} (lengths = {self.lengths!r}, arrival = {self.arrival!r}, "
                             f"window = {self.window!r})")
        if self.cached_prompts is not None and not (
                self.cached_prompts == self.num_requests
                or (self.lengths == "sglang_random" and self.cached_prompts < (self.num_requests or 0))):
            raise ValueError("cached_prompts counts at most num_requests prompts, and all of them unless lengths = "
                             "'sglang_random' (whose draw names each prompt); remove it or correct it")
        if self.chat_template_tokens and self.endpoint != "chat":
            raise ValueError(f"chat_template_tokens goes with endpoint = 'chat' (this row's is {self.endpoint!r}); "
                             "remove it or set endpoint = 'chat'")
        if self.network_rtt_ms and self.endpoint == "engine":
            raise ValueError("network_rtt_ms is the client's round trip to the server, and endpoint = 'engine' has "
                             "no client; remove one of them")
        for part in ("input", "output"):
            low, high, mean = (getattr(self, f"{part}_{end}") for end in ("min", "max", "mean"))
            if low is None:
                continue
            if self.lengths != "uniform" or high is None:
                raise ValueError(f"{part}_min goes with lengths = 'uniform' and its {part}_max; remove it or add them")
            if not low <= mean <= high:
                raise ValueError(f"{part}_mean ({mean:g}) must lie between {part}_min ({low}) and {part}_max ({high})")
        return self


class ShareGPTStats(BaseModel):
    """How the benchmark clients filter ShareGPT (validate.latency.sharegpt_lengths); other keys, such as
    the published means the rows quote, are kept for the record."""

    model_config = ConfigDict(extra="allow", strict=True)

    clip_input_max: int = Field(ge=1)
    clip_total_max: int = Field(ge=2)
    min_tokens: int = Field(ge=1)


class LeftOutRow(LatencyRow):
    """A published row left out of the validation, with the reason (validate/consistency.py checks it)."""

    reason: str = Field(min_length=1)


def read_latency_rows(path: str | Path | None = None) -> dict[str, Any]:
    """The latency data (`sharegpt` statistics, `sources`, `rows`, and `left_out`: rows documented and left
    out, each with its reason) of `path`, or the shipped file, each row checked; the shipped ShareGPT
    statistics where the file gives none."""
    if path is None:
        data, where = _shipped(), "catalog/validation/latency.toml"
    else:
        where = files.shown(path)
        data = files.parse_toml(files.read_text(path, "the latency rows file"), where)
    sharegpt = data["sharegpt"] if "sharegpt" in data else _shipped()["sharegpt"]
    _check(ShareGPTStats, sharegpt, f"{where}: sharegpt")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise UserError(f"{where}: no [[rows]]; give at least one published measurement (see docs/validation.md)")
    for k, row in enumerate(rows):
        label = f"{where}: rows[{k}]" + (f" ({row['source']})"
                                         if isinstance(row, dict) and isinstance(row.get("source"), str) else "")
        if not isinstance(row, dict):
            raise UserError(f"{label}: a row is a table of fields")
        _check(LatencyRow, row, label)
    sources = data.get("sources", {})
    for row in rows:
        source = sources.get(row["source"]) if isinstance(sources, dict) else None
        if not row.get("client") and isinstance(source, dict) and isinstance(source.get("client"), str):
            row["client"] = source["client"]
    left_out = data.get("left_out", [])
    if not isinstance(left_out, list) or not all(isinstance(row, dict) for row in left_out):
        raise UserError(f"{where}: left_out is an array of row tables ([[left_out]]), each with its reason")
    for k, row in enumerate(left_out):
        _check(LeftOutRow, row, f"{where}: left_out[{k}]")
    return {"sharegpt": sharegpt, "sources": sources, "rows": rows, "left_out": left_out}


def _shipped() -> dict[str, Any]:
    shipped = resources.files("tokenpath.catalog") / "validation" / "latency.toml"
    return tomllib.loads(shipped.read_text(encoding="utf-8"))


def _check(model: type[BaseModel], table: Any, label: str) -> None:
    """`table` read as `model`, or a UserError naming `label` and the first field at fault."""
    try:
        model.model_validate(table)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise UserError(f"{label}: {field + ': ' if field else ''}{first['msg']}") from None
