"""Scenarios: the embedded default, dotted overrides, validation errors, fingerprints, TOML round trips."""

from __future__ import annotations

import json
import re
import shutil
from importlib import resources
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.config.errors import UserError
from tokenpath.sim.scenario import Scenario, build_scenario, load_scenario, read_scenario_table, set_path

AZURE_TRACE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:47.1000000,1200,300\n"
    "2023-11-16 18:15:49.0000000,80,12\n"
)
LLAMA_8B_CONFIG = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}


def round_trip(scenario: Scenario) -> Scenario:
    return build_scenario(tomllib.loads(scenario.to_toml()), "round trip")


def trace_scenario(folder: Path, trace_text: str = AZURE_TRACE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trace.csv").write_text(trace_text, encoding="utf-8")
    path = folder / "replay.toml"
    path.write_text('name = "replay"\n[workload.trace]\npath = "trace.csv"\nformat = "azure"\n', encoding="utf-8")
    return path


# The embedded default

def test_default_scenario_is_the_typical_deployment():
    s = load_scenario()
    assert s.name == "typical"
    # vLLM (the default profile) keeps the KV cache at the model's bf16; TensorRT-LLM quantizes it with fp8 weights.
    assert (s.model.name, s.model.precision, s.model.kv_precision()) == ("llama-3.1-70b", "fp8", "bf16")
    assert s.model.kv_precision("trtllm") == "fp8"
    # ... unless the checkpoint's fp8 is block-scaled (DeepSeek-V3's own), which declares no KV quantization
    # (TensorRT-LLM's load_hf_quant_config): its KV cache stays bf16, at half the tokens' bytes' worth of fp8.
    assert load_scenario(None, {"engine.scheduler": "trtllm"}).kv_precision() == "fp8"
    deepseek = load_scenario(None, {"engine.scheduler": "trtllm", "model.name": "deepseek-v3"})
    assert deepseek.kv_precision() == "bf16"
    assert load_scenario(None, {"engine.scheduler": "trtllm", "model.name": "deepseek-v3",
                                "model.kv_cache_precision": "fp8"}).kv_precision() == "fp8"
    assert (s.deployment.chip, s.deployment.chips, s.deployment.tp, s.deployment.replicas) == ("h200", 8, 8, 1)
    assert s.workload.arrival.rate == 34.0 and s.workload.arrival.burstiness == 1.0
    assert s.workload.num_requests == 2000 and s.workload.trace is None and s.workload.max_concurrency is None
    assert (s.workload.input.kind, s.workload.input.mean, s.workload.input.sd) == ("normal", 550.0, 150.0)
    assert (s.workload.output.kind, s.workload.output.mean, s.workload.output.sd) == ("normal", 150.0, 80.0)
    assert (s.slo.ttft, s.slo.tpot, s.slo.ttfv, s.slo.e2e) == (2.0, 0.1, None, None)
    assert s.seed == 0
    assert load_scenario("typical") == s


def test_default_scenario_holds_every_value_of_the_typical_file():
    text = (resources.files("tokenpath.catalog") / "scenarios" / "typical.toml").read_text(encoding="utf-8")
    written = tomllib.loads(text)
    # Each value the file writes, as the scenario holds it (units parsed to SI).
    held = load_scenario().model_dump()
    si = {"64 GB/s": 64e9, "20 ms": 0.020, "2 s": 2.0, "100 ms": 0.1}

    def check(table: dict, mirror: dict, where: str) -> None:
        for key, value in table.items():
            assert key in mirror, f"{where}{key} is not in the scenario"
            if isinstance(value, dict):
                check(value, mirror[key], f"{where}{key}.")
            else:
                assert mirror[key] == si.get(value, value), f"{where}{key}"

    check(written, held, "")


# Overrides

def test_overrides_take_dotted_paths_at_every_depth():
    s = load_scenario(None, {
        "seed": 7,
        "deployment.tp": 4,
        "deployment.fabric.link_bw": "900 GB/s",
        "workload.arrival.rate": "inf",
        "workload.input": {"kind": "fixed", "value": 128},
        "delivery.network_rtt": "35 ms",
        "slo.ttfv": "300 ms",
    })
    assert s.seed == 7 and s.deployment.tp == 4 and s.deployment.replicas == 2
    assert s.deployment.fabric.link_bw == 900e9
    assert s.workload.arrival.rate == float("inf")
    assert (s.workload.input.kind, s.workload.input.value) == ("fixed", 128)
    assert s.workload.output.mean == 150.0  # untouched sibling
    assert s.delivery.network_rtt == 0.035
    assert s.slo.ttfv == pytest.approx(0.3)


def test_set_path_creates_tables_and_refuses_to_descend_into_a_value():
    table = {"seed": 1}
    set_path(table, "workload.trace.format", "azure")
    assert table == {"seed": 1, "workload": {"trace": {"format": "azure"}}}
    with pytest.raises(UserError, match=r"seed\.rate: 'seed' is not a table"):
        set_path(table, "seed.rate", 3)


@pytest.mark.parametrize("dotted, value, fragment", [
    ("deployment.tp", 0, "deployment.tp"),
    ("deployment.chips", "eight", "deployment.chips"),
    ("workload.arrival.rate", -1.0, "workload.arrival.rate"),
    ("workload.num_requests", 0, "workload.num_requests"),
    ("delivery.network_rtt", "35 parsecs", "delivery.network_rtt"),
    ("delivery.network_rtt", "-5 ms", "delivery.network_rtt"),
    ("delivery.stream_interval", 0, "delivery.stream_interval"),
    ("model.precision", "int4", "model.precision"),
    ("deployment.fabric.algorithm", "bogus", "deployment.fabric.algorithm"),
])
def test_a_bad_value_is_a_one_line_user_error_naming_its_field(dotted, value, fragment):
    with pytest.raises(UserError) as error:
        load_scenario(None, {dotted: value})
    message = str(error.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize("dotted, suggestion, allowed", [
    ("sed", "seed", ["name", "seed", "workload", "delivery"]),
    ("model.nam", "name", ["name", "precision", "kv_cache_precision"]),
    ("deployment.chipz", "chip", ["chip", "chips", "tp", "fabric"]),
    ("deployment.fabric.algo", "algorithm", ["kind", "link_bw", "algorithm", "nvls"]),
    ("engine.max_seqs", "max_num_seqs", ["max_num_seqs", "max_num_batched_tokens"]),
    ("workload.num_request", "num_requests", ["num_requests", "max_concurrency", "trace"]),
    ("workload.input.mena", "mean", ["kind", "value", "mean", "sd"]),
    ("workload.output.sdd", "sd", ["kind", "mean", "sd"]),
    ("workload.arrival.rat", "rate", ["rate", "burstiness", "pattern"]),
    ("workload.trace.fromat", "format", ["path", "format", "time_scale"]),
    ("delivery.network_rt", "network_rtt", ["network_rtt", "stream_interval", "detokenize"]),
    ("slo.tfft", "ttft", ["ttft", "ttfv", "tpot", "e2e"]),
])
def test_unknown_keys_fail_at_every_level_naming_the_dotted_path(dotted, suggestion, allowed):
    table: dict = {}
    if dotted.startswith("workload.trace."):
        table = {"workload": {"trace": {"path": "t.csv", "format": "azure"}}}
    for side in ("input", "output"):
        if dotted.startswith(f"workload.{side}."):
            table = {"workload": {side: {"kind": "normal", "mean": 10, "sd": 1}}}
    set_path(table, dotted, 1)
    with pytest.raises(UserError) as error:
        build_scenario(table, "mine.toml")
    message = str(error.value)
    assert message.startswith(f"mine.toml: unknown key '{dotted}'; did you mean '{suggestion}'?")
    listed = message.split("allowed here: ", 1)[1].split(", ")
    assert set(allowed) <= set(listed)


def test_a_misspelt_required_key_is_named_as_unknown_not_as_the_key_it_leaves_missing():
    # `num_speculative_tokens` misspelt `k` leaves the required key missing as well: the typo is the news
    with pytest.raises(UserError) as error:
        build_scenario({"engine": {"speculative": {"method": "ngram", "k": 3}}, "workload": {"draft_acceptance": 0.5}},
                       "mine.toml")
    assert str(error.value).startswith("mine.toml: unknown key 'engine.speculative.k'; allowed here: method, "
                                       "num_speculative_tokens")


def test_human_units_in_delivery_are_parsed_to_si():
    s = load_scenario(None, {
        "delivery.network_rtt": "35 ms",
        "delivery.network_bw": "100 Mb/s",
        "delivery.host_link_bw": "25 GB/s",
        "delivery.host_link_latency": "2 us",
        "delivery.detokenize_per_token": "0.05 ms",
    })
    d = s.delivery
    assert d.network_rtt == 0.035
    assert d.network_bw == 12.5e6
    assert d.host_link_bw == 25e9
    assert d.host_link_latency == pytest.approx(2e-6, rel=1e-12)
    assert d.detokenize_per_token == pytest.approx(50e-6, rel=1e-12)
    assert load_scenario(None, {"delivery.network_rtt": 0.035}).delivery.network_rtt == 0.035  # bare SI number


# Reading files

def test_missing_file_and_unknown_names_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such scenario file"):
        load_scenario(str(tmp_path / "absent.toml"))
    with pytest.raises(UserError, match="unknown scenario 'typcal'; did you mean 'typical'"):
        load_scenario("typcal")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"{bad}: not valid TOML")):
        load_scenario(str(bad))


