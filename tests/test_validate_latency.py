"""The latency validation group: its published rows and how each row becomes a scenario (its medians' guard:
test_validate_cross.py, on the simulations its fits share)."""

import numpy as np
import pytest

from benchmark_scripts import load_benchmark
from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.config.assumptions import lookup
from tokenpath.config.errors import UserError
from tokenpath.sim.run import Run
from tokenpath.sim.simulate import prepare, simulate
from tokenpath.validate.latency import (
    MAX_SIMULATED_REQUESTS,
    load_latency,
    measured,
    predict_row,
    relative_errors,
    row_prepared,
    row_scenario,
    run_prediction,
    sharegpt_lengths,
    simulated_requests,
)

DATA = load_latency()


def test_the_rows_cover_what_the_group_promises():
    rows, sources = DATA["rows"], DATA["sources"]
    assert len(rows) >= 24
    assert len({r["source"] for r in rows}) >= 4 and all(r["source"] in sources for r in rows)
    assert all(sources[name]["url"].startswith("https://") for name in sources)
    assert {r["engine"] for r in rows} == {"vllm", "sglang", "trtllm"}
    assert len({r["chip"] for r in rows}) >= 2
    assert {"fixed", "sharegpt"} <= {r["lengths"] for r in rows}
    assert {"poisson", "concurrency"} <= {r["arrival"] for r in rows}
    assert sum(bool(r.get("calibration")) for r in rows) == 4


def test_every_row_names_a_known_model_chip_statistic_and_metric():
    for row in DATA["rows"]:
        load_model(row["model"]), load_chip(row["chip"])
        assert row["ttft_stat"] in ("mean", "median") and row["decode_stat"] in ("mean", "median")
        assert row["decode_metric"] in ("tpot", "itl")
        assert row["ttft_ms"] > 0 and row["decode_ms"] > 0
        assert row["window"] in ("whole", "steady", "profiling_phase")


@pytest.mark.parametrize("row, expected", [
    ({"window": "whole", "num_requests": 3200, "arrival": "poisson"}, (MAX_SIMULATED_REQUESTS, 0)),
    ({"window": "whole", "num_requests": 300, "arrival": "poisson"}, (300, 0)),
    # one request at a time: a short run is lengthened only to average the sampled lengths
    ({"window": "whole", "num_requests": 10, "arrival": "concurrency", "concurrency": 1}, (100, 0)),
    ({"window": "whole", "num_requests": 80, "arrival": "concurrency", "concurrency": 16}, (80, 0)),
    # steady state: 10 requests per slot, the first 2 per slot skipped
    ({"window": "steady", "arrival": "concurrency", "concurrency": 25}, (250, 50)),
    ({"window": "steady", "arrival": "concurrency", "concurrency": 1}, (100, 2)),
    # AIPerf's profiling phase, after a drained warm-up phase: its requests alone, none skipped
    ({"window": "profiling_phase", "arrival": "concurrency", "concurrency": 64, "requests_per_slot": 20}, (1280, 0)),
    ({"window": "profiling_phase", "arrival": "concurrency", "concurrency": 4, "requests_per_slot": 20}, (80, 0)),
])
def test_simulated_requests_follow_the_window(row, expected):
    assert simulated_requests(row) == expected


def test_an_unknown_window_is_refused():
    with pytest.raises(ValueError, match="unknown window 'rolling'"):
        simulated_requests({"source": "test", "window": "rolling", "arrival": "poisson", "num_requests": 10})


def _row(**changes):
    base = {"source": "test", "engine": "vllm", "model": "llama-3.1-8b", "precision": "bf16", "chip": "h100",
            "tp": 1, "lengths": "fixed", "input_len": 500, "output_len": 50, "arrival": "poisson", "rate": 2.0,
            "num_requests": 120, "window": "whole", "ttft_stat": "median", "decode_stat": "mean",
            "decode_metric": "tpot"}
    return {**base, **changes}


