"""tokenpath search: the deployments it enumerates, those it refuses (impossible splits, too little
memory), the order it judges the rest in and what the bound skips, and its answer reproduced by
`tokenpath capacity`."""

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from tokenpath.cli.search import target_text
from tokenpath.config.errors import UserError
from tokenpath.engine.profiles import MEASURED_ENGINES, PROFILES
from tokenpath.sim.overrides import apply_overrides
from tokenpath.sim.scenario import read_scenario_table
from tokenpath.whatif import search as search_module
from tokenpath.whatif.capacity import parse_slo
from tokenpath.whatif.layouts import Candidate, enumerate_candidates, outside_domain, parse_engines, scaleup_domain
from tokenpath.whatif.objective import Prices
from tokenpath.whatif.run import Base
from tokenpath.whatif.search import Entry, Question, _judge, _Local, _State, classify

SMALL_8B = {"model.name": "llama-3.1-8b", "deployment.chip": "h100", "workload.num_requests": 50}


def _base(**overrides) -> Base:
    table, source, folder = read_scenario_table(None)
    return Base(apply_overrides(table, overrides), source, folder)


def _classified(base: Base, chips: int, disaggregated: bool = False) -> list[Entry]:
    scenario = base.scenario({"deployment.chips": chips})
    return [classify(base, candidate, scaleup_domain(scenario), None, "layouts")
            for candidate in enumerate_candidates(base, chips, ["vllm-v1"], disaggregated, moe=False)]


def test_8b_on_4_chips_is_every_split_the_model_allows():
    # Llama-3.1-8B: 32 heads (8 KV heads) and 32 layers, so every TP and PP dividing 4 chips is possible.
    entries = _classified(_base(**SMALL_8B, **{"deployment.chips": 4}), 4)
    assert {entry.candidate.layout for entry in entries} == {
        "TP1 x DP4", "TP1 x PP2 x DP2", "TP1 x PP4 x DP1", "TP2 x DP2", "TP2 x PP2 x DP1", "TP4 x DP1"}
    assert all(entry.stage == "pending" and entry.bound_per_s > 0 for entry in entries)
    split = _classified(_base(**SMALL_8B, **{"deployment.chips": 4}), 4, disaggregated=True)
    assert {entry.candidate.layout for entry in split} - {entry.candidate.layout for entry in entries} == {
        "TP1 x DP4 (1P:3D)", "TP1 x DP4 (2P:2D)", "TP1 x DP4 (3P:1D)", "TP2 x DP2 (1P:1D)"}


def test_splits_the_model_cannot_take_are_invalid_with_the_projects_reason():
    # On 6 chips: TP 3 and 6 do not divide 32 heads; PP 3 and 6 split 32 layers unevenly, as the engines
    # do (compute/roofline.py, pipeline_stage_layers).
    entries = {entry.candidate.layout: entry for entry in _classified(_base(**SMALL_8B, **{"deployment.chips": 6}), 6)}
    valid = {"TP1 x DP6", "TP1 x PP2 x DP3", "TP2 x DP3", "TP1 x PP3 x DP2", "TP2 x PP3 x DP1", "TP1 x PP6 x DP1"}
    assert {layout for layout, entry in entries.items() if entry.stage == "pending"} == valid
    assert "attention heads" in entries["TP3 x DP2"].reason
    assert all(entry.stage == "invalid" for layout, entry in entries.items() if layout not in valid)


def test_a_tensor_parallel_group_stays_inside_one_scale_up_domain():
    # 16 H100s are two 8-chip NVLink nodes by default: TP16 would cross the scale-out network.
    base = _base(**SMALL_8B, **{"deployment.chips": 16})
    domain = scaleup_domain(base.scenario())
    assert domain == 8
    assert outside_domain(Candidate(16, 16, 1, "vllm-v1", 1024, 8192), domain) == \
        "tp=16 spans more than one 8-chip scale-up domain"
    assert outside_domain(Candidate(16, 8, 1, "vllm-v1", 1024, 8192), domain) is None


