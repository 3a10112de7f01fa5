"""Which steps replay a CUDA graph when the scenario does not say: the profiles' defaults."""

import numpy as np
import pytest

from tokenpath.compute import load_chip
from tokenpath.engine.cuda_graphs import (
    PromptStepShape,
    sglang_cuda_graph_max_bs,
    sglang_defaults,
    sglang_prefill_graph_tokens,
)
from tokenpath.engine.platforms import runs_cuda, runs_rocm
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import build_scenario

GIB = 2**30


@pytest.mark.parametrize(("hbm_gib", "tp", "max_bs"), [
    (16, 1, 8), (16, 8, 8),          # T4-class
    (20, 1, 24), (24, 4, 80),        # A10, 4090: from 20 GiB on
    (40, 2, 32), (40, 4, 160),       # A100 40 GB
    (80, 1, 256), (80, 8, 512),      # H100, A100 80 GB
    (141, 3, 256), (141, 4, 512),    # H200
    (160, 1, 512), (192, 8, 512),    # B200, MI300X
])
def test_sglang_captures_decode_batches_up_to_its_default_for_the_gpu_and_tp(hbm_gib, tp, max_bs):
    assert sglang_cuda_graph_max_bs(hbm_gib * GIB, tp) == max_bs


@pytest.mark.parametrize(("release", "hbm_gib", "tp", "chunk", "max_bs"), [
    # before 0.4.6: 160 on any GPU of 25 GB or more, chunks of 8,192
    ("0.4.2", 80, 8, 8192, 160), ("0.4.2", 192, 8, 8192, 160), ("0.3.0", 141, 1, 8192, 160), ("0.4.2", 20, 1, 2048, 8),
    # 0.4.6: 256 above 81,920 MiB
    ("0.4.6", 80, 8, 8192, 160), ("0.4.6", 141, 8, 8192, 256), ("0.4.6", 192, 8, 8192, 256),
    # 0.4.7: 256 above 96 GiB, 512 and chunks of 16,384 above 180,000 MiB
    ("0.4.7", 141, 8, 8192, 256), ("0.4.7", 180, 8, 16384, 512),
    # 0.4.8 to 0.5.3rc0: 256 above 90 GiB, 512 above 160,000 MiB; chunks of 16,384 from 160 GiB
    ("0.4.9", 80, 1, 8192, 160), ("0.5.3rc0", 141, 8, 8192, 256), ("0.5.2", 160, 8, 16384, 512),
    ("0.5.2", 157, 8, 8192, 512), ("0.5.2", 40, 1, 8192, 160), ("0.5.2", 24, 4, 2048, 80),
    # 0.5.3 on, and no release stated: the tiers by memory and tp
    ("0.5.3", 80, 1, 8192, 256), ("0.5.3.post3", 80, 8, 8192, 512), (None, 40, 1, 4096, 32),
    ("0.5.9", 192, 8, 16384, 512),
])
def test_each_sglang_release_picks_its_prefill_chunk_and_graph_batches_by_its_own_rule(release, hbm_gib, tp, chunk,
                                                                                        max_bs):
    assert sglang_defaults(hbm_gib * GIB, tp, release) == (chunk, max_bs)


def test_an_sglang_scenario_of_an_old_release_takes_that_releases_defaults():
    table = {"model": {"name": "llama-3.1-8b"}, "deployment": {"chip": "mi300x", "chips": 8, "tp": 8},
             "engine": {"scheduler": "prefill-first", "version": "0.4.2"}}
    scenario = build_scenario(table, "test")
    assert scenario.engine.max_num_batched_tokens == 8192   # 16,384 under the newest release
    assert scenario.engine.graph_max_tokens(192 * GIB, 8) == 160  # 512 under the newest release


