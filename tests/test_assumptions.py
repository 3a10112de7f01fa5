"""The registry of assumptions: complete, each one read where it is used, overridable per scenario."""

import ast
import importlib
import json
import os
import pathlib
import pkgutil
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpath
from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario, simulate
from tokenpath.config.assumptions import BY_NAME, DELIVERY_FIELDS, PROFILE_DELIVERY_FIELDS, REGISTRY, lookup
from tokenpath.config.errors import UserError
from tokenpath.engine.profiles import PROFILES
from tokenpath.report.simulation import assumptions_line
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.document import result_document

SRC = pathlib.Path(tokenpath.__file__).parent
MODEL_PACKAGES = ("compute", "fabric", "engine", "delivery")

# Numeric module-level constants in the model packages that are not assumptions, each with why.
NOT_ASSUMPTIONS = {
    "tokenpath.compute.vector_search.D2H_COPY_LATENCY_S": "delivery.spec's registered constant, bound again from "
                                                          "the registry: the compute layer imports no other layer",
    "tokenpath.compute.model_spec.MAX_DIMENSION": "a bound on config input (int32 shapes), not a prediction",
    "tokenpath.compute.hf_config._LLAMA4_NO_ROPE_INTERVAL": "Llama 4's architecture (every 4th layer), a fact",
    "tokenpath.fabric.spec.MAX_FABRIC_HOSTS": "a bound on config input",
    "tokenpath.fabric.spec.MAX_ROUTERS": "a bound on config input",
    "tokenpath.fabric.spec.MAX_FULLMESH_HOSTS": "a bound on config input",
    "tokenpath.fabric.collectives._ROUTED_LATENCY_FLOWS": "where routing each flow stops paying off (speed only)",
    "tokenpath.engine.replica.MIN_DECODE_RUN": "when the loop takes decode steps at once: the same steps either way",
    "tokenpath.engine.replica.MAX_DECODE_RUN": "how many decode steps the loop takes at once at most: the same steps "
                                               "either way",
    "tokenpath.engine.requests._ID_BITS": "a packing of request ids into integers",
    "tokenpath.engine.requests._ID_MASK": "a packing of request ids into integers",
    "tokenpath.engine.spec.MAX_NUM_SEQS": "a bound on config input",
    "tokenpath.engine.costs.PP_HANDOFF_TENSORS": "the tensors the engines' code hands a pipeline's next stage "
                                                 "(hidden states and residual), a fact",
    "tokenpath.engine.eager_launches.SGLANG_FUSED_MXFP4_MOE_CALLS": "SGLang's calls for the block, counted in its "
                                                                    "code (cited there), a fact",
    "tokenpath.engine.speculative.MAX_SPECULATIVE_TOKENS": "a bound on config input",
    "tokenpath.engine.speculative._DRAW_BLOCK": "how many acceptance draws one numpy call makes (speed only)",
    "tokenpath.compute.drafter.EAGLE3_DRAFT_VOCAB": "the published EAGLE-3 heads' draft vocabulary, a fact",
    "tokenpath.engine.draft_slots.SGLANG_V2_DECODE_ALLOCATIONS": "SGLang's V2 worker's over-allocation per decode "
                                                                 "step, read in its code (cited there), a fact",
    "tokenpath.engine.spec.MAX_STEP_TOKENS": "a bound on config input",
    "tokenpath.engine.spec.MAX_BLOCK_SIZE": "a bound on config input",
    "tokenpath.engine.batch_limits.VLLM_V0_MAX_NUM_SEQS": "vLLM V0's own default (cited there), a fact",
    "tokenpath.engine.batch_limits.VLLM_V1_LARGEST_GPU_BYTES": "vLLM V1's own threshold for its defaults (cited "
                                                              "there), a fact",
    "tokenpath.engine.batch_limits.VLLM_V1_LARGE_GPU_BYTES": "vLLM V1's own threshold for its defaults (cited "
                                                             "there), a fact",
    "tokenpath.delivery.lastmile.ID_BYTES": "the size of an int32 token id, a data type",
    "tokenpath.delivery.spec.MAX_STREAM_INTERVAL": "a bound on config input",
    "tokenpath.delivery.spec.MAX_TOKENIZER_BATCH": "a bound on config input",
    "tokenpath.delivery.spec.TOKENIZER_BATCH_MAX": "vLLM's and SGLang's own default (cited there), a fact",
    "tokenpath.delivery.spec.MAX_HOST_COST_S": "a bound on config input",
    "tokenpath.delivery.spec.MAX_OVERHEAD_BYTES": "a bound on config input",
    "tokenpath.delivery.spec.MAX_BYTES_PER_TOKEN": "a bound on config input",
    "tokenpath.delivery.sse.MEMO_ENTRIES": "a cache size of the SSE framer (speed only)",
    "tokenpath.delivery.stream.CONTEXT_TOKENS": "the prompt tokens an output streams after, SGLang's own "
                                                "INIT_INCREMENTAL_DETOKENIZATION_OFFSET: it decides text, not a cost",
    "tokenpath.delivery.calibration.MAX_COST_S": "a bound on a calibration file's input",
    "tokenpath.delivery.request_measure.HANDOFF_PROMPT_TOKENS": "the prompt length the hand-off is timed at "
                                                                "(the measurement's setup, written in the file)",
    "tokenpath.delivery.request_measure.MAX_TOKENS": "a field of the sample request body that is timed",
    "tokenpath.delivery.request_measure.MIN_REPEAT_S": "the length of one timing loop (the measurement's method)",
    "tokenpath.engine.cluster._NEVER": "a sentinel time, later than any event",
    "tokenpath.engine.prefix_cache._PLAIN": "a marker in the free-block queue",
    "tokenpath.engine.cuda_graphs.VLLM_V0_CUDA_GRAPH_MAX_BS": "vLLM V0's own capture list (cited there), a fact",
    "tokenpath.engine.cuda_graphs.TRTLLM_CUDA_GRAPH_MAX_BS": "TensorRT-LLM's own capture default (cited there), a fact",
    "tokenpath.engine.batch_limits.SGLANG_SPECULATIVE_MAX_RUNNING": "SGLang's default with a drafter (cited), a fact",
    "tokenpath.engine.batch_limits.SGLANG_SPECULATIVE_MAX_RUNNING_BEFORE_0_4_5": "the same in 0.4.3-0.4.4, a fact",
    "tokenpath.engine.memory_share.DEFAULT_UTILIZATION": "vLLM's own default (cited there), a fact",
    "tokenpath.engine.memory_share.MIB": "a unit",
    "tokenpath.engine.batch_limits.SGLANG_RUNNING_PER_CONTEXT": "SGLang's own rule (cited there), a fact",
    "tokenpath.engine.batch_limits.SGLANG_RUNNING_FLOOR": "SGLang's own rule (cited there), a fact",
    "tokenpath.engine.batch_limits.SGLANG_RUNNING_CEILING": "SGLang's own rule (cited there), a fact",
    "tokenpath.engine.kv_blocks.DEFAULT_BLOCK_SIZE": "the launches write it (cited there), a setting",
    "tokenpath.engine.kv_blocks.VLLM_BLOCK_SIZE_0_34": "vLLM's own default (cited there), a fact",
    "tokenpath.engine.memory_share.VLLM_UTILIZATION_0_92": "vLLM's own default (cited there), a fact",
    "tokenpath.engine.tokenizer_batching.VLLM_TOKENIZER_BATCH_WAIT_S": "vLLM's own default (cited there), a fact",
    "tokenpath.engine.memory_share.VLLM_MEASURED_KV_MARGIN_FLOOR_BYTES": "vLLM's own margin (cited there), a fact",
    "tokenpath.engine.memory_share.VLLM_MEASURED_KV_MARGIN_FLOOR_BYTES_ROCM": "vLLM's own margin (cited there), a fact",
    "tokenpath.engine.memory_share.VLLM_MEASURED_KV_MARGIN_FRACTION": "vLLM's own margin (cited there), a fact",
    "tokenpath.engine.cuda_graphs.SGLANG_GRAPH_BATCH": "SGLang's own capture list (cited there), a fact",
    "tokenpath.engine.cuda_graphs.SGLANG_PREFILL_GRAPH_OPT_IN_TOKENS": "SGLang's own default (cited there), a fact",
    "tokenpath.engine.memory_share._SGLANG_PREFILL_GRAPH_MIB": "SGLang's own reserve (cited there), a fact",
    "tokenpath.engine.memory_share._SGLANG_MLA_PREFILL_GRAPHS_MIB": "SGLang's own reserve (cited there), a fact",
    "tokenpath.engine.cuda_graphs.SGLANG_MLA_PREFILL_GRAPH_TOKENS": "SGLang's own default (cited there), a fact",
    "tokenpath.engine.cuda_graphs.SGLANG_MLA_PREFILL_GRAPH_TOKENS_0_5_23": "SGLang's own default (cited there), a fact",
    "tokenpath.engine.memory_share._SGLANG_DRAFTER_DEFAULT_MIB": "SGLang's own reserve (cited there), a fact",
    "tokenpath.engine.memory_share._SGLANG_DRAFTER_DEFAULT_MIB_0_5_10": "SGLang's own reserve (cited there), a fact",
    **{f"tokenpath.engine.new_token_ratio.{name}": "SGLang's own scheduler default (cited there), a fact"
       for name in ("INIT_NEW_TOKEN_RATIO", "MIN_NEW_TOKEN_RATIO_FACTOR", "NEW_TOKEN_RATIO_DECAY_STEPS",
                    "RETRACT_DECODE_STEPS", "CLIP_MAX_NEW_TOKENS_ESTIMATION",
                    "ATTENTION_DP_CONSERVATIVENESS")},
    "tokenpath.engine.sliding_pool.SGLANG_SWA_FULL_TOKENS_RATIO": "SGLang's own default (cited there), a fact",
    "tokenpath.engine.routing.CACHE_THRESHOLD":
        "the modelled router's own setting (SGLang router default, cited there)",
    "tokenpath.engine.routing.BALANCE_ABS_THRESHOLD": "the modelled router's own setting (SGLang router default)",
    "tokenpath.engine.routing.BALANCE_REL_THRESHOLD": "the modelled router's own setting (SGLang router default)",
}


