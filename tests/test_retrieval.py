"""A retrieval stage's latency from its index (application/index.py, compute/vector_search.py): the
model by hand, against published FAISS measurements, the index table's parsing and errors, and the
levers that change how the index is searched."""

import math
from importlib import resources

import numpy as np
import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario
from tokenpath.application.index import IndexSpec
from tokenpath.compute.chip import load_chip
from tokenpath.compute.vector_search import hnsw_distances, retrieval_latency_s
from tokenpath.config.assumptions import BY_NAME, Assumptions
from tokenpath.config.errors import UserError
from tokenpath.sim.simulate import prepare
from tokenpath.whatif.catalog import APPLICATION_GROUP, catalog

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# A CPU with round figures: 10 cores sharing 100 GB/s (10 GB/s each), 100 GFLOP/s a core.
ROUND_CPU = {"cpu_memory_bw_Bps": 100e9, "cpu_cores": 10.0, "cpu_core_flops": 100e9}


def latency_s(values=None, **table):
    with Assumptions({**ROUND_CPU, **(values or {})}).active():
        return retrieval_latency_s(IndexSpec.model_validate(table))


def test_flat_and_ivf_scans_by_hand():
    # 1M x 100 fp32 = 400 MB at one core's 10 GB/s: 40 ms (its 200 FLOPs a vector take 2 ns, under 40 ns)
    assert latency_s(vectors=10**6, dim=100, method="flat") == pytest.approx(0.040)
    assert latency_s(vectors=10**6, dim=100, method="flat", threads=4) == pytest.approx(0.010)
    assert latency_s(vectors=10**6, dim=100, method="flat", threads=50) == pytest.approx(0.004)  # 10 cores at most
    # int8 at 1 GFLOP/s a core: 200 FLOPs take 200 ns, more than the 100 bytes' 10 ns: compute-bound
    assert latency_s({"cpu_core_flops": 1e9}, vectors=10**6, dim=100, method="flat",
                     precision="int8") == pytest.approx(0.200)
    # PQ codes of 8 bytes at 1 ns a look-up: 8 ns a vector against 0.8 ns of bytes
    assert latency_s({"pq_lookup_s": 1e-9}, vectors=10**6, dim=100, method="flat", pq_bytes=8) == pytest.approx(0.008)
    # IVF: 10 of 1,000 lists, imbalance 1.5: 15,000 vectors x 400 B (0.6 ms) + 1,000 centroids x 400 B (40 us)
    assert latency_s({"ivf_imbalance": 1.5}, vectors=10**6, dim=100, method="ivf", nlist=1000,
                     nprobe=10) == pytest.approx(0.6e-3 + 40e-6)
    # every list probed: the whole index once (not 1.5 times), plus the centroids
    assert latency_s({"ivf_imbalance": 1.5}, vectors=10**6, dim=100, method="ivf", nlist=1000,
                     nprobe=1000) == pytest.approx(0.040 + 40e-6)


def test_hnsw_by_hand():
    index = IndexSpec(vectors=1000, dim=100, method="hnsw", m=10, ef_search=20, top_k=30)
    values = {"hnsw_distance_fraction": 0.5, "hnsw_visit_s": 100e-9}
    with Assumptions({**ROUND_CPU, **values}).active():
        # ef = max(20, top_k 30); 0.5 x 30 x 2 x 10 = 300 on the bottom layer, 10 x log_10(1000) = 30 above
        assert hnsw_distances(index) == pytest.approx(330)
        # each: 100 ns visit + 400 B at 10 GB/s (40 ns) + 200 FLOPs at 100 GFLOP/s (2 ns)
        assert retrieval_latency_s(index) == pytest.approx(330 * 142e-9)
        # an ef near the index's size: its visited set compares each of the 1,000 vectors once at most
        assert hnsw_distances(index.model_copy(update={"ef_search": 500})) == 1000


def test_a_scan_on_a_chip_is_its_bytes_at_hbm_speed_plus_copies_and_kernels():
    h200 = load_chip("h200")
    flat = IndexSpec(vectors=10**7, dim=768, method="flat", on="h200")
    # 2 kernels x (their fixed time + the eager launch gap) + the query's copy in and the results' out (10 us each)
    kernel_s = BY_NAME["kernel_fixed_s"].value + BY_NAME["eager_kernel_launch_s"].value
    fixed = 2 * kernel_s + 2 * 10e-6
    assert retrieval_latency_s(flat) == pytest.approx(10**7 * 768 * 4 / h200.effective_hbm_bw_Bps + fixed)
    ivf = IndexSpec(vectors=10**7, dim=768, method="ivf", nlist=4096, nprobe=16, on="h200")
    assert retrieval_latency_s(ivf) < retrieval_latency_s(flat) / 50


