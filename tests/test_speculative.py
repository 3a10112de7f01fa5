"""Speculative decoding: a verify step's width and cost, the tokens it gains, and what a run makes of them
(engine/speculative.py, compute/drafter.py, engine/replica.py)."""

import math

import numpy as np
import pytest

from cli_helpers import assert_user_error, run_cli
from test_engine import NO_NETWORK, SpeculativeCosts
from tokenpath.compute.chip import load_chip
from tokenpath.compute.drafter import EAGLE3_DRAFT_VOCAB, DraftCost, drafter_compute, drafter_model
from tokenpath.compute.efficiency import SAMPLER_PROFILE_BYTES_PER_LOGIT
from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.loop import run_engine
from tokenpath.engine.replica import Replica
from tokenpath.engine.spec import EngineSpec
from tokenpath.engine.speculative import Acceptance, SpeculativeSpec, mean_tokens_per_step, mtp_head_shared
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import Scenario, load_scenario


def run(inputs, outputs, costs, spec=EngineSpec(), kv_tokens=10**9, arrivals_s=None):
    inputs, outputs = np.array(inputs), np.array(outputs)
    arrivals = (np.zeros(len(inputs), np.int64) if arrivals_s is None
                else np.rint(np.array(arrivals_s) * 1e9).astype(np.int64))
    return run_engine(arrivals, inputs, outputs, costs, LastMile(NO_NETWORK), spec, kv_tokens)