def _model_modules():
    for package in MODEL_PACKAGES:
        pkg = importlib.import_module(f"tokenpath.{package}")
        for info in pkgutil.iter_modules(pkg.__path__):
            yield f"tokenpath.{package}.{info.name}"


def _numeric_constants(module_name):
    """UPPER_CASE names assigned at module level whose value is an int or a float."""
    module = importlib.import_module(module_name)
    tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding="utf-8"))
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id.lstrip("_").isupper():
                value = getattr(module, target.id)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    yield target.id


def test_every_numeric_constant_of_the_model_packages_is_registered_or_excused():
    registered = {f"{a.module}.{a.constant}" for a in REGISTRY}
    found = {f"{m}.{name}" for m in _model_modules() for name in _numeric_constants(m)}
    missing = sorted(found - registered - set(NOT_ASSUMPTIONS))
    assert not missing, f"register these in tokenpath/config/assumptions.py (or excuse them here, with why): {missing}"
    assert not set(NOT_ASSUMPTIONS) - found, "an excused constant no longer exists: drop it from the list"
    assert registered <= found  # every registry entry names a real constant of a model package


def _assumed_calls():
    """(name, constant) of every assumed("name", CONSTANT) call in the source, and (name, None) of every
    assumptions.value("name") read (a run's Assumptions handed to the compute model)."""
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "assumed":
                name, default = node.args
                constant = default.attr if isinstance(default, ast.Attribute) else default.id
                yield name.value, constant
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "value"
                  and "assumptions" in (getattr(node.func.value, "id", None), getattr(node.func.value, "attr", None))
                  and isinstance(node.args[0], ast.Constant)):  # (a profile's own: PROFILE_DELIVERY_FIELDS)
                yield node.args[0].value, None


