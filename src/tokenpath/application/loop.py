"""The model stage's agent loop: one user request makes several model calls, with stages (tool calls,
parsing) between them. Each call's prompt is the previous call's prompt, its answer (tool-call text the
user does not see) and the tools' result; the last call's answer is the workload's output.

The `between` stages run after each call but the last, in the order their `after` lists give among
themselves, starting when the call's answer reaches the client; they are neither before nor after the
model in the application's DAG.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenpath.workload.spec import LengthSpec, check_turns


class LoopSpec(BaseModel):
    """`turns`: model calls per user request (a count, or a token-length style distribution of counts,
    clipped to MAX_TURNS); `between`: the stages run between two calls; `result_tokens`: the tokens the
    tools' result adds to the next call's prompt; `call_output`: the output tokens of each call but the
    last (the tool call)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    turns: int | LengthSpec = Field(description="model calls per request: a count or a distribution of counts")
    between: list[str] = Field(default_factory=list, description="the stages run after each call but the last")
    result_tokens: LengthSpec = Field(description="tokens the tools' result adds to the next call's prompt")
    call_output: LengthSpec = Field(description="output tokens of each call but the last (its tool call)")

    @field_validator("turns")
    @classmethod
    def _check_turns(cls, value: int | LengthSpec) -> int | LengthSpec:
        return check_turns(value)


def loop_problem(stages: Sequence[Any], model: str) -> str | None:
    """What is wrong with the model stage's loop among `stages` (StageSpec), in one line; None if nothing.
    The between stages wait only for each other, and no other stage waits for them."""
    by_name = {stage.name: stage for stage in stages}
    loop = by_name[model].loop
    if loop is None:
        return None
    for name in ("turns", "result_tokens", "call_output"):
        lengths = getattr(loop, name)
        if isinstance(lengths, LengthSpec) and lengths.kind == "empirical":
            return (f"stage {model!r}: loop.{name} cannot read a lengths file; use kind fixed, normal, lognormal "
                    "or uniform")
    between = loop.between
    for name in between:
        if name == model:
            return f"stage {model!r}: loop.between names the model call itself; name the stages run between its calls"
        if name not in by_name:
            return (f"stage {model!r}: loop.between names {name!r}, which is no stage; "
                    f"use one of {', '.join(by_name)}")
        if between.count(name) > 1:
            return f"stage {model!r}: loop.between names {name!r} twice; name it once"
    for name in between:
        stage = by_name[name]
        outside = [before for before in stage.after if before not in between]
        if outside:
            return (f"stage {name!r} runs between the model calls and cannot wait for {outside[0]!r}, which does not; "
                    "remove it from its after")
        if stage.start == "ahead":
            return f"stage {name!r} runs between the model calls and cannot start ahead; remove start"
    for stage in stages:
        inside = [before for before in stage.after if before in between and stage.name not in between]
        if inside:
            return (f"stage {stage.name!r} waits for {inside[0]!r}, which runs between the model calls; remove it "
                    f"from its after (a stage after the last call waits for {model!r})")
    return None
