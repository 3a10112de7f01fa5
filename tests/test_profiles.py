"""The scheduler profiles as data: named in engine/profiles.py only, each one's facts read where they
apply, its rules restated in the reference engine, and the waiting queue behind a seam."""

import re
from pathlib import Path

import numpy as np
import pytest

import tokenpath
from reference_engine import RULES
from test_engine import PROFILES as COMPARED
from test_engine import engine
from tokenpath.config.assumptions import lookup
from tokenpath.engine.host_time import host_step_cost
from tokenpath.engine.profiles import DEFAULT_PROFILE, PROFILES, choices
from tokenpath.engine.queues import QUEUES, FcfsQueue
from tokenpath.engine.spec import EngineSpec

SRC = Path(tokenpath.__file__).parent
PROFILES_FILE = SRC / "engine" / "profiles.py"
GIB = 2**30


def _quoted_names(text):
    """Profile names written as a value: in quotes, as code compares, indexes or suggests them."""
    names = "|".join(re.escape(name) for name in PROFILES)
    return re.findall(rf"""["'`]({names})\\?["'`]""", text)


def test_the_profile_names_appear_in_code_only_in_engine_profiles():
    assert set(_quoted_names(PROFILES_FILE.read_text(encoding="utf-8"))) == set(PROFILES)  # the pattern finds them
    found = {str(path.relative_to(SRC)): names for path in sorted(SRC.rglob("*.py")) if path != PROFILES_FILE
             if (names := _quoted_names(path.read_text(encoding="utf-8")))}
    assert not found, f"read a Profile field instead of naming the profile: {found}"


def test_every_profile_has_its_rules_in_the_reference_engine_and_is_compared_with_them():
    assert list(RULES) == list(PROFILES)
    # test_engine compares the two engines under each profile (the default in tests of its own).
    assert {variant["scheduler"] for variant in COMPARED.values()} | {DEFAULT_PROFILE} == set(PROFILES)


@pytest.mark.parametrize(("scheduler", "kv_admission", "cuda_graphs", "max_num_seqs", "graph_max_tokens",
                          "host_s", "overlapped", "eager_host"), [
    # host_s: the registry's names of (per scheduler call, every step besides)
    ("vllm-v1", "on_demand", "all", 1024, None, ("host_step_s", None), False, False),
    ("vllm-v0", "on_demand", "decode", 256, 256, ("vllm_v0_host_window_s", "vllm_v0_host_step_s"), False, True),
    ("prefill-first", "on_demand", "decode", 1024, 512, ("host_step_s", None), True, True),  # SGLang's at 141 GiB
    ("trtllm", "reserve", "decode", 2048, 128, ("host_step_s", None), True, True),  # trtllm-serve's 2048; graphs 128
])
def test_each_profile_sets_the_defaults_and_host_it_models(scheduler, kv_admission, cuda_graphs, max_num_seqs,
                                                          graph_max_tokens, host_s, overlapped, eager_host):
    spec = EngineSpec(scheduler=scheduler)
    assert (spec.kv_admission, spec.cuda_graphs, spec.max_num_seqs) == (kv_admission, cuda_graphs, max_num_seqs)
    assert spec.graph_max_tokens(141 * GIB, 4) == graph_max_tokens
    assert EngineSpec(scheduler=scheduler, cuda_graph_max_tokens=64).graph_max_tokens(141 * GIB, 4) == 64
    host = host_step_cost(scheduler)
    host_s = tuple(0.0 if name is None else lookup(name).value for name in host_s)
    assert ((host.window_s, host.step_s), host.overlapped, host.eager_per_kernel_s > 0) == (host_s, overlapped,
                                                                                           eager_host)
    assert host_step_cost(scheduler, overlap=not overlapped).overlapped == (not overlapped)


def test_trtllm_replays_only_the_decode_batches_it_captured_and_the_others_pad():
    """trtllm-serve's CudaGraphConfig captures 1 to 32, 64 and 128 sequences unpadded; any other decode
    batch runs eagerly. Padded (its enable_padding), every size up to the largest replays a graph."""
    trtllm = EngineSpec(scheduler="trtllm")
    assert not trtllm.cuda_graph_padding
    assert trtllm.graph_batch_sizes(141 * GIB, 4) == frozenset([*range(1, 33), 64, 128])
    larger = EngineSpec(scheduler="trtllm", cuda_graph_max_tokens=1000).graph_batch_sizes(141 * GIB, 4)
    assert larger - trtllm.graph_batch_sizes(141 * GIB, 4) == {256, 512, 1000}
    assert EngineSpec(scheduler="trtllm", cuda_graph_padding=True).graph_batch_sizes(141 * GIB, 4) is None
    unpadded = {name for name in PROFILES if EngineSpec(scheduler=name).graph_batch_sizes(141 * GIB, 4) is not None}
    assert unpadded == {"trtllm"}
    with pytest.raises(ValueError, match='cuda_graph_padding = false: vLLM V1 pads .* use scheduler = "trtllm"'):
        EngineSpec(cuda_graph_padding=False)


def test_trtllm_starts_without_chunked_prefill_and_the_others_with_it():
    """trtllm-serve passes enable_chunked_prefill=False unless asked (tensorrt_llm/commands/serve.py); an
    [engine] table's own setting wins either way."""
    assert {name: EngineSpec(scheduler=name).chunked_prefill for name in PROFILES} == {
        "vllm-v1": True, "vllm-v0": True, "prefill-first": True, "trtllm": False}
    assert EngineSpec(scheduler="trtllm", chunked_prefill=True).chunked_prefill
    assert not EngineSpec(chunked_prefill=False).chunked_prefill


