"""A scenario: one deployment plus one workload, loaded from TOML and validated at the edge.

Each layer owns the table it reads (workload, engine, fabric, delivery); this module composes them,
applies command-line overrides, turns validation errors into one-line `UserError`s and fingerprints
the normalized result.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import tomli_w
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from tokenpath.application.spec import ApplicationSpec
from tokenpath.config import files
from tokenpath.config.assumptions import (
    DELIVERY_FIELDS,
    PROFILE_DELIVERY_FIELDS,
    Assumptions,
    check_table,
    lookup,
    resolve,
)
from tokenpath.config.config_errors import explain
from tokenpath.config.errors import UserError, quoted
from tokenpath.config.files import PathText
from tokenpath.config.units import Duration
from tokenpath.delivery.spec import INVISIBLE_TOKEN_FRACTION, DeliverySpec
from tokenpath.engine.profiles import DEFAULT_PROFILE, PROFILES, Profile, profiles_where
from tokenpath.engine.release import release_at_least
from tokenpath.engine.routing import Routing
from tokenpath.engine.spec import EngineSpec
from tokenpath.engine.template_work import cost_per_char_s
from tokenpath.fabric.spec import MAX_FABRIC_HOSTS, FabricSpec, SwitchFabric, read_topology_file
from tokenpath.sim.continuity import ContinuitySettings
from tokenpath.workload._files import sha256_file
from tokenpath.workload.generate import fingerprint_inputs
from tokenpath.workload.spec import CHAT_TEMPLATE_EXAMPLES, WorkloadSpec

if TYPE_CHECKING:
    from tokenpath.compute.model_spec import ModelSpec

DEFAULT_SCENARIO = "typical"

Precision = Literal["bf16", "fp8", "fp4"]

# Every chip of a deployment sits on one fabric host, so the fabric's limit bounds the deployment.
MAX_CHIPS = MAX_FABRIC_HOSTS
# numpy's seeds take any integer; 2^63 - 1 keeps a seed one JSON number every reader takes.
MAX_SEED = 2**63 - 1
# API-server processes of a deployment: vLLM and TensorRT-LLM cap theirs in the tens (TensorRT-LLM's
# num_serve_frontends at 64); a front end of a million processes is a typo.
MAX_API_SERVERS = 4096
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSection(BaseModel):
    """Which model, at which precision. `name` is a catalog name or a path to a HF config.json."""

    model_config = _STRICT

    name: PathText = "llama-3.1-70b"
    precision: Precision = "fp8"
    expert_precision: Precision | None = Field(
        None, description="an MoE model's routed experts' weights, where they differ from `precision`, the "
                          "rest's (gpt-oss ships MXFP4 experts with bf16 attention: precision = \"bf16\", "
                          "expert_precision = \"fp4\"); unset: `precision`")
    kv_cache_precision: Literal["auto", "bf16", "fp8"] = Field(
        "auto", description="auto: the engine's default: the model's own bf16 in vLLM and SGLang (their "
                            "--kv-cache-dtype auto); fp8 with fp8 or fp4 weights in TensorRT-LLM "
                            f"({profiles_where(lambda p: p.fp8_kv_with_quantized_weights)}), except a "
                            "block-scaled fp8 checkpoint's (DeepSeek-V3's), which declares no KV quantization"
    )

    def kv_precision(self, scheduler: str = DEFAULT_PROFILE, fp8_block_scaled: bool = False) -> str:
        """The KV cache's precision: the profile's rule (Profile.fp8_kv_with_quantized_weights) unless
        set. vLLM's and SGLang's `--kv-cache-dtype auto` keep the model's activation dtype (bf16)
        whatever the weights' precision; TensorRT-LLM's follows the checkpoint's quantization config:
        NVIDIA's fp8 and NVFP4 checkpoints (ModelOpt's kv_cache_quant_algo FP8) quantize it to fp8, a
        block-scaled fp8 checkpoint (`fp8_block_scaled`: DeepSeek-V3's own, Qwen3's FP8) declares no KV
        quantization and keeps bf16 (tensorrt_llm/_torch/model_config.py, load_hf_quant_config)."""
        if self.kv_cache_precision != "auto":
            return self.kv_cache_precision
        quantized = PROFILES[scheduler].fp8_kv_with_quantized_weights and self.precision != "bf16"
        return "fp8" if quantized and not fp8_block_scaled else "bf16"


def _check_placement(value: object) -> object:
    """One clear message for the two shapes a placement takes."""
    if isinstance(value, str) and value not in ("packed", "spread"):
        raise ValueError(f"use 'packed', 'spread' or a list of host ids (got {quoted(value)})")
    if isinstance(value, list):
        if len(value) > MAX_CHIPS:
            raise ValueError(f"a list of {len(value):,} hosts; a deployment has at most {MAX_CHIPS:,} chips")
        if not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < MAX_FABRIC_HOSTS for h in value):
            raise ValueError(f"every host in the list must be a whole number from 0 to {MAX_FABRIC_HOSTS - 1:,}, "
                             "e.g. [0, 1, 2, 3]")
    if not isinstance(value, (str, list)):
        raise ValueError(f"use 'packed', 'spread' or a list of host ids (got {quoted(value)})")
    return value


class DeploymentSection(BaseModel):
    """The chips and how they are split: `chips / (tp * pp)` data-parallel replicas, each `pp` pipeline
    stages of `tp` chips; the fabric that joins them and where each chip sits on it."""

    model_config = _STRICT

    chip: str = Field("h200", max_length=200)
    chips: int = Field(8, ge=1, le=MAX_CHIPS)
    tp: int = Field(8, ge=1, le=MAX_CHIPS)
    pp: int = Field(1, ge=1, le=MAX_CHIPS, description="pipeline stages per replica")
    expert_parallel: bool = Field(False, description="MoE experts placed whole over each replica's tp chips; "
                                                     "their tokens gathered over those chips and reduced after, as "
                                                     "the engines do by default, unless moe_all_to_all")
    moe_all_to_all: bool = Field(False, description="with expert_parallel: the MoE layers dispatch each token to its "
                                                    "experts' chips and combine the results with all-to-all kernels "
                                                    "(DeepEP: SGLang --moe-a2a-backend deepep, vLLM --all2all-backend "
                                                    "deepep_low_latency) instead")
    attention_dp: bool = Field(False, description="attention data-parallel over each replica's tp chips (SGLang "
                                                  "--attn-dp-size tp, TensorRT-LLM enable_attention_dp): each chip "
                                                  "runs attention with every head for its own share of the "
                                                  "sequences and holds only their KV cache; the MLP and MoE layers "
                                                  "stay tensor- or expert-parallel")
    prefill_replicas: int = Field(0, ge=0, le=MAX_CHIPS,
                                  description="replicas that only prefill (disaggregated serving); "
                                              "0: every replica prefills and decodes")
    routing: Routing = Field(
        "round_robin", description="how requests are spread over the replicas: round_robin, least_outstanding, "
                                   "least_kv_load, prefix_aware (SGLang router's cache-aware policy) or "
                                   "session_affinity; see engine/routing.py")
    api_servers: int | None = Field(None, ge=1, le=MAX_API_SERVERS,
                                    description="API-server processes of the whole deployment, each one CPU "
                                                "shared by its requests and tokens (vLLM's --api-server-count); "
                                                "unset: the engine profile's default")
    fabric: FabricSpec = SwitchFabric()
    placement: Annotated[Literal["packed", "spread"] | list[int], BeforeValidator(_check_placement)] = Field(
        "packed", description="packed: each group on consecutive hosts; spread: a group's ranks strided "
                              "across the fabric; or the host of every chip, replica by replica, stage by "
                              "stage, rank by rank")

    @property
    def replicas(self) -> int:
        return self.chips // (self.tp * self.pp)


_TARGET = "an SLO target is a duration > 0 (no request takes no time), or \"none\" for no target"


def _none_or_duration(value: object) -> object:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    negative = value.strip().startswith("-") if isinstance(value, str) else (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0)
    if negative:  # (before the duration's own "zero or more", which an SLO target is not)
        raise ValueError(_TARGET)
    return value


def _positive_target(value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise ValueError(_TARGET)
    return value


# An SLO target: a duration > 0, or "none" for no target (TOML has no null).
Target = Annotated[Duration | None, BeforeValidator(_none_or_duration), AfterValidator(_positive_target),
                   PlainSerializer(lambda v: "none" if v is None else v, when_used="json")]


class SloSpec(BaseModel):
    """Latency targets a request must meet to count towards goodput; "none" turns one off."""

    model_config = _STRICT

    ttft: Target = 2.0
    ttfv: Target = None
    tpot: Target = 0.1
    e2e: Target = None


def _engine_table_and_profile(data: Any) -> tuple[dict[str, Any], Any, Profile | None]:
    """A scenario table's [engine] and [deployment] as given, and its engine profile (None: a table, or a
    scheduler, its validators leave to the fields' own checks)."""
    if not isinstance(data, dict) or not isinstance(data.get("engine", {}), dict):
        return {}, {}, None
    engine = data.get("engine", {})
    scheduler = engine.get("scheduler", DEFAULT_PROFILE)
    return engine, data.get("deployment", {}), PROFILES.get(scheduler) if isinstance(scheduler, str) else None


