"""Collectives on one switched scale-up domain: alpha-beta times against nccl-tests references."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.config.errors import UserError
from tokenpath.fabric.build import NVLINK_HOP_LATENCY_S
from tokenpath.fabric.collectives import BASE_LATENCY_S as RING_BASE_LATENCY_S
from tokenpath.fabric.collectives import NVLS_LATENCY_S, Collectives
from tokenpath.fabric.single_hop import Switch

H100_LINK_BPS = 450e9  # NVLink4 per direction (the nccl-tests references ran on 8x H100/H200 SXM)
LARGE_BYTES = 32e9     # bandwidth-bound: even NCCL Simple's 56 us ring latency is < 0.1% of the time


def _reference_busbw(chip: str, algorithm: str) -> float:
    """Published bus bandwidth (bytes/s) of a large 8-rank all-reduce, from the project's validation data."""
    from tokenpath.validate.groups import published_rows

    _, rows = published_rows()
    matches = [r for r in rows if r["group"] == "nccl_allreduce" and r["chip"] == chip and r["ranks"] == 8
               and r["algorithm"] == algorithm and r.get("unit") != "s"]
    assert len(matches) == 1, f"expected one reference row for {chip} {algorithm}"
    return matches[0]["published"]


class SwitchedDomain:
    """One switch of `hosts` chips; a collective runs on the first `ranks` of them."""

    def __init__(self, hosts: int, link_bw_Bps: float, algorithm: str = "auto", nvls: bool = True,
                 link_latency_s: float = NVLINK_HOP_LATENCY_S) -> None:
        # A chip-to-chip hop crosses two links: up to the switch and down.
        self.collectives = Collectives(Switch(hosts, link_bw_Bps, link_latency_s / 2, nvls=nvls), algorithm)

    def collective_time_s(self, op: str, size_bytes: float, ranks: int) -> float:
        return self.collectives.time_s(op, size_bytes, [list(range(ranks))])

    def bus_bandwidth_Bps(self, op: str, size_bytes: float, ranks: int) -> float:
        return self.collectives.bus_bandwidth_Bps(op, size_bytes, [list(range(ranks))])


def domain(algorithm: str = "auto", hosts: int = 8, nvls: bool = True) -> SwitchedDomain:
    return SwitchedDomain(hosts=hosts, link_bw_Bps=H100_LINK_BPS, algorithm=algorithm, nvls=nvls)


# Large messages: bus bandwidth reproduces nccl-tests.

def test_nvls_all_reduce_bus_bandwidth_matches_nccl_tests_on_8_h100():
    measured = _reference_busbw("h100", "nvls")
    assert measured == 480e9
    predicted = domain("nvls").bus_bandwidth_Bps("all_reduce", LARGE_BYTES, 8)
    assert predicted == pytest.approx(measured, rel=0.02)


def test_a_blackwell_switch_reduces_at_its_generations_nvls_rating():
    """NCCL's tuner rates NVLS at 0.85 of the links on Hopper and 0.74 on Blackwell (tuning.cc
    nvlsEfficiency): the H100-measured efficiency is scaled by 0.74 / 0.85 on a Blackwell switch, so at
    NVLink5's 900 GB/s a large all-reduce reaches 480 GB/s x 2 x 0.74 / 0.85 = 835.8 GB/s of bus bandwidth."""
    from tokenpath.compute.chip import load_chip
    from tokenpath.fabric.build import build_topology
    from tokenpath.fabric.spec import NVLS_TUNER_EFFICIENCY, SwitchFabric, load_fabric
    from tokenpath.sim.deployment import chip_fabric

    blackwell = Collectives(Switch(8, 900e9, NVLINK_HOP_LATENCY_S / 2, generation="Blackwell"), "nvls")
    busbw = blackwell.bus_bandwidth_Bps("all_reduce", LARGE_BYTES, [list(range(8))])
    assert busbw == pytest.approx(480e9 * 2 * 0.74 / 0.85, rel=0.02)
    hopper = Collectives(Switch(8, 900e9, NVLINK_HOP_LATENCY_S / 2), "nvls")
    assert busbw / hopper.bus_bandwidth_Bps("all_reduce", LARGE_BYTES, [list(range(8))]) == pytest.approx(
        0.74 / 0.85, rel=1e-3)
    assert NVLS_TUNER_EFFICIENCY == {"Hopper": 0.85, "Blackwell": 0.74}
    # the catalog's chips name their generation, so their switches carry its rating; a preset built with no
    # chip names its own; Ampere's switch reduces in no switch (tuning.cc nvlsEfficiency Ampere 0.0)
    for chip, generation in (("b200", "Blackwell"), ("gb200", "Blackwell"), ("h200", "Hopper"), ("h100", "Hopper")):
        spec = load_chip(chip)
        fabric, _ = chip_fabric(spec, 8)
        assert spec.generation == generation and fabric.nvls and fabric.nvls_generation is None, chip
        switch = build_topology(fabric, spec.scaleup_bw_Bps, 8, spec.generation)
        assert (switch.generation, switch.nvls) == (generation, True)
        assert switch.nvls_efficiency == {"Blackwell": 0.74, "Hopper": 0.85}[generation]
    assert build_topology(load_fabric("gb200-nvl72")[0]).nvls_efficiency == 0.74
    a100 = build_topology(chip_fabric(load_chip("a100"), 8)[0], 300e9, 8, "Ampere")
    assert (a100.generation, a100.nvls, a100.nvls_efficiency) == ("Ampere", False, 0.0)
    assert not build_topology(SwitchFabric(), 300e9, 8, "Ampere").nvls  # nvls = true asks for what Ampere lacks