def test_relative_trace_paths_resolve_against_the_scenario_folder(tmp_path, monkeypatch):
    path = trace_scenario(tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    s = load_scenario(str(Path("scenarios") / "replay.toml"))
    assert s.workload.trace.path == "trace.csv"  # kept as written
    assert Path(s.resolved_workload().trace.path) == (tmp_path / "scenarios" / "trace.csv").resolve()
    table, source, base_dir = read_scenario_table(str(path))
    assert base_dir == path.resolve().parent and source == str(path)


# Fingerprints

def test_fingerprint_is_stable_across_loads_and_is_sha256_hex():
    first = load_scenario().fingerprint()
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert load_scenario().fingerprint() == first
    assert load_scenario("typical").fingerprint() == first


FIELD_CHANGES = [
    ("name", "other"), ("description", "changed"), ("seed", 1),
    ("model.name", "llama-3.1-8b"), ("model.precision", "bf16"), ("model.kv_cache_precision", "bf16"),
    ("deployment.chip", "h100"), ("deployment.chips", 16), ("deployment.tp", 4),
    ("deployment.fabric.link_bw", "900 GB/s"), ("deployment.fabric.link_latency", "1 us"),
    ("deployment.fabric.algorithm", "ring"), ("deployment.fabric.nvls", False),
    ("engine.max_num_seqs", 256), ("engine.max_num_batched_tokens", 4096), ("engine.block_size", 32),
    ("engine.chunked_prefill", False), ("engine.gpu_memory_utilization", 0.8), ("engine.scheduler", "trtllm"),
    ("workload.num_requests", 2001), ("workload.max_concurrency", 8),
    ("workload.input.mean", 551.0), ("workload.input.sd", 149.0), ("workload.input.max", 4000),
    ("workload.output.mean", 151.0), ("workload.output.min", 2),
    ("workload.arrival.rate", 36.5), ("workload.arrival.burstiness", 0.5), ("workload.arrival.pattern", "constant"),
    ("delivery.host_link_bw", "32 GB/s"), ("delivery.host_link_latency", "20 us"),
    ("delivery.detokenize", "detokenizer"),
    ("delivery.detokenize_per_token", "20 us"), ("delivery.frame_per_event", "3 us"), ("delivery.stream_interval", 2),
    ("delivery.network_rtt", "21 ms"), ("delivery.network_bw", "1 Gb/s"), ("delivery.event_overhead_bytes", 231),
    ("delivery.bytes_per_token", 4.5), ("delivery.request_overhead_bytes", 401),
    ("delivery.invisible_token_fraction", 0.06),
    ("slo.ttft", "1 s"), ("slo.ttfv", "1 s"), ("slo.tpot", "50 ms"), ("slo.e2e", "10 s"),
]


def test_fingerprint_changes_with_every_field():
    base = load_scenario().fingerprint()
    prints = {}
    for dotted, value in FIELD_CHANGES:
        changed = load_scenario(None, {dotted: value})
        prints[dotted] = changed.fingerprint()
        assert prints[dotted] != base, dotted
    assert len(set(prints.values())) == len(FIELD_CHANGES)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(1, 2**32), rate=st.floats(0.1, 1e4))
