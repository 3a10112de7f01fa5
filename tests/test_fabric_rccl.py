"""Chips RCCL runs on (catalog/chips.toml's CDNA3: MI300X, MI325X) take RCCL's tuner, not NCCL's: ROCm/rccl
src/graph/tuning.cc at 0cbce2a, tuning_model_5 (the model its rome_models.cc gives the 8-GPU xGMI platforms of
gfx942), its figures written out here."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpath.compute.chip import load_chip
from tokenpath.config.assumptions import Assumptions
from tokenpath.fabric.build import XGMI_HOP_LATENCY_S, build_topology
from tokenpath.fabric.collectives import RCCL_BASE_LATENCY_S, Collectives
from tokenpath.fabric.single_hop import FullMesh
from tokenpath.fabric.tuner import RCCL_PROTOCOLS, RCCL_TUNING_MODELS, Tuner
from tokenpath.sim.deployment import chip_fabric

REL = 1e-9
# tuning.cc baseLat, Ring and Tree {LL 12.0, LL128 12.0, Simple 17.0} us.
BASE_US = {"LL": 12.0, "Simple": 17.0}
# tuning_model_5 hwLat NVLINK (xGMI): Ring {LL 0.8, Simple 2.1}, Tree {LL 0.9, Simple 2.3} us a step.
XGMI_US = {("ring", "LL"): 0.8, ("ring", "Simple"): 2.1, ("tree", "LL"): 0.9, ("tree", "Simple"): 2.3}
# tuning_model_5 bwRatio: Ring {LL 0.08, Simple 1.00}; Tree {LL 0.06, Simple 0.11} over 2 nodes (and inside
# one: nNodes <= 2), {0.06, 0.59} over more.
RING_SHARE = {"LL": 0.08, "Simple": 1.0}
TREE_SHARE = {(2, "LL"): 0.06, (2, "Simple"): 0.11, (4, "LL"): 0.06, (4, "Simple"): 0.59}


def chips(name: str, n: int) -> Collectives:
    spec = load_chip(name)
    return Collectives(build_topology(chip_fabric(spec, n)[0], spec.scaleup_bw_Bps, n, spec.generation))


def test_the_constants_are_rccl_s():
    assert RCCL_TUNING_MODELS == {"CDNA3": 5}
    assert (RCCL_BASE_LATENCY_S, XGMI_HOP_LATENCY_S) == (12.0e-6, 0.8e-6)
    ll, simple = RCCL_PROTOCOLS
    assert (ll.name, ll.base_extra_s, ll.ring_bandwidth, ll.tree_bandwidth) == ("LL", (0.0, 0.0), 0.08, (0.06,) * 3)
    assert (simple.name, simple.ring_bandwidth, simple.tree_bandwidth) == ("Simple", 1.0, (0.0, 0.11, 0.59))
    assert simple.base_extra_s == pytest.approx((5.0e-6, 5.0e-6), rel=REL)
    assert ll.ring_step_ratio[0] * 0.8 == pytest.approx(0.8) and simple.ring_step_ratio[0] * 0.8 == pytest.approx(2.1)
    assert ll.tree_step_ratio[0] * 0.8 == pytest.approx(0.9) and simple.tree_step_ratio[0] * 0.8 == pytest.approx(2.3)


@pytest.mark.parametrize("chip", ["mi300x", "mi325x"])
def test_eight_cdna3_gpus_run_rccl_s_ring_under_ll_and_simple_at_its_ratings(chip):
    # One node: 8 GPUs on xGMI, a link of 448 / 7 = 64 GB/s to each peer, a hop of 0.8 us. The ring all-reduce's
    # 14 steps: LL 12.0 + 14 x 0.8 = 23.2 us, Simple 17.0 + 14 x 2.1 = 46.4 us; LL at 0.08 of what Simple moves.
    # No LL128 (no ll128Enabled on gfx942's platforms), none of NCCL's ceilings or corrections.
    c = chips(chip, 8)
    assert c.topology.kind == "fullmesh" and c.tuner.rccl
    assert set(c.topology.links.latency_s) == {0.8e-6}
    ring = c.costs("all_reduce", [list(range(8))], "ring")
    assert list(ring) == ["LL", "Simple"]
    for name, cost in ring.items():
        assert cost.alpha_s == pytest.approx((BASE_US[name] + 14 * XGMI_US["ring", name]) * 1e-6, rel=REL)
        assert cost.corrections == ()
    assert ring["LL"].beta_s_per_byte == pytest.approx(ring["Simple"].beta_s_per_byte / RING_SHARE["LL"], rel=REL)
    # The tree inside one node: under LL alone (gfx94x runs no Tree under Simple in a node), 12.0 + 2 x 7 x 0.9.
    tree = c.costs("all_reduce", [list(range(8))], "tree")
    assert list(tree) == ["LL"]
    assert tree["LL"].alpha_s == pytest.approx((12.0 + 2 * 7 * 0.9) * 1e-6, rel=REL)
    # auto: the ring under LL while its latency is the least (1 KB), Simple from its bandwidth on (1 MB).
    assert [c.protocol("all_reduce", size, [list(range(8))]) for size in (1e3, 1e6)] == ["LL", "Simple"]
    assert c.choose("all_reduce", 1e3, [list(range(8))]) == "ring"


@pytest.mark.parametrize("nodes", [2, 4])
def test_mi300x_nodes_on_rails_take_rccl_s_shares_and_no_ceiling_of_nccl_s(nodes):
    # nodes x 8 MI300X on 400G rails. The ring's 2 (n - 1) steps, 2 (nodes - 1) across: inside a node at the
    # xGMI step but at least the net overhead (1 us, x3 under Simple), across at NCCL's network step (2.7 us
    # under LL, 14.0 under Simple: RCCL's NET figures are not taken). No plateau, no per-channel or LL ceiling:
    # LL at 0.08 of the ring's links, the tree at RCCL's share for the nodes.
    n = 8 * nodes
    c = chips("mi300x", n)
    group = [list(range(n))]
    assert c.topology.kind == "hierarchy" and c._span(np.arange(n)) is None
    ring = c.costs("all_reduce", group, "ring")
    inside, across = 2 * (n - 1) - 2 * (nodes - 1), 2 * (nodes - 1)
    assert ring["LL"].alpha_s == pytest.approx((12.0 + inside * max(0.8, 1.0) + across * 2.7) * 1e-6, rel=REL)
    assert ring["Simple"].alpha_s == pytest.approx((17.0 + inside * max(2.1, 3.0) + across * 14.0) * 1e-6, rel=REL)
    assert ring["LL"].beta_s_per_byte == pytest.approx(ring["Simple"].beta_s_per_byte / 0.08, rel=REL)
    tree = c.costs("all_reduce", group, "tree")
    assert list(tree) == ["LL", "Simple"]
    assert tree["LL"].beta_s_per_byte * TREE_SHARE[nodes, "LL"] == pytest.approx(
        tree["Simple"].beta_s_per_byte * TREE_SHARE[nodes, "Simple"], rel=REL)
    assert tree["Simple"].corrections == ()


def test_rccl_s_latencies_are_assumptions():
    with Assumptions({"rccl_base_latency_s": 20e-6, "xgmi_hop_latency_s": 1e-6}).active():
        c = chips("mi300x", 8)
    ring = c.costs("all_reduce", [list(range(8))], "ring")
    assert ring["LL"].alpha_s == pytest.approx(20e-6 + 14 * 1e-6, rel=REL)
    assert ring["Simple"].alpha_s == pytest.approx(25e-6 + 14 * 1e-6 * 2.1 / 0.8, rel=REL)


def test_a_full_mesh_built_with_no_chip_keeps_nccl_s_table():
    c = Collectives(FullMesh(8, 64e9, 0.6e-6))
    assert not c.tuner.rccl and list(c.costs("all_reduce", [list(range(8))], "ring")) == ["LL", "LL128", "Simple"]
    assert not Tuner("Hopper").rccl and Tuner("CDNA3").rccl


def test_a_step_s_collectives_on_rccl_chips_name_rccl_s_latencies():
    from tokenpath.report.explain import traffic_assumptions

    assert traffic_assumptions("tp_all_reduce", "ring", True, rccl=True)[:3] == [
        "rccl_base_latency_s", "xgmi_hop_latency_s", "scaleup_bw_efficiency"]
    assert traffic_assumptions("tp_all_reduce", "ring", True)[:2] == ["base_latency_s", "nvlink_hop_latency_s"]
