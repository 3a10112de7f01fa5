"""The share of a GPU's memory an engine's KV cache is cut from: SGLang's --mem-fraction-static as each
generation of its releases sets it when left unset (python/sglang/srt/server_args.py, the numbers below
worked by hand from each release's code), and what the share covers (SGLang: the weights and the KV
pool; vLLM and TensorRT-LLM: everything, the activations included)."""

import pytest

from tokenpath.compute.roofline import DoesNotFit
from tokenpath.config.assumptions import DEFAULTS
from tokenpath.engine.memory_share import KvMargin, ServerShape, sglang_mem_fraction_static
from tokenpath.engine.release import release_at_least
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import build_scenario, load_scenario

GIB = 2**30
H100, H200, B200 = 80 * GIB, 141 * GIB, 180 * GIB  # the catalog's: 81,920, 144,384 and 184,320 MiB


def _fraction(release, hbm=H100, tp=1, pp=1, chunk=8192, graphs=256, attention_dp=False, drafter=None,
              prefill_graphs=0, mla=False):
    return sglang_mem_fraction_static(ServerShape(release, hbm, tp, pp, chunk, graphs, attention_dp, drafter,
                                                  prefill_graphs, mla))


@pytest.mark.parametrize(("release", "tp", "expected"), [
    ("0.3.0", 1, 0.88), ("0.3.0", 2, 0.87), ("0.3.0", 4, 0.85), ("0.3.0", 8, 0.83), ("0.3.0", 16, 0.79),
    ("0.3.6", 8, 0.82), ("0.4.2", 8, 0.81), ("0.4.5", 4, 0.85), ("0.2.5", 8, 0.83),
])
def test_releases_before_0_4_6_take_the_table_by_tensor_parallel_size(release, tp, expected):
    assert _fraction(release, H200, tp=tp) == expected  # whatever the GPU's memory


def test_0_4_6_and_0_4_7_leave_a_fixed_reserve_on_gpus_above_80_gib():
    assert _fraction("0.4.6", H100, tp=8) == 0.81
    assert _fraction("0.4.6", H200, tp=8) == pytest.approx((144384 - 13 * 1024) / 144384)
    # 0.4.7: 0.88 above 81,920 MiB, then min(0.88 + 48 GiB x 0.12 / memory, all but 18 GiB)
    assert _fraction("0.4.7", H200, tp=8) == pytest.approx((144384 - 18 * 1024) / 144384)
    assert _fraction("0.4.7", H200, tp=8, drafter="eagle") == pytest.approx((144384 - 20 * 1024) / 144384)
    assert _fraction("0.4.7", B200, tp=8) == 0.79  # above 180,000 MB
    assert _fraction("0.4.7", H100, tp=4, pp=2) == 0.81  # the table by tp x pp now
    assert _fraction("0.4.7", H100, tp=1, drafter="eagle") == pytest.approx(0.88 * 0.95)


@pytest.mark.parametrize(("release", "hbm", "tp", "more", "reserve_gib"), [
    ("0.4.8", H100, 1, {}, 9.5 + 0.5),
    ("0.5.2", H100, 8, {}, 9.5 + 4),
    ("0.5.3rc0", H200, 8, {}, 12 + 4),            # a pre-release of 0.5.3 keeps 0.5.2's rule
    ("0.4.9", B200, 8, {}, 32),
    ("0.5.2", H200, 8, {"drafter": "eagle"}, 12 + 4 + 2),
    ("0.5.2", H200, 8, {"drafter": "draft_model"}, 12 + 4 + 6),
    ("0.5.2", H200, 8, {"attention_dp": True}, 12 + 4 + 4),
])
def test_0_4_8_to_0_5_3rc0_reserve_by_memory_tier(release, hbm, tp, more, reserve_gib):
    mib = hbm / 2**20
    assert _fraction(release, hbm, tp=tp, **more) == round((mib - reserve_gib * 1024) / mib, 3)


