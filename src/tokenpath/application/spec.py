"""The `[application]` table of a scenario: the stages around the model call, as a DAG.

A stage runs when every stage in its `after` list is done; stages with no path between them run in
parallel. Exactly one stage is the model call (`kind = "model"`): the simulated deployment. Every
other stage must lie before it (the model depends on it) or after it (it depends on the model), or
run between its calls where it has a loop (application/loop.py).
Problems are pydantic `ValidationError`s naming the field; the scenario turns them into one line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from tokenpath.application.index import IndexSpec
from tokenpath.application.loop import LoopSpec, loop_problem
from tokenpath.application.served import SHARED, ServedSpec
from tokenpath.config.units import Duration
from tokenpath.workload.spec import MAX_TOKENS

_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
StageKind = Literal["cpu", "retrieval", "embed", "rerank", "tool", "model"]
# Stages per application: a RAG or agent pipeline has a handful; hundreds is a generated table gone wrong.
MAX_STAGES = 64
# Chunks of retrieved context per prompt: retrievers return tens; beyond this the prompt is a document dump.
MAX_CHUNKS = 10_000
# Characters in a stage's name: a name, not a description.
MAX_NAME_CHARS = 200


def _invalid(reason: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_application", "{reason}", {"reason": reason})


class LatencySpec(BaseModel):
    """How long a stage takes, per request: `fixed` (`value`), `lognormal` (`mean` and `sd`, the
    workload's lognormal in durations) or `exponential` (`mean`)."""

    model_config = _CONFIG

    kind: Literal["fixed", "lognormal", "exponential"]
    value: Duration | None = None
    mean: Duration | None = None
    sd: Duration | None = None

    @model_validator(mode="after")
    def _check_kind(self) -> LatencySpec:
        needs = {"fixed": ("value",), "lognormal": ("mean", "sd"), "exponential": ("mean",)}[self.kind]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise _invalid(f"kind {self.kind!r} needs {' and '.join(needs)}; missing {', '.join(missing)}")
        unused = [name for name in ("value", "mean", "sd") if name not in needs and getattr(self, name) is not None]
        if unused:
            raise _invalid(f"kind {self.kind!r} does not use {', '.join(unused)}; remove it or change kind")
        if self.kind == "lognormal" and self.mean <= 0:
            raise _invalid("kind 'lognormal' needs mean > 0; use kind 'fixed' with value 0 for no time")
        return self


class CacheSpec(BaseModel):
    """A result cache in front of a stage: each request hits with probability `hit_rate` and then takes
    `hit_latency` instead of the stage's latency."""

    model_config = _CONFIG

    hit_rate: float = Field(ge=0, le=1)
    hit_latency: Duration = 0.0


class PromptSpec(BaseModel):
    """What the model call's prompt holds besides the question (the workload's input): a template of
    `template_tokens` and `chunks` retrieved chunks of `chunk_tokens` each."""

    model_config = _CONFIG

    template_tokens: int = Field(0, ge=0, le=MAX_TOKENS)
    chunks: int = Field(0, ge=0, le=MAX_CHUNKS)
    chunk_tokens: int = Field(0, ge=0, le=MAX_TOKENS)

    @property
    def added_tokens(self) -> int:
        return self.template_tokens + self.chunks * self.chunk_tokens


class StageSpec(BaseModel):
    """One stage. `start = "ahead"` starts it `ahead` before the user's send (while they type) or, with
    `after`, when those are done if later; it may finish before the send. `needs`: of `after`, the
    stages whose output it uses (unset: all)."""

    model_config = _CONFIG

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    kind: StageKind
    after: list[str] = Field(default_factory=list, max_length=MAX_STAGES)
    # Of `after`, the stages whose output this one uses; unset: all of them. The others are an order the
    # application's code imposes, which the "run independent stages in parallel" lever drops.
    needs: list[str] | None = Field(None, max_length=MAX_STAGES)
    latency: LatencySpec | None = None
    cache: CacheSpec | None = None
    start: Literal["after", "ahead"] = "after"
    ahead: Duration = 0.0
    prompt: PromptSpec | None = None
    loop: LoopSpec | None = None  # the model stage's: several calls with stages between (application/loop.py)
    index: IndexSpec | None = None  # a retrieval stage's vector index, in place of its latency
    served: ServedSpec | None = None  # embed and rerank: a model of their own instead of a latency (served.py)
    # The model stage's: the stages directly after it start on its first token (application/stream.py).
    stream_into_next: bool = False

    @model_validator(mode="after")
    def _check_fields(self) -> StageSpec:
        if self.index is not None and self.kind != "retrieval":
            raise _invalid(f"stage {self.name!r}: only a retrieval stage takes an index; remove it or set "
                           "kind = \"retrieval\"")
        if self.loop is not None and self.kind != "model":
            raise _invalid(f"stage {self.name!r}: only the model stage takes a loop; remove it")
        if self.stream_into_next and self.kind != "model":
            raise _invalid(f"stage {self.name!r}: only the model stage streams into the stages after it; remove "
                           "stream_into_next")
        if self.served is not None:
            _check_served(self)
        elif self.kind == "model":
            used = [name for name in ("latency", "cache") if getattr(self, name) is not None]
            if used:
                raise _invalid(f"stage {self.name!r} is the model call, whose time is simulated; "
                               f"remove {', '.join(used)}")
            if self.start == "ahead":
                raise _invalid(f"stage {self.name!r}: the model call cannot start ahead of the send; remove start")
        else:
            if self.index is not None and self.latency is not None:
                raise _invalid(f"stage {self.name!r} has both a latency and an index; keep one (the index sets "
                               "the latency)")
            if self.latency is None and self.index is None:
                other = {"retrieval": " (or an index)", "embed": ", or a served model (served = {...})",
                         "rerank": ", or a served model (served = {...})"}.get(self.kind, "")
                raise _invalid(f"stage {self.name!r} needs a latency, e.g. latency = {{kind = \"fixed\", value = "
                               f"\"5 ms\"}}{other}")
            if self.prompt is not None:
                raise _invalid(f"stage {self.name!r}: only the model stage takes a prompt; remove it")
        extra = [name for name in self.needs or () if name not in self.after]
        if extra:
            raise _invalid(f"stage {self.name!r} needs {extra[0]!r} but does not run after it; add it to after")
        if self.ahead > 0 and self.start != "ahead":
            raise _invalid(f"stage {self.name!r}: ahead is set but start is 'after'; set start = \"ahead\"")
        return self


class ApplicationSpec(BaseModel):
    """The stages of the application, in any order that lists each stage's `after` first."""

    model_config = _CONFIG

    stages: list[StageSpec] = Field(min_length=1, max_length=MAX_STAGES)

    @model_validator(mode="after")
    def _check_graph(self) -> ApplicationSpec:
        names = [stage.name for stage in self.stages]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise _invalid(f"stage name {repeated[0]!r} is used twice; give each stage its own name")
        models = [stage.name for stage in self.stages if stage.kind == "model"]
        if len(models) != 1:
            raise _invalid(f"{len(models)} model stages ({', '.join(models) or 'none'}); exactly one stage has "
                           "kind = \"model\" (several calls of one model: its loop table)")
        for stage in self.stages:
            for name in stage.after:
                if name not in names:
                    raise _invalid(f"stage {stage.name!r} runs after {name!r}, which is no stage; "
                                   f"use one of {', '.join(names)}")
                if name == stage.name:
                    raise _invalid(f"stage {stage.name!r} runs after itself; remove it from its after")
        order = _topological(self.stages)
        model = models[0]
        problem = loop_problem(self.stages, model)
        if problem:
            raise _invalid(problem)
        upstream, downstream = _ancestors(self.stages, model), _descendants(self.stages, model)
        between = self.between()
        for name in order:
            if name != model and name not in upstream and name not in downstream and name not in between:
                raise _invalid(f"stage {name!r} is neither before the model call nor after it; add it to the "
                               f"after of a stage on the model's path, or {model!r} to its after")
        by_name = {stage.name: stage for stage in self.stages}
        for name in downstream:
            if by_name[name].start == "ahead":
                raise _invalid(f"stage {name!r} runs after the model call and cannot start ahead; remove start")
        _check_shared(self.stages, upstream)
        return self

    @property
    def model(self) -> StageSpec:
        return next(stage for stage in self.stages if stage.kind == "model")

    def order(self) -> list[StageSpec]:
        """The stages, each after every stage in its `after`."""
        by_name = {stage.name: stage for stage in self.stages}
        return [by_name[name] for name in _topological(self.stages)]

    def between(self) -> list[str]:
        """The stages run between the model's calls (its loop's `between`; none without a loop)."""
        return [] if self.model.loop is None else list(self.model.loop.between)

    def before_model(self) -> set[str]:
        return _ancestors(self.stages, self.model.name)

    def waits_for(self, name: str) -> set[str]:
        """The stages `name` waits for, directly or through others."""
        return _ancestors(self.stages, name)


def _check_served(stage: StageSpec) -> None:
    """A stage served by a model: an embedder or a reranker, without a latency or a cache, with the tokens
    of its kind."""
    served, name = stage.served, stage.name
    if stage.kind not in ("embed", "rerank"):
        raise _invalid(f"stage {name!r}: only embed and rerank stages are served by a model; remove served "
                       "or set kind")
    if stage.latency is not None:
        raise _invalid(f"stage {name!r} has a latency and a served model; keep one")
    if stage.cache is not None:
        raise _invalid(f"stage {name!r}: a cache in front of a served model is not modelled; remove cache")
    if stage.prompt is not None:
        raise _invalid(f"stage {name!r}: only the model stage takes a prompt; remove it")
    rerank = ("documents", "document_tokens", "query_tokens")
    if stage.kind == "embed":
        used = [key for key in rerank if getattr(served, key) is not None]
        if used:
            raise _invalid(f"stage {name!r}: an embed stage embeds tokens (unset: the question); remove {used[0]}")
    else:
        if served.tokens is not None:
            raise _invalid(f"stage {name!r}: a rerank stage scores documents plus the query; remove tokens and "
                           "give documents, document_tokens (and query_tokens; unset: the question)")
        missing = [key for key in rerank[:2] if getattr(served, key) is None]
        if missing:
            raise _invalid(f"stage {name!r}: a served reranker needs documents and document_tokens (the pairs it "
                           f"scores and each document's tokens); missing {', '.join(missing)}")


def _check_shared(stages: list[StageSpec], upstream: set[str]) -> None:
    """Served stages run before the model (their queue needs their arrivals before the engine runs); at
    most one on the deployment's GPU, and no stage on a queue of its own waits for it (its end is known
    only as the engine runs)."""
    served = [stage.name for stage in stages if stage.served is not None]
    for name in served:
        if name not in upstream:
            raise _invalid(f"stage {name!r} is served by a model after the model call, which is not modelled; "
                           "move it before the model or give it a latency")
    shared = [stage.name for stage in stages if stage.served is not None and stage.served.on == SHARED]
    if len(shared) > 1:
        raise _invalid(f"stages {shared[0]!r} and {shared[1]!r} both run on the shared GPU; only one stage can "
                       "(move the other to \"cpu\" or a chip)")
    for name in shared:
        for other in served:
            if other != name and name in _ancestors(stages, other):
                raise _invalid(f"stage {other!r} is served on a queue of its own after {name!r}, which runs on "
                               "the shared GPU; that order is not modelled: give it a latency or reorder them")


def _topological(stages: list[StageSpec]) -> list[str]:
    """The stage names in an order that puts each after its `after`; a cycle is an error naming it."""
    after = {stage.name: list(stage.after) for stage in stages}
    done: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            cycle = path[path.index(name):] + [name]
            raise _invalid(f"stages run in a cycle ({' -> '.join(reversed(cycle))}); remove one of those after entries")
        state[name] = "open"
        for before in after[name]:
            visit(before, path + [name])
        state[name] = "done"
        done.append(name)

    for stage in stages:
        visit(stage.name, [])
    return done


def _ancestors(stages: list[StageSpec], name: str) -> set[str]:
    after = {stage.name: stage.after for stage in stages}
    found: set[str] = set()
    pending = list(after[name])
    while pending:
        current = pending.pop()
        if current not in found:
            found.add(current)
            pending.extend(after[current])
    return found


def _descendants(stages: list[StageSpec], name: str) -> set[str]:
    return {stage.name for stage in stages if name in _ancestors(stages, stage.name)}