def test_every_assumption_is_read_through_the_registry_by_its_own_constant():
    calls = list(_assumed_calls())
    for name, constant in calls:
        assert constant is None or BY_NAME[name].constant == constant, \
            f"assumed({name!r}, {constant}) reads the wrong constant"
    # delivery ones are [delivery] defaults, or a profile's in their place
    read = {name for name, _ in calls} | set(DELIVERY_FIELDS) | set(PROFILE_DELIVERY_FIELDS)
    assert read == set(BY_NAME), f"registered but never read (an override would do nothing): {set(BY_NAME) - read}"
    named = {name for p in PROFILES.values() for name in (p.detokenize_assumption, p.output_assumption)}
    assert set(PROFILE_DELIVERY_FIELDS) <= named, "a profile's delivery assumption that no profile names"


def test_each_module_binds_its_constant_to_the_registry_s_value():
    for a in REGISTRY:
        assert getattr(importlib.import_module(a.module), a.constant) == a.value, f"{a.module}.{a.constant}"


def test_the_registry_lists_every_value_without_importing_the_model_packages():
    # The registry is the ground floor: it holds the values, so listing them loads no module above it.
    listed = subprocess.run(
        [sys.executable, "-c", "import json, sys; from tokenpath.config.assumptions import listing; "
                               "rows = listing(); print(json.dumps([sorted(m for m in sys.modules "
                               "if m.startswith('tokenpath.') and not m.startswith('tokenpath.config')), "
                               "{r['name']: r['value'] for r in rows}]))"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(SRC.parent)})
    loaded, values = json.loads(listed.stdout)
    assert loaded == [] and values == {a.name: a.value for a in REGISTRY}
    assert values["kernel_fixed_s"] == 2.45e-6 and values["scaleout_link_latency_s"] == 2.7e-6 / 4


