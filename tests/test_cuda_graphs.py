"""Which steps replay a CUDA graph when the scenario does not say: the profiles' defaults."""

import pytest

from tokenpath.engine.cuda_graphs import sglang_cuda_graph_max_bs, sglang_defaults
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
    h100 = _compute("h100", 1, scheduler="prefill-first")
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
