"""The chat template a serving front end applies to a conversation before the prompt is tokenized.

A Hugging Face tokenizer.json whose folder holds a `chat_template` (in tokenizer_config.json, or a
chat_template.jinja file) is rendered with Jinja2 as transformers' `apply_chat_template` renders it:
an `ImmutableSandboxedEnvironment` with `trim_blocks`, `lstrip_blocks` and the loop controls, its
`raise_exception` and `strftime_now` globals, its `tojson` filter (no HTML escaping, non-ASCII kept),
and the tokenizer's special tokens (`bos_token`, ...) as variables
(transformers/utils/chat_template_utils.py, `_compile_jinja_template` and `render_jinja_template`).
Mistral's tokenizers (Tekken, the SentencePiece models mistral-common ships) are applied by
mistral-common's own `encode_chat_completion`, as vLLM does for them; it tokenizes while it renders.
Any other tokenizer gets Llama 3's template, embedded here. `added_tokens` counts the tokens a template
adds to a one-message conversation (what a scenario's `chat_template_tokens = "auto"` adds to each prompt).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenpath import catalog
from tokenpath.config import files
from tokenpath.config.errors import UserError

# meta-llama/Meta-Llama-3-8B-Instruct, tokenizer_config.json, "chat_template" (as published in April 2024).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# The same file's bos_token and eos_token.
LLAMA3_SPECIAL_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

# A short chat: the system prompt and question a front end sees on most requests. Templates that refuse
# a system message (some insist on alternating user/assistant turns) get the question alone.
SYSTEM = "You are a helpful assistant. Answer briefly and cite your sources."
QUESTION = ("How long does it take for the first word of an answer to appear after I send a question to a "
            "chat service, and what happens to my request in the meantime?")
ONE_MESSAGE = [{"role": "user", "content": QUESTION}]
CONVERSATIONS = ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], ONE_MESSAGE)

# The special-token attributes transformers passes to a template (SpecialTokensMixin.SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _raise_exception(message: str):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=8)
def compile_template(source: str):
    """A Jinja2 template compiled in transformers' environment (cached, as transformers caches it)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(source)


def render(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
           **variables: Any) -> str:
    """The prompt text of `messages` under the template `source`; `variables` are the special tokens."""
    return compile_template(source).render(messages=messages, tools=None, documents=None,
                                           add_generation_prompt=add_generation_prompt, **variables)


@dataclass(frozen=True)
class ChatRenderer:
    """How a front end turns one conversation into a prompt for this tokenizer."""

    name: str                                         # what renders, for the calibration file
    apply: Callable[[list[dict[str, Any]]], object]   # a conversation -> its prompt (text, or ids)
    encodes: Callable[[str], object] | None = None    # the text encoding `apply` does inside it, if any