def _published():
    text = (resources.files("tokenpath.catalog") / "validation" / "retrieval.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    for row in data["rows"]:
        source = data["sources"][row["source"]]
        machine = {k: v for k, v in data["machines"][source["machine"]].items() if k != "source"}
        with Assumptions(machine).active():
            predicted = retrieval_latency_s(IndexSpec.model_validate(row["index"]))
        yield row, predicted, row["ms_per_query"] * 1e-3 * source["threads"]


def test_the_model_against_published_faiss_measurements():
    rows = list(_published())
    ratios = {(row["role"], row["index"]["method"], row["index"].get("precision", "fp32")): [] for row, _, _ in rows}
    for row, predicted, measured in rows:
        ratios[row["role"], row["index"]["method"], row["index"].get("precision", "fp32")].append(predicted / measured)
    # HNSW (fitted on the fp32 rows; the 8-bit rows held out) and IVF within 2x of every row
    for key in (("fit", "hnsw", "fp32"), ("check", "hnsw", "int8"), ("check", "ivf", "fp32")):
        assert len(ratios[key]) == 5 and all(0.5 <= r <= 2 for r in ratios[key]), (key, ratios[key])
    # the registry's hnsw_visit_s is the fit: each fp32 row's time per distance less its bytes and FLOPs
    fitted = []
    for row, predicted, measured in rows:
        if row["role"] == "fit" and row["index"]["method"] == "hnsw":
            index = IndexSpec.model_validate(row["index"])
            fitted.append(BY_NAME["hnsw_visit_s"].value + (measured - predicted) / hnsw_distances(index))
    assert math.exp(np.mean(np.log(fitted))) == pytest.approx(BY_NAME["hnsw_visit_s"].value, rel=0.005)
    # the PQ row sets pq_lookup_s: a look-up-bound scan on one core, exactly
    assert ratios["fit", "flat", "fp32"] == [pytest.approx(1.0)]


KNOBS = {"flat": {}, "ivf": {"nlist": 64, "nprobe": 8}, "hnsw": {"m": 16, "ef_search": 32}}


@settings(max_examples=60, deadline=None)
@given(vectors=st.integers(-2, 10**9), dim=st.integers(-1, 4096), method=st.sampled_from(["flat", "ivf", "hnsw"]),
       nlist=st.integers(0, 5000), nprobe=st.integers(0, 5000), top_k=st.integers(1, 200),
       on=st.sampled_from(["cpu", "h200"]), pq=st.one_of(st.none(), st.integers(1, 64)))
def test_the_index_table_parses_exactly_when_it_is_valid(vectors, dim, method, nlist, nprobe, top_k, on, pq):
    table = {"vectors": vectors, "dim": dim, "method": method, "top_k": top_k, "on": on, **KNOBS[method]}
    if method == "ivf":
        table.update(nlist=nlist, nprobe=nprobe)
    if pq is not None:
        table["pq_bytes"] = pq
    valid = (vectors >= 1 and dim >= 1 and top_k <= vectors and (pq is None or pq <= dim)
             and (method != "ivf" or 1 <= nprobe <= nlist <= vectors) and not (on != "cpu" and method == "hnsw"))
    try:
        index = IndexSpec.model_validate(table)
    except ValidationError as error:
        assert not valid or index_too_big(table), error
        return
    assert valid
    assert IndexSpec.model_validate(index.model_dump(exclude_none=True)) == index  # round trip
    time_s = retrieval_latency_s(index)
    assert 0 < time_s < math.inf
    if method == "ivf" and nprobe < nlist:  # probing more lists never takes less time
        assert retrieval_latency_s(index.model_copy(update={"nprobe": nprobe + 1})) >= time_s


def index_too_big(table):
    size = table["vectors"] * (table.get("pq_bytes") or table["dim"] * 4)
    return table["on"] != "cpu" and size > load_chip(table["on"]).hbm_bytes


def stages_with(index=None, **retrieve):
    retrieve = {"name": "retrieve", "kind": "retrieval", **({"index": index} if index else {}), **retrieve}
    return [retrieve, {"name": "answer", "kind": "model", "after": ["retrieve"]}]


FLAT = {"vectors": 200_000, "dim": 768, "method": "flat"}


@pytest.mark.parametrize("retrieve, fragments", [
    ({"index": FLAT, "latency": {"kind": "fixed", "value": "5 ms"}}, ["both a latency and an index"]),
    ({"index": {**FLAT, "method": "annoy"}}, ["index.method", "'flat', 'ivf' or 'hnsw'", "annoy"]),
    ({"index": {**FLAT, "on": "h300"}}, ["index", "neither \"cpu\" nor a catalog chip", "unknown chip 'h300'"]),
    ({"index": {**FLAT, "method": "ivf", "nlist": 16, "nprobe": 64}}, ["nprobe (64) is more than nlist (16)"]),
    ({"index": {**FLAT, "vectors": 0}}, ["index.vectors", "greater than or equal to 1"]),
    ({"index": {**FLAT, "dim": -3}}, ["index.dim", "greater than or equal to 1"]),
    ({"index": {**FLAT, "method": "hnsw", "m": 16, "ef_search": 64, "on": "h200"}}, ["walked on the CPU"]),
    ({"index": {**FLAT, "nprobe": 4}}, ["nprobe belongs to method 'ivf'"]),
    ({"index": {**FLAT, "method": "ivf"}}, ["method 'ivf' needs nlist and nprobe"]),
    ({"index": {**FLAT, "vectors": 10**11, "on": "h200"}}, ["does not fit in one h200"]),
    ({"index": {**FLAT, "colour": 1}}, ["unknown key 'application.stages.0.index.colour'", "vectors, dim, method"]),
    ({"kind": "tool", "index": FLAT}, ["only a retrieval stage takes an index"]),
    ({}, ["needs a latency", "(or an index)"]),
])
def test_a_bad_index_is_one_line(retrieve, fragments):
    with pytest.raises(UserError) as raised:
        load_scenario("rag", {"application.stages": stages_with(**retrieve)})
    line = str(raised.value)
    assert "\n" not in line and line.startswith("scenario 'rag': ") and "application.stages.0" in line, line
    for fragment in fragments:
        assert fragment in line, (fragment, line)


def test_a_bad_index_exits_2_from_the_cli(tmp_path, monkeypatch, capsys):
    path = tmp_path / "app.toml"
    path.write_text(tomli_w.dumps({"application": {"stages": stages_with({**FLAT, "method": "ivf", "nlist": 8,
                                                                               "nprobe": 9})}}), encoding="utf-8")
    assert_user_error(*run_cli(["simulate", str(path), "--num-requests", "5"], monkeypatch, capsys),
                      "application.stages", "nprobe (9) is more than nlist (8)")


def test_a_search_past_int64_nanoseconds_is_one_line_not_a_wrapped_time():
    """The largest flat index the table takes, 1e12 vectors of 65,536 fp32 dimensions, is 1.9 years a query
    on one core; spread 10 draws some requests past 292 years, which as int64 nanoseconds wrapped to a
    negative time (the stage then took none)."""
    from tokenpath.application.spec import ApplicationSpec
    from tokenpath.application.timeline import draw_latencies_ns

    huge = {"vectors": 10**12, "dim": 65_536, "method": "flat", "spread": 10.0}
    spec = ApplicationSpec.model_validate({"stages": [{"name": "retrieve", "kind": "retrieval", "index": huge},
                                                      {"name": "answer", "kind": "model", "after": ["retrieve"]}]})
    with pytest.raises(UserError) as raised:
        draw_latencies_ns(spec, 20_000, np.random.default_rng(0))
    assert "\n" not in str(raised.value) and "stage 'retrieve'" in str(raised.value)
    assert "index.spread" in str(raised.value)


def test_a_stage_with_an_index_takes_the_model_s_time_and_the_scenario_s_assumptions(tmp_path):
    stages = stages_with(FLAT)
    laid = prepare(load_scenario("rag", {"workload.num_requests": 20, "application.stages": stages})).application
    expected_ns = round(retrieval_latency_s(IndexSpec.model_validate(FLAT)) * 1e9)
    assert laid.pre_ns.tolist() == [expected_ns] * 20  # no spread: every request the model's time
    # [assumptions] reaches the index: half the bandwidth, twice the (bandwidth-bound) scan
    slower = prepare(load_scenario("rag", {"workload.num_requests": 20, "application.stages": stages,
                                           "assumptions": {"cpu_memory_bw_Bps": "122.88 GB/s"}})).application
    assert slower.pre_ns.tolist() == [2 * expected_ns] * 20
    spread = prepare(load_scenario("rag", {"workload.num_requests": 400, "application.stages":
                                           stages_with({**FLAT, "spread": 0.5})})).application.pre_ns
    assert spread.mean() == pytest.approx(expected_ns, rel=0.1) and spread.std() == pytest.approx(expected_ns / 2,
                                                                                                  rel=0.25)
    scenario = load_scenario("rag", {"application.stages": stages_with({**FLAT, "spread": 0.5, "threads": 2})})
    path = tmp_path / "shown.toml"
    path.write_text(scenario.to_toml(), encoding="utf-8")  # as `tokenpath scenario show` writes it
    assert load_scenario(str(path)).application == scenario.application


def test_the_index_levers(tmp_path):
    stages = stages_with({**FLAT, "threads": 4})
    scenario = load_scenario("rag", {"workload.num_requests": 20, "application.stages": stages})
    table = {"application": {"stages": stages}}
    levers = {lever.name: lever for lever in catalog(scenario, table, tmp_path) if lever.group == APPLICATION_GROUP}
    hnsw = levers["HNSW instead of a flat scan (M 16, ef 64): retrieve"].overrides["application.stages"][0]["index"]
    dumped = scenario.application.stages[0].index.model_dump(mode="json", exclude_none=True, exclude={"threads"})
    assert hnsw == {**dumped, "method": "hnsw", "m": 16, "ef_search": 64} and "threads" not in hnsw
    gpu = levers["retrieval on the h200: retrieve"].overrides["application.stages"][0]["index"]
    assert gpu == {**dumped, "on": "h200"} and "threads" not in gpu
    before = prepare(scenario).application.pre_ns[0]
    for lever in (levers["HNSW instead of a flat scan (M 16, ef 64): retrieve"], levers["retrieval on the h200: "
                                                                                        "retrieve"]):
        moved = prepare(load_scenario("rag", {"workload.num_requests": 20, **lever.overrides})).application
        assert moved.pre_ns[0] < before / 10
    rag = {lever.name: lever for lever in catalog(load_scenario("rag"), {}, tmp_path)
           if lever.group == APPLICATION_GROUP}
    assert rag["HNSW instead of a flat scan (M 16, ef 64)"].skipped == ("no retrieval stage scans a flat index on "
                                                                        "the CPU")


@pytest.mark.parametrize("engine, fits, shrinks", [
    ({"scheduler": "prefill-first"}, True, True), ({"scheduler": "trtllm"}, True, True),  # a share of what is free
    ({}, True, True),  # the newest vLLM: sized from the memory it measures free after warmup
    ({"version": "0.11.0"}, False, False),  # vLLM's 0.9 of the whole chip: it refuses to start beside 30.7 GB
    ({"version": "0.11.0", "gpu_memory_utilization": 0.7}, True, False),  # 0.7 of it, free beside the index
])
def test_an_index_on_the_deployments_chip_takes_its_memory_from_the_engine(engine, fits, shrinks):
    """A flat 10M x 768 fp32 index (30.7 GB) searched on the deployment's H200s is held on one chip of each replica,
    beside the engine: the KV cache sizes around it as each engine sizes around another process's memory."""
    from tokenpath.config.errors import DoesNotFit
    from tokenpath.sim.deployment import build_deployment

    index = {"vectors": 10_000_000, "dim": 768, "method": "flat", "on": "h200"}
    engine_set = {f"engine.{key}": value for key, value in engine.items()}
    plain = load_scenario("rag", {"application.stages": stages_with({**index, "on": "cpu"}), **engine_set})
    beside = load_scenario("rag", {"application.stages": stages_with(index), **engine_set})
    if not fits:
        with pytest.raises(DoesNotFit, match=r"GiB held on the h200 beside the engine leave .* lower "
                                             r"engine.gpu_memory_utilization to 0.80 or less"):
            build_deployment(beside)
        return
    before, after = build_deployment(plain), build_deployment(beside)
    held_tokens = 30.72e9 / before.compute.kv_bytes_per_token_per_chip
    share = before.memory_share if before.engine.profile.engine != "vLLM V1" else 1.0
    lost = before.kv_capacity_tokens - after.kv_capacity_tokens
    assert lost == (pytest.approx(share * held_tokens, rel=0.01) if shrinks else 0)