def test_fingerprint_separates_seeds_and_rates(seed, rate):
    base = load_scenario(None, {"workload.arrival.rate": rate})
    assert load_scenario(None, {"workload.arrival.rate": rate, "seed": seed}).fingerprint() != base.fingerprint()
    assert load_scenario(None, {"workload.arrival.rate": rate}).fingerprint() == base.fingerprint()


def test_fingerprint_follows_the_bytes_of_a_trace_file(tmp_path):
    path = trace_scenario(tmp_path)
    before = load_scenario(str(path)).fingerprint()
    assert load_scenario(str(path)).fingerprint() == before
    trace = tmp_path / "trace.csv"
    trace.write_text(AZURE_TRACE.replace(",44\n", ",45\n"), encoding="utf-8")
    changed = load_scenario(str(path)).fingerprint()
    assert changed != before
    trace.write_text(AZURE_TRACE, encoding="utf-8")
    assert load_scenario(str(path)).fingerprint() == before


def test_fingerprint_follows_the_bytes_of_an_empirical_lengths_file(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("10\n20\n30\n", encoding="utf-8")
    overrides = {"workload.input": {"kind": "empirical", "path": str(lengths)}}
    before = load_scenario(None, overrides).fingerprint()
    lengths.write_text("10\n20\n31\n", encoding="utf-8")
    assert load_scenario(None, overrides).fingerprint() != before


def test_a_missing_trace_file_is_a_user_error_when_fingerprinting(tmp_path):
    path = trace_scenario(tmp_path)
    (tmp_path / "trace.csv").unlink()
    with pytest.raises(UserError, match="trace.csv: workload.trace file not found"):
        load_scenario(str(path)).fingerprint()


def test_fingerprint_follows_the_bytes_of_a_model_config(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_8B_CONFIG), encoding="utf-8")
    before = load_scenario(None, {"model.name": str(config)}).fingerprint()
    config.write_text(json.dumps({**LLAMA_8B_CONFIG, "num_hidden_layers": 40}), encoding="utf-8")
    assert load_scenario(None, {"model.name": str(config)}).fingerprint() != before