def test_a_row_becomes_the_scenario_it_was_measured_as():
    poisson = row_scenario(_row(engine_settings={"chunked_prefill": False, "max_num_seqs": 256}), DATA["sharegpt"])
    assert poisson.workload.arrival.rate == 2.0 and poisson.workload.max_concurrency is None
    assert poisson.workload.num_requests == 120
    assert (poisson.workload.input.kind, poisson.workload.input.value) == ("fixed", 500)
    assert not poisson.engine.chunked_prefill and poisson.engine.max_num_seqs == 256
    assert (poisson.deployment.chips, poisson.deployment.tp) == (1, 1)
    assert poisson.delivery.network_rtt == 0
    closed = row_scenario(_row(arrival="concurrency", concurrency=16, tp=4, model="llama-3.1-70b"), DATA["sharegpt"])
    assert closed.workload.arrival.rate == float("inf") and closed.workload.max_concurrency == 16
    assert (closed.deployment.chips, closed.deployment.tp) == (4, 4)


def test_a_row_is_simulated_as_the_release_it_states():
    """engine_version is the row's engine.version (engine/release.py), which selects each release's rules:
    vLLM before 0.7.1 caches DeepSeek's attention expanded per head, SGLang 0.5.3rc0 keeps 0.5.2's memory
    share and graph batches; text that starts with no release number is the newest, as is no version."""
    deepseek = {"model": "deepseek-v3", "precision": "fp8", "chip": "h200", "tp": 8}
    old = row_scenario(_row(engine_version="0.7.0", **deepseek), DATA["sharegpt"])
    new = row_scenario(_row(engine_version="0.7.1", **deepseek), DATA["sharegpt"])
    assert (old.engine.version, old.engine.latent_attention, new.engine.latent_attention) == ("0.7.0", False, True)
    sglang = row_scenario(_row(engine="sglang", engine_version="0.5.3rc0", model="llama-3.1-70b", chip="h100", tp=8),
                          DATA["sharegpt"])
    assert sglang.engine.memory_share(80 * 2**30, 8, 1, False) == round((81920 - 13.5 * 1024) / 81920, 3)
    assert sglang.engine.graph_max_tokens(80 * 2**30, 8) == 160
    for stated in ("lmsysorg/sglang:dev (early 2025)", ""):
        assert row_scenario(_row(engine="sglang", engine_version=stated), DATA["sharegpt"]).engine.latent_attention
    pinned = row_scenario(_row(engine_version="0.6.0", engine_settings={"version": "0.8.0"}), DATA["sharegpt"])
    assert pinned.engine.version == "0.8.0"  # engine_settings go over the stated release


def test_a_rows_client_path_sets_its_last_mile():
    """A row goes through the server's front end as its client did, every cost at the registry's and the
    chat template's rendering only on a chat endpoint; a row measured at the engine, and a closed loop of
    fixed lengths (validate/latency.locked_loop), have none."""
    completions = row_scenario(_row(), DATA["sharegpt"]).resolved_delivery()
    assert completions.frontend_per_request == lookup("frontend_per_request_s").value
    assert completions.tokenize_per_token == lookup("tokenize_per_token_s").value
    assert completions.detokenize_per_token == lookup("detokenize_per_token_s").value
    assert completions.chat_template_per_request == 0 and completions.network_rtt == 0
    assert completions.bytes_per_token == completions.event_overhead_bytes == completions.request_overhead_bytes == 0
    chat = row_scenario(_row(endpoint="chat", chat_template_tokens=30, network_rtt_ms=20.0), DATA["sharegpt"])
    assert chat.resolved_delivery().chat_template_per_request == lookup("chat_template_per_request_s").value
    assert chat.resolved_delivery().network_rtt == pytest.approx(0.02)
    assert chat.workload.chat_template_tokens == 30
    assert prepare(chat).requests.input_tokens.tolist() == [530] * 120  # the client's 500 and the template's 30
    for row in (_row(endpoint="engine"), _row(arrival="concurrency", concurrency=16)):
        engine_side = row_scenario(row, DATA["sharegpt"]).resolved_delivery()
        assert engine_side.frontend_per_request == engine_side.tokenize_per_token == 0
        assert engine_side.detokenize_per_token == engine_side.frame_per_event == 0


