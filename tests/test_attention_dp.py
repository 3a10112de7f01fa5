"""Attention data-parallel over a replica's tp chips (SGLang --attn-dp-size, TensorRT-LLM enable_attention_dp):
each chip runs every head for its share of the sequences and holds only their KV cache."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_engine import NO_NETWORK
from tokenpath.compute.chip import load_chip
from tokenpath.compute.efficiency import SAMPLER_PROFILE_BYTES_PER_LOGIT
from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel
from tokenpath.config.errors import UserError
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.loop import run_engine
from tokenpath.engine.replica import Replica
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import load_scenario

ATTENTION_OPS = ("q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "attention", "o_proj")


def test_each_chip_runs_every_head_for_the_sequences_it_holds():
    model, chip = load_model("deepseek-v3"), load_chip("h200")
    whole = {op.name: op for op in ComputeModel(model, chip, 1, "fp8", "bf16").ops}
    dp = {op.name: op for op in ComputeModel(model, chip, 8, "fp8", "bf16", attention_dp=True).ops}
    tp = {op.name: op for op in ComputeModel(model, chip, 8, "fp8", "bf16").ops}
    for name in ATTENTION_OPS:  # one chip's attention, every head's weights, evaluated at its share of a step
        assert dp[name].per_sequence and not tp[name].per_sequence
        assert dp[name].bytes_fixed == whole[name].bytes_fixed
        assert dp[name].flops_per_token == whole[name].flops_per_token
    assert dp["moe_experts"] == tp["moe_experts"]  # the experts stay tensor-parallel


def test_the_busiest_chip_holds_the_prompt_whole_and_an_even_share_of_the_decodes():
    compute = ComputeModel(load_model("deepseek-v3"), load_chip("h200"), 8, "fp8", "bf16", attention_dp=True)
    assert compute.busiest_chip_share(200, 1) == (1.0, 1.0)        # one prompt: all on its chip
    assert compute.busiest_chip_share(16, 16) == (2 / 16, 2.0)     # 16 decodes over 8 chips: 2 each
    assert compute.busiest_chip_share(17, 17) == (3 / 17, 3.0)     # the 17th pads every chip to 3
    assert compute.busiest_chip_share(100 + 16, 17) == ((99 + 3) / 116, 3.0)  # a 100-token chunk beside 16 decodes
    # MLA's latent cache, which every tensor-parallel rank reads whole, is read by its sequence's chip alone:
    # 64 decodes of 4,000 positions cost less at the busiest chip than under tensor parallelism.
    tp = ComputeModel(load_model("deepseek-v3"), load_chip("h200"), 8, "fp8", "bf16")
    step = (64, 64, 64 * 4000.0, 64 * 4000.0)
    dp_attention = sum(c.time_s for c in compute.step_ops(*step) if c.name == "attention")
    tp_attention = sum(c.time_s for c in tp.step_ops(*step) if c.name == "attention")
    assert dp_attention < tp_attention


def test_the_replica_holds_each_chips_own_kv_and_runs_one_all_reduce_a_layer():
    base = {"model.name": "deepseek-v3", "deployment.chip": "h200", "deployment.chips": 8, "deployment.tp": 8,
            "engine.gpu_memory_utilization": 0.9}  # a share that sets the cache, not vLLM's margin
    tp = build_deployment(load_scenario("typical", base))
    dp = build_deployment(load_scenario("typical", {**base, "deployment.attention_dp": True}))
    compute = dp.compute
    seqs = 1024  # vLLM V1's default on an H200, whose memory profile runs its sampler
    reserve = compute.activation_reserve_bytes(8192, seqs, SAMPLER_PROFILE_BYTES_PER_LOGIT)
    free = compute.chip.hbm_bytes * 0.9 - compute.weight_bytes_per_chip - reserve
    assert dp.kv_capacity_tokens == 8 * int(free // compute.kv_bytes_per_token_per_chip)
    assert compute.kv_bytes_per_token_per_chip == tp.compute.kv_bytes_per_token_per_chip  # MLA's latent, whole
    # vLLM's engines run DeepSeek's three dense layers whole, each its own sequences: no collective there
    assert (tp.costs.allreduces_per_step, dp.costs.allreduces_per_step) == (2 * 61, 61 - 3)
    sglang = build_deployment(load_scenario("typical", {**base, "engine.scheduler": "prefill-first",
                                                        "deployment.attention_dp": True}))
    assert sglang.costs.allreduces_per_step == 61  # its dense MLPs tensor-parallel over the gathered tokens


def test_attention_dp_needs_a_tensor_parallel_group():
    scenario = load_scenario("typical", {"model.name": "qwen3-30b-a3b", "deployment.chips": 1, "deployment.tp": 1,
                                         "deployment.attention_dp": True})
    with pytest.raises(UserError, match="deployment.attention_dp: .* tp > 1"):
        build_deployment(scenario)


def test_attention_dp_runs_without_multi_step_windows():
    scenario = load_scenario("typical", {"model.name": "deepseek-v3", "engine.scheduler": "prefill-first",
                                         "engine.chunked_prefill": False, "engine.num_scheduler_steps": 4,
                                         "deployment.attention_dp": True})
    with pytest.raises(UserError, match="engine.num_scheduler_steps: .*attention_dp = false"):
        build_deployment(scenario)


def test_the_launch_carries_it_to_each_engine():
    import json

    from tokenpath.launch import launch_files
    from tokenpath.launch.command import shell_words

    scenario = load_scenario("typical", {"model.name": "deepseek-v3", "deployment.tp": 8,
                                         "deployment.attention_dp": True})
    (argv,) = shell_words(launch_files(scenario, "sglang")["launch-sglang.sh"])
    assert argv[argv.index("--attn-dp-size") + 1] == "8"
    assert json.loads(launch_files(scenario, "trtllm")["extra-llm-api-server.yaml"])["enable_attention_dp"] is True
    # vLLM: eight data-parallel engines of one chip each, sharing their expert layers
    (argv,) = shell_words(launch_files(scenario, "vllm")["launch-vllm.sh"])
    assert (argv[argv.index("--tensor-parallel-size") + 1], argv[argv.index("--data-parallel-size") + 1]) == ("1", "8")
    # Two replicas in one server would be sixteen engines in lockstep: each is a server of its own.
    two = load_scenario("typical", {"model.name": "deepseek-v3", "deployment.chips": 16, "deployment.tp": 8,
                                    "deployment.attention_dp": True})
    servers = shell_words(launch_files(two, "vllm")["launch-vllm.sh"])
    assert [(argv[argv.index("--tensor-parallel-size") + 1], argv[argv.index("--data-parallel-size") + 1])
            for argv in servers] == [("1", "8"), ("1", "8")]


def test_levers_turn_it_on_and_keep_one_chip_replicas_valid():
    from tokenpath.whatif.catalog import catalog

    on = load_scenario("typical", {"model.name": "deepseek-v3", "deployment.tp": 8})
    levers = {lever.name: lever for lever in catalog(on, on.model_dump(mode="json"))}
    assert levers["attention data-parallel on"].overrides == {"deployment.attention_dp": True}
    small = load_scenario("typical", {"model.name": "qwen3-30b-a3b", "deployment.tp": 2,
                                      "deployment.attention_dp": True})
    levers = {lever.name: lever for lever in catalog(small, small.model_dump(mode="json"))}
    assert levers["TP2 -> TP1x8"].overrides == {"deployment.tp": 1, "deployment.attention_dp": False}
    assert levers["attention data-parallel off"].overrides == {"deployment.attention_dp": False}


class RanksCosts:
    """A 1 ms step that records the prompt tokens of its busiest attention rank (None: not given)."""

    speculation = None
    draft_s = None

    def __init__(self, ranks):
        self.attention_ranks = ranks
        self.busiest: list = []

    def compute_s(self, num_tokens, num_logits, attn_pairs, kv_read_tokens, chunk_context_tokens, scheduled,
                  traffic_s, ahead_s, prompt_on_busiest=None, sequences=None):
        self.busiest.append(prompt_on_busiest)
        return 1e-3

    def host_busy_s(self, num_tokens, num_logits, scheduled, sequences=None):
        return 0.0

    def traffic_s(self, num_tokens, decode_only):
        return 0.0


def run_ranks(ranks, inputs, spec):
    costs = RanksCosts(ranks)
    n = len(inputs)
    run_engine(np.zeros(n, np.int64), np.array(inputs), np.full(n, 2), costs, LastMile(NO_NETWORK), spec, 10**9)
    return costs.busiest


def test_prompts_go_to_the_ranks_in_turn_and_the_step_lasts_as_the_rank_with_the_most():
    # Six prompts at once over four ranks: ranks 0 and 1 hold two each (100 + 300, 200 + 50 tokens), the
    # busiest 400 of the step's 1,050; the decode step after it has no prompt tokens.
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=2048)
    assert run_ranks(4, [100, 200, 150, 100, 300, 50], spec)[:2] == [400, None]
    # vLLM's (and TensorRT-LLM's) ranks each schedule a budget of their own: 300 and 900 tokens on two ranks
    # run together. A chunked prompt keeps its rank: request 2 (rank 0) takes the 100 tokens rank 0 has left
    # beside request 0's 900, then its rest, 800 (its rank's 1,000 less its share of the two decodes).
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=1000)
    assert run_ranks(2, [300, 900], spec)[:2] == [900, None]
    assert run_ranks(2, [900, 100, 900], spec)[:2] == [1000, 800]
    # Without attention data-parallel the engine does not say (every prompt token on one chip).
    assert run_ranks(1, [100, 200], spec)[0] is None


def test_sglangs_ranks_each_take_their_share_of_the_chunked_budget():
    # SGLang divides chunked_prefill_size by the attention ranks (arg_groups/parallel_hook.py): a lone
    # 4,000-token prompt on 4 ranks runs in chunks of 2,048 / 4 = 512, one a step, then its decode (up to
    # 0.5.21 also the batch formed with it, decoding the finished request once more:
    # Profile.runs_finished_batch).
    sglang = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=2048)
    assert run_ranks(4, [4000], sglang) == [512] * 7 + [416, None]
    assert run_ranks(4, [4000], sglang.model_copy(update={"version": "0.5.21"})) == [512] * 7 + [416, None, None]
    # Each rank chunks a prompt of its own (a scheduler's chunked_req, managers/scheduler.py): requests 0
    # and 1 (ranks 0 and 1) run 512 tokens each in the first step, their last 488 in the second.
    assert run_ranks(4, [1000, 1000], sglang)[:3] == [512, 488, None]
    # Each vLLM V1 rank has the whole budget of its own.
    vllm = EngineSpec(max_num_seqs=8, max_num_batched_tokens=2048)
    assert run_ranks(4, [4000], vllm)[:2] == [2048, 1952]
    # Without chunked prefill SGLang runs a prompt whole, as it does with one rank.
    assert run_ranks(4, [1500], sglang.model_copy(update={"chunked_prefill": False}))[0] == 1500


def first_token_steps(ranks, inputs, spec, kv_capacity_tokens=10**9, outputs=2):
    n = len(inputs)
    trace = run_engine(np.zeros(n, np.int64), np.array(inputs), np.full(n, outputs), RanksCosts(ranks),
                       LastMile(NO_NETWORK), spec, kv_capacity_tokens)
    return [int(trace.token_steps(i, i + 1)[0]) for i in range(n)], trace


@pytest.mark.parametrize("scheduler", ["prefill-first", "vllm-v1", "trtllm"])
def test_each_rank_chunks_a_prompt_of_its_own_beside_the_others(scheduler):
    # Two 4,096-token prompts on two ranks, 1,024 tokens a rank a step (SGLang: its 2,048 split over two
    # ranks; vLLM's and TensorRT-LLM's ranks: 1,024 each): each rank's scheduler chunks its own prompt, so
    # both run side by side and sample their first tokens in the fourth step. One rank chunks them in turn
    # (vLLM's and TensorRT-LLM's second prompt shares the steps with the first one's decodes).
    budget = 2048 if scheduler == "prefill-first" else 1024
    spec = EngineSpec(scheduler=scheduler, max_num_seqs=8, max_num_batched_tokens=budget, chunked_prefill=True,
                      host_overlap=False)
    assert first_token_steps(2, [4096, 4096], spec)[0] == [3, 3]
    one_rank = first_token_steps(1, [4096, 4096], spec.model_copy(update={"max_num_batched_tokens": 1024}))[0]
    assert one_rank[0] == 3 and one_rank[1] >= 7


@pytest.mark.parametrize("chunked", [True, False])
def test_a_rank_that_can_take_no_more_holds_back_only_its_own_queue(chunked):
    # Request 0 takes rank 0's whole budget (chunked: the first 1,000 of its 3,000 tokens; whole: 900 of
    # 1,000, leaving too little for request 2 behind it). Rank 1's requests 1 and 3 are admitted in the
    # same step by their own scheduler, as the engines' ranks do, where one queue stopped at request 2.
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=1000, chunked_prefill=chunked, host_overlap=False)
    steps, _ = first_token_steps(2, [3000 if chunked else 900, 100, 200, 100], spec)
    assert steps[1] == steps[3] == 0
    assert steps[2] > 0


def test_the_newest_prompt_in_progress_is_preempted_first_and_the_oldest_goes_on():
    # Two 2,000-token prompts chunked side by side on two ranks (512 tokens each a step) in a cache of
    # 3,200 tokens that holds one of them: the newer (request 1) is preempted when both no longer fit, the
    # older goes on and finishes its prompt in its fourth step; request 1 is recomputed afterwards and
    # every request finishes (two ranks never preempt each other in turn forever).
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=512, host_overlap=False)
    steps, trace = first_token_steps(2, [2000, 2000], spec, kv_capacity_tokens=3200, outputs=20)
    assert steps[0] == 3
    assert steps[1] > steps[0]
    assert trace.times_preempted.tolist() == [0, 1]


@pytest.mark.parametrize(("scheduler", "budget"), [
    ("prefill-first", "max 256 seqs (32 a rank), 8192 tokens/step (1024 a rank)"),
    ("trtllm", "max 256 seqs and 8192 tokens/step a rank")])
def test_the_engine_line_says_each_ranks_limits(scheduler, budget):
    from tokenpath.report.simulation import describe
    from tokenpath.sim.simulate import prepare

    scenario = load_scenario(None, {"model.name": "deepseek-v3", "deployment.chip": "h200",
                                    "engine.scheduler": scheduler, "engine.max_num_batched_tokens": 8192,
                                    "engine.max_num_seqs": 256,
                                    "engine.chunked_prefill": True, "deployment.attention_dp": True,
                                    "workload.num_requests": 20})
    assert budget in " ".join(dict(describe(prepare(scenario)))["engine"].split())


@pytest.mark.parametrize(("scheduler", "seqs", "running"),
                         [("trtllm", 2, 8), ("vllm-v1", 2, 8), ("prefill-first", 4, 4)])
def test_each_trtllm_and_vllm_rank_runs_max_num_seqs_of_its_own(scheduler, seqs, running):
    # TensorRT-LLM's max_batch_size and vLLM's max_num_seqs are each rank's scheduler's (four ranks: eight
    # sequences at 2 a rank); SGLang's max_running_requests is the server's, divided among its ranks (1 a rank).
    spec = EngineSpec(scheduler=scheduler, max_num_seqs=seqs, max_num_batched_tokens=512)
    trace = run_engine(np.zeros(8, np.int64), np.full(8, 10), np.full(8, 20), RanksCosts(4), LastMile(NO_NETWORK),
                       spec, 10**9)
    assert trace.step_seqs.max() == running


@pytest.mark.parametrize(("ranks", "decoding_steps"), [(4, [0, 1, 2, 3, 4, 5]), (1, [0, 1, 2, 4, 5, 6])])
def test_sglangs_other_ranks_decode_while_a_rank_prefills(ranks, decoding_steps):
    # Each SGLang DP rank runs its own scheduler, their forwards kept in step (dp_attn.py,
    # prepare_mlp_sync_batch_raw): request 1's prompt (rank 1), arriving during step 2, pauses only rank 1's
    # decodes, so request 0 (rank 0) gains a token in step 3 beside it. With one rank it pauses there.
    # (Without the overlapped scheduler, a step's batch is formed as it starts.)
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=2048, host_overlap=False)
    arrivals = np.array([0, 2_500_000], np.int64)
    trace = run_engine(arrivals, np.array([100, 100]), np.array([6, 2]), RanksCosts(ranks), LastMile(NO_NETWORK),
                       spec, 10**9)
    assert list(trace.token_steps(0, 1)) == decoding_steps
    assert list(trace.token_steps(1, 2))[0] == 3


@pytest.mark.parametrize("scheduler, whole_ops", [("prefill-first", {"embedding"}),
                                                 ("trtllm", {"embedding", "lm_head"})])
def test_each_engine_holds_its_own_ops_whole_on_every_attention_rank(scheduler, whole_ops):
    # SGLang builds DeepSeek's embedding over the attention-TP group (whole under full attention DP), its LM
    # head split; TensorRT-LLM holds an unsharded embedding and LM head under enable_attention_dp.
    scenario = load_scenario(None, {"model.name": "deepseek-v3", "engine.scheduler": scheduler,
                                    "deployment.attention_dp": True})
    ops = {op.name: op for op in build_deployment(scenario).compute.ops}
    model = load_model("deepseek-v3")
    table_bytes = model.vocab_size * model.hidden_size * 2  # bf16
    for name in ("embedding", "lm_head"):
        assert ops[name].resident_bytes == pytest.approx(table_bytes / (1 if name in whole_ops else 8)), name
    assert ops["lm_head"].per_sequence == ("lm_head" in whole_ops)  # a whole head: its chip's sequences' logits


def test_a_tied_table_is_whole_on_every_trtllm_attention_rank():
    """A tied LM head shares the embedding's weight, and TensorRT-LLM asserts the two have one TP size: under
    attention DP both are unsharded, so each chip holds Llama-3.2-1B's whole table, 128,256 x 2,048 in bf16
    (525.3 MB), not an eighth of it (65.7 MB)."""
    scenario = load_scenario(None, {"model.name": "llama-3.2-1b", "model.precision": "bf16",
                                    "engine.scheduler": "trtllm", "deployment.attention_dp": True})
    ops = {op.name: op for op in build_deployment(scenario).compute.ops}
    assert ops["embedding"].resident_bytes + ops["lm_head"].resident_bytes == 128_256 * 2_048 * 2 == 525_336_576


DEEPSEEK_LOCAL_OPS = ("mlp_gate_up", "mlp_down", "shared_experts", "moe_router")


@pytest.mark.parametrize("scheduler, local", [("vllm-v1", True), ("trtllm", True), ("prefill-first", False)])
def test_an_moe_models_dense_layers_shared_experts_and_router_run_on_each_rank_where_the_engine_says(scheduler,
                                                                                                   local):
    # vLLM's data-parallel engines share only the expert layers; TensorRT-LLM's DeepSeek-V3 runs its dense MLPs
    # and shared experts at tp 1 under attention DP (modeling_deepseekv3.py), each rank's gate on its own
    # tokens; SGLang keeps them tensor-parallel. The routed experts stay split over the replica either way.
    base = {"model.name": "deepseek-v3", "engine.scheduler": scheduler}
    tp = {op.name: op for op in build_deployment(load_scenario(None, base)).compute.ops}
    dp = {op.name: op for op in build_deployment(load_scenario(None, {**base, "deployment.attention_dp": True}))
          .compute.ops}
    for name in DEEPSEEK_LOCAL_OPS:
        assert dp[name].per_sequence == local, name
        split = 1 if name == "moe_router" else 8  # (a router's weights are whole on every chip under TP too)
        assert dp[name].resident_bytes == pytest.approx(tp[name].resident_bytes * (split if local else 1)), name
        assert dp[name].flops_per_token == pytest.approx(tp[name].flops_per_token * (split if local else 1)), name
    assert dp["moe_experts"] == tp["moe_experts"]


def test_a_dense_models_mlp_stays_tensor_parallel_under_attention_data_parallel():
    # TensorRT-LLM's attention DP of a dense model keeps its FFN tensor-parallel (docs/features/parallel-strategy.md)
    base = {"model.name": "llama-3.1-70b", "engine.scheduler": "trtllm"}
    tp = {op.name: op for op in build_deployment(load_scenario(None, base)).compute.ops}
    dp = build_deployment(load_scenario(None, {**base, "deployment.attention_dp": True}))
    ops = {op.name: op for op in dp.compute.ops}
    assert ops["mlp_down"] == tp["mlp_down"] and not ops["mlp_down"].per_sequence
    assert dp.costs.allreduces_per_step == 80


@pytest.mark.parametrize("scheduler, model, message", [
    ("vllm-v1", "llama-3.1-70b", "vLLM V1 runs attention data-parallel for MoE models only: the ranks of a dense "
                                 "model share no layer and are replicas of tp = 1; set it to false and "
                                 "deployment.tp = 1 for 8 replicas"),
    ("vllm-v0", "deepseek-v3", "vLLM V0 has no attention data-parallel; set it to false"),
    ("vllm-v0", "llama-3.1-70b", "vLLM V0 has no attention data-parallel; set it to false"),
    ("prefill-first", "llama-3.1-70b", "SGLang's model code for LlamaForCausalLM splits attention over the whole "
                                       "tensor-parallel group, with no attention data-parallel "
                                       "(engine/attention_dp_models.py lists the classes that have it, such as "
                                       "Qwen3ForCausalLM and DeepseekV3ForCausalLM); set it to false"),
    ("prefill-first", "mixtral-8x7b", "SGLang's model code for MixtralForCausalLM splits attention over the whole "
                                      "tensor-parallel group, with no attention data-parallel "
                                      "(engine/attention_dp_models.py lists the classes that have it, such as "
                                      "Qwen3ForCausalLM and DeepseekV3ForCausalLM); set it to false")])
def test_an_engine_that_does_not_run_attention_data_parallel_for_the_model_is_refused(scheduler, model, message):
    from tokenpath.whatif.catalog import catalog

    table = {"model.name": model, "engine.scheduler": scheduler, "deployment.attention_dp": True}
    with pytest.raises(UserError) as error:
        build_deployment(load_scenario(None, table))
    assert str(error.value) == f"deployment.attention_dp: {message}"
    off = load_scenario(None, {**table, "deployment.attention_dp": False})
    [lever] = [lever for lever in catalog(off, off.model_dump(mode="json")) if lever.name.startswith("attention")]
    assert lever.overrides == {} and lever.skipped == message.split(";")[0]


def test_the_busiest_chip_holds_the_prompt_tokens_the_engine_says():
    compute = ComputeModel(load_model("deepseek-v3"), load_chip("h200"), 8, "fp8", "bf16", attention_dp=True)
    # Eight 1,000-token prompts on eight ranks: 1,000 on the busiest chip, not 8,000.
    assert compute.busiest_chip_share(8000, 8, 1000.0) == ((1000 + 1) / 8000, 1.0)
    assert compute.busiest_chip_share(8000, 8) == ((7992 + 1) / 8000, 1.0)
    step = (8000, 8, 8 * 1000 * 1001 / 2, 8000.0)
    assert compute.step_time_s(*step, prompt_on_busiest=1000.0) < 0.5 * compute.step_time_s(*step)


@pytest.mark.parametrize("attention_dp", [True, False])
def test_each_rank_replays_a_graph_of_its_own_batch_and_schedules_its_own_sequences(attention_dp):
    # Under attention data-parallel each rank captures decode graphs of its own batch sizes and its scheduler
    # works on its own sequences: 256 decoding sequences on 8 ranks are 32 a rank, within graphs of up to 32.
    compute = ComputeModel(load_model("deepseek-v3"), load_chip("h200"), 8, "fp8", "bf16", cuda_graphs="decode",
                           cuda_graph_max_tokens=32, host_step_s=1e-3, host_per_sequence_s=1e-5,
                           attention_dp=attention_dp)
    assert compute.eager(256, 256) is not attention_dp
    assert compute.eager(264, 264)  # 33 on the busiest rank
    assert compute.host_s(256) == pytest.approx(1e-3 + (32 if attention_dp else 256) * 1e-5)


@settings(max_examples=60, deadline=None)
@given(ranks=st.integers(1, 4), scheduler=st.sampled_from(["vllm-v1", "trtllm", "prefill-first"]),
       chunked=st.booleans(), budget=st.integers(64, 1500), seqs=st.integers(1, 12), kv_blocks=st.integers(0, 300),
       prefix_caching=st.booleans(),
       requests=st.lists(st.tuples(st.integers(1, 1200), st.integers(1, 40), st.integers(0, 50), st.integers(0, 3)),
                         min_size=1, max_size=30))
def test_every_request_finishes_each_rank_chunking_at_most_one_prompt_and_every_block_comes_back(
        ranks, scheduler, chunked, budget, seqs, kv_blocks, prefix_caching, requests):
    # Requests of prefix key k > 0 share their first 40 k tokens, where the prompt holds them.
    spec = EngineSpec(scheduler=scheduler, max_num_seqs=min(seqs, budget), max_num_batched_tokens=budget,
                      chunked_prefill=chunked, block_size=16, host_overlap=False, prefix_caching=prefix_caching)
    if spec.step_bounds_prompts:  # a step holds a request whole (serve and simulate refuse the others)
        requests = [r for r in requests if spec.whole_step_tokens(r[0], r[1]) <= budget] or [(1, 1, 0, 0)]
    longest = max(p + o for p, o, _, _ in requests)
    capacity = (-(-longest // 16) + kv_blocks) * 16  # the longest request fits, and up to 300 blocks more
    replica = Replica(RanksCosts(ranks), LastMile(NO_NETWORK), spec, capacity)
    requests = sorted(requests, key=lambda r: r[2])
    for prompt, out, arrival_ms, key in requests:
        prefix = ([key], [40 * key]) if key and prompt >= 40 * key else None
        replica.submit(prompt, out, arrival_ms * 1_000_000, prefix=prefix)
    finished = []
    for _ in range(100_000):
        if replica.idle:
            break
        finished += replica.step()
        rank_of = replica.waiting.rank_of if ranks > 1 else dict.fromkeys(range(len(requests)), 0)
        prompt_ranks = [rank_of[prefill.request] for prefill in replica.prefills]
        assert len(set(prompt_ranks)) == len(prompt_ranks) <= ranks  # each rank chunks one prompt at most
        assert 0 <= replica.free_blocks <= replica.cache_blocks
        if ranks > 1:  # each rank runs its own max_num_seqs at most (SGLang: its share of the replica's)
            running = [0] * ranks
            for i in (*replica.decoding, *(prefill.request for prefill in replica.prefills)):
                running[rank_of[i]] += 1
            assert running == replica.waiting.running
            assert max(running) <= (seqs if scheduler != "prefill-first" else max(min(seqs, budget) // ranks, 1))
    assert sorted(finished) == list(range(len(requests)))
    assert replica.generated == [out for _, out, _, _ in requests]
    assert replica.free_blocks == replica.cache_blocks
    assert ranks == 1 or (not replica.waiting.rank_of and not any(replica.waiting.tokens))


def ranks_replica(scheduler, ranks, max_num_seqs, requests):
    """A replica of `ranks` attention ranks (1 ms steps) with (prompt, output, arrival ms) `requests` submitted."""
    spec = EngineSpec(scheduler=scheduler, max_num_seqs=max_num_seqs, max_num_batched_tokens=4096,
                      host_overlap=False)
    replica = Replica(RanksCosts(ranks), LastMile(NO_NETWORK), spec, 10**7)
    for prompt, out, arrival_ms in requests:
        replica.submit(prompt, out, arrival_ms * 1_000_000)
    return replica


def step_until(replica, time_ms):
    while replica.now < time_ms * 1_000_000:
        replica.step()


@pytest.mark.parametrize(("scheduler", "rank"), [("prefill-first", 0), ("vllm-v1", 1), ("trtllm", 1)])
def test_each_engine_routes_a_request_to_a_rank_as_its_own_balancer_does(scheduler, rank):
    # Requests 0 and 1 start on ranks 0 and 1 (every engine); request 1 (100 tokens, one to make) is done
    # when request 2 comes at 20 ms, while request 0 (500 tokens) still decodes on rank 0. SGLang's
    # controller sends request 2 to the next rank in turn, 0; vLLM's client to the least loaded (4 x
    # waiting + running: 1 against 0), rank 1; TensorRT-LLM's to the rank holding the fewest tokens, 1.
    replica = ranks_replica(scheduler, 2, 8, [(500, 100, 0), (100, 1, 0), (300, 5, 20)])
    step_until(replica, 21)
    assert replica.waiting.rank_of == {0: 0, 2: rank}


def test_tensorrt_llms_ranks_take_requests_by_the_tokens_they_hold():
    # At once: 900 tokens to rank 0, then 100 to rank 1, then 300 and 200 to rank 1 (100, then 400, against
    # 900), then 50 to rank 1 (600 against 900) as well; vLLM's balancer counts requests (0, 1, 0, 1, 0).
    requests = [(900, 5, 0), (100, 5, 0), (300, 5, 0), (200, 5, 0), (50, 5, 0)]
    assert ranks_replica("trtllm", 2, 8, requests).waiting.rank_of == {}  # (none has reached the engine yet)
    for scheduler, ranks in [("trtllm", [0, 1, 1, 1, 1]), ("vllm-v1", [0, 1, 0, 1, 0])]:
        replica = ranks_replica(scheduler, 2, 8, requests)
        replica.step()
        assert [replica.waiting.rank_of[i] for i in range(5)] == ranks


def test_a_full_rank_holds_its_requests_back_while_another_rank_has_room():
    # SGLang divides max_running_requests over the ranks: 4 over 2 ranks, 2 each. Requests 1 and 3 (rank 1)
    # finish at once; at 20 ms requests 4 and 5 come, to ranks 0 and 1 in turn. Rank 0 still runs requests
    # 0 and 2, so request 4 waits though the replica runs 2 of its 4; request 5 runs on rank 1.
    requests = [(100, 200, 0), (100, 1, 0), (100, 200, 0), (100, 1, 0), (100, 5, 20), (100, 5, 20)]
    replica = ranks_replica("prefill-first", 2, 4, requests)
    step_until(replica, 22)
    assert list(replica.waiting.queues[0]) == [4]
    assert 5 in replica.decoding and sorted(replica.decoding) == [0, 2, 5]
    assert replica.waiting.running == [2, 1]


def test_sglang_refuses_fewer_running_requests_than_attention_ranks():
    from tokenpath.sim.simulate import prepare

    scenario = load_scenario(None, {"model.name": "deepseek-v3", "deployment.chip": "h200", "engine.max_num_seqs": 4,
                                    "engine.scheduler": "prefill-first", "deployment.attention_dp": True,
                                    "workload.num_requests": 20})
    with pytest.raises(UserError, match=r"^engine\.max_num_seqs: 4 running requests do not divide over 8 attention "
                                        r"ranks.*raise it to 8 or more$"):
        prepare(scenario)
    prepare(scenario.model_copy(update={"engine": scenario.engine.model_copy(update={"scheduler": "vllm-v1"})}))


def test_sglangs_rank_that_runs_a_prompt_pauses_its_own_decodes_and_only_those():
    # Two ranks: requests 0 and 2 on rank 0, request 1 on rank 1 (in turn). Request 2's prompt, arriving
    # during step 2, runs in step 3 on rank 0: request 0 makes no token there (its scheduler's batch is a
    # prefill), request 1 on rank 1 decodes beside it; each still makes its six tokens.
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=2048, host_overlap=False)
    arrivals = np.array([0, 0, 2_500_000], np.int64)
    trace = run_engine(arrivals, np.array([100, 100, 100]), np.array([6, 6, 2]), RanksCosts(2), LastMile(NO_NETWORK),
                       spec, 10**9)
    assert list(trace.token_steps(0, 1)) == [0, 1, 2, 4, 5, 6]
    assert list(trace.token_steps(1, 2)) == [0, 1, 2, 3, 4, 5]
    assert list(trace.token_steps(2, 3)) == [3, 4]
    assert list(trace.step_seqs[:5]) == [2, 2, 2, 2, 3]  # step 3: request 2's prompt and request 1's decode


@settings(max_examples=200, deadline=None)
@given(context=st.integers(1, 100), out=st.integers(2, 60), taken=st.integers(0, 30), ticks=st.integers(1, 4),
       interval=st.integers(1, 5))
def test_a_paused_decode_has_the_aggregates_of_one_that_started_after_the_pause(context, out, taken, ticks,
                                                                               interval):
    # Decoding.pause keeps its place, and its sums, block and event grids and finishing tick equal those of a
    # sequence that stopped at tick `taken` and started again at taken + ticks with the context it had.
    from array import array

    from tokenpath.engine.running import Decoding

    taken = min(taken, out - 2)
    decodings = []
    for way in ("pause", "stop and start"):
        decoding = Decoding(16, interval, array("q", [out, out]), [0, 0], [])
        decoding.start(0, 0, context)
        decoding.start(1, 0, 10)
        if way == "pause":
            assert decoding.pause(0, taken, ticks) == context + taken
        else:
            decoding.start(0, taken + ticks, decoding.stop(0, taken))
        decodings.append(decoding)
    paused, restarted = decodings
    assert list(paused.states) == [0, 1] and paused.states[0] == restarted.states[0]
    assert (paused.context_sum, paused.last_tick_sum, paused.out_sum) == \
        (restarted.context_sum, restarted.last_tick_sum, restarted.out_sum)
    assert paused.block_due == restarted.block_due and paused.event_due == restarted.event_due
    assert paused.generated == restarted.generated and paused.spans == restarted.spans
    last = paused.states[0][2]
    assert paused.still_due(paused.finishing_at[last]) == restarted.still_due(restarted.finishing_at[last]) == [0]


def test_sglang_holds_its_shared_experts_whole_on_each_rank_with_an_all_to_all_backend():
    # deepseek_v2.py's _shared_expert_use_tp1 under DeepEP; its dense MLPs stay tensor-parallel
    base = {"model.name": "deepseek-v3", "engine.scheduler": "prefill-first", "deployment.attention_dp": True,
            "deployment.expert_parallel": True}
    gathers = {op.name: op for op in build_deployment(load_scenario(None, base)).compute.ops}
    a2a = {op.name: op for op in build_deployment(load_scenario(None, {**base, "deployment.moe_all_to_all": True}))
           .compute.ops}
    assert a2a["shared_experts"].per_sequence and not gathers["shared_experts"].per_sequence
    assert a2a["shared_experts"].resident_bytes == pytest.approx(8 * gathers["shared_experts"].resident_bytes)
    assert not a2a["mlp_down"].per_sequence and a2a["mlp_down"] == gathers["mlp_down"]


@pytest.mark.parametrize("scheduler, model", [
    ("prefill-first", "qwen3-8b"), ("prefill-first", "qwen3-30b-a3b"), ("prefill-first", "deepseek-v3"),
    ("prefill-first", "gpt-oss-120b"), ("trtllm", "llama-3.1-70b"), ("vllm-v1", "mixtral-8x7b")])
def test_an_engine_whose_code_has_attention_data_parallel_for_the_model_runs_it(scheduler, model):
    """SGLang's Qwen3 (dense and MoE), DeepSeek and gpt-oss files split attention over the attention-TP
    group; TensorRT-LLM's Attention module and vLLM's data-parallel engines run any model's whole."""
    from tokenpath.whatif.catalog import catalog

    table = {"model.name": model, "engine.scheduler": scheduler, "deployment.attention_dp": True}
    assert build_deployment(load_scenario(None, table)).compute.attention_dp
    off = load_scenario(None, {**table, "deployment.attention_dp": False})
    [lever] = [lever for lever in catalog(off, off.model_dump(mode="json")) if lever.name.startswith("attention")]
    assert lever.overrides == {"deployment.attention_dp": True} and not lever.skipped


