"""Pipeline parallelism's batches in flight share their replica's stages (engine/pipeline.py): a flow shop
checked against hand-worked schedules, alone and inside the cluster that steps the batches."""

from __future__ import annotations

import numpy as np
import pytest

from test_engine import FixedCosts
from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.spec import DeliverySpec
from tokenpath.engine.cluster import run_cluster
from tokenpath.engine.pipeline import Pipeline
from tokenpath.engine.routing import Router
from tokenpath.engine.spec import EngineSpec


def test_equal_steps_of_two_batches_overlap_as_a_pipeline():
    stages = Pipeline(2)
    # Steps of 10 (5 a stage): the second batch's first step waits 5 for stage one, then the two alternate,
    # each batch stepping every 10, as often as alone.
    assert stages.run(0, 10) == 10
    assert stages.run(0, 10) == 15
    assert stages.run(10, 10) == 20
    assert stages.run(15, 10) == 25


def test_a_long_step_holds_each_stage_in_turn_and_the_rest_goes_to_the_last():
    stages = Pipeline(2)
    assert stages.run(0, 40) == 40      # a prompt: 20 on each stage
    assert stages.run(1, 10) == 45      # a decode step behind it: stage one at 20-25, stage two at 40-45
    assert stages.run(100, 11) == 111   # parts of 5 and 6
    assert stages.free_ns == [105, 111]


def test_a_drafter_runs_on_the_last_stage_alone_and_paces_the_batches():
    """vLLM builds the whole draft model on the last pipeline rank: two batches of 100 of layers and 50 of
    drafter each step every 100 + 50 at the last stage, not every 75 as a drafter spread over the stages."""
    stages = Pipeline(2)
    assert stages.run(0, 100, 50) == 150   # stage one 0-50, stage two 50-150 (its 50, then the drafter's)
    assert stages.run(0, 100, 50) == 250   # stage one 50-100, stage two 150-250
    assert stages.free_ns == [100, 250]
    spread = Pipeline(2)
    assert spread.run(0, 150) == 150 and spread.run(0, 150) == 225


def test_a_pipeline_has_two_stages_or_more():
    with pytest.raises(ValueError, match="two stages"):
        Pipeline(1)


def test_a_prompt_in_one_batch_stalls_the_other_batch_s_next_step_by_its_last_stage():
    """Request 0 decodes alone on batch 0 from t=0; request 1's 1,000-token prompt reaches batch 1 at 10 ms.
    With the stages shared, batch 0's step launched after the prompt ends half a decode step (its last
    stage's part) after the prompt's; apart, no step of batch 0 is longer than a decode step."""
    costs = FixedCosts(base_s=1e-3, per_token_s=1e-5)  # a decode step 1.01 ms, the prompt's 11 ms
    scheduled = np.array([0, 10_000_000], np.int64)
    inputs, outputs = np.array([1, 1000], np.int64), np.array([50, 2], np.int64)
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=2048)

    def batches(stages):
        _, traces, _ = run_cluster(scheduled, inputs, outputs, None, costs,
                                   [LastMile(DeliverySpec()) for _ in range(2)], spec, 10**6, "round_robin",
                                   pipeline_stages=stages)
        return traces

    decode, prompt = batches(2)
    prompt_end = int(prompt.step_start_ns[0] + prompt.step_compute_ns[0])
    ends = decode.step_start_ns + decode.step_compute_ns
    stalled = int(np.argmax(decode.step_compute_ns))
    assert decode.step_start_ns[stalled] > prompt.step_start_ns[0]  # launched after the prompt
    assert ends[stalled] == prompt_end + 1_010_000 // 2
    alone_decode, _ = batches(1)
    assert alone_decode.step_compute_ns.max() == 1_010_000


def test_a_router_given_each_request_s_replica_keeps_to_it():
    router = Router("session_affinity", 3, None, np.array([2, 0, 2, 1]))
    assert [router.choose(i, 10, [0.0, 0.0, 0.0]) for i in range(4)] == [2, 0, 2, 1]