def test_fingerprint_does_not_depend_on_where_the_scenario_folder_lives(tmp_path):
    path = trace_scenario(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert load_scenario(str(path)).fingerprint() == load_scenario(str(tmp_path / "b" / "replay.toml")).fingerprint()


def test_relative_model_config_paths_resolve_against_the_scenario_folder(tmp_path, monkeypatch):
    from tokenpath.sim.simulate import prepare

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B_CONFIG), encoding="utf-8")
    (folder / "s.toml").write_text(
        '[model]\nname = "config.json"\n[deployment]\nchip = "h100"\nchips = 1\ntp = 1\n[workload]\nnum_requests = 5\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    prepared = prepare(load_scenario(str(Path("mine") / "s.toml")))
    assert prepared.deployment.model.num_layers == 32


# TOML round trips

def test_to_toml_parses_and_is_stable_under_a_second_trip():
    for s in (load_scenario(), load_scenario(None, {"workload.arrival.rate": "inf", "workload.max_concurrency": 3})):
        text = s.to_toml()
        again = round_trip(s)
        assert again.to_toml() == text
        assert again.fingerprint() == s.fingerprint()
        assert again.model_dump(mode="json") == s.model_dump(mode="json")


def test_to_toml_writes_every_default():
    table = tomllib.loads(load_scenario().to_toml())
    assert set(table) == {"name", "description", "seed", "model", "deployment", "engine", "workload", "delivery", "slo",
                          "continuity", "assumptions"}
    assert table["continuity"] == {"stall_threshold": "250 ms", "reading_speed": f"{238 / 60 * 4 / 3!r} tokens/s",
                                   "expected_ttft": "1 s"}
    # cuda_graph_max_tokens (no limit) and gpu_memory_utilization (the profile's share) are unset, which TOML
    # cannot write; host_overlap is the newest vLLM's async scheduling
    assert set(table["engine"]) == {"max_num_seqs", "max_num_batched_tokens", "block_size", "chunked_prefill",
                                    "cuda_graphs", "cuda_graph_padding", "scheduler", "mixed_chunk",
                                    "kv_admission", "num_scheduler_steps", "prefix_caching", "nccl_nvls",
                                    "host_overlap"}
    assert table["engine"]["host_overlap"] is True
    assert (table["engine"]["scheduler"], table["engine"]["kv_admission"]) == ("vllm-v1", "on_demand")
    assert table["delivery"]["network_rtt"] == "20 ms" and table["delivery"]["host_link_bw"] == "64 GB/s"
    assert table["deployment"]["fabric"] == {"kind": "switch", "algorithm": "auto", "nvls": True}  # the chip's
    # generation, left unset, is the chip's (catalog/chips.toml)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**40),
    name=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20),
    tp=st.sampled_from([1, 2, 4, 8]),
    interval=st.integers(1, 64),
    detokenize=st.sampled_from(["engine", "api-server", "detokenizer"]),
    rate=st.one_of(st.floats(0.01, 1e6), st.just("inf")),
    burstiness=st.floats(0.05, 20.0),
    requests=st.integers(1, 10**6),
    concurrency=st.one_of(st.none(), st.integers(1, 4096)),
    rtt_ms=st.integers(0, 1000),
)
def test_to_toml_round_trips_exactly(seed, name, tp, interval, detokenize, rate, burstiness, requests, concurrency,
                                     rtt_ms):
    overrides = {
        "seed": seed, "name": name, "deployment.tp": tp, "delivery.stream_interval": interval,
        "delivery.detokenize": detokenize, "workload.arrival.rate": rate, "workload.arrival.burstiness": burstiness,
        "workload.num_requests": requests, "workload.max_concurrency": concurrency,
        "delivery.network_rtt": f"{rtt_ms} ms",
        # Written as text, as a user would.
        "delivery.host_link_latency": "10 us",
    }
    s = load_scenario(None, {k: v for k, v in overrides.items() if v is not None})
    assert round_trip(s) == s