@pytest.mark.parametrize(("hbm", "tp", "chunk", "graphs", "more", "reserve_mib"), [
    # 512 + 1.5 x chunk + 2 x graph batch + tp/8 GiB: H100 TP1 at SGLang's own tier (8,192; 256)
    (H100, 1, 8192, 256, {}, 512 + 12288 + 512 + 128),
    (H200, 8, 8192, 512, {}, 512 + 12288 + 1024 + 1024),
    (B200, 8, 16384, 512, {}, 512 + 24576 + 1024 + 1024),
    # a small chunk: the 10 GiB floor on a GPU above 60 GiB
    (H100, 1, 1024, 32, {}, 10240),
    # DP attention over 8 ranks with 512-sequence graphs: 3 + 1.5 MiB per sequence per rank
    (H200, 8, 8192, 512, {"attention_dp": True}, 512 + 12288 + 1024 + 1024 + 512 * 8 * 4.5),
    # drafters after the floor, to 0.5.9: EAGLE or MTP 2 GiB, a draft model 6, n-gram none
    (H100, 1, 1024, 32, {"drafter": "mtp"}, 10240 + 2048),
    (H100, 1, 1024, 32, {"drafter": "draft_model"}, 10240 + 6144),
    (H100, 1, 1024, 32, {"drafter": "ngram"}, 10240),
])
def test_0_5_3_on_reserves_for_the_prefill_chunk_and_the_decode_graphs(hbm, tp, chunk, graphs, more, reserve_mib):
    mib = hbm / 2**20
    expected = round((mib - reserve_mib) / mib, 3)
    releases = ("0.5.3", "0.5.3.post3", "0.5.9 (lmsysorg/sglang:v0.5.9-cu130)")
    if "drafter" not in more:
        releases += (None, "not stated")  # (unstated: the newest, which reserves for no drafter)
    for release in releases:
        assert _fraction(release, hbm, tp=tp, chunk=chunk, graphs=graphs, **more) == expected


@pytest.mark.parametrize(("release", "drafter", "drafter_mib"), [
    ("0.5.10", "mtp", 4096), ("0.5.13", "eagle", 4096), ("0.5.13", "draft_model", 6144), ("0.5.13", "ngram", 0),
    ("0.5.14", "mtp", 0), ("0.5.14", "draft_model", 0), (None, "eagle", 0),
])
def test_the_drafters_reserve_is_4_gib_from_0_5_10_and_none_from_0_5_14(release, drafter, drafter_mib):
    # 0.5.10 raised an EAGLE or MTP drafter's reserve to 4 GiB; 0.5.14 counts the drafter in the pool instead.
    mib = H100 / 2**20
    expected = round((mib - 10240 - drafter_mib) / mib, 3)
    assert _fraction(release, H100, chunk=1024, graphs=32, drafter=drafter) == expected


@pytest.mark.parametrize(("text", "since", "expected"), [
    ("0.5.3rc0", "0.5.3", False), ("0.5.3", "0.5.3", True), ("0.5.3.post3", "0.5.3", True),
    ("0.5.4rc1", "0.5.3", True), ("v0.8.0.dev1", "0.8", False), ("1.0.0a2", "1.0", False),
    ("0.5.9-cu130", "0.5.9", True), ("0.7.1 (build)", "0.7.1", True),
])
def test_a_pre_release_comes_before_the_release_it_leads_to(text, since, expected):
    assert release_at_least(text, since) is expected


def _deployment(scheduler: str, **more):
    overrides = {"model.name": "llama-3.1-70b", "model.precision": "fp8", "deployment.chip": "h100",
                 "deployment.chips": 2, "deployment.tp": 2, "engine.scheduler": scheduler, **more}
    return build_deployment(load_scenario("typical", overrides))