def test_where_each_engine_runs_its_front_end_and_detokenizes():
    assert {name: p.detokenizes_in for name, p in PROFILES.items()} == {
        "vllm-v1": "api-server", "vllm-v0": "engine", "prefill-first": "detokenizer", "trtllm": "api-server"}
    newest = {name: p.api_servers(None) if callable(p.api_servers) else p.api_servers for name, p in PROFILES.items()}
    assert newest == {
        "vllm-v1": "per-replica", "vllm-v0": "per-replica", "prefill-first": "per-server", "trtllm": "per-replica"}


def test_the_scheduler_help_lists_every_profile_from_the_registry():
    assert choices() == ("vllm-v1 (vLLM V1), vllm-v0 (vLLM V0), prefill-first (SGLang) or "
                         "trtllm (TensorRT-LLM)")
    assert choices() in EngineSpec.model_fields["scheduler"].description


class NewestFirst(FcfsQueue):
    """The newest arrival first: another admission order through the same seam."""

    def append(self, request):
        self.appendleft(request)


def test_a_queue_class_plugged_in_through_the_seam_sets_the_admission_order(monkeypatch):
    spec = EngineSpec(max_num_seqs=1)  # one request at a time: the queue's order is the service order
    fcfs = engine([10, 10, 10], [3, 3, 3], spec=spec)
    assert [int(fcfs.token_steps(i, i + 1)[0]) for i in range(3)] == [0, 3, 6]
    monkeypatch.setitem(QUEUES, "fcfs", NewestFirst)
    newest = engine([10, 10, 10], [3, 3, 3], spec=spec)
    assert [int(newest.token_steps(i, i + 1)[0]) for i in range(3)] == [6, 3, 0]
    assert np.array_equal(np.sort(newest.last_step_end_ns), np.sort(fcfs.last_step_end_ns))


def test_each_profile_pays_the_host_times_it_models():
    """What the calibration's screen and the cross-validation's fits read: a host time a profile does not
    pay moves nothing under it."""
    host = ("host_step_s", "vllm_v0_host_window_s", "vllm_v0_host_step_s", "eager_host_per_kernel_s",
            "trtllm_eager_host_per_kernel_s")
    assert {name: {n for n in host if p.pays(n)} for name, p in PROFILES.items()} == {
        "vllm-v1": {"host_step_s"},
        "vllm-v0": {"vllm_v0_host_window_s", "vllm_v0_host_step_s", "eager_host_per_kernel_s"},
        "prefill-first": {"host_step_s", "eager_host_per_kernel_s"},
        "trtllm": {"host_step_s", "trtllm_eager_host_per_kernel_s"}}
    assert all(p.pays("serving_gemm_fraction") for p in PROFILES.values())


def test_vllm_v1_schedules_ahead_by_default_from_0_14_0():
    """vLLM made its async scheduling (the next step's batch formed while the GPU runs this one) the default
    in 0.14.0: a scenario of that release or none (the newest) overlaps its host, an earlier one does not,
    and the table's own setting stands either way."""
    assert EngineSpec().host_overlap is True and EngineSpec(version="0.14.0").host_overlap is True
    assert EngineSpec(version="0.13.0").host_overlap is None  # the profile's: no overlap
    assert EngineSpec(version="0.34.0", host_overlap=False).host_overlap is False
    newest, old = host_step_cost("vllm-v1", EngineSpec().host_overlap), host_step_cost("vllm-v1", None)
    assert newest.overlapped and not old.overlapped


@pytest.mark.parametrize(("release", "pp", "stated", "overlapped"), [
    ("0.14.1", 2, None, False), ("0.14.0", 4, None, False),  # 0.14.x: not with pipeline parallelism
    ("0.14.1", 1, None, True), ("0.15.0", 2, None, True), (None, 2, None, True),
    ("0.14.1", 2, True, True),  # the table's own setting stands
])
def test_vllm_0_14_schedules_ahead_without_pipeline_parallelism_alone(release, pp, stated, overlapped):
    from tokenpath.sim.scenario import load_scenario

    overrides = {"deployment.tp": 4, "deployment.pp": pp} if pp > 1 else {}
    overrides |= {"engine.version": release} if release else {}
    overrides |= {} if stated is None else {"engine.host_overlap": stated}
    assert load_scenario("typical", overrides).engine.host_overlap is overlapped


@pytest.mark.parametrize(("method", "release", "overlapped"), [
    ("eagle3", "0.14.0", True), ("mtp", None, True),
    ("draft_model", "0.30.0", False), ("draft_model", "0.31.0", True),
    ("ngram", "0.32.0", False), ("ngram", "0.33.0", True), ("ngram", None, True),
])
def test_vllm_keeps_its_async_scheduling_with_the_drafters_its_release_supports(method, release, overlapped):
    from tokenpath.engine.speculative import SpeculativeSpec

    spec = EngineSpec(version=release, speculative=SpeculativeSpec(method=method, num_speculative_tokens=2,
                                                                   draft_model="llama-3.2-1b"
                                                                   if method == "draft_model" else None))
    assert spec.host_overlap is overlapped
