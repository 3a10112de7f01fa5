"""The chat template's source read again per request by some vLLM releases (engine/template_work.py): which
releases, what it costs a request, and where in the front end it runs."""

from __future__ import annotations

import json

import pytest

from tokenpath.config.assumptions import default
from tokenpath.delivery.chat_template import LLAMA3_TEMPLATE, chat_template_chars
from tokenpath.delivery.frontend import Layout
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.profiles import PROFILES
from tokenpath.engine.template_work import no_template_work, vllm_template_work
from tokenpath.sim.scenario import load_scenario

DETECTION = "template_format_detection_per_char_s"
KWARGS = "template_kwargs_resolution_per_char_s"


@pytest.mark.parametrize(("release", "work"), [
    ("0.6.4", None),              # no content-format detection yet
    ("0.6.5", DETECTION), ("v0.7.3", DETECTION), ("0.8.5.post1", DETECTION), ("0.9.1", DETECTION),
    ("0.9.2", None),              # vLLM PR 20065 caches the detection
    ("0.10.2", None),
    ("0.11.0", KWARGS),           # resolve_chat_template_kwargs parses the template per request
    ("0.11.1", None), ("0.13.0", None),
    (None, None),                 # unstated: the newest release
    ("not stated", None),
])
def test_vllm_reads_the_template_per_request_in_two_spans_of_releases(release, work):
    assert vllm_template_work(release) == work


def test_each_profile_follows_its_engine():
    assert {name: p.template_work for name, p in PROFILES.items()} == {
        "vllm-v1": vllm_template_work, "vllm-v0": vllm_template_work,
        "prefill-first": no_template_work, "trtllm": no_template_work}
    assert no_template_work("0.11.0") is None


def _parse_s(overrides: dict) -> float:
    return load_scenario("typical", overrides).resolved_delivery().chat_template_parse_per_request


def test_a_release_that_parses_costs_its_rate_times_the_templates_length():
    chars = chat_template_chars("qwen3-8b")
    assert chars == 4168
    base = {"model.name": "qwen3-8b", "engine.scheduler": "vllm-v1"}
    assert _parse_s({**base, "engine.version": "0.11.0"}) == pytest.approx(default(KWARGS) * chars)
    assert _parse_s({**base, "engine.version": "0.8.5"}) == pytest.approx(default(DETECTION) * chars)
    assert _parse_s({**base, "engine.version": "0.12.0"}) == 0.0
    assert _parse_s({**base, "engine.scheduler": "prefill-first", "engine.version": "0.11.0"}) == 0.0


def test_no_parse_without_a_rendered_template_or_a_template_to_parse():
    base = {"engine.scheduler": "vllm-v1", "engine.version": "0.11.0"}
    assert _parse_s({**base, "model.name": "qwen3-8b", "delivery.chat_template_per_request": "0 s"}) == 0.0
    assert chat_template_chars("gpt-oss-120b") is None  # rendered by openai-harmony, not Jinja
    assert _parse_s({**base, "model.name": "gpt-oss-120b"}) == 0.0


def test_a_stated_time_and_an_overridden_rate_win():
    base = {"model.name": "qwen3-8b", "engine.scheduler": "vllm-v1", "engine.version": "0.11.0"}
    assert _parse_s({**base, "delivery.chat_template_parse_per_request": "3 ms"}) == pytest.approx(3e-3)
    assert _parse_s({**base, f"assumptions.{KWARGS}": "1 us"}) == pytest.approx(1e-6 * 4168)


def test_a_model_folder_gives_its_own_templates_length(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}), encoding="utf-8")
    assert chat_template_chars(str(tmp_path)) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": LLAMA3_TEMPLATE}), encoding="utf-8")
    assert chat_template_chars(str(config)) == len(LLAMA3_TEMPLATE)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}", encoding="utf-8")
    assert chat_template_chars(str(tmp_path)) == len("{{ messages[0]['content'] }}")


def test_a_burst_pays_every_parse_before_any_request_reaches_the_engine():
    """Hand-built: 100 requests at once, 1 ms of HTTP work and 10 ms of parse each on one process. The
    parse runs in the first stage, so the first request is handed to the engine only after all 100 first
    stages (1.1 s); without it, after the 100 HTTP stages (0.1 s)."""
    def first_handoff_s(parse_s: float) -> float:
        last_mile = LastMile(load_scenario("typical", {
            "delivery.frontend_per_request": "1 ms", "delivery.chat_template_per_request": "0.1 ms",
            "delivery.tokenize_per_token": "0 s", "delivery.chat_template_parse_per_request": f"{parse_s} s",
        }).resolved_delivery(), Layout("api-server"))
        waits = last_mile.requests([0] * 100, [500] * 100)
        return min(done_ns for done_ns, _, _ in waits) / 1e9

    assert first_handoff_s(0.0) == pytest.approx(100 * 1e-3 + 0.1e-3)
    assert first_handoff_s(10e-3) == pytest.approx(100 * 11e-3 + 0.1e-3)


def test_a_release_that_parses_per_request_is_offered_one_that_parses_once():
    from tokenpath.whatif.catalog import catalog

    lever = "chat template parsed once (a vLLM release that caches it)"
    base = {"model.name": "qwen3-8b", "engine.scheduler": "vllm-v1"}
    parsing = {item.name: item for item in catalog(load_scenario("typical", {**base, "engine.version": "0.11.0"}),
                                                   {}, None)}
    assert parsing[lever].overrides == {"delivery.chat_template_parse_per_request": "0 s"}
    newest = {item.name for item in catalog(load_scenario("typical", base), {}, None)}
    assert lever not in newest


def test_calibrate_delivery_times_the_template_a_hugging_face_folder_ships(tmp_path):
    from tokenpath.delivery.chat_template import jinja_source_for

    tokenizer = tmp_path / "tokenizer.json"
    assert jinja_source_for(tokenizer, "huggingface") == (LLAMA3_TEMPLATE, "Llama 3 template (embedded)")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}), encoding="utf-8")
    assert jinja_source_for(tokenizer, "huggingface") == ("{{ messages }}", "tokenizer_config.json chat_template")
    assert jinja_source_for(tokenizer, "tekken")[1] == "Llama 3 template (embedded)"
