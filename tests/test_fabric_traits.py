"""What a topology is (its traits), not what it is called: collectives and the lever catalog read the
traits, the builder and the catalog share one rule for scale-up ports, and the fabric's modules import
one another without a cycle."""

from __future__ import annotations

import ast
import copy
import pathlib
import typing

import numpy as np
import pytest

import tokenpath
from tokenpath.config.errors import UserError
from tokenpath.fabric.build import build_topology, scaleup_ports
from tokenpath.fabric.collectives import (
    OPS,
    SCALEOUT_BW_EFFICIENCY,
    SCALEUP_BW_EFFICIENCY,
    Collectives,
    link_efficiency,
)
from tokenpath.fabric.dragonfly import DragonFly
from tokenpath.fabric.fattree import FatTree
from tokenpath.fabric.hierarchy import Hierarchy
from tokenpath.fabric.single_hop import FullMesh, Switch
from tokenpath.fabric.spec import FabricSpec
from tokenpath.fabric.torus import Mesh, Torus
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.overrides import apply_overrides
from tokenpath.sim.scenario import read_scenario_table
from tokenpath.whatif.catalog import catalog
from tokenpath.whatif.run import Base

SRC = pathlib.Path(tokenpath.__file__).parent
# Every table kind: the names a module outside the topology's own would have to test.
KINDS = {cls.model_fields["kind"].default for cls in typing.get_args(typing.get_args(FabricSpec)[0])}
BW, LATENCY_S = 100e9, 1e-6


def _topologies():
    return {
        "switch": Switch(8, BW, LATENCY_S),
        "fullmesh": FullMesh(8, BW, LATENCY_S),
        "torus": Torus((2, 4), BW, LATENCY_S),
        "mesh": Mesh((2, 4), BW, LATENCY_S),
        "fattree": FatTree(4, BW, LATENCY_S, levels=2),
        "dragonfly": DragonFly(1, BW, LATENCY_S, a=2, h=1, g=3),
        "hierarchy": Hierarchy(2, Switch(4, BW, LATENCY_S), FatTree(4, BW, LATENCY_S, levels=2)),
    }


def _outcomes(topology, groups) -> dict:
    """Every collective's cost (or its error) for every algorithm, on `topology`."""
    collectives = Collectives(topology)
    outcomes = {}
    for op in OPS:
        for algorithm in ["auto", *collectives.available(op, len(groups[0]))]:
            try:
                outcomes[op, algorithm] = collectives.cost(op, groups, algorithm)
            except UserError:
                outcomes[op, algorithm] = "refused"
    return outcomes


def test_the_topologies_cover_every_kind():
    assert set(_topologies()) == KINDS


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_collectives_cost_the_same_whatever_the_topology_is_called(kind):
    # A topology under a new name (as a new topology would be) with the traits of an existing one:
    # collectives must treat it exactly as they treat the one it copies.
    topology = _topologies()[kind]
    renamed = copy.copy(topology)
    renamed.kind = "renamed"
    np.testing.assert_array_equal(link_efficiency(renamed), link_efficiency(topology))
    for groups in ([list(range(topology.hosts))], [[0, 1, 2, 3], [4, 5, 6, 7]] if topology.hosts == 8 else [[0, 1]]):
        original = _outcomes(topology, groups)
        assert _outcomes(renamed, groups) == original
        assert any(cost != "refused" for cost in original.values())


def test_a_hierarchy_has_scale_up_links_in_its_nodes_only():
    hierarchy = _topologies()["hierarchy"]
    node_links = hierarchy.nodes * len(hierarchy.node.links)
    assert hierarchy.scale_up_links()[:node_links].all() and not hierarchy.scale_up_links()[node_links:].any()
    efficiency = link_efficiency(hierarchy)
    assert set(efficiency[:node_links]) == {SCALEUP_BW_EFFICIENCY}
    assert set(efficiency[node_links:]) == {SCALEOUT_BW_EFFICIENCY}