def test_prefill_first_replays_decode_steps_only_unless_told():
    assert EngineSpec(scheduler="prefill-first").cuda_graphs == "decode"
    assert EngineSpec(scheduler="prefill-first", cuda_graphs="all").cuda_graphs == "all"
    assert EngineSpec().cuda_graphs == "all"
    assert EngineSpec(scheduler="trtllm").cuda_graphs == "decode"  # its PyTorch backend's prompts: no graph


def _compute(chip, tp, **engine):
    table = {"model": {"name": "llama-3.1-8b"}, "deployment": {"chip": chip, "chips": tp, "tp": tp}, "engine": engine}
    return build_deployment(build_scenario(table, "test")).compute


def test_a_prefill_first_deployment_graphs_decode_batches_up_to_sglangs_default():
    h100 = _compute("h100", 1, scheduler="prefill-first", version="0.5.9")
    assert h100.launch_s(256, 256) == 0.0 and h100.launch_s(257, 257) > 0.0   # 256 at TP1 on 80 GB
    assert h100.launch_s(100, 1) > 0.0                                       # a prefill runs eagerly
    assert h100.graph_policy() == "CUDA graphs for decode steps of up to 256 sequences"
    assert _compute("h100", 4, scheduler="prefill-first").launch_s(512, 512) == 0.0
    capped = _compute("h100", 1, scheduler="prefill-first", cuda_graph_max_tokens=160)
    assert capped.launch_s(160, 160) == 0.0 and capped.launch_s(161, 161) > 0.0
    v1 = _compute("h100", 1)
    assert v1.launch_s(4096, 1) == 0.0 and v1.graph_policy() == "CUDA graphs for all steps"
    assert _compute("h100", 1, cuda_graphs="none").graph_policy() == "no CUDA graphs"


def test_trtllm_replays_the_decode_batches_it_captured_and_launches_the_others():
    """trtllm-serve's graphs: decode batches of 1-32, 64 and 128 sequences, unpadded; a batch of 33 or 129
    launches its kernels. Padded (cuda_graph_padding), every decode batch up to the largest replays one."""
    trtllm = _compute("h100", 1, scheduler="trtllm")
    launched = [size for size in (1, 32, 33, 63, 64, 65, 128, 129) if trtllm.launch_s(size, size) > 0.0]
    assert launched == [33, 63, 65, 129]
    assert trtllm.launch_s(32, 1) > 0.0  # a prompt step
    assert trtllm.graph_policy() == "CUDA graphs for decode steps of 1-32, 64 and 128 sequences (unpadded)"
    padded = _compute("h100", 1, scheduler="trtllm", cuda_graph_padding=True, cuda_graph_max_tokens=512)
    assert padded.launch_s(511, 511) == 0.0 and padded.launch_s(513, 513) > 0.0
    assert padded.graph_policy() == "CUDA graphs for decode steps of up to 512 sequences"


def test_vllm_v0_graphs_decode_batches_up_to_256_and_its_host_runs_in_every_step():
    """vLLM V0 captured decode batches of 1, 2, 4, 8, ..., 256 and ran prompt and mixed chunked-prefill
    steps eagerly from Python; it prepares each step while the GPU waits (engine/host_time.py)."""
    from tokenpath.engine.host_time import (
        EAGER_HOST_PER_KERNEL_S,
        HOST_STEP_S,
        VLLM_V0_HOST_STEP_S,
        VLLM_V0_HOST_WINDOW_S,
    )

    assert EngineSpec(scheduler="vllm-v0").cuda_graphs == "decode"
    assert EngineSpec(scheduler="vllm-v0").max_num_seqs == 256 and EngineSpec().max_num_seqs == 1024
    assert EngineSpec(scheduler="vllm-v0", max_num_seqs=64).max_num_seqs == 64
    v0 = _compute("h200", 4, scheduler="vllm-v0")
    assert v0.launch_s(256, 256) == 0.0 and v0.launch_s(257, 257) > 0.0
    assert v0.launch_s(100, 1) > 0.0 and v0.launch_s(130, 30) > 0.0  # a prefill, a mixed chunked step
    assert v0.graph_policy() == "CUDA graphs for decode steps of up to 256 sequences"
    # its host per scheduler call and every step, in the step's path: a step run alone pays both
    assert (v0.host_window_s, v0.host_step_s) == (VLLM_V0_HOST_WINDOW_S, VLLM_V0_HOST_STEP_S)
    assert v0.host_s(0) == VLLM_V0_HOST_WINDOW_S + VLLM_V0_HOST_STEP_S > HOST_STEP_S and not v0.host_overlapped
    assert v0.host_eager_per_kernel_s == EAGER_HOST_PER_KERNEL_S
    v1 = _compute("h200", 4)
    assert (v1.host_window_s, v1.host_step_s) == (HOST_STEP_S, 0.0)