def test_the_compute_model_reads_the_assumptions_it_is_handed_and_no_others():
    from tokenpath.compute.chip import load_chip
    from tokenpath.compute.model import load_model
    from tokenpath.compute.roofline import ComputeModel
    from tokenpath.config.assumptions import DEFAULTS, Assumptions

    model, changed = load_model("llama-3.1-8b"), Assumptions({"kernel_fixed_s": 5e-6, "serving_gemm_fraction": 0.4})
    plain = ComputeModel(model, load_chip("h100"), 1, "fp8", "bf16")
    handed = ComputeModel(model, load_chip("h100", changed), 1, "fp8", "bf16", assumptions=changed)
    assert plain.kernel_fixed_s == 2.45e-6 and handed.kernel_fixed_s == 5e-6
    assert handed.chip.matmul_efficiency["fp8"] == pytest.approx(plain.chip.matmul_efficiency["fp8"] * 0.4 / 0.85)
    with changed.active():  # a run's block changes nothing for a model handed other assumptions
        inside = ComputeModel(model, load_chip("h100", DEFAULTS), 1, "fp8", "bf16", assumptions=DEFAULTS)
    assert inside.kernel_fixed_s == 2.45e-6 and inside.chip.matmul_efficiency == plain.chip.matmul_efficiency


def test_every_entry_has_a_unit_a_source_and_a_guard():
    for a in REGISTRY:
        assert a.unit in ("s", "bytes", "B/s", "1") and len(a.source) > 20 and a.guarded_by
        assert a.value >= 0


def test_an_unknown_name_is_one_line_with_the_closest_names():
    with pytest.raises(UserError, match=r"assumptions.serving_gemm_fractoin: no such assumption; did you mean "
                                        r"'serving_gemm_fraction'"):
        load_scenario("typical", {"assumptions.serving_gemm_fractoin": 0.6})
    assert lookup("host_step_s").constant == "HOST_STEP_S"


@pytest.mark.parametrize("given, expected", [(2e-3, 2e-3), ("2 ms", 2e-3), ("1500 us", 1.5e-3), (0, 0.0)])
def test_values_take_the_registry_unit_or_a_string_with_a_unit(given, expected):
    scenario = load_scenario("typical", {"assumptions.host_step_s": given})
    assert scenario.resolved_assumptions().values == {"host_step_s": pytest.approx(expected, rel=1e-12)}


