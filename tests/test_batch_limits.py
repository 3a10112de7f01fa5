"""The limits an engine picks for the GPU it runs on, where the scenario's [engine] table leaves them out."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpath.sim.scenario import Scenario, load_scenario
from tokenpath.sim.simulate import simulate


def _scenario(chip: str, scheduler: str, **engine) -> Scenario:
    return Scenario.model_validate({"model": {"name": "llama-3.1-8b", "precision": "bf16"},
                                    "deployment": {"chip": chip, "chips": 1, "tp": 1},
                                    "engine": {"scheduler": scheduler, **engine}})


@pytest.mark.parametrize(("chip", "scheduler", "max_num_seqs", "max_num_batched_tokens"), [
    # vLLM V1's OpenAI server: the larger pair on a GPU of 70 GiB or more that is not an A100.
    ("h100", "vllm-v1", 1024, 8192), ("h200", "vllm-v1", 1024, 8192), ("mi300x", "vllm-v1", 1024, 8192),
    ("a100", "vllm-v1", 256, 2048), ("a100-40gb", "vllm-v1", 256, 2048), ("tpu-v6e", "vllm-v1", 256, 2048),
    # vLLM V0: 256 sequences anywhere.
    ("a100", "vllm-v0", 256, 8192), ("h200", "vllm-v0", 256, 8192),
    # SGLang's chunked prefill by the GPU's memory: 4096 under 60 GiB, 8192 under 160, 16384 above.
    ("a100-40gb", "prefill-first", 1024, 4096), ("h100", "prefill-first", 1024, 8192),
    ("h200", "prefill-first", 1024, 8192), ("b200", "prefill-first", 1024, 16384),
    ("mi300x", "prefill-first", 1024, 16384),
    # trtllm-serve: BuildConfig's 2048 requests and 8192 tokens on any GPU.
    ("a100", "trtllm", 2048, 8192), ("h200", "trtllm", 2048, 8192),
])
def test_each_engine_picks_its_limits_for_the_chip(chip, scheduler, max_num_seqs, max_num_batched_tokens):
    engine = _scenario(chip, scheduler).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (max_num_seqs, max_num_batched_tokens)


@pytest.mark.parametrize(("chip", "version", "large"), [
    # 0.7.0 to 0.8.4: H100 and H200 by name
    ("h100", "0.8.3 (vllm/vllm-openai:v0.8.3, V1)", True), ("h200", "0.7.3", True), ("mi300x", "0.8.4", False),
    ("b200", "0.8.3", False), ("a100", "0.8.3", False),
    # 0.8.5: every GPU of 70 GiB or more, the A100 80 GB too
    ("a100", "0.8.5", True), ("mi300x", "0.8.5.post1", True), ("a100-40gb", "0.8.5", False),
    # 0.9.0 on: not the A100
    ("a100", "0.9.0", False), ("b200", "0.9.2", True),
])
def test_vllm_v1s_limits_follow_each_releases_rule(chip, version, large):
    engine = _scenario(chip, "vllm-v1", version=version).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == ((1024, 8192) if large else (256, 2048))


def test_limits_the_table_states_stand_and_the_other_one_is_still_the_chips():
    engine = _scenario("a100", "vllm-v1", max_num_seqs=128).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (128, 2048)
    engine = _scenario("a100", "vllm-v1", max_num_batched_tokens=4096).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (256, 4096)


def test_switching_the_default_scenario_to_an_a100_takes_vllms_a100_limits():
    """The embedded scenario states none, so a lever or flag that moves it to another chip moves them too."""
    assert (load_scenario().engine.max_num_seqs, load_scenario().engine.max_num_batched_tokens) == (1024, 8192)
    moved = load_scenario(None, {"deployment.chip": "a100"})
    assert (moved.engine.max_num_seqs, moved.engine.max_num_batched_tokens) == (256, 2048)


def test_a_burst_on_an_a100_queues_behind_vllms_256_sequences():
    """1,000 prompts at once on one A100 80 GB, Llama 3.1 8B: the cache holds every one, but at most 256
    run in a step and the rest wait; with the H100's limits stated, four times as many start at once."""
    table = {"model": {"name": "llama-3.1-8b", "precision": "bf16"},
             "deployment": {"chip": "a100", "chips": 1, "tp": 1},
             "workload": {"num_requests": 1000, "arrival": {"rate": "inf"},
                          "input": {"kind": "fixed", "value": 200}, "output": {"kind": "fixed", "value": 200}}}
    a100 = simulate(Scenario.model_validate(table))
    stated = simulate(Scenario.model_validate({**table, "engine": {"max_num_seqs": 1024,
                                                                   "max_num_batched_tokens": 8192}}))
    assert a100.deployment.kv_capacity_tokens > 1000 * 400  # room for every request's whole cache
    assert a100.traces[0].step_seqs.max() == 256 and stated.traces[0].step_seqs.max() > 256

    def started_before_the_first_finished(sim) -> int:
        return int(np.sum(sim.run.sent_ns + sim.run.ttft_engine_ns < sim.run.engine_done_ns.min()))

    assert started_before_the_first_finished(a100) == 256
    assert started_before_the_first_finished(stated) == 1000