def _shape(release, budget=8192, mla=False, generation="Hopper", pp=1, attention_dp=False, speculative=False):
    return PromptStepShape(release, budget, mla, generation, pp, attention_dp, speculative)


@pytest.mark.parametrize(("shape", "tokens"), [
    # on by default on NVIDIA GPUs from 0.5.10, up to the prefill chunk; never on ROCm
    (_shape("0.5.9"), None), (_shape("0.5.10"), 8192), (_shape("0.5.23", budget=16384), 16384), (_shape(None), 8192),
    (_shape("0.5.23", generation="CDNA3"), None), (_shape("0.5.12", generation="Ampere", budget=4096), 4096),
    # pipeline parallelism: off in 0.5.10-0.5.14 and from 0.5.19, on in between
    (_shape("0.5.14", pp=2), None), (_shape("0.5.15", pp=2), 8192), (_shape("0.5.18", pp=2), 8192),
    (_shape("0.5.19", pp=2), None),
    # DP attention: off until 0.5.17; a drafter: off in 0.5.10 (and its post-release) only
    (_shape("0.5.16", attention_dp=True), None), (_shape("0.5.17", attention_dp=True), 8192),
    (_shape("0.5.10.post1", speculative=True), None), (_shape("0.5.11", speculative=True), 8192),
    # MLA: 2,048 tokens; off from 0.5.15 to 0.5.17, and on Blackwell (trtllm_mla) from 0.5.15; 8,192 in 0.5.23
    (_shape("0.5.10", mla=True), 2048), (_shape("0.5.14", mla=True, generation="Blackwell"), 2048),
    (_shape("0.5.15", mla=True), None), (_shape("0.5.17", mla=True), None), (_shape("0.5.18", mla=True), 2048),
    (_shape("0.5.18", mla=True, generation="Blackwell"), None), (_shape("0.5.23", mla=True, budget=16384), 8192),
    (_shape("0.5.23", mla=True, budget=4096), 4096),
])
def test_sglang_replays_prompt_steps_as_graphs_by_its_releases_rules(shape, tokens):
    assert sglang_prefill_graph_tokens(shape, None) == tokens


def test_prefill_cuda_graphs_forces_sglangs_prompt_graphs_on_or_off():
    """True skips the rules, as --enforce-piecewise-cuda-graph does, up to the release's largest step: 4,096
    tokens when the graphs were opt-in (0.5.4-0.5.6), the chunk from 0.5.7; False turns them off."""
    assert sglang_prefill_graph_tokens(_shape("0.5.5"), True) == 4096
    assert sglang_prefill_graph_tokens(_shape("0.5.7", budget=16384), True) == 16384
    assert sglang_prefill_graph_tokens(_shape("0.5.23", generation="CDNA3"), True) == 8192
    assert sglang_prefill_graph_tokens(_shape("0.5.23"), False) is None
    with pytest.raises(ValueError, match="from 0.5.4; set version to 0.5.4 or later"):
        EngineSpec(scheduler="prefill-first", version="0.5.3", prefill_cuda_graphs=True)
    with pytest.raises(ValueError, match=r"prefill_cuda_graphs applies to scheduler = \"prefill-first\" only"):
        EngineSpec(prefill_cuda_graphs=False)