class Scenario(BaseModel):
    model_config = _STRICT

    name: str = Field("custom", max_length=200)
    description: str = Field("", max_length=10_000)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    model: ModelSection = ModelSection()
    deployment: DeploymentSection = DeploymentSection()
    engine: EngineSpec = EngineSpec()
    workload: WorkloadSpec = WorkloadSpec()
    delivery: DeliverySpec = DeliverySpec()
    slo: SloSpec = SloSpec()
    assumptions: Annotated[dict[str, Any], BeforeValidator(check_table)] = Field(
        default_factory=dict, description="overrides of the model's assumptions by name (`tokenpath assumptions` "
                                          "lists them), and `calibration`: calibration files to apply")
    continuity: ContinuitySettings = ContinuitySettings()
    application: ApplicationSpec | None = Field(
        None, description="the stages around the model call (docs/application.md); unset: the model call alone")

    @model_validator(mode="before")
    @classmethod
    def _engine_overlap_for_the_pipeline(cls, data: Any) -> Any:
        """The host overlap a release turns off under pipeline parallelism, where the [engine] table leaves
        it out (Profile.host_overlap_with_pp_since: vLLM 0.14.x's async scheduling)."""
        engine, deployment, profile = _engine_table_and_profile(data)
        if profile is None or profile.host_overlap_with_pp_since is None or "host_overlap" in engine:
            return data
        pp = deployment.get("pp", 1) if isinstance(deployment, dict) else getattr(deployment, "pp", 1)
        release = engine.get("version") if isinstance(engine.get("version"), str) else None
        if isinstance(pp, int) and pp > 1 and not release_at_least(release, profile.host_overlap_with_pp_since):
            return {**data, "engine": {**engine, "host_overlap": False}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _engine_limits_for_the_chip(cls, data: Any) -> Any:
        """The [engine] limits the table leaves out, as the engine picks them for the deployment's chip
        (Profile.batch_limits). A chip or scheduler that is not known is left to its own check."""
        engine, deployment, profile = _engine_table_and_profile(data)
        chip = deployment.get("chip", DeploymentSection.model_fields["chip"].default) \
            if isinstance(deployment, dict) else getattr(deployment, "chip", None)
        if profile is None or not isinstance(chip, str):
            return data
        from tokenpath.compute import load_chip

        try:
            spec = load_chip(chip)
        except UserError:
            return data
        release = engine.get("version")
        limits = profile.batch_limits(spec.name, spec.hbm_bytes, release if isinstance(release, str) else None).given()
        missing = {name: value for name, value in limits.items() if name not in engine}
        return {**data, "engine": {**missing, **engine}} if missing else data

    @model_validator(mode="after")
    def _assumptions_not_shadowed_by_delivery(self) -> Scenario:
        """An [assumptions] value a field of the scenario's own [delivery] table sets would change nothing
        (the table's value wins: resolved_delivery), while the result said it was applied."""
        fields = {**DELIVERY_FIELDS, **PROFILE_DELIVERY_FIELDS}
        for name in self.assumptions:
            field = fields.get(name)
            if field is not None and field in self.delivery.model_fields_set:
                raise ValueError(f"assumptions.{name}: the scenario's [delivery] sets {field} itself, which wins; "
                                 f"set delivery.{field} instead (or remove it from [delivery])")
        return self

    @model_validator(mode="after")
    def _speculation_has_its_acceptance(self) -> Scenario:
        speculative, acceptance = self.engine.speculative, self.workload.draft_acceptance
        if speculative is not None and acceptance is None:
            raise ValueError("engine.speculative needs workload.draft_acceptance, the chance a drafted token is "
                             "accepted (0 to 1; DeepSeek-V3 reports 0.85-0.9 for its MTP token)")
        if speculative is not None and self.delivery.stream_interval > 1:
            raise ValueError("engine.speculative streams each step's tokens of a sequence as one event; "
                             "delivery.stream_interval > 1 with it is not modelled: set stream_interval = 1")
        if speculative is None and acceptance is not None:
            raise ValueError("workload.draft_acceptance applies with [engine.speculative] only; add that table or "
                             "remove draft_acceptance")
        return self

    # The folder of the scenario file: relative paths in it (traces, length files, a model's
    # config.json) are read from there. Not part of the scenario's identity.
    _base_dir: Path | None = PrivateAttr(None)

    def resolve_path(self, path: str) -> str:
        if self._base_dir is None or Path(path).is_absolute():
            return path
        return str(self._base_dir / path)

    def resolved_workload(self, chat_template: bool = True) -> WorkloadSpec:
        """The workload with its file paths resolved against the scenario's folder and its chat template's
        tokens counted (`chat_template_tokens`). `chat_template=False` leaves them out (0): the prompts as
        a client sends them, whose chat server adds the template itself."""
        workload = self.workload if self._base_dir is None else self.workload.resolve_paths(self._base_dir)
        tokens = self.chat_template_tokens() if chat_template else 0
        return workload if workload.chat_template_tokens == tokens else \
            workload.model_copy(update={"chat_template_tokens": tokens})

    def chat_template_tokens(self) -> int:
        """Tokens the server's chat template adds to each prompt: the workload's count, or for "auto" what
        the default tokenizer's template adds to a one-message conversation (delivery/chat_template.py)."""
        given = self.workload.chat_template_tokens
        if given != "auto":
            return given
        from tokenpath.delivery.chat_template import added_tokens

        return added_tokens()

    def calibration_files(self) -> list[str]:
        """The files of `[assumptions] calibration`, resolved against the scenario's folder."""
        given = self.assumptions.get("calibration", [])
        return [self.resolve_path(p) for p in ([given] if isinstance(given, str) else given)]

    def resolved_assumptions(self) -> Assumptions:
        """The assumptions this scenario runs with: calibration files first, its own overrides over them."""
        return resolve(self.assumptions, self.calibration_files())

    def resolved_delivery(self) -> DeliverySpec:
        """The delivery spec with its calibration file resolved against the scenario's folder, and the
        scenario's delivery assumptions (overridden or calibrated) for the fields its table leaves unset."""
        assumptions = self.resolved_assumptions()
        update = assumptions.delivery_fields(self.delivery.model_fields_set)
        # The profile's own per-token times, where it has them (Profile.detokenize_assumption, output_assumption).
        profile = self.engine.profile
        for name in (profile.detokenize_assumption, profile.output_assumption):
            field = PROFILE_DELIVERY_FIELDS.get(name)
            if field is not None and field not in self.delivery.model_fields_set:
                update[field] = assumptions.value(name)
        calibration = self.delivery.calibration
        if calibration is not None:
            update["calibration"] = self.resolve_path(calibration)
        elif assumptions.delivery_calibration is not None:
            update["calibration"] = assumptions.delivery_calibration
        if self.delivery.tokenizer_batch_wait is None:
            update["tokenizer_batch_wait"] = self.engine.profile.tokenizer_batch_wait_s(self.engine.version)
        if self.delivery.chat_template_parse_per_request is None:
            update["chat_template_parse_per_request"] = self._template_parse_s(
                assumptions, update.get("chat_template_per_request", self.delivery.chat_template_per_request),
                update.get("calibration"))
        if not update:
            return self.delivery
        try:  # validated again: an assumption's value must also fit the [delivery] field it sets
            return DeliverySpec.model_validate({**self.delivery.model_dump(), **update})
        except ValidationError as error:
            raise UserError(explain(error, "assumptions (as [delivery])", DeliverySpec)) from None

    def _template_parse_s(self, assumptions: Assumptions, render_s: float, calibration: str | None) -> float:
        """The engine release's CPU time per chat request reading the model's chat template source
        (engine/template_work.py): its cost per character (the delivery `calibration` file's where it measured
        one, else the registry's) times the template's length; 0 where the release does no such work, the
        template is not known, or no template is rendered (`render_s` 0)."""
        work = self.engine.profile.template_work(self.engine.version)
        if work is None or not render_s:
            return 0.0
        from tokenpath.delivery.calibration import Calibration
        from tokenpath.delivery.chat_template import chat_template_chars

        chars = chat_template_chars(self.model_source())
        if not chars:
            return 0.0
        measured = None if calibration is None else Calibration.read(calibration).template_parse
        return chars * (getattr(measured, work) if measured else cost_per_char_s(work, assumptions))

    def kv_precision(self, model: ModelSpec | None = None) -> str:
        """The KV cache's precision (ModelSection.kv_precision) for this engine and the checkpoint the model
        names (`model`: its ModelSpec where the caller has loaded it)."""
        if model is None:
            from tokenpath.compute import load_model

            model = load_model(self.model_source())
        return self.model.kv_precision(self.engine.scheduler, model.fp8_block_scaled)

    def model_source(self) -> str:
        """What to load the model from: a catalog name, or a config.json path (resolved)."""
        resolved = self.resolve_path(self.model.name)
        return resolved if files.exists(resolved) else self.model.name

    def fingerprint(self) -> str:
        """sha256 of the normalized scenario (paths as written) and of the contents of the files it
        reads, so it changes when a trace or a model config does and not when the folder moves."""
        normal = self.model_dump(mode="json")
        if not normal["assumptions"]:  # none: the fingerprint it had before assumptions could be set
            del normal["assumptions"]
        if normal["application"] is None:  # none: the fingerprint it had before an application could be set
            del normal["application"]
        if normal["engine"]["speculative"] is None:  # likewise before speculative decoding
            del normal["engine"]["speculative"], normal["workload"]["draft_acceptance"]
        if normal["model"]["expert_precision"] is None:  # likewise before experts had a precision of their own
            del normal["model"]["expert_precision"]
        if not normal["deployment"]["attention_dp"]:  # and before attention could be data-parallel
            del normal["deployment"]["attention_dp"]
        inputs = list(fingerprint_inputs(self.resolved_workload(chat_template=False)).values())
        if self.delivery.calibration is not None:
            inputs.append(sha256_file(self.resolved_delivery().calibration, "delivery.calibration file",
                                      files.MAX_CONFIG_BYTES))
        for path in self.calibration_files():
            inputs.append(sha256_file(path, "assumptions.calibration file", files.MAX_CONFIG_BYTES))
        source = self.model_source()
        if files.exists(source):
            config = Path(source) / "config.json" if Path(source).is_dir() else Path(source)
            inputs.append(sha256_file(config, "model config", files.MAX_CONFIG_BYTES))
        normal["files"] = inputs
        return hashlib.sha256(json.dumps(normal, sort_keys=True).encode()).hexdigest()

    def to_toml(self) -> str:
        """The scenario as TOML, a default whose value was measured followed by a comment saying where."""
        text = tomli_w.dumps(_drop_none(self.model_dump(mode="json")))
        if self.delivery.invisible_token_fraction == INVISIBLE_TOKEN_FRACTION:
            line = f"invisible_token_fraction = {INVISIBLE_TOKEN_FRACTION!r}\n"
            text = text.replace(line, f"{line[:-1]}  # {lookup('invisible_token_fraction').source}\n", 1)
        line = tomli_w.dumps({"chat_template_tokens": self.workload.chat_template_tokens})
        return text.replace(line, f"{line[:-1]}  # a chat endpoint's template adds {CHAT_TEMPLATE_EXAMPLES} tokens "
                                  "to a one-message prompt; \"auto\": the default tokenizer's count\n", 1)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _drop_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):  # an array of tables: [[application.stages]]
        return [_drop_none(item) for item in value]
    return value


