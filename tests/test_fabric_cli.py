"""`tokenpath fabric`: every preset's structure and collective sweep, topology files, traffic patterns,
the human table, and one-line user errors. The entry point runs in-process (tests/cli_helpers.py)."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest

from cli_helpers import assert_user_error, run_cli
from tokenpath.cli import main
from tokenpath.fabric.build import NVLINK_HOP_LATENCY_S
from tokenpath.fabric.spec import preset_names

MiB = 2**20
GiB = 2**30
SIZES = [8 * 8**i for i in range(11)]  # 8 B .. 8 GiB, every 8x (nccl-tests -b 8 -e 8G)
DEFAULT_OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
STRUCTURE_KEYS = {"hosts", "switches", "links", "diameter", "avg_hops", "bisection_bw_Bps", "collectives"}
ROW_KEYS = {"op", "algorithm", "protocol", "ranks", "size_bytes", "time_s", "algbw_Bps", "busbw_Bps"}
PRESETS = preset_names()
BY_HAND = {"dgx-h100", "dgx-h200", "gb200-nvl72", "h100-4x8-rail", "slingshot-dragonfly", "tpu-v5p-4x4x4",
           "wafer-mesh-16x16"}


def fabric_json(argv: list[str], monkeypatch, capsys) -> dict:
    code, out, err = run_cli(["fabric", *argv, "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    return json.loads(out)


def write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def nccl_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


# -- presets ---------------------------------------------------------------------------------------

def test_list_names_every_preset(monkeypatch, capsys):
    code, out, err = run_cli(["fabric", "--list"], monkeypatch, capsys)
    assert code == 0, err
    assert BY_HAND <= set(PRESETS)
    for name in PRESETS:
        assert f"{name}  " in out  # name, two spaces, its description
    assert "16,512" in out  # a description, not just the names


@pytest.fixture(scope="module")
def preset_documents():
    """`tokenpath fabric --preset NAME --json -` for every preset, run once for the module (the
    function-scoped capsys of run_cli is not available here, so stdout is redirected by hand)."""
    docs = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in PRESETS:
            monkeypatch.setattr(sys, "argv", ["tokenpath", "fabric", "--preset", name, "--json", "-"])
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                try:
                    main()
                except SystemExit as exit:
                    assert exit.code in (0, None), (name, exit.code)
            docs[name] = json.loads(buffer.getvalue())
    return docs


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_returns_the_documented_keys(name, preset_documents):
    doc = preset_documents[name]
    assert STRUCTURE_KEYS <= set(doc)
    rows = doc["collectives"]
    # Four default ops, 11 sizes each, over every host of the fabric.
    assert len(rows) == len(DEFAULT_OPS) * len(SIZES)
    assert [(r["op"], r["size_bytes"]) for r in rows] == [(op, s) for op in DEFAULT_OPS for s in SIZES]
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["ranks"] == doc["hosts"]
        assert row["time_s"] > 0
    assert all(r["algorithm"] == "direct" for r in rows if r["op"] == "all_to_all")
    assert doc["diameter"] >= 1 and doc["avg_hops"] <= doc["diameter"]
    assert doc["bisection_bw_Bps"] > 0


@pytest.mark.parametrize("name", PRESETS)
def test_algbw_is_size_over_time_and_busbw_the_nccl_tests_factor(name, preset_documents):
    doc = preset_documents[name]
    for row in doc["collectives"]:
        n = row["ranks"]
        assert row["algbw_Bps"] == pytest.approx(row["size_bytes"] / row["time_s"], rel=1e-12)
        assert row["busbw_Bps"] == pytest.approx(row["algbw_Bps"] * nccl_factor(row["op"], n), rel=1e-12)
    # Time grows with size (an affine cost per algorithm, the cheapest taken at each size).
    for op in DEFAULT_OPS:
        times = [r["time_s"] for r in doc["collectives"] if r["op"] == op]
        assert times == sorted(times)


def test_dgx_h100_by_hand(preset_documents):
    doc = preset_documents["dgx-h100"]
    assert doc["kind"] == "switch"
    assert (doc["hosts"], doc["switches"], doc["links"], doc["diameter"], doc["avg_hops"]) == (8, 1, 8, 2, 2.0)
    assert doc["bisection_bw_Bps"] == 4 * 450e9  # 4 hosts' ports on either side of the switch
    big = next(r for r in doc["collectives"] if r["op"] == "all_reduce" and r["size_bytes"] == 8 * GiB)
    assert big["algorithm"] == "nvls"
    assert big["busbw_Bps"] == pytest.approx(480e9, rel=0.02)  # nccl-tests NVLS busbw on 8x H100
    # Small all-reduces keep NCCL's ring (its tuner rates NVLS at 25 us): 6.6 us and 14 hops of 0.6 us,
    # against 15.6 us measured by nccl-tests at 512 B.
    small = next(r for r in doc["collectives"] if r["op"] == "all_reduce" and r["size_bytes"] == 8)
    assert small["algorithm"] == "ring"
    assert small["time_s"] == pytest.approx(15.0e-6, rel=1e-3)


def test_dgx_h200_matches_dgx_h100(preset_documents):
    h100, h200 = preset_documents["dgx-h100"], preset_documents["dgx-h200"]
    assert h100 == h200


def test_tpu_v5p_by_hand(preset_documents):
    doc = preset_documents["tpu-v5p-4x4x4"]
    assert doc["kind"] == "torus"
    assert (doc["hosts"], doc["switches"], doc["links"], doc["diameter"]) == (64, 0, 192, 6)  # 64 x 6 / 2
    # Ring of 4: mean distance 4/4 over all 16 coordinate pairs; 3 dims; distinct pairs only.
    assert doc["avg_hops"] == pytest.approx(3 * (4 / 4) * 64 / 63, rel=1e-12)
    # The cut across one dimension breaks 16 rings twice: 32 cables of 100 GB/s.
    assert doc["bisection_bw_Bps"] == pytest.approx(32 * 100e9)
    big = next(r for r in doc["collectives"] if r["op"] == "all_reduce" and r["size_bytes"] == 8 * GiB)
    assert big["algorithm"] == "bucket"


def test_the_other_presets_by_hand(preset_documents):
    nvl72 = preset_documents["gb200-nvl72"]
    assert (nvl72["hosts"], nvl72["switches"], nvl72["links"]) == (72, 1, 72)
    assert nvl72["bisection_bw_Bps"] == pytest.approx(36 * 900e9)
    rail = preset_documents["h100-4x8-rail"]
    assert rail["kind"] == "hierarchy"
    # 4 NVSwitches + a k=8 leaf-spine (8 leaves, 4 spines); 32 NVLink ports + 32 NICs + 8 x 4 uplinks.
    assert (rail["hosts"], rail["switches"], rail["links"]) == (32, 16, 96)
    dragonfly = preset_documents["slingshot-dragonfly"]
    # p = 8, a = 2p = 16, h = p = 8, g = a*h + 1 = 129.
    assert dragonfly["hosts"] == 8 * 16 * 129 == 16_512
    assert dragonfly["switches"] == 16 * 129
    assert dragonfly["links"] == 16_512 + 129 * 16 * 15 // 2 + 129 * 128 // 2
    assert dragonfly["diameter"] == 5
    wafer = preset_documents["wafer-mesh-16x16"]
    assert (wafer["kind"], wafer["hosts"], wafer["links"], wafer["diameter"]) == ("mesh", 256, 2 * 16 * 15, 30)
    assert wafer["bisection_bw_Bps"] == pytest.approx(16 * 200e9)


# -- topology files --------------------------------------------------------------------------------

def test_a_topology_file_with_ranks_op_and_algorithm(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "torus.toml", 'kind = "torus"\ndims = [4, 4]\nlink_bw = "100 GB/s"\n')
    doc = fabric_json([path, "--ranks", "4", "--op", "all_reduce", "--algorithm", "ring"], monkeypatch, capsys)
    assert (doc["kind"], doc["hosts"], doc["switches"], doc["links"], doc["diameter"]) == ("torus", 16, 0, 32, 4)
    rows = doc["collectives"]
    assert [r["size_bytes"] for r in rows] == SIZES
    assert {(r["op"], r["algorithm"], r["ranks"]) for r in rows} == {("all_reduce", "ring", 4)}
    # Ranks 0..3 are one ring of the last dimension: each ring step crosses one 100 GB/s link, which
    # achieves 370/450 of it (NVLink-class efficiency); 2(n-1) = 6 steps of size/4, at 8 GiB under NCCL's
    # Simple protocol: 8.4 us, and 3.4 us a step where LL takes the link's own 0.6 us.
    big = rows[-1]
    efficiency = 370 / 450
    beta = 6 * (1 / 4) / (100e9 * efficiency)
    alpha = 8.4e-6 + 6 * NVLINK_HOP_LATENCY_S * 3.4 / 0.6
    assert big["time_s"] == pytest.approx(alpha + big["size_bytes"] * beta, rel=1e-9)
    assert big["busbw_Bps"] == pytest.approx(
        big["size_bytes"] / (alpha + big["size_bytes"] * beta) * 2 * 3 / 4, rel=1e-9)
    # 8 B under LL: the link's own latency a step, half the bandwidth.
    assert rows[0]["time_s"] == pytest.approx(6.6e-6 + 6 * NVLINK_HOP_LATENCY_S + 8 * 2 * beta, rel=1e-9)


def test_a_topology_file_can_start_from_a_preset(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "half.toml", 'description = "half a DGX"\npreset = "dgx-h100"\nhosts = 4\n')
    doc = fabric_json([path, "--op", "all_gather"], monkeypatch, capsys)
    assert (doc["hosts"], doc["links"], doc["bisection_bw_Bps"]) == (4, 4, 2 * 450e9)


def test_chip_fills_an_unset_scale_up_bandwidth(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "switch.toml", 'kind = "switch"\nhosts = 8\n')
    doc = fabric_json([path, "--chip", "tpu-v5p", "--op", "all_reduce"], monkeypatch, capsys)
    assert doc["bisection_bw_Bps"] == pytest.approx(4 * 600e9)


def test_tornado_on_a_ring_loads_every_clockwise_link_with_three_flows(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "ring.toml", 'kind = "torus"\ndims = [8]\nlink_bw = "100 GB/s"\n')
    doc = fabric_json([path, "--op", "all_reduce", "--pattern", "tornado"], monkeypatch, capsys)
    pattern = doc["pattern"]
    assert pattern["name"] == "tornado" and pattern["bytes_per_host"] == MiB
    # Each chip sends 1 MiB to the chip ceil(8/2) - 1 = 3 ahead: three clockwise hops, so each of the 8
    # clockwise links carries 3 flows and the counter-clockwise ones carry nothing.
    worst = pattern["worst_links"]
    assert len(worst) == 8
    assert [(w["from"], w["to"]) for w in worst] == [(f"host {i}", f"host {(i + 1) % 8}") for i in range(8)]
    for w in worst:
        assert w["tier"] == "dim0"
        assert w["bytes"] == pytest.approx(3 * MiB)
        assert w["busy_s"] == pytest.approx(3 * MiB / 100e9)
    assert pattern["mean_link_utilization"] == pytest.approx(0.5)
    # Busiest link plus the diameter (4 hops) at the default 0.6 us per direct hop.
    assert pattern["completion_time_s"] == pytest.approx(3 * MiB / 100e9 + 4 * NVLINK_HOP_LATENCY_S)


def test_adversarial_on_a_min_routed_dragonfly_piles_each_group_on_one_global_link(tmp_path, monkeypatch, capsys):
    # p = 2 hosts per router, a = 4 routers per group, h = 2 global ports, g = a*h + 1 = 9 groups:
    # exactly one global link between each pair of groups.
    p, a, g = 2, 4, 9
    path = write(tmp_path / "df.toml",
                 f'kind = "dragonfly"\np = {p}\na = {a}\nh = 2\nrouting = "min"\nlink_bw = "25 GB/s"\n')
    doc = fabric_json([path, "--op", "all_to_all", "--pattern", "adversarial"], monkeypatch, capsys)
    assert (doc["hosts"], doc["switches"]) == (p * a * g, a * g)
    worst = doc["pattern"]["worst_links"]
    assert len(worst) == 10
    globals_ = [w for w in worst if w["tier"] == "global"]
    assert len(globals_) == g  # one per group: i -> i + 1
    for w in globals_:
        # Every host of group i sends 1 MiB to group i + 1 over the one link between them.
        assert w["bytes"] == pytest.approx(p * a * MiB)
        assert w["busy_s"] == pytest.approx(p * a * MiB / 25e9)
        src = int(w["from"].removeprefix("switch "))
        dst = int(w["to"].removeprefix("switch "))
        assert dst // a == (src // a + 1) % g
    assert worst[:g] == globals_  # the busiest links of all
    assert worst[g]["bytes"] < p * a * MiB


def test_all_to_all_pattern_on_a_switch_loads_every_host_link_equally(monkeypatch, capsys):
    doc = fabric_json(["--preset", "dgx-h100", "--op", "all_reduce", "--pattern", "all-to-all"], monkeypatch, capsys)
    worst = doc["pattern"]["worst_links"]
    assert len(worst) == 10  # 16 directed host links, all equally busy; the 10 first shown
    assert {w["tier"] for w in worst} == {"host"}
    assert all(w["bytes"] == pytest.approx(MiB) for w in worst)
    assert doc["pattern"]["mean_link_utilization"] == pytest.approx(1.0)


# -- the human table -------------------------------------------------------------------------------

def test_the_human_table_shows_structure_and_collectives(monkeypatch, capsys):
    code, out, err = run_cli(["fabric", "--preset", "dgx-h100", "--op", "all_reduce"], monkeypatch, capsys)
    assert code == 0, err
    assert out.startswith("DGX H100: 8 GPUs on NVSwitch")  # the preset's description first
    for fragment in ("kind", "switch", "hosts", "diameter", "2 links", "average hops", "2.000", "bisection",
                     "1,800.0 GB/s", "Collectives (nccl-tests columns", "size per rank", "algorithm", "algbw",
                     "busbw", "all_reduce", "nvls", "8 GiB", "8 B", "479.6"):
        assert fragment in out, fragment
    assert not out.lstrip().startswith("{")


def test_the_human_table_shows_the_busiest_links_and_json_to_a_file(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "ring.toml", 'description = "a ring of eight"\nkind = "torus"\ndims = [8]\n'
                                         'link_bw = "100 GB/s"\n')
    target = tmp_path / "out.json"
    code, out, err = run_cli(["fabric", path, "--op", "all_gather", "--pattern", "tornado", "--json", str(target)],
                             monkeypatch, capsys)
    assert code == 0, err
    assert "a ring of eight" in out
    assert "tornado" in out and "busiest links" in out and "host 7" in out and "dim0" in out
    doc = json.loads(target.read_text(encoding="utf-8"))
    assert doc["hosts"] == 8 and doc["pattern"]["worst_links"][0]["bytes"] == 3 * MiB


# -- errors ----------------------------------------------------------------------------------------

def test_no_file_and_no_preset(monkeypatch, capsys):
    assert_user_error(*run_cli(["fabric"], monkeypatch, capsys), "topology file or --preset", "--list")


def test_both_a_file_and_a_preset(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "t.toml", 'kind = "torus"\ndims = [4]\nlink_bw = "1 GB/s"\n')
    assert_user_error(*run_cli(["fabric", path, "--preset", "dgx-h100"], monkeypatch, capsys),
                      "one of them")


def test_unknown_preset_lists_the_presets(monkeypatch, capsys):
    line = assert_user_error(*run_cli(["fabric", "--preset", "dgx-h1000"], monkeypatch, capsys),
                             "'dgx-h1000'")
    assert line.split("use one of ")[1].split(", ") == PRESETS


def test_bad_toml_names_the_file(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "bad.toml", 'kind = "torus\n')
    assert_user_error(*run_cli(["fabric", path], monkeypatch, capsys), "bad.toml", "not valid TOML")


def test_missing_file_names_it(tmp_path, monkeypatch, capsys):
    assert_user_error(*run_cli(["fabric", str(tmp_path / "nowhere.toml")], monkeypatch, capsys),
                      "nowhere.toml", "topology file not found")


def test_unknown_key_names_it_and_lists_the_keys_of_its_kind(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "t.toml", 'kind = "torus"\ndims = [4]\nlink_bw = "1 GB/s"\nwraparoud = true\n')
    line = assert_user_error(*run_cli(["fabric", path], monkeypatch, capsys),
                             "t.toml", "unknown key 'wraparoud'", "did you mean 'wraparound'?")
    allowed = line.split("allowed here: ")[1]
    assert allowed.split(", ") == ["algorithm", "link_bw", "link_latency", "kind", "dims", "wraparound"]


def test_unknown_key_in_a_dragonfly_lists_the_dragonfly_keys(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "df.toml", 'kind = "dragonfly"\np = 2\nlink_bw = "1 GB/s"\ngroups = 3\n')
    line = assert_user_error(*run_cli(["fabric", path], monkeypatch, capsys), "unknown key 'groups'")
    for key in ("p", "a", "h", "g", "routing", "global_bw", "global_latency"):
        assert key in line.split("allowed here: ")[1].split(", ")


@pytest.mark.parametrize("text, fragments", [
    ('kind = "dragonfly"\np = 1\na = 2\nh = 1\ng = 4\nlink_bw = "25 GB/s"\n', ("fabric.g", "a*h+1 = 3", "got 4")),
    ('kind = "torus"\ndims = [4, 1]\nlink_bw = "1 GB/s"\n', ("fabric.dims", ">= 2", "[4, 1]")),
    ('kind = "torus"\ndims = [4]\nlink_bw = "0 GB/s"\n', ("link_bw", "'0 GB/s' is out of range", "1 kB/s to 100 PB/s")),
    ('kind = "fattree"\nk = 4\n', ("fabric.link_bw", "fattree", "50 GB/s")),
    ('kind = "switch"\nhosts = 4\n', ("fabric.link_bw", "not set")),
    ('kind = "torus"\ndims = [4]\nlink_bw = "35 parsecs"\n', ("link_bw", "parsecs")),
    ('kind = "hypercube"\n', ("kind 'hypercube'", "torus", "dragonfly", "hierarchy")),
], ids=["dragonfly_g", "torus_dim_1", "zero_link_bw", "fattree_no_link_bw", "switch_no_link_bw", "bad_unit",
        "unknown_kind"])
def test_bad_topology_files_are_one_line_errors(text, fragments, tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "net.toml", text)
    assert_user_error(*run_cli(["fabric", path], monkeypatch, capsys), *fragments)


@pytest.mark.parametrize("argv, fragments", [
    (["--preset", "dgx-h100", "--pattern", "bogus"], ("--pattern", "'bogus'", "tornado", "adversarial")),
    (["--preset", "dgx-h100", "--op", "bogus"], ("--op", "'bogus'", "all_reduce", "all_to_all")),
    (["--preset", "dgx-h100", "--ranks", "1"], ("--ranks", "2 to the 8 hosts", "got 1")),
    (["--preset", "dgx-h100", "--ranks", "9"], ("--ranks", "2 to the 8 hosts", "got 9")),
    (["--preset", "dgx-h100", "--algorithm", "bucket"], ("fabric.algorithm", "'bucket'", "switch")),
    (["--preset", "dgx-h100", "--algorithm", "bogus"], ("fabric.algorithm", "'bogus'")),
], ids=["pattern", "op", "ranks_1", "ranks_too_many", "algorithm_not_here", "algorithm_unknown"])
def test_bad_flags_are_one_line_errors(argv, fragments, monkeypatch, capsys):
    assert_user_error(*run_cli(["fabric", *argv], monkeypatch, capsys), *fragments)


# -- bugs ------------------------------------------------------------------------------------------

def test_rows_name_the_algorithm_that_actually_ran(monkeypatch, capsys):
    forced = fabric_json(["--preset", "dgx-h100", "--op", "all_gather", "--algorithm", "nvls"], monkeypatch, capsys)
    ring = fabric_json(["--preset", "dgx-h100", "--op", "all_gather", "--algorithm", "ring"], monkeypatch, capsys)
    # The times are the ring's (NVLS only reduces), so the label must be too.
    assert [r["time_s"] for r in forced["collectives"]] == [r["time_s"] for r in ring["collectives"]]
    assert {r["algorithm"] for r in forced["collectives"]} == {"ring"}


def test_errors_inside_a_hierarchy_name_the_sub_table(tmp_path, monkeypatch, capsys):
    path = write(tmp_path / "h.toml", 'kind = "hierarchy"\nnodes = 2\n[node]\nkind = "switch"\nhosts = 4\n'
                                      'link_bw = "450 GB/s"\n[network]\nkind = "fattree"\nk = 4\nlevels = 2\n')
    assert_user_error(*run_cli(["fabric", path], monkeypatch, capsys), "fabric.network.link_bw")

