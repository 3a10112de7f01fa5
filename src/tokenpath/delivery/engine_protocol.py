"""An engine's own OpenAI protocol code: the pydantic request it validates and the chunks it streams.

Modelled on vLLM's vllm/entrypoints/openai/protocol.py (v0.10): every model is an `OpenAIBaseModel`
(extra fields allowed, a wrap validator that looks for them), the chat request holds the OpenAI
fields and vLLM's sampling extras with its before-validators, messages are validated against
TypedDicts as vLLM validates the openai package's message params, and each streamed chunk is a
`ChatCompletionStreamResponse` dumped with `model_dump_json(exclude_unset=True)` and framed as
`data: ...\\n\\n` (vllm/entrypoints/openai/serving_chat.py). `tokenpath calibrate delivery` times
these to price what a server built this way spends per request and per event, next to this
package's own framer (sse.py) and `tokenpath serve`'s own request checks (serve/fields.py).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Required, TypedDict

# torch.iinfo(torch.long): the seed's bounds in vLLM's request.
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    field_names: ClassVar[set[str] | None] = None

    @model_validator(mode="wrap")
    @classmethod
    def _extra_fields(cls, data: Any, handler: Any) -> Any:
        """vLLM logs the request fields it ignores; this finds them the same way (and drops the log)."""
        result = handler(data)
        if isinstance(data, dict):
            if cls.field_names is None:
                cls.field_names = {name for name in cls.model_fields} | {
                    f.alias for f in cls.model_fields.values() if f.alias}
            _ = any(key not in cls.field_names for key in data)  # vLLM logs these at warning level
        return result


class TextPart(TypedDict, total=False):
    text: Required[str]
    type: Required[Literal["text"]]


class ImageUrl(TypedDict, total=False):
    url: Required[str]
    detail: Literal["auto", "low", "high"]


class ImagePart(TypedDict, total=False):
    image_url: Required[ImageUrl]
    type: Required[Literal["image_url"]]


class FunctionCall(TypedDict):
    arguments: str
    name: str


class ToolCallParam(TypedDict):
    id: str
    function: FunctionCall
    type: Literal["function"]


class SystemMessage(TypedDict, total=False):
    content: Required[str | list[TextPart]]
    role: Required[Literal["system"]]
    name: str


class UserMessage(TypedDict, total=False):
    content: Required[str | list[TextPart | ImagePart]]
    role: Required[Literal["user"]]
    name: str


class AssistantMessage(TypedDict, total=False):
    role: Required[Literal["assistant"]]
    content: str | list[TextPart] | None
    name: str
    tool_calls: list[ToolCallParam]


class ToolMessage(TypedDict, total=False):
    content: Required[str | list[TextPart]]
    role: Required[Literal["tool"]]
    tool_call_id: Required[str]


class CustomMessage(TypedDict, total=False):
    """vLLM's catch-all message (any role), tried after the OpenAI ones."""

    role: Required[str]
    content: str | list[TextPart | ImagePart]
    name: str
    tool_call_id: str | None
    tool_calls: list[ToolCallParam] | None


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage | CustomMessage


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    function: NamedFunction
    type: Literal["function"] = "function"


class ChatCompletionRequest(OpenAIBaseModel):
    """The OpenAI chat-completions request with vLLM's sampling and extra parameters."""

    messages: list[Message]
    model: str | None = None
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    presence_penalty: float | None = 0.0
    response_format: ResponseFormat | None = None
    seed: int | None = Field(None, ge=_LONG_MIN, le=_LONG_MAX)
    stop: str | list[str] | None = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ToolParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = "none"
    parallel_tool_calls: bool | None = False
    user: str | None = None
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=1)] | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    guided_json: str | dict | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    priority: int = 0
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)  # vLLM's random_uuid()
    cache_salt: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options(cls, data: Any) -> Any:
        if data.get("stream_options") and not data.get("stream"):
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return data

    @model_validator(mode="before")
    @classmethod
    def _logprobs(cls, data: Any) -> Any:
        prompt_logprobs = data.get("prompt_logprobs")
        if prompt_logprobs is not None and (prompt_logprobs < 0 or data.get("stream") and prompt_logprobs > 0):
            raise ValueError("`prompt_logprobs` must be >= 0 and is not available when `stream=True`.")
        top_logprobs = data.get("top_logprobs")
        if top_logprobs is not None and (top_logprobs < 0 or top_logprobs > 0 and not data.get("logprobs")):
            raise ValueError("`top_logprobs` must be >= 0, and needs `logprobs`.")
        return data

    @model_validator(mode="before")
    @classmethod
    def _guided_decoding_count(cls, data: Any) -> Any:
        if sum(data.get(key) is not None for key in ("guided_json", "guided_regex", "guided_choice")) > 1:
            raise ValueError("You can only use one kind of guided decoding.")
        return data

    @model_validator(mode="before")
    @classmethod
    def _tool_usage(cls, data: Any) -> Any:
        if "tool_choice" not in data and data.get("tools"):
            data["tool_choice"] = "auto"
        choice = data.get("tool_choice")
        if choice not in (None, "none") and data.get("tools") is None:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        return data

    @model_validator(mode="before")
    @classmethod
    def _generation_prompt(cls, data: Any) -> Any:
        if data.get("continue_final_message") and data.get("add_generation_prompt"):
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return data


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class StreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[StreamChoice]
    usage: UsageInfo | None = Field(default=None)


def validate_request(body: bytes) -> ChatCompletionRequest:
    """A request body decoded and validated as the engine's HTTP handler does."""
    import orjson

    return ChatCompletionRequest.model_validate(orjson.loads(body))


def engine_event(request_id: str, model: str, created: int, text: str) -> bytes:
    """One streamed text chunk as the engine builds it: models, JSON dump, SSE framing, UTF-8 bytes."""
    choice = StreamChoice(index=0, delta=DeltaMessage(content=text), logprobs=None, finish_reason=None)
    chunk = ChatCompletionStreamResponse(id=request_id, object="chat.completion.chunk", created=created,
                                         model=model, choices=[choice])
    return f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n".encode()
