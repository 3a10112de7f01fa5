"""Whether an engine's NCCL reduces in the NVLink switches: SGLang runs it with NCCL_NVLS_ENABLE=0 unless
--enable-nccl-nvls, so its prompt steps' large all-reduces take the ring on an NVLS-capable switch."""

from __future__ import annotations

import pytest

from tokenpath.config.errors import UserError
from tokenpath.engine.profiles import PROFILES
from tokenpath.fabric.build import build_topology
from tokenpath.fabric.collectives import Collectives
from tokenpath.fabric.spec import SwitchFabric
from tokenpath.launch import launch_files
from tokenpath.launch.command import shell_words
from tokenpath.launch.files import emit
from tokenpath.launch.plan import make_plan
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.overrides import apply_overrides
from tokenpath.sim.scenario import load_scenario, read_scenario_table
from tokenpath.whatif.catalog import catalog
from tokenpath.whatif.run import Base

# DeepSeek-V3's hidden state for an 8,000-token prompt step, bf16: one all-reduce's bytes.
PROMPT_STEP_BYTES = 8000 * 7168 * 2
EIGHT = [list(range(8))]


def _b200_domain(nvls: bool) -> Collectives:
    """8 B200s on their NVLink5 switch, as catalog/chips.toml has it: Blackwell's NVLS, rated at 0.74."""
    return Collectives(build_topology(SwitchFabric(nvls_generation="Blackwell"), 900e9, 8), nvls=nvls)


def test_sglang_alone_keeps_nccl_off_the_switches_reduction():
    assert {name: p.nccl_nvls for name, p in PROFILES.items()} == {
        "vllm-v1": True, "vllm-v0": True, "prefill-first": False, "trtllm": True}


def test_without_nvls_a_large_all_reduce_takes_the_ring_it_would_have_left():
    allowed, barred = _b200_domain(True), _b200_domain(False)
    assert "nvls" in allowed.available("all_reduce", 8) and "nvls" not in barred.available("all_reduce", 8)
    assert allowed.choose("all_reduce", PROMPT_STEP_BYTES, EIGHT) == "nvls"
    assert barred.choose("all_reduce", PROMPT_STEP_BYTES, EIGHT) == "ring"
    ring_s = allowed.cost("all_reduce", EIGHT, "ring", PROMPT_STEP_BYTES).time_s(PROMPT_STEP_BYTES)
    assert barred.time_s("all_reduce", PROMPT_STEP_BYTES, EIGHT) == ring_s
    # The ring moves 2 x 7/8 of the buffer over each link under NCCL's Simple protocol (56 us of latency),
    # NVLS (1 + 1/8) at its own efficiency, Blackwell's 0.74 / 0.85 of Hopper's, after its 25 us: 327 us
    # against 265 us on NVLink5.
    assert allowed.protocol("all_reduce", PROMPT_STEP_BYTES, EIGHT, "ring") == "Simple"
    assert round(ring_s * 1e6) == 327
    assert round(allowed.time_s("all_reduce", PROMPT_STEP_BYTES, EIGHT) * 1e6) == 265
    # A decode step's small all-reduce is the ring's either way: NCCL's tuner rates NVLS at 25 us.
    small = 64 * 7168 * 2
    assert barred.time_s("all_reduce", small, EIGHT) == allowed.time_s("all_reduce", small, EIGHT)


def _deepseek_b200(**overrides) -> dict:
    return {"model.name": "deepseek-v3", "model.precision": "fp8", "deployment.chip": "b200", "deployment.chips": 8,
            "deployment.tp": 8, "engine.scheduler": "prefill-first", **overrides}


def test_an_sglang_deployment_prices_its_prompt_steps_all_reduces_as_the_ring():
    sglang = build_deployment(load_scenario("typical", _deepseek_b200()))
    enabled = build_deployment(load_scenario("typical", _deepseek_b200(**{"engine.nccl_nvls": True})))
    vllm = build_deployment(load_scenario("typical", _deepseek_b200(**{"engine.scheduler": "vllm-v1"})))
    ring_s = sglang.collectives.cost("all_reduce", EIGHT, "ring", PROMPT_STEP_BYTES).time_s(PROMPT_STEP_BYTES)
    nvls_s = enabled.collectives.cost("all_reduce", EIGHT, "nvls", PROMPT_STEP_BYTES).time_s(PROMPT_STEP_BYTES)
    all_reduces = 2 * 61  # two a layer, 61 layers
    assert sglang.costs.traffic_parts_s(8000)["tp_all_reduce"] == pytest.approx(all_reduces * ring_s, rel=1e-12)
    assert enabled.costs.traffic_parts_s(8000)["tp_all_reduce"] == pytest.approx(all_reduces * nvls_s, rel=1e-12)
    assert vllm.costs.traffic_parts_s(8000)["tp_all_reduce"] == pytest.approx(all_reduces * nvls_s, rel=1e-12)


def test_an_nvls_algorithm_asked_of_an_engine_that_keeps_nccl_off_it_is_refused():
    scenario = load_scenario("typical", _deepseek_b200(**{"deployment.fabric": {"kind": "switch",
                                                                                  "algorithm": "nvls"}}))
    with pytest.raises(UserError, match="engine.nccl_nvls = true"):
        build_deployment(scenario)


def _levers(tmp_path, **overrides) -> dict:
    table, source, base_dir = read_scenario_table(None)
    apply_overrides(table, {"workload.num_requests": 100, **overrides})
    base = Base(table, source, base_dir)
    return {lever.name: lever for lever in catalog(base.scenario(), base.table, tmp_path) if "NVLS" in lever.name}


def test_the_nvls_lever_turns_on_what_holds_it_back(tmp_path):
    assert _levers(tmp_path, **{"engine.scheduler": "prefill-first"})["NVLS on"].overrides == {
        "engine.nccl_nvls": True}
    assert _levers(tmp_path)["NVLS off"].overrides == {
        "deployment.fabric": {"kind": "switch", "algorithm": "auto", "nvls": False}}  # the chip's generation
    both = _levers(tmp_path, **{"engine.scheduler": "prefill-first", "deployment.fabric": {"kind": "switch",
                                                                                        "nvls": False}})
    assert both["NVLS on"].overrides == {"deployment.fabric.nvls": True, "engine.nccl_nvls": True}


def test_sglang_is_launched_with_nvls_only_where_the_scenario_has_it():
    def argv(**overrides) -> list[str]:
        (words,) = shell_words(launch_files(load_scenario("typical", _deepseek_b200(**overrides)),
                                            "sglang")["launch-sglang.sh"])
        return words
    assert "--enable-nccl-nvls" not in argv()
    assert "--enable-nccl-nvls" in argv(**{"engine.nccl_nvls": True})
    _, settings = emit(make_plan(load_scenario("typical", {"engine.nccl_nvls": False})), "vllm")
    assert [note.text for note in settings.notes if note.setting == "engine.nccl_nvls"] == [
        "no flag turns NVLS off: set NCCL_NVLS_ENABLE=0 in the server's environment"]