@pytest.mark.parametrize("name, value, message", [
    ("host_step_s", "2 GB", "host_step_s"), ("serving_gemm_fraction", "lots", "not a number"),
    ("serving_gemm_fraction", -1, "above 0 and at most 1"), ("serving_gemm_fraction", True, "not a number"),
    ("hbm_bw_efficiency", 0, "out of range"), ("hbm_bw_efficiency", 1.5, "at most 1"),
    ("host_link_bw_Bps", "0 GB/s", "at least 1 kB/s"), ("gemm_overlap_norm", 0.5, "at least 1"),
    ("activation_bytes", float("inf"), "not a finite number"), ("host_step_s", "2 s", "at most 1 s"),
    ("host_step_s", 760.9, "at most 1 s"), ("cpu_cores", 0.5, "a whole number above 0"),
    ("gemm_overlap_norm", "1_000", "not a number"),
    ("calibration", 3, "calibration file"),
])
def test_a_bad_value_names_the_assumption(name, value, message):
    with pytest.raises(UserError, match=message):
        load_scenario("typical", {f"assumptions.{name}": value})


# vLLM V1 without its async scheduling: its host time per step adds to every step (overlapped, it would hide
# behind steps longer than it)
SMALL = {"model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 2, "deployment.tp": 1,
         "engine.host_overlap": False, "workload.num_requests": 60, "workload.arrival.rate": 10.0,
         "workload.output": {"kind": "fixed", "value": 20}}
PERTURBED = {"assumptions.serving_gemm_fraction": 0.4, "assumptions.host_step_s": "4 ms",
             "assumptions.kernel_fixed_s": "5 us", "assumptions.base_latency_s": "20 us"}


def _latency(scenario, workers=1):
    return result_document(simulate(scenario, workers=workers))[0]["latency_s"]


def test_overrides_change_the_deployment_and_do_not_leak_into_the_next_scenario():
    base = load_scenario("typical", SMALL)
    perturbed = load_scenario("typical", {**SMALL, **PERTURBED})
    before = build_deployment(base)
    changed = build_deployment(perturbed)
    after = build_deployment(base)
    # vLLM V1 pays host_step_s per scheduler call: every step
    assert changed.compute.host_window_s == 4e-3
    assert before.compute.host_window_s == after.compute.host_window_s == lookup("host_step_s").value
    assert changed.chip.matmul_efficiency["fp8"] == pytest.approx(before.chip.matmul_efficiency["fp8"] * 0.4 / 0.85)
    assert changed.compute.kernel_fixed_s == 5e-6 and after.compute.kernel_fixed_s == 2.45e-6
    assert changed.collectives.base_latency_s == 20e-6 and after.collectives.base_latency_s == 6.6e-6
    # built objects keep their values outside the block they were built in
    assert changed.compute.step_time_s(1, 1, 100, 100) > 1.5 * before.compute.step_time_s(1, 1, 100, 100)
    assert _latency(base) == _latency(load_scenario("typical", SMALL))


def test_overrides_reach_forked_workers():
    perturbed = load_scenario("typical", {**SMALL, **PERTURBED})
    one, two = _latency(perturbed, workers=1), _latency(perturbed, workers=2)
    assert one == two
    assert one["tpot"]["p50"] > 1.5 * _latency(load_scenario("typical", SMALL))["tpot"]["p50"]


def test_delivery_assumptions_set_the_defaults_of_the_delivery_table():
    scenario = load_scenario("typical", {"assumptions.detokenize_per_token_s": "40 us"})
    assert scenario.resolved_delivery().detokenize_per_token == pytest.approx(40e-6)
    # A value the [delivery] table sets itself would win and the assumption change nothing: refused.
    with pytest.raises(UserError, match=r"assumptions\.detokenize_per_token_s: the scenario's \[delivery\] sets "
                                        r"detokenize_per_token itself, which wins; set delivery\.detokenize_per_token"):
        load_scenario("typical", {"assumptions.detokenize_per_token_s": "40 us",
                                  "delivery.detokenize_per_token": "1 us"})
    with pytest.raises(UserError, match=r"assumptions\.host_link_bw_Bps: the scenario's \[delivery\] sets "
                                        r"host_link_bw"):
        load_scenario("typical", {"assumptions.host_link_bw_Bps": "1 kB/s"})  # typical.toml's own 64 GB/s