def test_a_layout_that_cannot_hold_the_weights_is_pruned_by_memory():
    # Llama-3.1-70B has 70.6e9 parameters: 141 GB at bf16 on one chip, more than an H100's 80 GiB
    # (85.9 GB, of which the engine takes 90%); two chips hold 70.6 GB each, under 77.3 GB.
    base = _base(**{"deployment.chip": "h100", "model.precision": "bf16", "deployment.chips": 2,
                    "workload.num_requests": 50})
    entries = {entry.candidate.layout: entry for entry in _classified(base, 2)}
    assert entries["TP1 x DP2"].stage == "memory"
    assert "does not fit in h100's 80 GiB HBM" in entries["TP1 x DP2"].reason
    assert entries["TP2 x DP1"].stage == entries["TP1 x PP2 x DP1"].stage == "pending"


def _capacity(rate: float) -> dict:
    return {"request_rate": rate, "converged": True, "convergence": [], "simulations": 1}


def test_candidates_are_judged_highest_bound_first_and_skipped_below_the_best(monkeypatch):
    # Bounds 100, 90, 80, 66 req/s; capacities 60, 30, 70, 65. TP1 sets the best at 60; TP8's bound (90)
    # and TP2's (80) are above it, so both are searched, TP2 setting the best at 70; TP4's bound (66) is
    # below 70, so it is skipped though its capacity (65) would beat the first best.
    bounds, capacities = {1: 100.0, 8: 90.0, 2: 80.0, 4: 66.0}, {1: 60.0, 8: 30.0, 2: 70.0, 4: 65.0}
    judged = []

    def evaluate(base, overrides, slo, reference, tolerance, stability, workers, progress):
        tp = overrides["deployment.tp"]
        judged.append(tp)
        return {"stage": "searched", "capacity": _capacity(capacities[tp]), "simulations": 1}

    monkeypatch.setattr(search_module, "evaluate", evaluate)
    monkeypatch.setattr(search_module, "make_reference", lambda *args: None)
    entries = [Entry(Candidate(8, tp, 1, "vllm-v1", 1024, 8192), "layouts", bound_per_s=bounds[tp])
               for tp in (4, 2, 1, 8)]
    question = Question(8, parse_slo("tpot_p99=50ms"))
    _judge(_base(), question, entries, _State(entries=entries), _Local(), 1, lambda k: None, lambda k: None)
    assert judged == [1, 8, 2]
    stage = {entry.candidate.tp: entry.stage for entry in entries}
    assert stage == {1: "searched", 8: "searched", 2: "searched", 4: "bound"}
    assert entries[0].reason == "its bound, 66 req/s, is below TP2 x DP4's capacity, 70 req/s"
    assert [entry.candidate.tp for entry in search_module.ranked(question, entries)] == [2, 1, 8]


def test_goodput_prunes_below_the_best_s_goodput_not_its_rate(monkeypatch):
    # --slo is not the scenario's [slo]: TP1 serves 60 req/s, 30% of them within [slo] (goodput 18); TP2's
    # bound (50) is below TP1's rate but not its goodput, so TP2 is searched: 45 req/s, all within (45), the
    # best. TP4's bound (40) is below that goodput: skipped. Judged by rate TP2 was skipped, TP1 the answer.
    bounds, capacities = {1: 100.0, 2: 50.0, 4: 40.0}, {1: (60.0, 0.3), 2: (45.0, 1.0), 4: (39.0, 1.0)}
    judged = []

    def evaluate(base, overrides, slo, reference, tolerance, stability, workers, progress):
        tp = overrides["deployment.tp"]
        judged.append(tp)
        rate, within = capacities[tp]
        summary = {"throughput": {"requests_per_s": 1.0, "goodput_requests_per_s": within}}
        return {"stage": "searched", "capacity": {**_capacity(rate), "summary": summary}, "simulations": 1}

    monkeypatch.setattr(search_module, "evaluate", evaluate)
    monkeypatch.setattr(search_module, "make_reference", lambda *args: None)
    entries = [Entry(Candidate(8, tp, 1, "vllm-v1", 1024, 8192), "layouts", bound_per_s=bounds[tp]) for tp in (1, 2, 4)]
    question = Question(8, parse_slo("tpot_p99=50ms"), objective="goodput")
    _judge(_base(), question, entries, _State(entries=entries), _Local(), 1, lambda k: None, lambda k: None)
    assert judged == [1, 2]
    assert entries[2].reason == "its bound, 40 req/s, is below TP2 x DP4's goodput, 45 req/s"
    assert [entry.candidate.tp for entry in search_module.ranked(question, entries)] == [2, 1]