def test_a_config_json_names_the_model_class_its_engines_load(tmp_path):
    """A user's config.json gives its `architectures`: SGLang runs attention data-parallel for a Qwen3
    checkpoint and refuses it for the same shape under Llama's class."""
    shape = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
             "tie_word_embeddings": False}
    for architecture, runs in (("Qwen3ForCausalLM", True), ("LlamaForCausalLM", False)):
        path = tmp_path / architecture / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**shape, "architectures": [architecture]}))
        assert load_model(str(path)).architecture == architecture
        scenario = load_scenario(None, {"model.name": str(path), "engine.scheduler": "prefill-first",
                                        "deployment.attention_dp": True})
        if runs:
            assert build_deployment(scenario).compute.attention_dp
        else:
            with pytest.raises(UserError, match=f"SGLang's model code for {architecture} splits attention"):
                build_deployment(scenario)
    path = tmp_path / "none" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(shape))
    assert load_model(str(path)).architecture == ""
    with pytest.raises(UserError, match="for a model whose config.json names no architectures splits"):
        build_deployment(load_scenario(None, {"model.name": str(path), "engine.scheduler": "prefill-first",
                                              "deployment.attention_dp": True}))


@pytest.mark.parametrize("scheduler, mlp_own", [("vllm-v1", True), ("trtllm", True), ("prefill-first", False)])
def test_a_rank_normalizes_its_own_tokens_and_the_mlps_norm_runs_where_its_input_is(scheduler, mlp_own):
    """Into attention, MLA's latents and the final norm each rank normalizes its own sequences; the norm before the
    MLP runs on the rank's tokens where the router after it does (vLLM, TensorRT-LLM), on every rank's where
    SGLang gathers them first (LayerCommunicator.prepare_mlp). Together they are the tensor-parallel norms."""
    base = {"model.name": "deepseek-v3", "engine.scheduler": scheduler, "deployment.expert_parallel": True}
    dp = {op.name: op for op in build_deployment(load_scenario(None, {**base, "deployment.attention_dp": True}))
          .compute.ops}
    tp = {op.name: op for op in build_deployment(load_scenario(None, base)).compute.ops}
    assert dp["norms"].per_sequence and dp["mlp_norms"].per_sequence == mlp_own
    h, layers = 7168, 61
    assert dp["mlp_norms"].bytes_per_token == 4 * layers * h * 2 and dp["mlp_norms"].kernels == layers
    for field in ("bytes_per_token", "bytes_fixed", "resident_bytes", "kernels"):
        assert getattr(dp["norms"], field) + getattr(dp["mlp_norms"], field) == pytest.approx(
            getattr(tp["norms"], field), rel=1e-12)