def scenario_names() -> list[str]:
    folder = resources.files("tokenpath.catalog") / "scenarios"
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def read_scenario_table(name_or_path: str | None) -> tuple[dict[str, Any], str, Path | None]:
    """The raw table of a catalog scenario or a TOML file: (table, where it came from, its folder); None: the
    default scenario."""
    if name_or_path is not None and not name_or_path.strip():
        raise UserError(f"scenario: an empty name; give a .toml file or one of {', '.join(scenario_names())}, or "
                        f"leave it out for {DEFAULT_SCENARIO!r}")
    name_or_path = name_or_path or DEFAULT_SCENARIO
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or files.exists(name_or_path) or files.path_problem(name_or_path):
        if not files.exists(name_or_path):
            files.check_path(name_or_path, "scenario")
            raise UserError(f"{files.shown(name_or_path)}: no such scenario file; give a path to a .toml file "
                            f"or one of: {', '.join(scenario_names())}")
        text = files.read_text(name_or_path, "scenario file")
        source = files.shown(name_or_path)
        return files.parse_toml(text, source), source, path.resolve().parent
    names = scenario_names()
    if name_or_path not in names:
        close = difflib.get_close_matches(name_or_path[:200], names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"unknown scenario {quoted(name_or_path)}; {hint}known: {', '.join(names)} "
                        "(or a path to a .toml file)")
    text = (resources.files("tokenpath.catalog") / "scenarios" / f"{name_or_path}.toml").read_text(encoding="utf-8")
    return files.parse_toml(text, f"scenario {name_or_path!r}"), f"scenario {name_or_path!r}", None