def test_the_screen_runs_at_the_best_s_last_length_and_bracket(monkeypatch):
    """A limit that binds at steady state can leave a short run unchanged (a tie there): the best is screened
    against at the length its capacity settled at."""
    from tokenpath.whatif.run import Outcome

    asked = []

    def simulate_many(base, overrides, workers, progress):
        asked.extend(overrides)
        return [Outcome(_run(0.5)) for _ in overrides]

    monkeypatch.setattr(search_module, "simulate_many", simulate_many)
    convergence = [{"num_requests": 100, "request_rate": 90.0, "above": 91.0},
                   {"num_requests": 400, "request_rate": 50.0, "above": 50.5}]
    best = Entry(Candidate(8, 1, 1, "vllm-v1", 1024, 8192), "layouts", "searched",
                 capacity={**_capacity(50.0), "convergence": convergence})
    reference = search_module.make_reference(_base(), best, 0.02, 1, None)
    assert reference.num_requests == 400 and reference.rates_per_s == pytest.approx((49.0, 50.5))
    assert [(run["workload.num_requests"], run["workload.arrival.rate"]) for run in asked] == [
        (400, pytest.approx(49.0)), (400, 50.5)]


def _run(ttft_p99_s: float, tag: str = "") -> dict:
    return {"requests": {"failed": 0}, "latency_s": {"ttft": {"p99": ttft_p99_s}, "tag": tag},
            "throughput": {}, "load": {"overloaded": False, "signs": []}}


@pytest.mark.parametrize("ttft_low_s, ttft_high_s, tag, stage", [
    (0.5, 0.5, "best", "tie"),             # both runs as the best's: nothing it changes binds
    (1.5, 2.0, "", "screen"),              # refused at the lower rate, where the best is accepted
    (0.5, 1.5, "", "close"),               # accepted at the lower, refused at the upper, as the best
    (0.5, 0.9, "", "searched"),            # accepted at both: it beats the best at that length
])
def test_the_screen_against_the_best(ttft_low_s, ttft_high_s, tag, stage, monkeypatch):
    from tokenpath.whatif.run import Outcome

    runs = [_run(ttft_low_s, tag), _run(ttft_high_s, tag)]
    best = (search_module.signature(_run(0.5, "best")), search_module.signature(_run(0.5, "best")))
    monkeypatch.setattr(search_module, "simulate_many", lambda *args: [Outcome(run) for run in runs])
    monkeypatch.setattr(search_module, "search", lambda *args: {"request_rate": 11.0, "simulations": 9})
    reference = search_module.Reference("TP2 x DP4", 2000, (10.0, 12.0), best)
    result = search_module.evaluate(_base(), {"deployment.tp": 1}, parse_slo("ttft_p99=1s"), reference, 0.01, 0.02, 2)
    assert result["stage"] == stage
    assert result["simulations"] == (11 if stage == "searched" else 2)
    assert result["screen"] == {"num_requests": 2000, "rates": [10.0, 12.0],
                                "accepted": [ttft_low_s <= 1, ttft_high_s <= 1]}


def test_on_ray_candidates_run_side_by_side_each_one_simulation_at_a_time(monkeypatch):
    # Two CPUs: TP1 and TP2 start together, before any best is known, so TP4 (bound 66) is judged
    # against TP1's 60 alone and searched; each task simulates one rate at a time.
    bounds, capacities = {1: 100.0, 2: 80.0, 4: 66.0}, {1: 60.0, 2: 70.0, 4: 65.0}
    calls = []

    def evaluate(base, overrides, slo, reference, tolerance, stability, workers, progress):
        calls.append((overrides["deployment.tp"], workers, progress))
        return {"stage": "searched", "capacity": _capacity(capacities[overrides["deployment.tp"]]), "simulations": 1}

    class Ref:
        def __init__(self, value):
            self.value = value

    class FakeRay:
        shut = False

        def is_initialized(self):
            return False

        def init(self, **options):
            pass

        def remote(self, function):
            return type("Task", (), {"remote": staticmethod(lambda *args: Ref(function(*args)))})

        def cluster_resources(self):
            return {"CPU": 2.0}

        def wait(self, refs, num_returns):
            return refs[:1], refs[1:]

        def get(self, ref):
            return ref.value

        def cancel(self, ref):
            pass

        def shutdown(self):
            FakeRay.shut = True

    monkeypatch.setitem(sys.modules, "ray", FakeRay())
    monkeypatch.setattr(search_module, "evaluate", evaluate)
    monkeypatch.setattr(search_module, "make_reference", lambda *args: None)
    entries = [Entry(Candidate(8, tp, 1, "vllm-v1", 1024, 8192), "layouts", bound_per_s=bounds[tp]) for tp in (1, 2, 4)]
    runner = search_module._Ray(None)
    _judge(_base(), Question(8, parse_slo("tpot_p99=50ms")), entries, _State(entries=entries), runner, 2,
           lambda k: None, lambda k: None)
    runner.close()
    assert calls == [(1, 1, None), (2, 1, None), (4, 1, None)]
    assert [entry.stage for entry in entries] == ["searched"] * 3 and FakeRay.shut