@pytest.mark.parametrize("engine", [
    {"engine.scheduler": "trtllm"},
    {"engine.scheduler": "trtllm", "engine.kv_admission": "on_demand", "engine.chunked_prefill": False},
    {"engine.scheduler": "prefill-first", "engine.num_scheduler_steps": 8},
    {"engine.scheduler": "prefill-first", "engine.mixed_chunk": True},
])
def test_to_toml_round_trips_scheduler_profiles(engine):
    s = load_scenario(None, engine)
    assert round_trip(s) == s
    written = tomllib.loads(s.to_toml())["engine"]
    assert written["scheduler"] == engine["engine.scheduler"]
    # The admission each profile takes by default is written out, so the file says what runs.
    assert written["kv_admission"] == engine.get("engine.kv_admission", "reserve" if s.engine.scheduler == "trtllm"
                                                 else "on_demand")

def test_to_toml_round_trips_the_default_scenario():
    s = load_scenario()
    assert round_trip(s) == s


@pytest.mark.parametrize("rtt", ["1002 ns", 0.0123456789012345])
def test_to_toml_round_trips_any_duration(rtt):
    s = load_scenario(None, {"delivery.network_rtt": rtt, "delivery.host_link_latency": "10 us"})
    assert round_trip(s).delivery.network_rtt == s.delivery.network_rtt


def test_to_toml_keeps_an_unset_slo_unset():
    s = load_scenario(None, {"slo.ttft": None, "delivery.host_link_latency": "10 us"})
    assert s.slo.ttft is None
    assert round_trip(s).slo.ttft is None


@pytest.mark.parametrize("value", [0, "0 ms", -1, "-1 s"])
def test_an_slo_target_of_no_time_is_refused(value):
    """Every request would miss it: 100% of requests missing a 0 s TTFT is not an answer but a typo. A negative
    one says the same (not the durations' "zero or more", which 0 is not for a target)."""
    with pytest.raises(UserError) as error:
        load_scenario(None, {"slo.ttft": value})
    assert "slo.ttft: an SLO target is a duration > 0" in str(error.value) and "\n" not in str(error.value)