def test_a_burst_queues_in_the_front_end_before_the_engine_sees_it():
    """All 50 prompts of 500 tokens sent at once: the API server reads and parses each (frontend_per_request)
    before it tokenizes the first, as an asyncio server's tasks take turns, so the k-th (from 1) reaches
    the engine after 50 parses and k tokenizations, and the mean TTFT is at least the 50 parses longer
    than the same burst's measured at the engine (the first request, alone at an idle engine, is
    prefilled alone: its first token comes sooner than in the burst's first batch)."""
    row = _row(arrival="all_at_once", num_requests=50)
    parse_s, tokenize_s = lookup("frontend_per_request_s").value, 500 * lookup("tokenize_per_token_s").value
    through = simulate(row_prepared(row, DATA["sharegpt"])).run
    at_engine = simulate(row_prepared({**row, "endpoint": "engine"}, DATA["sharegpt"])).run
    handed_s = np.sort(through.upload_ns) / 1e9
    assert handed_s == pytest.approx(50 * parse_s + np.arange(1, 51) * tokenize_s, abs=2e-9)
    assert through.ttft_ns.mean() - at_engine.ttft_ns.mean() >= 50 * parse_s * 1e9


def test_uniform_rows_draw_from_one_to_twice_the_published_mean():
    row = _row(lengths="uniform", input_mean=500.0, output_mean=250.0, input_max=1000, output_max=500,
               num_requests=2000)
    requests = prepare(row_scenario(row, DATA["sharegpt"])).requests
    assert requests.input_tokens.min() >= 1 and requests.input_tokens.max() <= 1000
    assert abs(requests.input_tokens.mean() / 500 - 1) < 0.03
    assert abs(requests.output_tokens.mean() / 250 - 1) < 0.03


def test_sharegpt_rows_keep_the_published_mean_within_the_clients_filter():
    row = _row(lengths="sharegpt", input_mean=224.234, output_mean=189.084, num_requests=2000)
    prompt, completion = sharegpt_lengths(row, DATA["sharegpt"])
    assert prompt["kind"] == completion["kind"] == "lognormal" and prompt["max"] == 1024
    requests = prepare(row_scenario(row, DATA["sharegpt"])).requests
    assert requests.input_tokens.min() >= 4 and requests.input_tokens.max() <= 1024
    assert requests.output_tokens.max() <= 2044
    # the clip at 1024 trims the lognormal's tail: the mean stays within 6% of the published one
    assert abs(requests.input_tokens.mean() / 224.234 - 1) < 0.06
    assert abs(requests.output_tokens.mean() / 189.084 - 1) < 0.06


def test_measured_skips_the_warm_up_and_follows_the_metric_definitions():
    run = simulate(row_scenario(_row(arrival="concurrency", concurrency=4, num_requests=40), DATA["sharegpt"])).run
    values = measured(run, skip=8)
    assert np.array_equal(values["ttft"], run.ttft_ns[8:] / 1e9)
    expected_tpot = (run.e2e_ns[8:] - run.ttft_ns[8:]) / (run.output_tokens[8:] - 1) / 1e9
    assert np.allclose(values["tpot"], expected_tpot)
    # every gap between streamed tokens of the kept requests: 49 per request at 50 tokens
    assert len(values["itl"]) == 32 * 49
    assert np.allclose(np.sort(measured(run, skip=0)["itl"]), np.sort(run.itl_ns() / 1e9))


def test_a_run_too_large_to_keep_token_times_still_gives_ttft_and_tpot(monkeypatch):
    """Past the limit of kept token times a run carries an ITL histogram only: TTFT and TPOT rows are
    still predicted after a warm-up, and an ITL row gets a one-line reason instead of a crash."""
    monkeypatch.setattr("tokenpath.sim.simulate.KEEP_TOKENS_LIMIT", 100)
    row = _row(arrival="concurrency", concurrency=4, num_requests=40)
    run = simulate(row_scenario(row, DATA["sharegpt"])).run
    assert run.token_client_ns is None
    values = measured(run, skip=8)
    assert "itl" not in values and len(values["tpot"]) == 32
    with pytest.raises(ValueError, match="kept no per-token times"):
        run.itl_ns()
    assert predict_row(row, DATA["sharegpt"])["decode_s"] > 0
    with pytest.raises(UserError, match="its ITL needs every token's time"):
        predict_row(_row(decode_metric="itl"), DATA["sharegpt"])