def test_the_catalogs_nvidia_chips_run_cuda_its_amd_chips_rocm_and_the_rest_neither():
    for name in ("a100", "h100", "h200", "b200", "gb200"):
        assert runs_cuda(load_chip(name).generation) and not runs_rocm(load_chip(name).generation)
    for name in ("mi300x", "mi325x"):
        assert runs_rocm(load_chip(name).generation) and not runs_cuda(load_chip(name).generation)
    for name in ("tpu-v5p", "tpu-v6e", "gaudi3"):
        assert not runs_cuda(load_chip(name).generation) and not runs_rocm(load_chip(name).generation)


def test_sglangs_prompt_steps_replay_graphs_up_to_the_chunk_in_the_releases_that_do():
    """From 0.5.10 a prompt step of up to the chunk launches nothing from Python; a longer one (without
    chunked prefill) still does, as do decode batches above the captured ones."""
    new = _compute("h100", 1, scheduler="prefill-first", version="0.5.10", chunked_prefill=False)
    assert new.launch_s(8192, 1) == 0.0 and new.launch_s(8193, 1) > 0.0 and new.launch_s(3000, 20) == 0.0
    assert new.launch_s(257, 257) > 0.0  # a decode batch above the 256 captured
    assert new.graph_policy() == "CUDA graphs for decode steps of up to 256 sequences, and prompt steps of up to " \
                                 "8192 tokens"
    off = _compute("h100", 1, scheduler="prefill-first", version="0.5.10", prefill_cuda_graphs=False)
    assert off.launch_s(100, 1) > 0.0
    assert _compute("h100", 1, scheduler="prefill-first", version="0.5.10", cuda_graphs="none").launch_s(100, 1) > 0.0
    assert _compute("mi300x", 1, scheduler="prefill-first", version="0.5.23").launch_s(100, 1) > 0.0


def test_prompt_graphs_take_sglangs_eager_launches_out_of_its_time_to_first_token():
    """One 500-token prompt at a time on an idle engine: 0.5.10 replays the step, 0.5.9 launches its kernels
    from Python (the registry's host time each), so 0.5.9's TTFT is longer by what the launches add to the
    prompt step and to nothing else."""
    from tokenpath.sim.simulate import simulate

    def ttft_s(version):
        table = {"model": {"name": "llama-3.1-8b"}, "deployment": {"chip": "h100", "chips": 1, "tp": 1},
                 "engine": {"scheduler": "prefill-first", "version": version},
                 "workload": {"num_requests": 20, "input": {"kind": "fixed", "value": 500},
                              "output": {"kind": "fixed", "value": 2}, "arrival": {"rate": 0.5}}}
        run = simulate(build_scenario(table, "test")).run
        return float(np.median(run.ttft_ns[run.completed])) / 1e9  # a request that finds none ahead of it

    pairs = 500 * 501 / 2
    eager_step = _compute("h100", 1, scheduler="prefill-first", version="0.5.9").step_time_s(500, 1, pairs, 500)
    graphed_step = _compute("h100", 1, scheduler="prefill-first", version="0.5.10").step_time_s(500, 1, pairs, 500)
    assert eager_step > graphed_step
    assert ttft_s("0.5.9") - ttft_s("0.5.10") == pytest.approx(eager_step - graphed_step, rel=0.02)


def test_the_result_says_up_to_which_prompt_step_graphs_are_replayed():
    from tokenpath.sim.simulate import simulate

    def resolved(version):
        table = {"model": {"name": "llama-3.1-8b"}, "deployment": {"chip": "h100", "chips": 1, "tp": 1},
                 "engine": {"scheduler": "prefill-first", "version": version}, "workload": {"num_requests": 4}}
        return simulate(build_scenario(table, "test")).summary["resolved"]["engine"]["prefill_graph_max_tokens"]

    assert resolved("0.5.10") == 8192 and resolved("0.5.9") is None
