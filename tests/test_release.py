"""An engine's stated release, read as far as the model needs it, and what an earlier release changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpath.engine.release import release_at_least, release_number, written_release
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import Scenario

numbers = st.lists(st.integers(0, 10_000), min_size=1, max_size=5)
# What follows a release number in the versions people write: a post or pre-release, a local build, a
# parenthesized image tag.
suffixes = st.sampled_from(["", ".post1", "rc2", "+cu124", "-dev", " (vllm/vllm-openai:v0.8.3, V1)", ".dev20250101"])


def _stripped(parts: list[int]) -> tuple[int, ...]:
    while len(parts) > 1 and parts[-1] == 0:
        parts = parts[:-1]
    return tuple(parts)


@given(parts=numbers, prefix=st.sampled_from(["", "v", "V", " "]), suffix=suffixes)
def test_the_leading_release_number_is_read_whatever_follows_it(parts, prefix, suffix):
    assert release_number(prefix + ".".join(map(str, parts)) + suffix) == _stripped(parts)


@given(a=numbers, b=numbers)
def test_releases_compare_as_their_numbers_with_trailing_zeros_ignored(a, b):
    text_a, text_b = ".".join(map(str, a)), ".".join(map(str, b))
    assert release_at_least(text_a, text_b) == (_stripped(a) >= _stripped(b))
    assert release_at_least(text_a + ".0", text_a) and release_at_least(text_a, text_a + ".0")


@given(text=st.text(alphabet=st.characters(blacklist_categories=["Nd"]), max_size=30))
def test_text_that_starts_with_no_number_states_no_release_and_reads_as_the_newest(text):
    assert release_number(text) is None
    assert release_at_least(text, "99.0")


def test_a_since_that_is_no_release_is_a_programming_error():
    with pytest.raises(ValueError, match="not a release number"):
        release_at_least("0.7.0", "latest")


@pytest.mark.parametrize("scheduler, version, latent", [
    ("vllm-v1", "0.7.0", False), ("vllm-v1", "v0.6.6.post1", False), ("vllm-v1", "0.7.1", True),
    ("vllm-v1", "0.8.3 (vllm/vllm-openai:v0.8.3, V1)", True), ("vllm-v1", None, True),
    ("vllm-v1", "nightly", True), ("vllm-v0", "0.6.0", False), ("prefill-first", "0.2.0", True),
    ("trtllm", "0.10.0", True),
])
def test_each_engine_runs_mla_in_the_latent_space_from_the_release_it_arrived_in(scheduler, version, latent):
    assert EngineSpec(scheduler=scheduler, version=version).latent_attention is latent


def test_deepseek_on_vllm_before_0_7_1_holds_a_tenth_of_the_tokens_in_its_kv_cache():
    """Neural Magic's measurement on 8 x H200 (v0.7.0 to v0.7.1): 54,560 to 512,000 tokens, 9.4x. The
    model's memory for the cache is the same in both but for the latent form's bf16 copies of the absorbed
    W_UK / W_UV (2 x 127,926,272 bytes a chip), so the ratio is about the bytes per token's, 10.7x."""
    def deployment(version: str):
        return build_deployment(Scenario.model_validate({
            "model": {"name": "deepseek-v3", "precision": "fp8"},
            "deployment": {"chip": "h200", "chips": 8, "tp": 8}, "engine": {"version": version}}))

    before, after = deployment("0.7.0"), deployment("0.7.1")
    assert before.compute.kv_bytes_per_token_per_chip == 749_568
    assert after.compute.kv_bytes_per_token_per_chip == 70_272
    copies_bytes = after.compute.weight_bytes_per_chip - before.compute.weight_bytes_per_chip
    assert copies_bytes == 2 * 127_926_272
    assert after.kv_capacity_tokens == pytest.approx(
        (before.kv_capacity_tokens * 749_568 - copies_bytes) / 70_272, rel=1e-3)


@pytest.mark.parametrize("text, written", [("v0.8.3", "0.8.3"), ("0.8.3.0", "0.8.3.0"), ("V1", "1"),
                                           ("0.5.3rc0", None), ("0.8.3 (V1)", None), ("NIM 1.8.0", None), ("", None)])
def test_a_written_release_is_a_release_number_alone_less_its_tags_v(text, written):
    assert written_release(text) == written