def set_path(table: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested table, creating the tables on the way."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        table = table.setdefault(key, {})
        if not isinstance(table, dict):
            raise UserError(f"{dotted}: {key!r} is not a table in this scenario")
    table[leaf] = value


def build_scenario(table: dict[str, Any], source: str, base_dir: Path | None = None) -> Scenario:
    """Validate a raw table into a Scenario; relative file paths are taken from `base_dir`."""
    fabric = table.get("deployment", {}).get("fabric") if isinstance(table.get("deployment"), dict) else None
    if isinstance(fabric, str) and fabric.endswith(".toml"):
        files.check_path(fabric, "deployment.fabric")
        path = Path(fabric) if base_dir is None or Path(fabric).is_absolute() else base_dir / fabric
        table = {**table, "deployment": {**table["deployment"], "fabric": read_topology_file(path)}}
    try:
        scenario = Scenario.model_validate(table)
    except ValidationError as error:
        raise UserError(explain(error, source, Scenario)) from None
    scenario._base_dir = base_dir
    return scenario


def load_scenario(name_or_path: str | None = None, overrides: dict[str, Any] | None = None) -> Scenario:
    """Load a catalog scenario or TOML file and apply `overrides` ({"deployment.tp": 4, ...})."""
    table, source, base_dir = read_scenario_table(name_or_path)
    for dotted, value in (overrides or {}).items():
        set_path(table, dotted, value)
    return build_scenario(table, source, base_dir)