def test_the_result_document_names_what_was_overridden():
    document = result_document(simulate(load_scenario("typical", {**SMALL, **PERTURBED})))[0]
    assert document["scenario"]["assumptions"]["overridden"] == {
        "serving_gemm_fraction": 0.4, "host_step_s": 0.004, "kernel_fixed_s": 5e-6, "base_latency_s": 2e-5}
    plain = result_document(simulate(load_scenario("typical", SMALL)))[0]
    assert plain["scenario"]["assumptions"] == {"overridden": {}, "calibrated": {}, "calibration_files": [],
                                                "delivery_fields": {}, "delivery_calibration": None}
    assert assumptions_line(plain["scenario"]["assumptions"]) == "the registry's defaults (`tokenpath assumptions`)"
    # A last-mile cost set in [delivery] itself is an override too, and the lines say each in its unit.
    own = result_document(simulate(load_scenario("typical", {**SMALL, "delivery.detokenize_per_token": "30 us"})))[0]
    assert own["scenario"]["assumptions"]["delivery_fields"] == {"detokenize_per_token_s": pytest.approx(30e-6)}
    assert assumptions_line(own["scenario"]["assumptions"]) == "overridden detokenize_per_token_s = 30 us"
    line = assumptions_line(document["scenario"]["assumptions"])
    assert line.startswith("overridden serving_gemm_fraction = 0.4, host_step_s = 4 ms,"), line