def _special_tokens(config: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json's special tokens, as strings (a token may be written as {"content": ...})."""
    found: dict[str, Any] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[name] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        found["additional_special_tokens"] = [t.get("content") if isinstance(t, dict) else t for t in extra]
    return found


def _template_source(config: dict[str, Any], folder: Path) -> tuple[str | None, str]:
    """The folder's default chat template and where it came from: chat_template.jinja, else
    tokenizer_config.json's (a string, or a list of named templates of which transformers takes "default")."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8"), "chat_template.jinja"
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return (template if isinstance(template, str) else None), "tokenizer_config.json chat_template"


def chat_template_chars(model_source: str) -> int | None:
    """The length in characters of the chat template a model's checkpoint ships, which some engines' API
    servers parse again for every request (engine/template_work.py): a catalog model's
    `hf_chat_template_chars` (models.toml, from its checkpoint's tokenizer_config.json), or the template in
    the folder of a config.json (chat_template.jinja, else tokenizer_config.json's). None where neither
    says: a catalog model whose conversations are rendered without one (gpt-oss's, by openai-harmony), or a
    folder without one."""
    path = Path(model_source)
    if not files.exists(path):
        _, entry = catalog.lookup(catalog.MODELS_FILE, model_source, "model", "models")
        return entry.get("hf_chat_template_chars")
    folder = path if path.is_dir() else path.parent
    source, _ = _template_source(_tokenizer_config(folder, "model"), folder)
    return None if source is None else len(source)


def _first_rendering(apply: Callable[[list[dict[str, Any]]], object], where: str) -> list[dict[str, Any]]:
    """The first of CONVERSATIONS that `apply` accepts."""
    problems = []
    for conversation in CONVERSATIONS:
        try:
            apply(conversation)
            return conversation
        except Exception as error:  # noqa: BLE001 - a template may refuse a conversation in any way
            problems.append(str(error).strip() or type(error).__name__)
    raise UserError(f"{where}: the chat template refuses a system + user and a user-only conversation "
                    f"({problems[-1]}); pass a tokenizer whose template accepts a user message")


def jinja_renderer(source: str, variables: dict[str, Any], name: str, where: str) -> tuple[ChatRenderer, list]:
    import jinja2

    try:
        compile_template(source)
    except jinja2.TemplateError as error:
        raise UserError(f"{where}: Jinja2 cannot compile the chat template ({error}); fix the template") from None
    renderer = ChatRenderer(name, lambda messages: render(source, messages, **variables))
    return renderer, _first_rendering(renderer.apply, where)


def _mistral_renderer(path: Path) -> ChatRenderer | None:
    """mistral-common's chat encoding of a tokenizer file it ships or reads, or None if it cannot load it."""
    try:
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        tokenizer = MistralTokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001 - not a tokenizer mistral-common knows: fall back to a template
        return None

    def apply(messages: list[dict[str, Any]]) -> object:
        return tokenizer.encode_chat_completion(ChatCompletionRequest(messages=messages)).tokens

    inner = tokenizer.instruct_tokenizer.tokenizer
    return ChatRenderer("mistral-common encode_chat_completion", apply,
                        lambda text: inner.encode(text, bos=False, eos=False))


def _tokenizer_config(folder: Path, where: str) -> dict[str, Any]:
    """The folder's tokenizer_config.json as a dict ({} where it has none)."""
    config_file = folder / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserError(f"{where} {config_file}: cannot read it as JSON ({error}); fix or remove it") from None
    return config if isinstance(config, dict) else {}


def renderer_for(path: Path, kind: str) -> tuple[ChatRenderer, list[dict[str, Any]]]:
    """The renderer a front end uses for the tokenizer file at `path` (`kind` as the Detokenizer names
    it), and the conversation it renders."""
    if kind == "huggingface":
        config = _tokenizer_config(path.parent, "tokenizer")
        source, origin = _template_source(config, path.parent)
        if source is not None:
            return jinja_renderer(source, _special_tokens(config), f"{origin}, Jinja2 as in transformers",
                                  f"tokenizer {path}")
    else:
        mistral = _mistral_renderer(path)
        if mistral is not None:
            return mistral, _first_rendering(mistral.apply, f"tokenizer {path}")
    return jinja_renderer(LLAMA3_TEMPLATE, LLAMA3_SPECIAL_TOKENS, "Llama 3 template (embedded), Jinja2 as in "
                          "transformers", f"tokenizer {path}")


def jinja_source_for(path: Path, kind: str) -> tuple[str, str]:
    """The Jinja template a front end would parse for the tokenizer file at `path`, and where it came
    from: a Hugging Face folder's own, else the embedded Llama 3 template (mistral-common's tokenizers
    are rendered without one)."""
    if kind == "huggingface":
        source, origin = _template_source(_tokenizer_config(path.parent, "tokenizer"), path.parent)
        if source is not None:
            return source, origin
    return LLAMA3_TEMPLATE, "Llama 3 template (embedded)"


@lru_cache(maxsize=8)
def _added_tokens(path: Path, kind: str) -> int:
    from tokenpath.delivery.detokenizer import Detokenizer

    renderer, _ = renderer_for(path, kind)
    rendered = renderer.apply(ONE_MESSAGE)
    if renderer.encodes is not None:  # mistral-common: the ids themselves, and its own encoding of the text
        return len(rendered) - len(renderer.encodes(QUESTION))
    encode = Detokenizer.load(path).encode  # as transformers tokenizes a rendered template: special tokens as such
    return len(encode(rendered)) - len(encode(QUESTION))


def added_tokens(path: str | Path | None = None) -> int:
    """Tokens the chat template of the tokenizer at `path` (None: the embedded default) adds to a
    one-message conversation: tokens(rendered conversation) - tokens(message text). Counted once a file."""
    from tokenpath.delivery.detokenizer import Detokenizer

    detokenizer = Detokenizer.load(path)
    return _added_tokens(detokenizer.path.resolve(), detokenizer.kind)