def _kind_comparisons(path: pathlib.Path) -> list[str]:
    """Comparisons in `path` against a topology kind's name, or of anything's `.kind`."""
    def names_a_kind(node: ast.expr) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_kind(element) for element in node.elts)
        return (isinstance(node, ast.Constant) and node.value in KINDS) or \
            (isinstance(node, ast.Attribute) and node.attr == "kind")

    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Compare) and any(map(names_a_kind, [node.left, *node.comparators]))]


def test_the_finder_sees_a_kind_test_by_name_or_by_attribute(tmp_path):
    example = tmp_path / "example.py"
    example.write_text('a = t.kind in ("torus", "mesh")\nb = t.dims == ()\nc = "fattree" != name\n'
                       'd = t.scheduler == "vllm"\ne = spec.kind == other\n', encoding="utf-8")
    assert _kind_comparisons(example) == ["example.py:1: t.kind in ('torus', 'mesh')",
                                          "example.py:3: 'fattree' != name", "example.py:5: spec.kind == other"]


@pytest.mark.parametrize("module", ["fabric/collectives.py", "whatif/catalog.py"])
def test_collectives_and_the_lever_catalog_never_test_a_topology_kind(module):
    assert _kind_comparisons(SRC / module) == [], "read a trait of the Topology (topology.py) instead"


def _fabric_imports() -> dict[str, set[str]]:
    """Each fabric module's imports of other fabric modules, those inside functions included."""
    prefix = "tokenpath.fabric."
    imports = {}
    for path in (SRC / "fabric").glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names.add(node.module or "")
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
        imports[path.stem] = {name.removeprefix(prefix) for name in names if name.startswith(prefix)}
    return imports


def test_the_fabric_modules_import_one_another_without_a_cycle():
    imports = _fabric_imports()
    assert "topology" in imports["hierarchy"] and "hierarchy" in imports["collectives"]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for module in imports.get(start, ()):
            if module == goal or (module not in seen and reaches(module, goal, seen | {module})):
                return True
        return False

    assert [module for module in sorted(imports) if reaches(module, module, set())] == []


# -- scale-up ports: one rule for the builder and the lever catalog --------------------------------

@pytest.mark.parametrize(("table", "chips", "ports"), [
    ({"kind": "switch"}, 8, 1),
    ({"kind": "fullmesh", "hosts": 8}, 4, 7),
    ({"kind": "fullmesh"}, 4, 3),
    ({"kind": "torus", "dims": [4, 4, 4]}, 64, 6),
    ({"kind": "mesh", "dims": [16, 16]}, 256, 4),
    ({"kind": "torus", "dims": [8]}, 8, 2),
])
def test_scaleup_ports(table, chips, ports):
    from pydantic import TypeAdapter

    spec = TypeAdapter(FabricSpec).validate_python(table)
    assert scaleup_ports(spec, chips) == ports
    topology = build_topology(spec, 450e9, chips)
    np.testing.assert_allclose(topology.links.bw_Bps, 450e9 / ports, rtol=1e-12)


@pytest.mark.parametrize(("chips", "fabric"), [
    (4, None), (4, {"kind": "fullmesh"}), (4, {"kind": "torus", "dims": [2, 2]}), (4, {"kind": "mesh", "dims": [4]}),
    (16, None),  # two 8-chip nodes on a leaf-spine: the nodes' links
])
def test_the_scale_up_lever_doubles_the_links_the_simulation_uses(chips, fabric, tmp_path):
    table, source, base_dir = read_scenario_table(None)
    apply_overrides(table, {"model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": chips,
                            "deployment.tp": 2, **({} if fabric is None else {"deployment.fabric": fabric})})
    base = Base(table, source, base_dir)
    levers = catalog(base.scenario(), base.table, tmp_path)
    lever = next(lever for lever in levers if lever.name.startswith("scale-up links"))

    def scale_up_bw_Bps(overrides):
        topology = build_deployment(base.scenario(overrides)).topology
        return topology.links.bw_Bps[topology.scale_up_links()]

    before = scale_up_bw_Bps({})
    assert len(before) and np.allclose(scale_up_bw_Bps(lever.overrides), 2 * before, rtol=1e-9)