def test_assumptions_command_lists_every_one_as_json(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["assumptions", "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    rows = json.loads(out)
    assert [r["name"] for r in rows] == [a.name for a in REGISTRY]
    gemm = next(r for r in rows if r["name"] == "serving_gemm_fraction")
    assert gemm["value"] == 0.85 and gemm["unit"] == "1" and "TensorRT-LLM" in gemm["source"]
    path = tmp_path / "s.toml"
    path.write_text('[assumptions]\nhost_step_s = "3 ms"\n')
    rows = json.loads(run_cli(["assumptions", str(path), "--json", "-"], monkeypatch, capsys)[1])
    host = next(r for r in rows if r["name"] == "host_step_s")
    assert host["value"] == pytest.approx(3e-3) and host["origin"] == "scenario"
    assert host["default"] == lookup("host_step_s").value
    path.write_text("[assumptions]\nhost_stp_s = 1\n")
    assert_user_error(*run_cli(["simulate", str(path)], monkeypatch, capsys), "did you mean 'host_step_s'")


def test_explain_names_the_assumptions_behind_each_row(monkeypatch, capsys):
    from tokenpath.report.explain import explain

    simulation = simulate(load_scenario("typical", {**SMALL, "deployment.tp": 2, **PERTURBED}))
    step = explain(simulation)
    by_op = {op["op"]: op for op in step["ops"]}
    assert by_op["mlp_gate_up"]["assumptions"][-2:] == ["kernel_fixed_s", "gemm_fixed_s"]
    assert by_op["norms"]["assumptions"][-1] == "kernel_fixed_s" and "gemm_fixed_s" not in by_op["norms"]["assumptions"]
    assert {"serving_gemm_fraction", "hbm_bw_efficiency"} & set(by_op["mlp_gate_up"]["assumptions"])
    assert all(name in BY_NAME for op in step["ops"] for name in op["assumptions"])
    assert step["assumptions_changed"] == sorted(["serving_gemm_fraction", "host_step_s", "kernel_fixed_s",
                                                  "base_latency_s"])
    # (the CLI's console reads COLUMNS once, when it is made, possibly by an earlier test: widen it itself)
    from tokenpath.cli.app import console
    monkeypatch.setattr(console, "width", 200)
    code, out, err = run_cli(["simulate", "--model", "llama-3.1-8b", "--chip", "h100", "--chips", "1", "--tp", "1",
                              "--num-requests", "50", "--explain"], monkeypatch, capsys)
    assert code == 0, err
    host_rows = [line for line in out.splitlines() if "engine host time" in line]
    assert len(host_rows) == 1, out
    host_row = host_rows[0]
    assert "host_step_s" in host_row and "host_step_s*" not in host_row and "assumptions" in out


def test_a_delivery_calibration_joins_through_the_assumptions_table(tmp_path):
    from tokenpath.delivery.calibration import BatchCost, Calibration

    slow = tmp_path / "host.toml"
    Calibration([BatchCost(1, 1e-3, 1e-3, 0.0), BatchCost(256, 1e-3, 1e-3, 0.0)], machine={"cpu": "test"}).write(slow)
    engine = tmp_path / "engine.toml"
    engine.write_text('schema = "tokenpath.engine-calibration/1"\n[fitted.host_step_s]\nvalue = 0.002\n'
                      '[fitted.serving_gemm_fraction]\nvalue = 0.5\n')
    (tmp_path / "s.toml").write_text('[assumptions]\ncalibration = ["engine.toml", "host.toml"]\n'
                                     'serving_gemm_fraction = 0.6\n[delivery]\ncalibrated_server = "serve"\n')
    scenario = load_scenario(str(tmp_path / "s.toml"), SMALL)
    assert scenario.resolved_delivery().calibration == str(slow)
    resolved = scenario.resolved_assumptions()
    assert resolved.values == {"host_step_s": 0.002, "serving_gemm_fraction": 0.6}  # the scenario's own wins
    assert resolved.calibrated == {"host_step_s": str(engine)} and resolved.overridden == ("serving_gemm_fraction",)
    # the engine file's host time (2 ms a step, the registry's 0.875 ms) slows each step
    plain = load_scenario("typical", SMALL)
    assert _latency(scenario)["tpot"]["p50"] > _latency(plain)["tpot"]["p50"] + 0.5e-3
    # the host file's 1 ms a detokenized batch (this package's server's, which it prices) runs on the API
    # server, in the tokens' delivery
    engine_only = tmp_path / "e.toml"
    engine_only.write_text('[assumptions]\ncalibration = ["engine.toml"]\nserving_gemm_fraction = 0.6\n')
    def delivery_s(scenario):
        return result_document(simulate(scenario, workers=1))[0]["attribution_s"]["delivery"]
    assert delivery_s(scenario) > delivery_s(load_scenario(str(engine_only), SMALL)) + 1e-3
    before = scenario.fingerprint()
    engine.write_text(engine.read_text().replace("0.002", "0.003"))  # the file is part of the fingerprint
    assert load_scenario(str(tmp_path / "s.toml"), SMALL).fingerprint() != before


@given(st.floats(min_value=0, max_value=1, allow_nan=False), st.sampled_from(["s", "ms", "us", "ns"]))
def test_a_duration_assumption_takes_any_duration_string(number, unit):
    from tokenpath.config.assumptions import parse_value

    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]
    value = parse_value(lookup("host_step_s"), f"{number!r} {unit}", "assumptions.host_step_s")
    assert value == pytest.approx(number * scale, rel=1e-12, abs=1e-300)


@given(st.one_of(st.floats(allow_nan=True), st.integers(), st.text(max_size=20), st.booleans(), st.none()))
def test_a_plain_assumption_takes_a_non_negative_number_or_says_which(value):
    from tokenpath.config.assumptions import parse_value

    try:
        number = parse_value(lookup("serving_gemm_fraction"), value, "assumptions.serving_gemm_fraction")
    except UserError as error:
        assert str(error).startswith("assumptions.serving_gemm_fraction: ") and "\n" not in str(error)
    else:
        assert 0 < number <= 1 and not isinstance(value, bool)


def test_the_assumptions_table_must_be_a_table():
    with pytest.raises(UserError, match="assumptions: 5 is not a table"):
        load_scenario("typical", {"assumptions": 5})