def test_a_row_measured_by_sglangs_bench_serving_against_sglang_takes_its_per_token_itl():
    """The row's client comes from its source's `client`; SGLang's bench_serving spreads an event's gap
    over its tokens against SGLang, and times one gap an event against vLLM (`--backend vllm`)."""
    sglang = next(r for r in DATA["rows"] if r["source"] == "datacrunch_h200" and r["decode_metric"] == "itl")
    vllm = {**next(r for r in DATA["rows"] if r["source"] == "sglang_vllm060" and r["engine"] == "vllm"),
            "decode_metric": "itl"}
    assert "bench_serving" in sglang.get("client", "") and "bench_serving" in vllm.get("client", "")
    # One request, events of 1, 3 and 1 tokens reaching the client at 100, 130 and 140 ms, sent at 0.
    ms = 1_000_000
    times = np.array([100, 130, 130, 130, 140], np.int64) * ms
    run = Run("simulate", np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64), np.array([5]),
              np.array([100 * ms]), np.array([100 * ms]), np.array([140 * ms]), times, np.array([0, 5]))
    # per token: 30/3 ms three times, then 10 ms; per event: 30 and 10 ms
    assert run_prediction({**sglang, "decode_stat": "median"}, run)["decode_s"] == pytest.approx(0.010)
    assert run_prediction({**vllm, "decode_stat": "median"}, run)["decode_s"] == pytest.approx(0.020)


def test_a_prediction_uses_the_rows_statistic():
    row = _row(ttft_stat="median", decode_stat="mean", decode_metric="itl")
    values = measured(simulate(row_scenario(row, DATA["sharegpt"])).run, skip=0)
    predicted = predict_row(row, DATA["sharegpt"])
    assert predicted["ttft_s"] == pytest.approx(np.median(values["ttft"]), rel=1e-12)
    assert predicted["decode_s"] == pytest.approx(np.mean(values["itl"]), rel=1e-12)
    assert predicted["ttft_s"] != pytest.approx(np.mean(values["ttft"]), rel=1e-6)


def test_a_row_stating_its_throughput_gets_a_throughput_error():
    """For the bands file (sim/bands.py): output tokens over the measured requests' window, first send
    to last byte, against the row's `also.throughput_tokens_per_s`."""
    row = _row(arrival="concurrency", concurrency=4, window="steady", ttft_ms=100.0, decode_ms=10.0)
    _, skip = simulated_requests(row)
    run = simulate(row_scenario(row, DATA["sharegpt"])).run.after(skip)
    tokens_per_s = run.output_tokens.sum() / ((run.sent_ns + run.e2e_ns).max() - run.sent_ns.min()) * 1e9
    predicted = predict_row(row, DATA["sharegpt"])
    assert predicted["output_tokens_per_s"] == pytest.approx(tokens_per_s, rel=1e-12)
    assert "throughput" not in relative_errors(row, predicted)
    stated = {**row, "also": {"throughput_tokens_per_s": 250.0}}
    assert relative_errors(stated, predicted)["throughput"] == pytest.approx(tokens_per_s / 250.0 - 1, rel=1e-12)
    # A calibration's fit predicts the two latencies only: no throughput error, no failure.
    latencies = {key: predicted[key] for key in ("ttft_s", "decode_s")}
    assert set(relative_errors(stated, latencies)) == {"ttft", "decode"}


def test_the_unshipped_silicon_check_predicts_runs_as_the_shipped_rows_are_predicted():
    """benchmarks/aiconfigurator_silicon.py must build its rows as latency.toml's AIConfigurator rows are
    written, or its figures would not check the same model."""
    script = load_benchmark("aiconfigurator_silicon")
    shipped = [r for r in DATA["rows"] if r["source"] == "aiconfigurator_silicon"]
    assert len(shipped) == 13
    for row in shipped:
        # every setting, both ways: one the shipped rows state and the script leaves out changes the runs too
        # (the vLLM runs' date, as silicon_sample states it for all of them, sets two: latency.toml's launch)
        measured = "2025-10-29" if row["engine"] == "vllm" else None
        # each shipped run's batch_size, as silicon_sample states it, is its concurrency
        assert script.engine_settings(row["engine"], row["input_len"], row["concurrency"], measured=measured) \
            == row["engine_settings"], row["id"]
        assert row["window"] == "profiling_phase" and row["requests_per_slot"] == script.REQUESTS_PER_SLOT