def test_every_draft_accepted_gains_drafts_plus_one_tokens_a_step():
    # k = 3 drafts, all accepted: after the prompt's token, 8 tokens in two verify steps of 4.
    trace = run([100], [9], SpeculativeCosts(drafts=3, acceptance=1.0))
    assert list(trace.step_tokens) == [100, 4, 4]  # each verify step runs 1 + 3 positions
    assert list(trace.step_logits) == [1, 4, 4]    # and the LM head over each
    assert list(trace.token_steps()) == [0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert trace.compute_ns[0] == 3_000_000        # each step charged once, not once a token
    assert trace.last_step_end_ns[0] == 3_000_000


def test_the_last_step_gains_only_the_tokens_left():
    # 6 tokens: the prompt's, then 4, then only 1 of the next 4.
    trace = run([10], [6], SpeculativeCosts(drafts=3, acceptance=1.0))
    assert list(trace.token_steps()) == [0, 1, 1, 1, 1, 2]


def test_nothing_accepted_is_one_token_a_step_at_the_verify_steps_cost():
    costs = SpeculativeCosts(drafts=2, acceptance=0.0, base_s=1e-3, per_token_s=1e-4, drafter=5e-4)
    trace = run([10], [4], costs)
    assert list(trace.token_steps()) == [0, 1, 2, 3]
    # Each decode step runs 3 positions (1 ms + 0.3 ms) and the drafter (0.5 ms); the prefill 1 ms + 1 ms
    # of its 10 tokens and the drafter's pass over them.
    assert list(trace.step_compute_ns) == [2_500_000, 1_800_000, 1_800_000, 1_800_000]


def test_sequences_that_finish_inside_a_step_leave_with_their_own_tokens_and_blocks():
    # Two requests decode together, 4 tokens a step; one has 3 tokens to go, the other 7.
    costs = SpeculativeCosts(drafts=3, acceptance=1.0)
    spec = EngineSpec(block_size=4)
    replica = Replica(costs, LastMile(NO_NETWORK), spec, kv_capacity_tokens=64)
    replica.submit(5, 4, 0)
    replica.submit(5, 8, 0)
    finished = []
    while not replica.idle:
        finished += replica.step()
    assert finished == [0, 1]
    assert list(replica.generated) == [4, 8]
    assert replica.free_blocks == replica.cache_blocks  # every block back: the context sums stayed exact
    assert replica.decoders.context_sum == 0


def test_acceptance_draws_follow_the_truncated_geometric_distribution():
    a, k, n = 0.7, 3, 200_000
    acceptance = Acceptance(a, k, seed=2)
    draws = np.array([acceptance.next() for _ in range(n)])
    expected = [a ** j * (1 - a) for j in range(k)] + [a ** k]  # drafts accepted: 0, 1, 2, 3
    shares = np.bincount(draws - 1, minlength=k + 1) / len(draws)
    assert np.allclose(shares, expected, atol=0.005)
    assert draws.mean() == pytest.approx(mean_tokens_per_step(a, k), rel=0.01)
    assert mean_tokens_per_step(a, k) == pytest.approx((1 - a ** 4) / (1 - a))
    assert mean_tokens_per_step(1.0, k) == k + 1 and mean_tokens_per_step(0.0, k) == 1


def test_a_run_with_random_acceptance_gains_its_mean_tokens_a_step():
    costs = SpeculativeCosts(drafts=4, acceptance=0.6)
    trace = run([50] * 20, [400] * 20, costs)
    decode_steps = np.flatnonzero(trace.step_tokens == 20 * 5)  # every sequence decoding, 5 positions each
    tokens = np.bincount(trace.token_steps(), minlength=len(trace.step_tokens))
    per_sequence = tokens[decode_steps] / 20
    assert per_sequence.mean() == pytest.approx(mean_tokens_per_step(0.6, 4), rel=0.05)


def test_the_drafters_passes_are_the_steps_shape_then_one_token_a_sequence():
    model = load_model("llama-3.1-8b")
    head = drafter_model(model, "eagle3")
    assert (head.num_layers, head.vocab_size, head.num_experts) == (1, EAGLE3_DRAFT_VOCAB, 0)
    compute = ComputeModel(head, load_chip("h100"), 1, "bf16", "bf16")
    cost = DraftCost(compute, drafts=3)
    expected = (compute.step_time_s(130, 8, 5000.0, 4000.0, 64.0)
                + 2 * compute.step_time_s(8, 8, 4000.0, 4000.0))
    assert cost.step_s(130, 8, 5000.0, 4000.0, 64.0) == pytest.approx(expected, rel=1e-12)
    # A step of prompt chunks that sample nothing: the first pass alone, writing the drafter's KV cache there
    assert cost.step_s(130, 0, 5000.0, 4000.0, 64.0) == compute.step_time_s(130, 0, 5000.0, 4000.0, 64.0) > 0
    assert cost.step_s(0, 0, 0.0, 0.0, 0.0) == 0.0
    mtp = drafter_model(load_model("deepseek-v3"), "mtp")
    assert (mtp.num_layers, mtp.moe_layers, mtp.kv_lora_rank) == (1, 1, 512)  # an MLA and MoE layer
    assert drafter_model(model, "ngram") is None


def _scenario(**engine):
    return Scenario.model_validate({
        "model": {"name": "llama-3.1-8b", "precision": "bf16"},
        "deployment": {"chip": "h100", "chips": 1, "tp": 1},
        "engine": {"gpu_memory_utilization": 0.9, **engine},  # a share that sets the cache, not vLLM's margin
        "workload": {"num_requests": 50, **({"draft_acceptance": 0.7} if "speculative" in engine else {})},
    })


def test_the_drafters_weights_and_kv_come_out_of_the_kv_cache():
    plain = build_deployment(_scenario())
    eagle = build_deployment(_scenario(speculative={"method": "eagle3", "num_speculative_tokens": 3}))
    ngram = build_deployment(_scenario(speculative={"method": "ngram", "num_speculative_tokens": 3}))
    head = drafter_compute(plain.model, "eagle3", plain.chip, 1, "bf16", "bf16")
    compute = plain.compute
    seqs = 1024  # vLLM V1's default on an H100, whose memory profile runs its sampler
    reserve = compute.activation_reserve_bytes(8192, seqs, SAMPLER_PROFILE_BYTES_PER_LOGIT)
    free = compute.chip.hbm_bytes * 0.9 - compute.weight_bytes_per_chip - reserve
    assert plain.kv_capacity_tokens == int(free // compute.kv_bytes_per_token_per_chip)
    assert eagle.kv_capacity_tokens == int((free - head.weight_bytes_per_chip)
                                           // (compute.kv_bytes_per_token_per_chip + head.kv_bytes_per_token_per_chip))
    assert ngram.kv_capacity_tokens == plain.kv_capacity_tokens and ngram.costs.draft_s is None


# Llama 3.1 8B's shape: hidden 4096, 32 query and 8 KV heads of 128, MLP 14336, vocabulary 128256.
H, LAYER_PARAMS = 4096, 4096 * 48 * 128 + 4096 * 4096 + 3 * 4096 * 14336 + 3 * 4096  # qkv, o, MLP, norms
EMBEDDING_BYTES = 128_256 * 4096 * 2  # bf16


def test_an_eagle_head_holds_its_layer_and_fc_and_not_the_targets_embedding_or_head():
    # vLLM's EagleProposer.load_model and SGLang's set_embed_and_head give it the target's: one decoder
    # layer and the 2h -> h fc, 0.25B parameters, as the published EAGLE-LLaMA3.1-Instruct-8B head.
    target, chip = load_model("llama-3.1-8b"), load_chip("h100")
    eagle = drafter_compute(target, "eagle", chip, 1, "bf16", "bf16")
    params = LAYER_PARAMS + 2 * H * H
    assert eagle.weight_bytes_per_chip == 2 * params and 0.25e9 < params < 0.26e9
    ops = {op.name: op for op in eagle.ops}
    assert ops["embedding"].resident_bytes == ops["lm_head"].resident_bytes == 0.0
    assert ops["lm_head"].bytes_fixed == EMBEDDING_BYTES  # each pass still streams the head and runs it
    assert ops["input_proj"].flops_per_token == 2 * 2 * H * H
    # Before, the drafter counted a second embedding and LM head and no fc.
    doubled = ComputeModel(drafter_model(target, "eagle"), chip, 1, "bf16", "bf16").weight_bytes_per_chip
    assert doubled - eagle.weight_bytes_per_chip == 2 * EMBEDDING_BYTES - 2 * 2 * H * H


def test_an_eagle3_head_holds_its_own_draft_vocabulary_head_3h_fc_and_2h_qkv():
    eagle3 = drafter_compute(load_model("llama-3.1-8b"), "eagle3", load_chip("h100"), 1, "bf16", "bf16")
    ops = {op.name: op.resident_bytes for op in eagle3.ops}
    assert ops["embedding"] == 0.0 and ops["lm_head"] == EAGLE3_DRAFT_VOCAB * H * 2
    # Its layer's QKV projection takes the embedding and the hidden state side by side: 2h in, so its
    # weights are the layer's QKV over again (4096 x 6144 for Llama-3.1-8B's 32 + 2 x 8 heads of 128).
    qkv = H * (32 + 2 * 8) * 128
    assert ops["qkv_proj"] == 2 * 2 * qkv
    assert eagle3.weight_bytes_per_chip == 2 * (LAYER_PARAMS + qkv + 3 * H * H + EAGLE3_DRAFT_VOCAB * H)
    # Its fc runs once a step, before the first pass: the later passes go without it.
    later = drafter_compute(load_model("llama-3.1-8b"), "eagle3", load_chip("h100"), 1, "bf16", "bf16",
                            later_pass=True)
    assert "input_proj" not in {op.name for op in later.ops}
    cost = DraftCost(eagle3, 3, later)
    expected = eagle3.step_time_s(130, 8, 5000.0, 4000.0, 64.0) + 2 * later.step_time_s(8, 8, 4000.0, 4000.0)
    assert cost.step_s(130, 8, 5000.0, 4000.0, 64.0) == pytest.approx(expected, rel=1e-12)
    assert later.step_time_s(8, 8, 4000.0, 4000.0) < eagle3.step_time_s(8, 8, 4000.0, 4000.0)


def test_deepseek_v3s_mtp_layer_shares_the_embedding_and_from_vllm_0_16_the_head():
    target, chip = load_model("deepseek-v3"), load_chip("h100")
    layer = ComputeModel(drafter_model(target, "mtp"), chip, 8, "fp8", "bf16")
    own = {op.name: op.resident_bytes for op in layer.ops}
    embedding = 129_280 / 8 * 7168 * 2
    assert own["embedding"] == own["lm_head"] == embedding
    eh_proj = 2 * 7168 * 7168 * 2  # bf16 on every chip, unsharded
    shared = drafter_compute(target, "mtp", chip, 8, "fp8", "bf16")
    assert shared.weight_bytes_per_chip == pytest.approx(layer.weight_bytes_per_chip - 2 * embedding + eh_proj)
    kept = drafter_compute(target, "mtp", chip, 8, "fp8", "bf16", mtp_head_shared=False)
    assert kept.weight_bytes_per_chip == pytest.approx(layer.weight_bytes_per_chip - embedding + eh_proj)
    assert not mtp_head_shared("vLLM V1", "0.15.1") and mtp_head_shared("vLLM V1", "0.16.0")
    assert mtp_head_shared("vLLM V1", None) and mtp_head_shared("SGLang", "0.5.2")
    assert not mtp_head_shared("vLLM V0", None)
    # Over pipeline stages the engines load the draft's own embedding.
    staged = drafter_compute(target, "mtp", chip, 8, "fp8", "bf16", pp=2)
    assert staged.weight_bytes_per_chip == pytest.approx(shared.weight_bytes_per_chip + embedding)


def test_a_draft_model_holds_its_own_embedding_and_head():
    target, draft, chip = load_model("llama-3.1-8b"), load_model("llama-3.2-1b"), load_chip("h100")
    drafter = drafter_compute(target, "draft_model", chip, 1, "bf16", "bf16", draft=draft)
    alone = ComputeModel(draft, chip, 1, "bf16", "bf16")
    assert drafter.weight_bytes_per_chip == alone.weight_bytes_per_chip
    assert {op.name: op.resident_bytes for op in drafter.ops}["embedding"] == 128_256 * 2048 * 2


def test_an_eagle_deployment_holds_the_kv_the_doubled_embedding_and_head_took():
    plain = build_deployment(_scenario())
    eagle = build_deployment(_scenario(speculative={"method": "eagle", "num_speculative_tokens": 3}))
    compute = plain.compute
    reserve = compute.activation_reserve_bytes(8192, 1024, SAMPLER_PROFILE_BYTES_PER_LOGIT)
    free = compute.chip.hbm_bytes * 0.9 - compute.weight_bytes_per_chip - reserve
    per_token = compute.kv_bytes_per_token_per_chip * 33 / 32  # the head's one layer of KV
    assert eagle.kv_capacity_tokens == int((free - 2 * (LAYER_PARAMS + 2 * H * H)) // per_token)
    doubled = ComputeModel(drafter_model(plain.model, "eagle"), plain.chip, 1, "bf16", "bf16").weight_bytes_per_chip
    gained = eagle.kv_capacity_tokens - int((free - doubled) // per_token)
    assert gained == pytest.approx((2 * EMBEDDING_BYTES - 2 * 2 * H * H) / per_token, abs=1)


def test_a_speculative_scenario_halves_tpot_as_its_tokens_a_step_say():
    from tokenpath.sim.simulate import prepare, simulate

    def tpot(scenario):
        sim = simulate(prepare(scenario))
        run = sim.run
        assert int(run.e2e_ns.sum()) == int(sum(getattr(run, f"{part}_ns").sum()
                                                for part in ("queue", "compute", "traffic", "delivery")))
        return float(np.median(run.tpot_ns()))

    plain = tpot(_scenario())
    fast = tpot(_scenario(speculative={"method": "eagle3", "num_speculative_tokens": 3}))
    # 2.53 tokens a verify step at acceptance 0.7, each step a little longer than a decode step.
    assert 1.8 < plain / fast < mean_tokens_per_step(0.7, 3)


@pytest.mark.parametrize("toml, message", [
    ('[engine.speculative]\nmethod = "eagle3"\nnum_speculative_tokens = 3\n',
     "engine.speculative needs workload.draft_acceptance"),
    ('[workload]\ndraft_acceptance = 0.7\n', "workload.draft_acceptance applies with [engine.speculative] only"),
    ('[engine.speculative]\nmethod = "draft_model"\nnum_speculative_tokens = 3\n[workload]\ndraft_acceptance = 0.5\n',
     "needs draft_model"),
    ('[engine]\nnum_scheduler_steps = 8\nscheduler = "vllm-v0"\nchunked_prefill = false\n'
     '[engine.speculative]\nmethod = "ngram"\nnum_speculative_tokens = 3\n[workload]\ndraft_acceptance = 0.5\n',
     "does not run with multi-step scheduling"),
    ('[engine.speculative]\nmethod = "eagle3"\nnum_speculative_tokens = 3\n[workload]\ndraft_acceptance = 1.5\n',
     "draft_acceptance"),
    ('[engine.speculative]\nmethod = "ngram"\nnum_speculative_tokens = 3\n[workload]\ndraft_acceptance = 0.5\n'
     '[delivery]\nstream_interval = 4\n', "set stream_interval = 1"),
    ('[engine]\nscheduler = "prefill-first"\nmixed_chunk = true\n[engine.speculative]\nmethod = "eagle"\n'
     'num_speculative_tokens = 3\n[workload]\ndraft_acceptance = 0.7\n', "mixed_chunk with a drafter is not modelled"),
    # the default model, Llama-3.1-70B, ships no MTP layers: vLLM and SGLang load them from the checkpoint
    ('[engine.speculative]\nmethod = "mtp"\nnum_speculative_tokens = 2\n[workload]\ndraft_acceptance = 0.8\n',
     "llama-3.1-70b's checkpoint has no multi-token-prediction layers"),
])
def test_a_bad_speculative_table_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, toml, message):
    path = tmp_path / "s.toml"
    path.write_text(toml)
    assert_user_error(*run_cli(["simulate", str(path), "--num-requests", "5"], monkeypatch, capsys), message)


def test_mean_tokens_per_step_is_continuous_in_acceptance():
    assert mean_tokens_per_step(0.999999, 5) == pytest.approx(6.0, rel=1e-4)
    assert SpeculativeSpec(method="mtp", num_speculative_tokens=1).describe(0.85).endswith("1.85 tokens a step")
    assert math.isclose(mean_tokens_per_step(0.5, 1), 1.5)


def test_a_speculative_run_is_outside_the_validated_envelope():
    from tokenpath.sim.document import result_document
    from tokenpath.sim.simulate import simulate

    scenario = _scenario(speculative={"method": "eagle3", "num_speculative_tokens": 1})
    document = result_document(simulate(scenario))[0]
    assert document["envelope"]["validated"] is False
    assert "speculative decoding (eagle3)" in document["envelope"]["outside"]
    assert document["regime"]["speculative"] == "eagle3"
    assert document["resolved"]["engine"]["speculative"]["mean_tokens_per_step"] == pytest.approx(1.7)


def test_a_row_of_the_same_method_brings_it_inside():
    from tokenpath.sim.bands import Record
    from tokenpath.sim.envelope import envelope

    regime = {"engine": "vllm-v1", "chip": "h100", "chip_generation": "Hopper", "model_family": "dense",
              "load": "light", "speculative": "mtp"}
    row = Record("r", "s", "vllm-v1", "", "h100", "Hopper", "m", "dense", "light", {"ttft": 0.1}, speculative="mtp")
    assert envelope(regime, [row])["validated"] is True
    assert envelope({**regime, "speculative": "ngram"}, [row])["outside"] == ["speculative decoding (ngram)"]


def test_levers_tune_the_drafts_and_leave_the_stream_interval_alone():
    from tokenpath.whatif.catalog import catalog

    scenario = _scenario(speculative={"method": "eagle3", "num_speculative_tokens": 1})
    levers = {lever.name: lever for lever in catalog(scenario, scenario.model_dump(mode="json"))}
    assert levers["2 speculative drafts a step"].overrides == {"engine.speculative.num_speculative_tokens": 2}
    assert levers["0 speculative drafts a step"].skipped == "num_speculative_tokens is 1"
    assert "speculative decoding" in levers["stream interval"].skipped


def test_serve_refuses_speculative_decoding_in_one_line():
    from tokenpath.config.errors import UserError
    from tokenpath.serve.app import ServeOptions, Server

    scenario = _scenario(speculative={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(UserError, match="engine.speculative: serve streams one token"):
        Server(scenario, ServeOptions())


def test_blocks_a_short_finisher_gives_back_reach_the_prefix_caches_free_queue():
    # Request 1 finishes inside a verify step and gives back its unused blocks; request 2's prefix, the
    # same 12 tokens as request 0's, was evicted when request 1 took the cache's blocks, and is not hit.
    from reference_engine import reference_engine
    from tokenpath.prefixes import chain

    costs = SpeculativeCosts(drafts=3, acceptance=1.0)
    args = (np.array([0, 10_000_000, 20_000_000]), np.array([12, 19, 16]), np.array([1, 2, 1]), costs)
    prefixes = chain([[0], [1], [0]], [12, 12, 12], 12)
    spec = EngineSpec(block_size=4)
    fast = run_engine(*args, LastMile(NO_NETWORK), spec, 32, prefixes=prefixes)
    slow = reference_engine(*args, LastMile(NO_NETWORK), spec, 32, prefixes=prefixes)
    assert list(fast.prefix_hit_tokens) == list(slow.prefix_hit_tokens) == [0, 0, 0]
    assert list(fast.step_tokens) == list(slow.step_tokens)


def test_a_reserving_engine_reserves_a_verify_steps_drafts_and_never_preempts():
    replica = Replica(SpeculativeCosts(drafts=7, acceptance=1.0), LastMile(NO_NETWORK),
                      EngineSpec(scheduler="trtllm", block_size=4), kv_capacity_tokens=16)
    replica.submit(3, 2, 0)  # 3 + 2 tokens and 7 drafts: 3 of the cache's 4 blocks reserved
    steps = 0
    while not replica.idle and steps < 10:
        replica.step()
        steps += 1
    assert replica.idle and replica.preemptions == 0
    assert replica.unreserved_blocks == replica.free_blocks == replica.cache_blocks
    with pytest.raises(ValueError, match="needs more than the 4 KV blocks"):
        replica.submit(3, 7, 0)  # 3 + 7 + 7 tokens: 5 blocks


def test_a_budget_under_one_block_is_refused_where_chunks_are_whole_blocks():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="under one KV block"):
        EngineSpec(scheduler="trtllm", chunked_prefill=True, max_num_seqs=8, max_num_batched_tokens=8, block_size=16)


def test_sglang_with_a_drafter_runs_48_requests_at_most_and_before_0_5_11_without_its_overlap_scheduler():
    """SGLang resets --max-running-requests to 48 (32 in 0.4.3-0.4.4) when a drafter runs, and until
    0.5.10 turned its overlap scheduler off with it, unless told (server_args.py); vLLM changes neither."""
    drafter = {"method": "mtp", "num_speculative_tokens": 3}
    sglang = EngineSpec(scheduler="prefill-first", speculative=drafter, version="0.5.7")
    assert (sglang.max_num_seqs, sglang.host_overlap) == (48, False)
    assert EngineSpec(scheduler="prefill-first", speculative=drafter, version="0.4.4").max_num_seqs == 32
    for newer in ("0.5.11", "0.5.23", None):  # spec V2 keeps the overlap; unset: the newest release
        assert EngineSpec(scheduler="prefill-first", speculative=drafter, version=newer).host_overlap is None
    assert EngineSpec(scheduler="prefill-first", speculative=drafter, version="0.5.10.post1").host_overlap is False
    ngram = {"method": "ngram", "num_speculative_tokens": 3}  # spec V2 overlaps no n-gram drafts
    assert EngineSpec(scheduler="prefill-first", speculative=ngram, version="0.5.23").host_overlap is False
    told = EngineSpec(scheduler="prefill-first", speculative=drafter, max_num_seqs=96, host_overlap=True)
    assert (told.max_num_seqs, told.host_overlap) == (96, True)
    plain = EngineSpec(scheduler="prefill-first")
    assert (plain.max_num_seqs, plain.host_overlap) == (1024, None)
    # vLLM V1 keeps its async scheduling with an EAGLE or MTP drafter (engine/speculative.py)
    assert (EngineSpec(speculative=drafter).max_num_seqs, EngineSpec(speculative=drafter).host_overlap) == (1024, True)


def test_tensorrt_llm_turns_its_overlap_scheduler_off_for_ngram_drafts_only():
    """TensorRT-LLM's PyTorch backend keeps its overlap scheduler with MTP and EAGLE-3, not with n-gram
    drafts (SpeculativeDecodingMode.support_overlap_scheduler)."""
    mtp, ngram = ({"method": method, "num_speculative_tokens": 2} for method in ("mtp", "ngram"))
    assert EngineSpec(scheduler="trtllm", speculative=mtp).host_overlap is None
    assert EngineSpec(scheduler="trtllm", speculative=ngram).host_overlap is False


@pytest.mark.parametrize("release, reserve_gib, in_pool", [("0.5.9", 2, False), ("0.5.12", 4, False),
                                                           ("0.5.23", 0, True)])
def test_sglang_takes_a_drafter_from_its_reserve_until_0_5_14_and_from_its_pool_after(release, reserve_gib, in_pool):
    # server_args.py reserves 2 GiB for an EAGLE or MTP drafter, 4 GiB from 0.5.10, and the drafter's
    # weights and KV come out of that reserve; from 0.5.14 it reserves none and counts them in the pool.
    base = {"model.name": "deepseek-v3", "engine.scheduler": "prefill-first", "engine.version": release}
    drafted = {**base, "engine.speculative": {"method": "mtp", "num_speculative_tokens": 3},
               "workload.draft_acceptance": 0.7}
    plain, with_drafter = (build_deployment(load_scenario(None, table)) for table in (base, drafted))
    hbm_gib = plain.chip.hbm_bytes / 2**30
    share_gib = (plain.memory_share - with_drafter.memory_share) * hbm_gib
    assert share_gib == pytest.approx(reserve_gib, abs=0.002 * hbm_gib)  # the fraction is rounded to 0.001
    pool_gib = ((plain.kv_capacity_tokens - with_drafter.kv_capacity_tokens)
                * plain.compute.kv_bytes_per_token_per_chip / 2**30)
    if in_pool:  # the drafter's own weights and KV cache
        assert pool_gib > 0.5
    else:  # the reserve alone moves the pool
        assert pool_gib == pytest.approx(share_gib, rel=0.05)


def test_the_drafters_gemms_run_at_their_shapes_measured_rates_as_the_targets_do():
    """The drafter's weight GEMMs read the engine's own GEMM table, as the target's do (compute/gemm_efficiency.py):
    its passes cost what their shapes' measured rates say, not the one rate of a chip without a table."""
    eagle = build_deployment(_scenario(speculative={"method": "eagle3", "num_speculative_tokens": 3}))
    draft = eagle.costs.draft_s.__self__  # the DraftCost whose step_s the engine calls
    assert draft.compute.gemm_kernels_of == eagle.compute.gemm_kernels_of == "vllm"
    args = (eagle.model, "eagle3", eagle.chip, 1, "bf16", "bf16")
    shaped, one_rate = drafter_compute(*args, gemm_kernels_of="vllm"), drafter_compute(*args)
    prompt = (2048, 1, 2048 * 2049 / 2, 2048.0)  # a 2,048-token prompt step: its GEMMs compute-bound
    assert draft.compute.step_time_s(*prompt) == pytest.approx(shaped.step_time_s(*prompt), rel=1e-12)
    assert shaped.step_time_s(*prompt) != pytest.approx(one_rate.step_time_s(*prompt), rel=1e-3)


def _blocks_used_each_step(spec, prompt, output, drafts, kv_tokens=64):
    """One request alone, every draft rejected (a token a step): the KV blocks in use after each step."""
    replica = Replica(SpeculativeCosts(drafts=drafts, acceptance=0.0), LastMile(NO_NETWORK), spec, kv_tokens)
    replica.submit(prompt, output, 0)
    used = []
    while not replica.idle:
        replica.step()
        used.append(replica.cache_blocks - replica.free_blocks)
    return used


def test_vllm_holds_a_verify_steps_slots_and_eagles_lookahead_past_its_context():
    """vLLM V1's allocate_slots at a step of context C reaches C + (k + 1) + k slots under EAGLE (its
    lookahead: num_lookahead_tokens = k), C + (k + 1) under n-gram drafts; they stay held until the request
    ends. k = 2, blocks of 4, a prompt of 8 and 7 tokens out, each step gaining one: contexts 8 to 12 at the
    decode steps before the last, so EAGLE's table reaches 13 to 17 slots (4, 4, 4, 4, 5 blocks), n-gram's
    11 to 15 (3, 3, 4, 4, 4); without the held drafts it was the context after the step (3, 3, 3, 3, 4)."""
    eagle = EngineSpec(block_size=4, host_overlap=False,
                       speculative=SpeculativeSpec(method="eagle", num_speculative_tokens=2))
    assert _blocks_used_each_step(eagle, 8, 7, 2) == [2, 4, 4, 4, 4, 5, 0]  # (the prompt's 2, then the decodes')
    ngram = EngineSpec(block_size=4, host_overlap=False,
                       speculative=SpeculativeSpec(method="ngram", num_speculative_tokens=2))
    assert _blocks_used_each_step(ngram, 8, 7, 2) == [2, 3, 3, 4, 4, 4, 0]


def test_vllm_s_async_scheduling_holds_the_step_before_s_drafts_as_if_accepted():
    """Async scheduling schedules a step before the one before it returns, counting that step's k + 1
    tokens computed (num_output_placeholders): the table reaches the context of the step before plus
    2 (k + 1) + k. k = 2, blocks of 4, a prompt of 8: the first decode step (its prompt's step scheduled no
    draft) reaches 8 + 5 = 13 slots, the second 8 + 8 = 16, then 9 + 8 = 17, 10 + 8, 11 + 8, 12 + 8:
    4, 4, 5, 5, 5, 5 blocks."""
    eagle = EngineSpec(block_size=4, host_overlap=True,
                       speculative=SpeculativeSpec(method="eagle", num_speculative_tokens=2))
    used = _blocks_used_each_step(eagle, 8, 7, 2)
    assert used[:6] == [2, 4, 4, 5, 5, 5] and used[-1] == 0


def test_a_chunk_of_a_running_prompt_takes_the_lookahead_and_its_first_chunk_none():
    """vLLM V1 gives a running request's prompt chunk its lookahead, a waiting request's first chunk none
    (effective_lookahead_tokens). k = 2 EAGLE drafts, blocks of 4, a 20-token prompt in chunks of 8: 8
    tokens (2 blocks), then 16 + 2 (5 blocks), then 20 + 2 (6 blocks) with its first token."""
    spec = EngineSpec(block_size=4, host_overlap=False, max_num_seqs=8, max_num_batched_tokens=8,
                      speculative=SpeculativeSpec(method="eagle", num_speculative_tokens=2))
    assert _blocks_used_each_step(spec, 20, 1, 2)[:3] == [2, 5, 0]  # (one token: it ends at its prompt)
    assert _blocks_used_each_step(spec, 20, 2, 2)[:3] == [2, 5, 6]


def test_vllm_v1_and_sglang_s_v2_worker_hold_drafts_slots_and_the_longest_request_gives_them_room():
    """SGLang's V1 worker frees a verify step's rejected slots and TensorRT-LLM rewinds them: no hold there.
    vLLM V1's cache of 16 blocks of 4 finishes a request of 65 tokens without drafts, 61 with two EAGLE
    drafts (its last step, at a context of 59 at most, reaches 59 + 3 + 2 = 64 slots)."""
    eagle = SpeculativeSpec(method="eagle", num_speculative_tokens=2)
    assert EngineSpec(scheduler="prefill-first", speculative=eagle, version="0.5.10").draft_hold() is None
    assert EngineSpec(scheduler="prefill-first", speculative=eagle, version="0.5.23").draft_hold().lookahead == 6
    assert EngineSpec(scheduler="trtllm", speculative=eagle).draft_hold() is None
    spec = EngineSpec(block_size=4, host_overlap=False, speculative=eagle)
    assert spec.draft_hold().lookahead == 2
    assert EngineSpec(block_size=4).longest_request_tokens(64) == 65
    assert spec.longest_request_tokens(64) == 61
    assert _blocks_used_each_step(spec, 40, 21, 2)[-2] == 16  # 61 tokens: the whole cache, at its last step


def _sglang(version, method="eagle", **engine):
    return EngineSpec(scheduler="prefill-first", block_size=4, version=version,
                      speculative=SpeculativeSpec(method=method, num_speculative_tokens=2), **engine)


def test_sglang_s_v2_worker_holds_its_committed_tokens_and_two_verify_steps_more():
    """SGLang's speculative V2 worker (with its overlap scheduler, from 0.5.11) grows a request's table to
    kv_committed_len + 2 x alloc_len_per_decode (k + 1) before each decode step and keeps it until the request
    ends; kv_committed_len is the context at the start of the step before, whose result the overlap scheduler
    takes in after forming the next batch (the prompt's step before the first decode). k = 2, blocks of 4, a
    prompt of 8 and 7 tokens out, each step gaining one: 8 + 6 = 14 slots at the first two decode steps, then
    9 + 6 to 12 + 6 (4, 4, 4, 4, 5 blocks). The V1 worker (0.5.10), and n-gram drafts, hold the context after
    the step (3, 3, 3, 3, 4)."""
    assert _blocks_used_each_step(_sglang("0.5.23"), 8, 7, 2) == [2, 4, 4, 4, 4, 5, 0]
    assert _blocks_used_each_step(_sglang("0.5.10"), 8, 7, 2) == [2, 3, 3, 3, 3, 4, 0]
    assert _blocks_used_each_step(_sglang("0.5.23", "ngram"), 8, 7, 2) == [2, 3, 3, 3, 3, 4, 0]
    # 16 blocks of 4 finish a request of 60 tokens: its first decode step, at a context of 58 at most, reaches 64
    assert _sglang("0.5.23").longest_request_tokens(64) == 60


def _blocks_each_step(spec, requests, ranks=1):
    """(prompt, output, arrival ns) requests, every draft rejected, on `ranks` attention ranks: the KV blocks in
    use after each step, and the blocks each decoding sequence holds then."""
    costs = SpeculativeCosts(drafts=spec.speculative.num_speculative_tokens, acceptance=0.0)
    costs.attention_ranks = ranks
    replica = Replica(costs, LastMile(NO_NETWORK), spec, 4 * 64)
    for prompt, output, arrival_ns in requests:
        replica.submit(prompt, output, arrival_ns)
    used, holds = [], []
    while not replica.idle:
        replica.step()
        used.append(replica.cache_blocks - replica.free_blocks)
        holds.append({i: replica.held.held(i) for i in replica.decoding})
    assert replica.free_blocks == replica.cache_blocks
    return used, holds


def test_sglang_s_v2_worker_counts_a_decode_committed_once_a_prompt_step_came_between():
    """A step that does not run a request's decode lets the overlap scheduler take its last result in: its next
    table is its context now plus 2 (k + 1). Request 0 (8 + 7 tokens) decodes in steps 2 to 4 (14, 14, 15 slots);
    request 1 (4 tokens, arriving at 2.5 ms) runs its prompt in step 5, formed when step 4 starts; in step 6
    request 0's context is 11: 11 + 6 = 17 slots, 5 blocks (counted lagged, at its context of 10 at step 4's
    start, it would hold 4), beside request 1's first decode at 4 + 6 = 10 (3 blocks)."""
    used, _ = _blocks_each_step(_sglang("0.5.23"), [(8, 7, 0), (4, 2, 2_500_000)])
    assert used == [2, 4, 4, 4, 5, 8, 5, 0]


def test_sglang_s_v2_decode_paused_on_its_attention_rank_keeps_its_table_and_takes_its_result_in():
    """Two attention ranks: requests 0 and 2 on rank 0, request 1 on rank 1. Request 2's prompt (arriving at 2.5
    ms) runs in step 5, whose rank-0 batch is a prefill: request 0 takes no part and keeps its table of step 4
    (9 + 6 = 15 slots, 4 blocks), request 1 reaches 10 + 6 (4 blocks). In step 6 request 0's result is in: 11 +
    6 = 17 slots (5 blocks), as request 1's lagged 11 + 6, and request 2's first decode 8 + 6 (4 blocks)."""
    spec = _sglang("0.5.23", max_num_seqs=8, max_num_batched_tokens=2048)
    used, holds = _blocks_each_step(spec, [(8, 7, 0), (8, 7, 0), (8, 2, 2_500_000)], ranks=2)
    assert used[:6] == [4, 8, 8, 8, 10, 14]
    assert holds[4] == {0: 4, 1: 4, 2: 2} and holds[5] == {0: 5, 1: 5}


def test_vllm_trims_the_drafts_of_the_decode_that_meets_the_budget_and_the_others_wait():
    """vLLM V1's scheduler takes each running request's tokens (its last and its drafts) from the budget in
    running order: the one that meets the budget's end runs the rest, its drafts trimmed, and those after wait a
    step, keeping their blocks (Scheduler.schedule: `num_new_tokens = min(num_new_tokens, token_budget)`, the
    loop ending at an empty budget). 5 one-token prompts, 9 tokens out, k = 3 drafts all accepted, 10 tokens a
    step: requests 0 and 1 run 4 tokens, request 2 the last 2 (one draft), 3 and 4 wait; with 0 and 1 done,
    2 and 3 run 4 and 4 the last 2; then 3 and 4, then 4 alone."""
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=10, block_size=4, host_overlap=False,
                      speculative=SpeculativeSpec(method="eagle", num_speculative_tokens=3))
    args = (np.zeros(5, np.int64), np.ones(5, np.int64), np.full(5, 9), SpeculativeCosts(drafts=3, acceptance=1.0))
    trace = run_engine(*args, LastMile(NO_NETWORK), spec, 4 * 64)
    assert list(trace.step_tokens) == list(trace.step_logits) == [5, 10, 10, 10, 8, 4]
    assert list(trace.step_seqs) == [5, 3, 3, 3, 2, 1]
    assert list(trace.step_attn_pairs[1:2]) == [2 * (4 * 1 + 10) + (2 * 1 + 3)]  # 4 and 2 queries on 1 cached
    assert list(trace.token_steps(2, 3)) == [0, 1, 1, 2, 2, 3, 3, 3, 3]
    assert list(trace.token_steps(4, 5)) == [0, 3, 3, 4, 4, 4, 4, 5, 5]
    # Its table reaches the tokens it runs and the lookahead (3): after the second step requests 0 to 2 hold
    # 1 + 4 + 3 = 8 and 1 + 2 + 3 = 6 slots (2 blocks each), 3 and 4 their prompt's block.
    replica = Replica(args[3], LastMile(NO_NETWORK), spec, 4 * 64)
    for _ in range(5):
        replica.submit(1, 9, 0)
    replica.step(), replica.step()
    assert {i: replica.held.held(i) for i in replica.decoding} == {0: 2, 1: 2, 2: 2, 3: 1, 4: 1}


def test_a_tensor_parallel_drafter_s_passes_all_reduce_its_layers_outputs():
    # Llama-3.1-70B on 8 H200s with an EAGLE head: each of its 3 passes all-reduces its attention's and its
    # MLP's outputs over the 8 chips, as the target's layers do: 6 all-reduces a step, at each pass's tokens.
    dep = build_deployment(load_scenario(None, {
        "model.name": "llama-3.1-70b", "deployment.tp": 8, "workload.draft_acceptance": 0.7,
        "engine.speculative": {"method": "eagle", "num_speculative_tokens": 3}}))
    draft = dep.costs.draft_s.__self__  # (the DraftCost whose step_s the engine calls)
    compute = draft.compute
    alone = DraftCost(compute, 3, draft.later)
    groups = [list(range(8))]
    each = [dep.collectives.time_s("all_reduce", compute.allreduce_bytes(tokens), groups) for tokens in (40, 10)]
    assert draft.step_s(40, 10, 900.0, 800.0, 0.0) - alone.step_s(40, 10, 900.0, 800.0, 0.0) == pytest.approx(
        2 * each[0] + 2 * 2 * each[1], rel=1e-9)
