"""benchmarks/vs_aisimulate.py without AISimulate: how a latency row becomes its config, and how its
report is read back and scored the way validate scores the row."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmark_scripts import load_benchmark
from tokenpath.validate.latency import load_latency
from tokenpath.workload.requests import Requests

DATA = load_latency()


SCRIPT = load_benchmark("vs_aisimulate")


def _row(**match):
    return next(r for r in DATA["rows"] if all(r.get(k) == v for k, v in match.items()))


def test_a_tensorrt_llm_closed_loop_row_carries_its_layout_precisions_and_concurrency():
    row = _row(source="nim_h100", concurrency=50)
    config, not_carried = SCRIPT.aisim_config(row, Path("t.jsonl"), "fp8", host_loop=True)
    engine = config["engine"]
    assert engine["model"] == "meta-llama/Meta-Llama-3.1-70B" and engine["gemm_quant_mode"] == "fp8"
    assert engine["hardware"] == "h100_sxm" and engine["backend"] == "trtllm"
    assert engine["kvcache_quant_mode"] == "fp8"
    assert engine["workers"]["aggregated"] == {"parallelism": {"replicas": 1, "tensor": 2}}
    assert config["traffic"]["load"] == {"type": "concurrency", "concurrency": 50}
    # host_overlap = false is AISimulate's only TensorRT-LLM loop; eager_host = false, its kernels alone; its
    # graphs' padding has no field there
    assert not_carried == ["cuda_graph_padding=True"]


def test_an_sglang_moe_row_splits_its_experts_over_tp_and_lists_what_it_cannot_carry():
    row = _row(id="dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81")
    config, not_carried = SCRIPT.aisim_config(row, Path("t.jsonl"), "bf16", host_loop=True)
    engine = config["engine"]
    worker = engine["workers"]["aggregated"]
    assert engine["model"] == "deepseek-ai/DeepSeek-V3" and engine["kvcache_quant_mode"] == "bfloat16"
    assert worker["parallelism"] == {"replicas": 1, "tensor": 8, "moe_tensor": 8}
    assert worker["scheduler"] == {"max_batched_tokens": 2524} and engine["enable_chunked_prefill"] is True
    assert worker["host_loop"] is True
    assert sorted(not_carried) == ["cuda_graphs=decode", "mixed_chunk=True"]
    assert SCRIPT.aisim_config(row, Path("t.jsonl"), "bf16", host_loop=False)[0]["engine"]["workers"][
        "aggregated"]["host_loop"] is False


def test_a_vllm_v0_poisson_row_runs_at_the_traces_times_with_its_batch_limits():
    row = _row(source="sglang_vllm060", engine="vllm", model="llama-3.1-8b", rate=4.0)
    config, not_carried = SCRIPT.aisim_config(row, Path("t.jsonl"), "bf16", host_loop=True)
    worker = config["engine"]["workers"]["aggregated"]
    assert config["traffic"]["load"] == {"type": "trace_timestamps"}
    assert config["engine"]["enable_chunked_prefill"] is False
    assert worker["scheduler"] == {"max_sequences": 256, "max_batched_tokens": 4096}
    assert worker["kv_cache"] == {"capacity": {"memory_fraction": 0.9}}
    assert sorted(not_carried) == ["num_scheduler_steps=10", "scheduler=vllm-v0"]


def test_only_the_chips_aisimulate_lacks_keep_rows_out():
    reasons = {r["chip"]: SCRIPT.why_not(r) for r in DATA["rows"]}
    assert reasons["mi300x"] == "no mi300x in AISimulate's systems"
    assert reasons["a100-40gb"] == "no a100-40gb in AISimulate's systems"
    assert all(reason is None for chip, reason in reasons.items() if chip in SCRIPT.AISIM_CHIPS)


# Four requests sent in this order, 3 and 5 tokens out: TTFT 10, 30, 20, 40 ms; E2E 50, 70, 40, 100 ms.
_SENT = [(100, 3, 10.0, 50.0), (200, 5, 30.0, 70.0), (300, 3, 20.0, 40.0), (400, 5, 40.0, 100.0)]
_REQUESTS = Requests(np.zeros(4), np.array([s[0] for s in _SENT]), np.array([s[1] for s in _SENT]))


def _report(order):
    records = [{"session_id": f"request_{i + 1}", "input_length": _SENT[i][0], "requested_output_length": _SENT[i][1],
                "output_length": _SENT[i][1], "ttft_ms": _SENT[i][2], "e2e_latency_ms": _SENT[i][3],
                "terminal_status": "completed"} for i in order]
    return {"per_request": records, "mean_itl_ms": 7.5, "median_itl_ms": 6.5}


@settings(max_examples=20, deadline=None)
@given(st.permutations(range(4)))
def test_the_report_is_read_in_the_order_sent_whatever_order_it_lists(order):
    row = {"window": "steady", "concurrency": 1, "requests_per_slot": 4, "ttft_stat": "mean",
           "decode_metric": "tpot", "decode_stat": "median", "source": "test"}
    # steady at concurrency 1: 4 requests, the first 2 skipped as warm-up
    predicted = SCRIPT.aisim_predicted(row, _report(order), _REQUESTS)
    assert predicted["ttft_s"] == pytest.approx(0.030)  # (20 + 40) / 2 ms
    assert predicted["decode_s"] == pytest.approx(0.0125)  # median of (40 - 20) / 2 = 10 and (100 - 40) / 4 = 15


def test_itl_comes_from_the_whole_runs_summary_and_a_mismatched_report_is_refused():
    row = {"window": "whole", "num_requests": 4, "concurrency": 2, "lengths": "fixed", "ttft_stat": "median",
           "decode_metric": "itl", "decode_stat": "median", "source": "test"}
    predicted = SCRIPT.aisim_predicted(row, _report(range(4)), _REQUESTS)
    assert predicted == {"ttft_s": pytest.approx(0.025), "decode_s": pytest.approx(0.0065)}
    report = _report(range(4))
    report["per_request"][0]["input_length"] = 101
    with pytest.raises(RuntimeError, match="not the trace's requests"):
        SCRIPT.aisim_predicted(row, report, _REQUESTS)


def test_held_out_runs_are_the_unshipped_measured_runs_as_rows_both_tools_take(tmp_path):
    """--held-out draws AIConfigurator's runs that latency.toml does not ship, each a row with its measured
    means, which AISimulate's config carries as a shipped row of the same engine."""
    columns = ("id,silicon_data_source,backend,model_path,system,mode,isl,osl,gemm_quant_mode,tp_size,pp_size,"
               "attention_dp_size,moe_ep_size,batch_size,silicon_ttft_ms,silicon_tpot_ms")
    shipped = _row(source="aiconfigurator_silicon", engine="vllm", concurrency=4)["id"]
    runs = [
        f"{shipped},silicon_concurrency=4,vllm,meta-llama/Llama-3.1-70B,h100_sxm,agg,1024,1024,fp8,8,1,1,1,4,70.4,9.1",
        "new_run,silicon_concurrency=4,trtllm,meta-llama/Llama-3.1-70B,h200_sxm,agg,8192,1024,fp8,4,1,1,1,4,439.1,9.3",
        "other_chip,silicon_concurrency=4,vllm,meta-llama/Llama-3.1-70B,l40s,agg,1024,1024,fp8,4,1,1,1,4,99.0,9.0",
        "disaggregated,silicon_concurrency=4,vllm,meta-llama/Llama-3.1-70B,h200_sxm,disagg,1024,1024,fp8,4,1,1,1,4,99,9",
    ]
    csv = tmp_path / "silicon_sample.csv"
    csv.write_text("\n".join([columns, *runs]) + "\n")
    rows = SCRIPT.held_out_rows(DATA, 10, 1, csv)
    assert [row["id"] for row in rows] == ["new_run"]
    row = rows[0]
    assert (row["engine"], row["model"], row["chip"], row["tp"], row["concurrency"]) == ("trtllm", "llama-3.1-70b",
                                                                                         "h200", 4, 4)
    assert (row["input_len"], row["output_len"], row["ttft_ms"], row["decode_ms"]) == (8192, 1024, 439.1, 9.3)
    assert row["window"] == "profiling_phase" and SCRIPT.why_not(row) is None
    # (its max_batch_size is the run's batch_size, which the generator's max_num_tokens adds to the prompt)
    assert (row["engine_settings"]["max_num_seqs"], row["engine_settings"]["max_num_batched_tokens"]) == (4, 8704)
    config, not_carried = SCRIPT.aisim_config(row, Path("t.jsonl"), "fp8", host_loop=True)
    assert config["engine"]["workers"]["aggregated"]["parallelism"] == {"replicas": 1, "tensor": 4}
    assert config["traffic"]["load"] == {"type": "concurrency", "concurrency": 4}
    # (the generator pads TensorRT-LLM's decode graphs, up to its max_batch_size, as the shipped rows state; none of
    # it carries to AISimulate)
    assert not_carried == ["cuda_graphs=decode", "cuda_graph_padding=True", "cuda_graph_max_tokens=4"]