def test_sglangs_share_covers_the_weights_and_the_pool_and_vllms_the_activations_too():
    """At the same share SGLang's pool is its share of the memory free at start (HBM less the runtime's
    context and communicators) less the weights; vLLM's cache also gives up a step's activations."""
    sglang = _deployment("prefill-first", **{"engine.gpu_memory_utilization": 0.85})
    vllm = _deployment("vllm-v1", **{"engine.gpu_memory_utilization": 0.85})
    compute = sglang.compute
    runtime = compute.activation_reserve_bytes(0)  # no tokens, no logit rows: the runtime reserve alone
    assert runtime == GIB
    free = (80 * GIB - runtime) * 0.85 - compute.weight_bytes_per_chip
    assert sglang.kv_capacity_tokens == int(free // compute.kv_bytes_per_token_per_chip)
    assert vllm.kv_capacity_tokens < sglang.kv_capacity_tokens


def test_tensorrt_llms_share_is_a_share_of_what_the_weights_and_a_step_leave():
    """KvCacheCreator._cal_max_memory: (total - peak of the profiling step) x free_gpu_memory_fraction."""
    trtllm = _deployment("trtllm", **{"engine.gpu_memory_utilization": 0.85, "engine.max_num_seqs": 256,
                                      "engine.max_num_batched_tokens": 8192})
    compute = trtllm.compute
    left = 80 * GIB - compute.weight_bytes_per_chip - compute.activation_reserve_bytes(8192, 256)
    assert trtllm.kv_capacity_tokens == int(left * 0.85 // compute.kv_bytes_per_token_per_chip)


def test_left_unset_each_engine_takes_its_own_share():
    engine = EngineSpec(scheduler="prefill-first", max_num_batched_tokens=8192, version="0.5.3rc0")
    assert engine.gpu_memory_utilization is None
    assert engine.memory_share(H100, tp=2, pp=1, attention_dp=False) == round((81920 - 10.5 * 1024) / 81920, 3)
    assert EngineSpec(scheduler="vllm-v1", version="0.19.1").memory_share(H100, 2, 1, False) == 0.9
    assert EngineSpec(scheduler="trtllm").memory_share(H100, 2, 1, False) == 0.9
    assert EngineSpec(scheduler="prefill-first", gpu_memory_utilization=0.7).memory_share(H100, 2, 1, False) == 0.7
    # SGLang's own graph batch at TP2 on an 80 GiB GPU is 256 (engine/cuda_graphs.py), its chunk the table's
    newest = EngineSpec(scheduler="prefill-first", max_num_batched_tokens=8192)
    assert newest.memory_share(H100, 2, 1, False) == round((81920 - (512 + 12288 + 512 + 256)) / 81920, 3)


def test_the_simulated_document_reports_the_share_the_engine_took():
    from tokenpath.sim.document import result_document
    from tokenpath.sim.simulate import simulate

    overrides = {"engine.scheduler": "prefill-first", "engine.version": "0.4.2", "workload.num_requests": 20}
    (document, *_) = result_document(simulate(load_scenario("typical", overrides)))
    assert document["resolved"]["engine"]["gpu_memory_utilization"] == 0.81  # TP8 under 0.4.2's table


def test_a_share_too_small_for_the_weights_names_the_share_to_raise():
    with pytest.raises(DoesNotFit, match=r"gpu_memory_utilization=0.4, the share for weights and KV cache; .*raise "
                                         r"engine.gpu_memory_utilization"):
        _deployment("prefill-first", **{"engine.gpu_memory_utilization": 0.4})


def test_a_model_that_does_not_fit_names_its_published_checkpoint_where_that_is_smaller():
    """gpt-oss-120b's checkpoint keeps MXFP4 experts beside bf16 attention; an fp8 scenario's 110 GiB do not
    fit one H100, its checkpoint's 64 GiB do. Llama's bf16 checkpoint is larger than fp8: no hint."""
    one_h100 = {"deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1}
    with pytest.raises(DoesNotFit, match=r"does not fit in h100's 80 GiB HBM; raise --tp or use a lower precision "
                                         r"\(gpt-oss-120b's published checkpoint is bf16 with fp4 routed experts: "
                                         r"--precision bf16 --set model.expert_precision=fp4\)$"):
        build_deployment(load_scenario("typical", {"model.name": "gpt-oss-120b", **one_h100}))
    as_published = {"model.name": "gpt-oss-120b", "model.precision": "bf16", "model.expert_precision": "fp4"}
    assert build_deployment(load_scenario("typical", {**as_published, **one_h100})).kv_capacity_tokens > 0
    with pytest.raises(DoesNotFit, match=r"raise --tp or use a lower precision$"):
        build_deployment(load_scenario("typical", {"model.name": "llama-3.1-405b", **one_h100}))


@pytest.mark.parametrize(("scheduler", "words"), [
    ("vllm-v1", "0.9 of HBM for everything"), ("trtllm", "0.9 of the memory the weights and a step leave"),
    ("prefill-first", "0.81 of HBM for weights and KV cache"),  # 0.4.2's table at TP8
])
def test_the_report_says_the_share_each_engine_took_and_what_it_covers(scheduler, words):
    from tokenpath.report.simulation import describe
    from tokenpath.sim.simulate import prepare

    overrides = {"engine.scheduler": scheduler, "engine.version": "0.4.2", "workload.num_requests": 20}
    lines = dict(describe(prepare(load_scenario("typical", overrides))))
    assert lines["KV cache"].endswith(f"; {words})")


def test_the_report_says_when_vllm_sized_its_cache_from_measured_memory():
    from tokenpath.report.simulation import describe
    from tokenpath.sim.simulate import prepare

    lines = dict(describe(prepare(load_scenario("typical", {"workload.num_requests": 20}))))
    assert lines["KV cache"].endswith("; all of HBM for everything, less a margin, as measured free)")


def test_prompt_step_graphs_reserve_8_mib_a_size_and_an_mla_models_1_5_gib():
    """0.5.8 on: 8 MiB per prompt-step size captured (58 up to 8,192 tokens) before the 10 GiB floor; from
    0.5.10 an MLA model's 1.5 GiB instead; 0.5.7's opt-in reserve is not modelled."""
    reserve = 512 + 8192 * 1.5 + 256 * 2 + 1024 / 8   # above the floor on an H100 at TP1
    assert _fraction("0.5.11", prefill_graphs=58) == round((81920 - reserve - 58 * 8) / 81920, 3)
    assert _fraction("0.5.11", prefill_graphs=42, mla=True) == round((81920 - reserve - 1536) / 81920, 3)
    assert _fraction("0.5.9", prefill_graphs=42, mla=True) == round((81920 - reserve - 42 * 8) / 81920, 3)
    assert _fraction("0.5.7", prefill_graphs=58) == _fraction("0.5.7") == round((81920 - reserve) / 81920, 3)


def test_an_sglang_server_reserves_for_its_prompt_graphs_where_its_release_runs_them():
    def share(version):
        table = {"model": {"name": "llama-3.1-8b"}, "deployment": {"chip": "h100", "chips": 1, "tp": 1},
                 "engine": {"scheduler": "prefill-first", "version": version}}
        return build_deployment(build_scenario(table, "test")).memory_share

    assert share("0.5.9") - share("0.5.10") == pytest.approx(58 * 8 / 81920, abs=1e-3)


@pytest.mark.parametrize(("release", "generation", "expected"), [
    ("0.11.0", "Hopper", 0.9), ("0.19.1", "Hopper", 0.9), ("0.20.0", "Hopper", 0.92), ("0.33.0", "Ampere", 0.92),
    ("0.34.0", "Hopper", 1.0), ("0.34.0", "CDNA3", 1.0), (None, "Blackwell", 1.0),
    ("0.34.0", "Trillium", 0.92), ("0.34.0", "", 0.92),  # no measured sizing off CUDA and ROCm
])
def test_vllm_v1s_unset_share_by_release(release, generation, expected):
    """CacheConfig.gpu_memory_utilization: 0.9, 0.92 from 0.20.0; from 0.34.0 all of it where the cache is
    sized from measured memory (resolved_gpu_memory_utilization)."""
    engine = EngineSpec(scheduler="vllm-v1", version=release)
    assert engine.memory_share(H100, 1, 1, False, generation=generation) == expected


def test_vllm_from_0_34_keeps_a_margin_where_it_measures_and_the_other_engines_none():
    assert EngineSpec(scheduler="vllm-v1", version="0.34.0").kv_margin("Hopper") == KvMargin(GIB, 0.75)
    assert EngineSpec(scheduler="vllm-v1").kv_margin("CDNA3") == KvMargin(3 * GIB, 0.75)  # ROCm's floor
    assert EngineSpec(scheduler="vllm-v1", version="0.33.0").kv_margin("Hopper") is None
    assert EngineSpec(scheduler="vllm-v1").kv_margin("Gaudi 3") is None
    for scheduler in ("vllm-v0", "prefill-first", "trtllm"):
        assert EngineSpec(scheduler=scheduler).kv_margin("Hopper") is None


def test_vllm_0_34_gives_its_cache_all_but_the_activations_a_margin_and_the_runtime():
    """The cache takes the GPU less the weights, the step's activations (the runtime reserve with them),
    and max(1 GiB, 0.75 x the step's activations), where 0.33.0 took 0.92 of the GPU less the same."""
    newest, older = _deployment("vllm-v1"), _deployment("vllm-v1", **{"engine.version": "0.33.0"})
    compute = newest.compute
    activations = compute.activation_reserve_bytes(8192, 1024, DEFAULTS.value("sampler_profile_bytes_per_logit"))
    step = activations - DEFAULTS.value("runtime_reserve_bytes")
    assert step > GIB / 0.75  # this step's margin is the share of its activations, not the floor
    left = H100 - compute.weight_bytes_per_chip - activations
    per_token = compute.kv_bytes_per_token_per_chip
    assert newest.kv_capacity_tokens == int((left - 0.75 * step) // per_token)
    assert older.kv_capacity_tokens == int((left - 0.08 * H100) // per_token)
    assert newest.memory_share == 1.0 and older.memory_share == 0.92


def test_a_share_set_under_vllm_0_34_caps_the_cache_it_measures():
    capped = _deployment("vllm-v1", **{"engine.gpu_memory_utilization": 0.5})
    compute = capped.compute
    activations = compute.activation_reserve_bytes(8192, 1024, DEFAULTS.value("sampler_profile_bytes_per_logit"))
    left = 0.5 * H100 - compute.weight_bytes_per_chip - activations
    assert capped.kv_capacity_tokens == int(left // compute.kv_bytes_per_token_per_chip)


def test_a_small_steps_margin_is_vllms_floor():
    small = _deployment("vllm-v1", **{"engine.max_num_batched_tokens": 512, "engine.max_num_seqs": 64})
    compute = small.compute
    activations = compute.activation_reserve_bytes(512, 64, DEFAULTS.value("sampler_profile_bytes_per_logit"))
    assert 0.75 * (activations - DEFAULTS.value("runtime_reserve_bytes")) < GIB
    left = H100 - GIB - compute.weight_bytes_per_chip - activations
    assert small.kv_capacity_tokens == int(left // compute.kv_bytes_per_token_per_chip)
