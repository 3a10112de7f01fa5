"""What an engine's API server does, per chat request, with the chat template's Jinja source besides
rendering it, release by release: work in proportion to the template's length, on the CPU every request
and every token of the server share (delivery/frontend.py).

Rendering is cheap everywhere: transformers compiles a template once and keeps it
(`_compile_jinja_template`, an lru_cache), and the front end's `chat_template_per_request` prices the
render. Some vLLM releases also parse the template's source again for every request:

- 0.6.5 to 0.9.1: `_preprocess_chat` (entrypoints/openai/serving_engine.py) calls
  `resolve_chat_template_content_format` (entrypoints/chat_utils.py) on every request, and it detects
  whether the template loops over a message's content parts: `_detect_content_format` parses the source
  (`_try_extract_ast`: the compiled template's `environment.parse`) and walks the tree for the loops
  (`_iter_nodes_assign_content_item`: `find_all` over its assignments and for loops). vLLM PR 20065, which
  cached it for 0.9.2: "when we send 1000 requests to OpenAI server, it internally calls this function
  1000 times which results in 6-8 seconds delay before prompts actually are started to process".
- 0.11.0: `apply_hf_chat_template` calls `resolve_chat_template_kwargs` on every request, which builds a
  sandboxed Jinja environment, parses the source and lists its undeclared variables
  (`jinja2.meta.find_undeclared_variables`) to filter the request's template arguments; 0.11.1 caches it
  (`_cached_resolve_chat_template_kwargs`).

Read in each release's wheel (`pip download vllm==X --no-deps`): 0.6.4 has no content-format detection,
0.9.2 to 0.10.2 cache it and have no `resolve_chat_template_kwargs`. vLLM renders gpt-oss conversations
with openai-harmony (serving_chat.py, `use_harmony`), never its Jinja template. SGLang detects the content
format once, at start (sglang/srt/managers/template_manager.py), and TensorRT-LLM's trtllm-serve resolves
the template without parsing it (tensorrt_llm/inputs/utils.py, `resolve_hf_chat_template`): neither
parses it per request.

Each kind of work costs its registry time per character of the template's source
(TEMPLATE_FORMAT_DETECTION_PER_CHAR_S, TEMPLATE_KWARGS_RESOLUTION_PER_CHAR_S).
"""

from __future__ import annotations

from typing import Literal

from tokenpath.config.assumptions import Assumptions, default
from tokenpath.engine.release import release_at_least

TemplateWork = Literal["template_format_detection_per_char_s", "template_kwargs_resolution_per_char_s"]

TEMPLATE_FORMAT_DETECTION_PER_CHAR_S = default("template_format_detection_per_char_s")
"""vLLM 0.6.5-0.9.1's per-request content-format detection, per character of the template: a parse and
three `find_all` walks of its tree (benchmarks/template_parse.py)."""
TEMPLATE_KWARGS_RESOLUTION_PER_CHAR_S = default("template_kwargs_resolution_per_char_s")
"""vLLM 0.11.0's per-request template-argument resolution, per character: a sandboxed environment built,
the source parsed and its undeclared variables listed (benchmarks/template_parse.py)."""

# The releases, first and first not, that do each per request.
VLLM_FORMAT_DETECTION_RELEASES = ("0.6.5", "0.9.2")
VLLM_KWARGS_RESOLUTION_RELEASES = ("0.11.0", "0.11.1")


def _within(release: str | None, releases: tuple[str, str]) -> bool:
    first, fixed = releases
    return release_at_least(release, first) and not release_at_least(release, fixed)


def vllm_template_work(release: str | None) -> TemplateWork | None:
    """The work vLLM's API server does per request on the template's source in `release` (None: the
    newest, which does none)."""
    if _within(release, VLLM_FORMAT_DETECTION_RELEASES):
        return "template_format_detection_per_char_s"
    if _within(release, VLLM_KWARGS_RESOLUTION_RELEASES):
        return "template_kwargs_resolution_per_char_s"
    return None


def no_template_work(release: str | None) -> TemplateWork | None:
    """An engine that parses its template once, at start, in every release read."""
    return None


def cost_per_char_s(work: TemplateWork, assumptions: Assumptions) -> float:
    """A run's time per character of the template for `work` (its registry value unless overridden)."""
    if work == "template_format_detection_per_char_s":
        return assumptions.value("template_format_detection_per_char_s")
    return assumptions.value("template_kwargs_resolution_per_char_s")