def test_ring_all_reduce_bus_bandwidth_matches_nccl_tests_on_8_h100():
    measured = _reference_busbw("h100", "ring")
    assert measured == 370e9
    predicted = domain("ring").bus_bandwidth_Bps("all_reduce", LARGE_BYTES, 8)
    assert predicted == pytest.approx(measured, rel=0.02)


def test_ring_bus_bandwidth_is_the_same_with_nvls_switched_off():
    ring = domain("ring").bus_bandwidth_Bps("all_reduce", LARGE_BYTES, 8)
    no_sharp = domain("auto", nvls=False).bus_bandwidth_Bps("all_reduce", LARGE_BYTES, 8)
    # auto may take halving-doubling, which moves the same bytes with fewer latency steps
    assert no_sharp == pytest.approx(ring, rel=1e-3) and no_sharp >= ring


def test_default_all_reduce_on_8_h200_matches_the_nccl_tests_sweep():
    measured = _reference_busbw("h200", "auto")
    predicted = domain("auto").bus_bandwidth_Bps("all_reduce", 4e9, 8)
    assert predicted == pytest.approx(measured, rel=0.02)


def test_bus_bandwidth_is_the_nccl_tests_definition():
    d = domain("ring")
    size, ranks = 1e9, 8
    algbw = size / d.collective_time_s("all_reduce", size, ranks)
    assert d.bus_bandwidth_Bps("all_reduce", size, ranks) == pytest.approx(algbw * 2 * 7 / 8, rel=1e-12)
    algbw = size / d.collective_time_s("all_gather", size, ranks)
    assert d.bus_bandwidth_Bps("all_gather", size, ranks) == pytest.approx(algbw * 7 / 8, rel=1e-12)


def test_ring_all_gather_and_reduce_scatter_reach_the_ring_bus_bandwidth():
    for op in ("all_gather", "reduce_scatter"):
        busbw = domain("ring").bus_bandwidth_Bps(op, LARGE_BYTES, 8)
        assert busbw == pytest.approx(370e9, rel=0.02)


def test_nvls_only_reduces_in_the_switch_for_all_reduce():
    for op in ("all_gather", "reduce_scatter"):
        assert domain("nvls").collective_time_s(op, 1e6, 8) == domain("ring").collective_time_s(op, 1e6, 8)


def test_all_gather_moves_half_the_steps_of_an_all_reduce_on_a_ring():
    d = domain("ring")
    size = 2e9
    # At this size the ring runs NCCL's Simple protocol: 8.4 us, and 3.4 us a step (tuning.cc).
    latency_ar = 8.4e-6 + 14 * 3.4e-6
    latency_ag = 8.4e-6 + 7 * 3.4e-6
    wire_ar = d.collective_time_s("all_reduce", size, 8) - latency_ar
    wire_ag = d.collective_time_s("all_gather", size, 8) - latency_ag
    assert wire_ar == pytest.approx(2 * wire_ag, rel=1e-9)


def test_bandwidth_scales_with_the_link():
    slow = SwitchedDomain(hosts=8, link_bw_Bps=450e9, algorithm="ring")
    fast = SwitchedDomain(hosts=8, link_bw_Bps=900e9, algorithm="ring")
    ratio = fast.bus_bandwidth_Bps("all_reduce", LARGE_BYTES, 8) / slow.bus_bandwidth_Bps("all_reduce", LARGE_BYTES, 8)
    assert ratio == pytest.approx(2.0, rel=1e-3)


# Small messages: latency-bound.

def test_small_ring_all_reduce_costs_the_ring_latency():
    expected = RING_BASE_LATENCY_S + 2 * 7 * NVLINK_HOP_LATENCY_S  # 6.6 us + 14 hops x 0.6 us = 15 us
    assert expected == pytest.approx(15e-6)
    assert domain("ring").collective_time_s("all_reduce", 8, 8) == pytest.approx(expected, rel=1e-4)


def test_small_nvls_all_reduce_costs_the_nvls_latency():
    assert NVLS_LATENCY_S == pytest.approx(25e-6)  # NCCL tuning.cc hwLatencies NVLINK / NVLS / Simple
    assert domain("nvls").collective_time_s("all_reduce", 8, 8) == pytest.approx(NVLS_LATENCY_S, rel=1e-4)