TINY = ["--model", "llama-3.1-8b", "--chip", "h100", "--chips", "2", "--num-requests", "100"]
PRECISION = ["--slo", "ttft_p99=300ms,tpot_p99=15ms", "--workers", "2", "--tolerance", "0.1", "--stability", "0.5"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A small search's JSON: Llama-3.1-8B on two H100s, 100 requests, a coarse capacity; its best
    deployment's vLLM launch files beside it, in launch/."""
    out = tmp_path_factory.mktemp("search") / "search.json"
    monkeypatch = pytest.MonkeyPatch()

    class Quiet:
        def readouterr(self):
            return "", ""

    code, _, _ = run_cli(["search", *TINY, *PRECISION, "--no-limits", "--json", str(out), "--emit", "vllm", "--out",
                          str(out.parent / "launch")], monkeypatch, Quiet())
    monkeypatch.undo()
    assert code == 0
    return out


def test_the_best_candidates_overrides_give_the_same_capacity(searched, monkeypatch, capsys):
    document = json.loads(searched.read_text())
    assert document["schema"] == "tokenpath.search/1"
    best = document["best"]
    assert best == document["candidates"][0] and best["rank"] == 1
    assert document["counts"]["enumerated"] == 3 and document["counts"]["searched"] >= 1
    sets = [arg for item in best["set"] for arg in ("--set", item)]
    code, out, err = run_cli(["capacity", *TINY, *PRECISION, *sets, "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["request_rate"] == best["request_rate"]


def test_emit_writes_the_launch_files_of_the_best_deployment(searched):
    best = json.loads(searched.read_text())["best"]
    script = (searched.parent / "launch" / "launch-vllm.sh").read_text()
    tp = best["overrides"]["deployment.tp"]
    assert f"--tensor-parallel-size {tp} " in script and f"--data-parallel-size {2 // tp} " in script


def test_a_search_json_makes_a_report_with_the_best_run_and_the_front(searched):
    from tokenpath.report.charts import search_front
    from tokenpath.report.views import load_inputs

    inputs = load_inputs([str(searched)])
    best = inputs.search["best"]
    assert [run.label for run in inputs.runs] == [f"best: {best['layout']} at {best['request_rate']:.4g} req/s"]
    # Three made-up candidates: the second has fewer requests per chip but a lower TTFT p99 (on the
    # front); the third is beaten on both by the first.
    rows = [dict(best, rank=1), dict(best, rank=2, layout="B", request_rate_per_chip=best["request_rate_per_chip"] / 2,
                                     ttft_p99_s=best["ttft_p99_s"] / 2),
            dict(best, rank=3, layout="C", request_rate_per_chip=best["request_rate_per_chip"] / 2,
                 ttft_p99_s=best["ttft_p99_s"] * 2)]
    inputs.search = dict(inputs.search, candidates=rows)
    figure = search_front(inputs)
    points = figure.chart.layer[1].data
    assert list(points["on the Pareto front"]) == [True, True, False]


@pytest.mark.parametrize("flags, fragment", [
    (["--chips", "0"], "deployment.chips"),
    (["--engines", "vllm-v1,fast"], "--engines: unknown engine 'fast'"),
    (["--engines", "fast", "--engines", "vllm-v1"], "--engines: unknown engine 'fast'"),  # every --engines is read
    (["--objective", "speed"], "--objective: unknown 'speed'; use rate-per-chip, cost, goodput"),
    (["--top", "0"], "--top: 0 must be at least 1"),
    (["--ray", "--workers", "2"], "--workers: Ray places candidates"),
    # every candidate would run on it: the search's error, not ten failed candidates and exit 0
    (["--set", "delivery.calibration=/no/such/file.toml", "--workers", "1"],
     "delivery.calibration = '/no/such/file.toml': no such file"),
    # a closed loop: no rate sets its load, so no candidate "meets the SLO at no rate"
    (["--max-concurrency", "4", "--workers", "1"],
     "search: the scenario's workload.max_concurrency holds at most 4 requests in flight"),
])
def test_a_bad_question_is_one_line(flags, fragment, monkeypatch, capsys):
    assert_user_error(*run_cli(["search", "--slo", "ttft_p99=1s", *flags], monkeypatch, capsys), fragment)


@given(st.lists(st.sampled_from(["vllm-v1", "vllm-v0", "prefill-first", "trtllm", "sglang", "vllm", " TRTLLM "]),
                min_size=1, max_size=6))
def test_engines_parse_to_profiles_in_order_once_each(names):
    parsed = parse_engines(",".join(names), "vllm-v1")
    wanted = [name.strip().lower() for name in names]
    wanted = list(dict.fromkeys(MEASURED_ENGINES.get(name, name) if name not in PROFILES else name for name in wanted))
    assert parsed == wanted


@given(st.text(alphabet="abcxyz-1", min_size=1, max_size=12))
def test_an_unknown_engine_is_one_line(name):
    if name.strip().lower() in PROFILES or name.strip().lower() in MEASURED_ENGINES or not name.strip(" ,"):
        return
    with pytest.raises(UserError, match="--engines: unknown engine"):
        parse_engines(f"vllm-v1,{name}", "vllm-v1")


@given(st.floats(min_value=1e-6, max_value=1e4), st.sampled_from(["s", None]))
def test_a_target_is_printed_as_slo_reads_it_back(limit, unit):
    name = "tpot_p99" if unit == "s" else "qoe_p10"
    if unit is None:
        limit = min(limit, 1.0)
    assert parse_slo(f"{name}={target_text({'target': limit, 'unit': unit})}")[name].limit == limit


def test_a_moe_models_splits_include_attention_data_parallel_where_tp_is_above_one():
    base = _base(**{"model.name": "qwen3-30b-a3b", "deployment.chips": 4, "deployment.tp": 1})
    layouts = {c.layout for c in enumerate_candidates(base, 4, ["vllm-v1"], False, moe=True)}
    assert {"TP2 x DP2 + DP-attention", "TP4 x DP1 + EP + DP-attention", "TP4 x DP1 + EP"} <= layouts
    assert not any("DP-attention" in layout and (layout.startswith("TP1 ") or "PP" in layout) for layout in layouts)
    candidate = next(c for c in enumerate_candidates(base, 4, ["vllm-v1"], False, moe=True) if c.attention_dp)
    assert candidate.overrides()["deployment.attention_dp"] is True


def test_a_moe_models_expert_parallel_splits_are_tried_with_deepeps_all_to_alls_too():
    """With its experts spread over tp > 1 chips, each split is tried with the tokens gathered (the engines'
    default) and sent by DeepEP's all-to-alls; TensorRT-LLM, which dispatches by all-to-all only over more
    expert ranks than a token's experts, is invalid there with the reason, SGLang is judged."""
    base = _base(**{"model.name": "qwen3-30b-a3b", "deployment.chips": 4, "deployment.tp": 1})
    found = enumerate_candidates(base, 4, ["prefill-first", "trtllm"], False, moe=True)
    layouts = {c.layout for c in found}
    assert {"TP4 x DP1 + EP (all-to-all)", "TP4 x DP1 + EP (all-to-all) + DP-attention", "TP2 x DP2 + EP",
            "TP2 x DP2 + EP (all-to-all)"} <= layouts
    assert not any(c.moe_all_to_all and (not c.expert_parallel or c.tp == 1 or c.pp > 1) for c in found)
    for scheduler, valid in (("prefill-first", True), ("trtllm", False)):
        [candidate] = [c for c in found if c.scheduler == scheduler and c.layout == "TP4 x DP1 + EP (all-to-all)"]
        assert candidate.overrides()["deployment.moe_all_to_all"] is True
        entry = classify(base, candidate, 8, None, "layouts")
        assert (entry.stage != "invalid") == valid
        if not valid:
            assert entry.reason.startswith("deployment.moe_all_to_all: TensorRT-LLM")


def test_an_sglang_attention_data_parallel_candidate_of_a_model_its_code_lacks_it_for_is_invalid():
    """SGLang's mixtral.py splits attention over the whole TP group: its DP-attention candidates are invalid,
    with the reason, while Qwen3-MoE's (qwen3_moe.py) are judged."""
    for model, valid in (("mixtral-8x7b", False), ("qwen3-30b-a3b", True)):
        base = _base(**{"model.name": model, "deployment.chips": 2, "deployment.tp": 1})
        [candidate] = [c for c in enumerate_candidates(base, 2, ["prefill-first"], False, moe=True)
                       if c.attention_dp and not c.expert_parallel]
        entry = classify(base, candidate, 8, None, "layouts")
        assert (entry.stage != "invalid") == valid
        if not valid:
            assert entry.reason.startswith("deployment.attention_dp: SGLang's model code for MixtralForCausalLM")


def test_a_trtllm_candidate_is_launched_tuned_unless_the_scenario_says():
    """trtllm-serve starts without chunked prefill, which refuses a prompt longer than the step's budget,
    and with unpadded decode graphs of 1-32, 64 and 128 sequences: the search turns chunked prefill on and
    pads graphs up to max_num_seqs (its commands carry both) where the scenario leaves them unset, and
    keeps the scenario's own settings otherwise."""
    long_prompts = {**SMALL_8B, "deployment.chips": 1, "deployment.tp": 1, "workload.input": {"kind": "fixed",
                    "value": 12000}, "workload.output": {"kind": "fixed", "value": 8}}
    base = _base(**long_prompts)
    del base.table["engine"]["chunked_prefill"]  # the embedded scenario states it; a user's may not
    [trtllm] = enumerate_candidates(base, 1, ["trtllm"], False, moe=False)
    [vllm] = enumerate_candidates(base, 1, ["vllm-v1"], False, moe=False)
    tuned = {"engine.chunked_prefill": True, "engine.cuda_graph_padding": True, "engine.cuda_graph_max_tokens": 2048}
    assert tuned.items() <= trtllm.overrides().items() and not tuned.keys() & vllm.overrides().keys()
    assert classify(base, trtllm, 8, None, "layouts").stage == "pending"
    unchunked = classify(base, Candidate(**{**trtllm.__dict__, "chunked_prefill": None}), 8, None, "layouts")
    assert unchunked.stage == "invalid" and "needs 12000 tokens in one step without chunked prefill" in unchunked.reason
    stated = _base(**long_prompts, **{"engine.chunked_prefill": False, "engine.cuda_graph_max_tokens": 64})
    assert not tuned.keys() & enumerate_candidates(stated, 1, ["trtllm"], False, moe=False)[0].overrides().keys()


def test_an_sglang_candidate_runs_its_own_running_requests_and_the_grid_moves_its_budget_alone():
    """SGLang sets its running requests from each candidate's KV pool (engine/batch_limits.py): the search
    leaves them to it, unless the scenario states them, and tries the token budget around its own."""
    from tokenpath.whatif.layouts import limit_grid, with_limits

    base = _base(**{**SMALL_8B, "deployment.chips": 2, "deployment.tp": 1})
    [sglang] = [c for c in enumerate_candidates(base, 2, ["prefill-first"], False, moe=False)
                if c.tp == 1 and c.pp == 1]
    assert sglang.max_num_seqs is None and "engine.max_num_seqs" not in sglang.overrides()
    assert sglang.limits == "own seqs, 8192 tokens"
    assert limit_grid(None, 8192) == [(None, 8192), (None, 4096), (None, 16384)]
    assert [(c.max_num_seqs, c.max_num_batched_tokens) for c in with_limits(sglang, (None, 8192))] == [
        (None, 4096), (None, 16384)]
    stated = _base(**{**SMALL_8B, "deployment.chips": 2, "deployment.tp": 1, "engine.max_num_seqs": 512})
    [pinned] = [c for c in enumerate_candidates(stated, 2, ["prefill-first"], False, moe=False)
                if c.tp == 1 and c.pp == 1]
    assert pinned.overrides()["engine.max_num_seqs"] == 512


def test_the_grid_of_limits_lists_each_pair_once_where_a_limit_halves_to_itself():
    """At max_num_seqs = 1, half of 1 sequence rounds back to 1: the grid listed (1, 4096) and (1, 16384)
    twice, so the limits phase judged and counted those variants twice (7 for 5)."""
    from tokenpath.whatif.layouts import limit_grid, with_limits

    assert limit_grid(1, 8192) == [(1, 8192), (1, 4096), (1, 16384), (2, 8192), (2, 4096), (2, 16384)]
    assert limit_grid(None, 1) == [(None, 1), (None, 2)]
    variants = with_limits(Candidate(2, 1, 1, "vllm-v1", 1, 8192), (1, 8192))
    assert [(c.max_num_seqs, c.max_num_batched_tokens) for c in variants] == [
        (1, 4096), (1, 16384), (2, 8192), (2, 4096), (2, 16384)]


def test_an_sglang_candidate_is_bounded_with_its_own_memory_share():
    """The bound replays every step as a graph; SGLang's default share reserves room per graph sequence,
    so the bound keeps the deployment's own share instead of one for graphs of every size (which came to
    a negative share and stopped the search)."""
    from tokenpath.sim.simulate import prepare
    from tokenpath.whatif.bound import _every_step_replayed, capacity_bound_per_s

    base = _base(**{**SMALL_8B, "deployment.chip": "h200", "deployment.chips": 1, "deployment.tp": 1,
                    "engine.scheduler": "prefill-first"})
    prepared = prepare(base.scenario())
    replayed = _every_step_replayed(prepared)
    assert replayed.deployment.memory_share == prepared.deployment.memory_share == pytest.approx(0.897, abs=0.03)
    assert replayed.deployment.kv_capacity_tokens == prepared.deployment.kv_capacity_tokens
    assert capacity_bound_per_s(prepared, None) > 0


def test_graphs_the_default_share_cannot_hold_are_one_line():
    from tokenpath.engine.spec import EngineSpec

    engine = EngineSpec(scheduler="prefill-first", cuda_graphs="all", cuda_graph_max_tokens=2**20)
    with pytest.raises(UserError, match="lower cuda_graph_max_tokens or max_num_batched_tokens, or set "
                                        "engine.gpu_memory_utilization"):
        engine.memory_share(141 * 2**30, 1, 1, False)


def _searched(rate_per_s: float, requests: int) -> Entry:
    """A candidate at `rate_per_s` whose capacity run sent `requests` requests of 150 output tokens, 95% of
    them within the SLO, the run's window its sends and a drain of 10 s."""
    window_s = requests / rate_per_s + 10.0
    summary = {"requests": {"output_tokens_mean": 150.0},
               "throughput": {"requests_per_s": requests / window_s, "output_tokens_per_s": requests * 150 / window_s,
                              "goodput_requests_per_s": 0.95 * requests / window_s},
               "resolved": {"deployment": {"chip": "h200"}}}
    candidate = Candidate(8, 1, 1, "vllm-v1", None, 8192)
    return Entry(candidate, "layouts", "searched", capacity={"request_rate": rate_per_s, "summary": summary})


@pytest.mark.parametrize("objective", ["cost", "goodput"])
def test_cost_and_goodput_rank_by_the_capacity_not_by_how_long_its_run_was(objective):
    # The same chips and price: the higher capacity is cheaper per token and serves more goodput, though its
    # search stopped at a shorter run, whose window is more of a drain (its counts per second read lower)
    prices = Prices({"h200": 3.5}, {"h200": "test"})
    question = Question(8, parse_slo("ttft_p99=1s"), objective=objective, prices=prices)
    higher, lower = _searched(58.5, 2000), _searched(56.9, 8000)
    assert higher.capacity["summary"]["throughput"]["requests_per_s"] < lower.capacity["summary"]["throughput"][
        "requests_per_s"]
    assert search_module.ranked(question, [lower, higher]) == [higher, lower]
    value = search_module.objective_value(question, higher)
    assert value == pytest.approx(58.5 * 0.95 if objective == "goodput" else 8 * 3.5 / 3600 / (58.5 * 150) * 1e6)


def test_cost_prices_the_chips_the_application_runs_on_with_the_deployment():
    """A reranker on an H100 of its own costs its price beside the deployment's eight H200s."""
    prices = Prices({"h200": 3.5, "h100": 2.0}, {"h200": "test", "h100": "test"})
    question = Question(8, parse_slo("ttft_p99=1s"), objective="cost", prices=prices, application_chips={"h100": 1})
    value = search_module.objective_value(question, _searched(58.5, 2000))
    assert value == pytest.approx((8 * 3.5 + 2.0) / 3600 / (58.5 * 150) * 1e6)


@pytest.mark.parametrize("address", ["bogus", "http://10.0.0.5:6379"])
def test_a_ray_address_that_is_not_one_is_a_one_line_error_in_search(address, monkeypatch, capsys):
    # As sweep's: search passed it to ray.init, whose ValueError ("Invalid address format") was a traceback.
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is imported
    argv = ["search", "--model", "llama-3.1-8b", "--chip", "h100", "--chips", "2", "--slo", "ttft_p99=1s",
            "--ray-address", address]
    assert_user_error(*run_cli(argv, monkeypatch, capsys), f"--ray-address: {address!r} is not a Ray cluster's "
                      "address; give 'auto'", "or HOST:PORT")


def test_ray_refusing_an_address_is_a_one_line_error_in_search(monkeypatch, capsys):
    import types

    def init(**kwargs):
        raise ConnectionError(f"Could not connect to {kwargs['address']}.\nIs it running?")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", fake)
    argv = ["search", "--model", "llama-3.1-8b", "--chip", "h100", "--chips", "2", "--slo", "ttft_p99=1s",
            "--num-requests", "100", "--ray-address", "10.0.0.5:6379"]
    assert_user_error(*run_cli(argv, monkeypatch, capsys), "--ray-address: cannot join the Ray cluster at "
                      "'10.0.0.5:6379' (Could not connect to 10.0.0.5:6379.)", "HOST:PORT")


def test_a_speculative_deployments_bound_is_above_a_rate_it_serves_within_the_slo():
    """Speculating, a sequence gains 3.36 tokens a verify step (4 drafts, acceptance 0.8), so a request takes
    that many times fewer steps and its TPOT is the step over those tokens. Llama-3.1-8B on one H100 with an
    n-gram drafter serves 64 req/s at tpot_p99 <= 10 ms, settled; the bound took one token a step and a step
    within 10 ms, 50.2 req/s, and would have skipped it below a best of 55."""
    from tokenpath.sim.simulate import prepare
    from tokenpath.whatif.bound import capacity_bound_per_s, decode_tokens_per_step, step_limit_s
    from tokenpath.whatif.capacity import Point, ok
    from tokenpath.whatif.run import simulate_many

    base = _base(**{**SMALL_8B, "deployment.chips": 1, "deployment.tp": 1, "engine.chunked_prefill": True,
                    "engine.speculative": {"method": "ngram", "num_speculative_tokens": 4},
                    "workload.draft_acceptance": 0.8, "workload.arrival.rate": 64.0, "workload.num_requests": 800})
    slo = parse_slo("ttft_p99=1s,tpot_p99=10ms")
    scenario = base.scenario()
    assert decode_tokens_per_step(scenario) == pytest.approx(3.3616)
    assert step_limit_s(slo, 3.3616) == pytest.approx(0.033616)
    assert step_limit_s(parse_slo("itl_p99=10ms,tpot_p99=10ms"), 3.3616) == pytest.approx(0.01)
    [run] = simulate_many(base, [{}], 1)
    assert ok(Point(64.0, run), slo) and run.summary["load"]["settled"]
    bound = capacity_bound_per_s(prepare(scenario), step_limit_s(slo, decode_tokens_per_step(scenario)))
    assert 64.0 < bound < 80.0


def test_a_candidate_within_the_search_s_stability_of_the_best_is_not_told_apart():
    # 2% (the default stability): 57.5 req/s is 1.7% under 58.5, 56.9 is 2.7% under.
    question = Question(8, parse_slo("ttft_p99=1s"))
    best = _searched(58.5, 2000)
    assert search_module._within_stability(question, best, _searched(57.5, 8000))
    assert not search_module._within_stability(question, best, _searched(56.9, 8000))