def test_custom_hop_latency_enters_the_ring_latency():
    d = SwitchedDomain(hosts=4, link_bw_Bps=H100_LINK_BPS, link_latency_s=2e-6, algorithm="ring")
    assert d.collective_time_s("all_reduce", 4, 4) == pytest.approx(RING_BASE_LATENCY_S + 6 * 2e-6, rel=1e-4)


# auto picks what NCCL's tuner picks: the fastest algorithm, each under its fastest protocol.

@settings(max_examples=150, deadline=None)
@given(size=st.floats(1.0, 1e11), ranks=st.integers(2, 8),
       op=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]))
def test_auto_is_the_fastest_algorithm_at_every_size_as_nccls_tuner_rates_them(size, ranks, op):
    auto = domain("auto").collective_time_s(op, size, ranks)
    names = ["ring", "tree", "nvls"] if op == "all_reduce" else ["ring"]  # what NCCL runs
    times = {name: domain(name).collective_time_s(op, size, ranks) for name in names}
    assert auto == min(times.values())


def test_auto_switches_to_ring_where_ring_is_faster():
    # Two ranks, large buffer: ring's busbw 370 GB/s beats NVLS's 274 GB/s (algbw = busbw at n=2).
    ring = domain("ring").collective_time_s("all_reduce", LARGE_BYTES, 2)
    nvls = domain("nvls").collective_time_s("all_reduce", LARGE_BYTES, 2)
    assert ring < nvls
    assert domain("auto").collective_time_s("all_reduce", LARGE_BYTES, 2) == ring
    # Eight ranks, a small buffer: the ring's 15 us, which NCCL's tuner prefers to NVLS's table 25 us.
    assert (domain("auto").collective_time_s("all_reduce", 1024, 8)
            == domain("ring").collective_time_s("all_reduce", 1024, 8))


def test_without_in_switch_reduction_auto_never_uses_nvls():
    no_sharp = domain("auto", nvls=False)
    assert "nvls" not in no_sharp.collectives.available("all_reduce", 8)
    for size in (8, 1e6, LARGE_BYTES):
        best = min(domain(a).collective_time_s("all_reduce", size, 8) for a in ("ring", "tree"))
        assert no_sharp.collective_time_s("all_reduce", size, 8) == best


# Shape of the cost curve.

@settings(max_examples=200, deadline=None)
@given(
    a=st.floats(0.0, 1e11),
    b=st.floats(0.0, 1e11),
    ranks=st.integers(1, 8),
    algorithm=st.sampled_from(["auto", "ring", "nvls"]),
    op=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]),
)
def test_time_is_monotone_in_size(a, b, ranks, algorithm, op):
    small, large = sorted((a, b))
    if algorithm == "nvls" and op != "all_reduce":
        algorithm = "ring"
    d = domain(algorithm)
    assert 0.0 <= d.collective_time_s(op, small, ranks) <= d.collective_time_s(op, large, ranks)


@pytest.mark.parametrize("algorithm, op", [(a, o) for a in ("auto", "ring", "tree", "nvls")
                                           for o in ("all_reduce", "all_gather", "reduce_scatter")
                                           if a in ("auto", "ring") or o == "all_reduce"])
def test_one_rank_or_no_bytes_cost_nothing(algorithm, op):
    d = domain(algorithm)
    assert d.collective_time_s(op, 1e9, 1) == 0.0
    assert d.collective_time_s(op, 0, 8) == 0.0
    assert d.collective_time_s(op, 1.0, 2) > 0.0


def test_a_group_larger_than_the_domain_is_a_user_error():
    with pytest.raises(UserError, match=r"placement: host 8 is outside this 8-host switch"):
        domain(hosts=8).collective_time_s("all_reduce", 1e6, 16)
    assert domain(hosts=16).collective_time_s("all_reduce", 1e6, 16) > 0


def test_bad_configurations_are_user_errors():
    with pytest.raises(UserError, match="fabric.algorithm: unknown 'bogus'"):
        SwitchedDomain(hosts=8, link_bw_Bps=H100_LINK_BPS, algorithm="bogus")
    with pytest.raises(UserError, match="fabric.algorithm: 'nvls' cannot run all_reduce over 8 ranks on a switch"):
        SwitchedDomain(hosts=8, link_bw_Bps=H100_LINK_BPS, algorithm="nvls", nvls=False).collective_time_s(
            "all_reduce", 1e6, 8)
    with pytest.raises(UserError, match="fabric.link_bw"):
        SwitchedDomain(hosts=8, link_bw_Bps=0.0)


def test_unknown_collective_is_a_user_error():
    with pytest.raises(UserError, match="collective: unknown 'all_to_some'"):
        domain().collective_time_s("all_to_some", 1e6, 8)


def test_bus_bandwidth_of_a_single_rank_is_zero():
    assert domain().bus_bandwidth_Bps("all_reduce", 1e6, 1) == 0.0
