"""`tokenpath application import`: a RAG request's OTLP and LangSmith traces as stages whose critical path
gives back the root span's duration to the nanosecond, an agent's trace of several model calls as a loop
whose rounds do likewise, the same tree in both formats giving the same table, malformed input a one-line
error, and the written TOML a scenario `simulate` runs."""

import copy
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli, simulate_json
from tokenpath.application.timeline import draw_latencies_ns, timeline
from tokenpath.application.traces import import_documents, import_file
from tokenpath.config.errors import UserError

DATA = Path(__file__).parent / "data" / "traces"
OTLP_RAG, LANGSMITH_RAG = DATA / "rag_otlp.jsonl", DATA / "rag_langsmith.json"
OTLP_AGENT = DATA / "agent_otlp.jsonl"
MS = 10**6
T0_NS = 1_718_000_000_000_000_000  # 2024-06-10T06:13:20Z
LS_T0 = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)


def stages_of(imported):
    """(name, kind, after, ns) per stage; ns None for the model call."""
    rows = []
    for stage in imported.spec.stages:
        ns = None if stage.latency is None else round(stage.latency.value * 1e9)
        rows.append((stage.name, stage.kind, tuple(stage.after), ns))
    return rows


def laid_out(imported):
    """The table laid out for one request with its stages' (fixed) latencies."""
    spec = imported.spec
    return timeline(spec, draw_latencies_ns(spec, 1, np.random.default_rng(0)), 1)


def test_an_otlp_rag_trace_as_the_collector_writes_it():
    imported, read_as = import_file(str(OTLP_RAG))
    assert read_as == "otlp"
    start, embed, chat = "start -> embeddings text-embedding-3-small", "embeddings text-embedding-3-small", \
        "chat llama-3.1-70b"
    # build_context only groups retrieval and rerank; the HTTP POST under the chat span is the model call's own time
    assert stages_of(imported) == [
        (start, "cpu", (), 2_100_000),
        ("moderation", "cpu", (start,), 17_900_000),  # beside the embedding, both after the opening gap
        (embed, "cpu", (start,), 29_300_000),
        ("retrieval docs", "retrieval", (embed,), 56_850_000),
        ("rerank", "rerank", ("retrieval docs",), 52_250_000),  # openinference.span.kind RERANKER
        ("rerank -> chat llama-3.1-70b", "cpu", ("rerank",), 11_500_000),  # no span covers 140.5-152 ms
        (chat, "model", ("rerank -> chat llama-3.1-70b", "moderation"), None),
        ("format_answer", "cpu", (chat,), 7_345_678),
        ("format_answer -> end", "cpu", ("format_answer",), 3_000_000),
    ]
    laid = laid_out(imported)
    assert laid.pre_ns.tolist() == [152 * MS] and laid.post_ns.tolist() == [10_345_678]
    assert laid.pre_ns[0] + imported.model_ns[0] + laid.post_ns[0] == imported.root_ns[0] == 1_312_345_678
    assert sum(int(ns[0]) for ns in laid.detail_ns.values()) == 162_345_678
    assert laid.detail_ns["moderation"].tolist() == [0]
    assert (imported.requests[0].model.input_tokens, imported.requests[0].model.output_tokens) == (1843, 212)


def test_a_langsmith_rag_run_tree_likewise():
    imported, read_as = import_file(str(LANGSMITH_RAG))
    assert read_as == "langsmith"
    start, retrieve = "start -> VectorStoreRetriever", "VectorStoreRetriever"
    assert stages_of(imported) == [
        (start, "cpu", (), 1_024_000),
        (retrieve, "retrieval", (start,), 205_976_000),
        ("RunnablePassthrough", "cpu", (start,), 250_000),  # a chain grouping nothing: a cpu stage
        ("VectorStoreRetriever -> CohereRerank", "cpu", (retrieve,), 1_100_000),
        ("CohereRerank", "rerank", ("VectorStoreRetriever -> CohereRerank",), 91_900_000),  # by its name
        ("ChatPromptTemplate", "cpu", ("CohereRerank",), 1_500_000),
        ("ChatOpenAI", "model", ("ChatPromptTemplate", "RunnablePassthrough"), None),
        ("ChatOpenAI -> StrOutputParser", "cpu", ("ChatOpenAI",), 100_000),
        ("StrOutputParser", "cpu", ("ChatOpenAI -> StrOutputParser",), 400_000),
        ("StrOutputParser -> end", "cpu", ("StrOutputParser",), 43_678_000),
    ]
    laid = laid_out(imported)
    assert laid.pre_ns.tolist() == [301_500_000] and laid.post_ns.tolist() == [44_178_000]
    assert laid.pre_ns[0] + imported.model_ns[0] + laid.post_ns[0] == imported.root_ns[0] == 2_345_678_000
    assert (imported.requests[0].model.input_tokens, imported.requests[0].model.output_tokens) == (1502, 180)


# A request in the abstract: (id, parent, name, kind, start, end) in us from the root's start; kind None
# for a span that only groups others (or, as a leaf, some code: a cpu stage).
def otlp_document(spans, tokens=(700, 90), trace_id="ab" * 16, usage=None):
    """`usage`: a model span's (input, output) tokens by its id, in place of `tokens` (None: none)."""
    operation = {"model": "chat", "cpu": "embeddings", "retrieval": "retrieval", "tool": "execute_tool"}
    rows = []
    for span_id, parent, name, kind, start_us, end_us in spans:
        attributes = []
        if kind in operation:
            attributes.append({"key": "gen_ai.operation.name", "value": {"stringValue": operation[kind]}})
        if kind == "rerank":
            attributes.append({"key": "openinference.span.kind", "value": {"stringValue": "RERANKER"}})
        counts = (usage or {}).get(span_id, tokens)
        if kind == "model" and counts is not None:
            attributes += [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(counts[0])}},
                           {"key": "gen_ai.usage.output_tokens", "value": {"intValue": counts[1]}}]
        rows.append({"traceId": trace_id, "spanId": span_id, "parentSpanId": parent or "", "name": name, "kind": 1,
                     "startTimeUnixNano": str(T0_NS + start_us * 1000), "endTimeUnixNano": str(T0_NS + end_us * 1000),
                     "attributes": attributes, "status": {}})
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "app"},
                                                                               "spans": rows}]}]}


def langsmith_runs(spans, tokens=(700, 90), trace_id=None, usage=None):
    run_type = {"model": "llm", "cpu": "embedding", "retrieval": "retriever", "tool": "tool", "rerank": "chain",
                None: "chain"}
    runs = []
    for span_id, parent, name, kind, start_us, end_us in spans:
        run = {"id": span_id, "name": name, "run_type": run_type[kind], "parent_run_id": parent,
               "start_time": (LS_T0 + dt.timedelta(microseconds=start_us)).isoformat(),
               "end_time": (LS_T0 + dt.timedelta(microseconds=end_us)).isoformat(), "inputs": {}, "outputs": {}}
        if kind == "model":
            counts = (usage or {}).get(span_id, tokens)
            run["outputs"] = {"llm_output": {"token_usage": {"prompt_tokens": counts[0],
                                                             "completion_tokens": counts[1]}}}
        if trace_id is not None:
            run["trace_id"] = trace_id
        runs.append(run)
    return runs


RAG = [("r", None, "request", None, 0, 1000), ("e", "r", "embed", "cpu", 10, 40),
       ("q", "r", "retrieve", "retrieval", 40, 140), ("m", "r", "answer", "model", 150, 900),
       ("f", "r", "format", None, 900, 960)]


def test_the_critical_path_of_a_stage_that_started_while_another_ran_gets_its_wait():
    # b starts 5 ms in while a runs and nothing has ended: the table starts it at the send, so the 5 ms
    # before it are a stage of their own, and the model call after b starts at 40 ms as it did
    spans = [("r", None, "request", None, 0, 100_000), ("a", "r", "a", "tool", 0, 30_000),
             ("b", "r", "b", "retrieval", 5_000, 40_000), ("m", "r", "answer", "model", 40_000, 90_000)]
    imported, _ = import_documents([otlp_document(spans)], "t")
    assert stages_of(imported) == [
        ("start -> b", "cpu", (), 5 * MS), ("a", "tool", (), 30 * MS), ("b", "retrieval", ("start -> b",), 35 * MS),
        ("answer", "model", ("b", "a"), None), ("answer -> end", "cpu", ("answer",), 10 * MS)]
    laid = laid_out(imported)
    assert laid.pre_ns.tolist() == [40 * MS] and laid.post_ns.tolist() == [10 * MS]


def test_several_traces_of_one_shape_give_each_stage_a_lognormal():
    runs = []
    for k, retrieve_us in enumerate([100_000, 120_000, 140_000]):
        spans = [(f"r{k}", None, "request", None, 0, retrieve_us + 800_000),
                 (f"q{k}", f"r{k}", "retrieve", "retrieval", 0, retrieve_us),
                 (f"m{k}", f"r{k}", "answer", "model", retrieve_us, retrieve_us + 800_000)]
        runs += langsmith_runs(spans, tokens=(500 + 100 * k, 80))
    imported, _ = import_documents([{"runs": runs}], "t")
    retrieve, answer = imported.spec.stages
    assert retrieve.latency.kind == "lognormal"
    assert (retrieve.latency.mean, retrieve.latency.sd) == (0.12, 0.02)  # 100, 120, 140 ms: sample sd 20 ms
    assert answer.after == ["retrieve"] and imported.model_ns == [800 * MS] * 3
    text = import_toml(imported)
    assert "# [workload.input]\n# kind = \"normal\"\n# mean = 600.0\n# sd = 100.0" in text
    assert "# [workload.output]\n# kind = \"fixed\"\n# value = 80" in text


def import_toml(imported):
    from tokenpath.application.traces import to_toml

    text = to_toml(imported, "t")
    assert tomllib.loads(text)["application"]["stages"] == imported.stages
    return text


def test_traces_of_other_shapes_are_refused_and_one_can_be_chosen(tmp_path, monkeypatch, capsys):
    other = [("r2", None, "request", None, 0, 1000), ("m2", "r2", "answer", "model", 0, 900)]
    path = tmp_path / "two.json"
    path.write_text(json.dumps(langsmith_runs(RAG) + langsmith_runs(other)), encoding="utf-8")
    assert_user_error(*run_cli(["application", "import", str(path)], monkeypatch, capsys),
                      "trace 'r2' has other stages than trace 'r'", "--trace ID")
    code, out, err = run_cli(["application", "import", str(path), "--trace", "r2"], monkeypatch, capsys)
    assert code == 0, err
    assert [stage["name"] for stage in tomllib.loads(out)["application"]["stages"]] == ["answer", "answer -> end"]


def _otlp(spans):
    return json.dumps(otlp_document(spans))


def _with(spans, *changed):
    """RAG with spans replaced (by id) or added."""
    by_id = {span[0]: span for span in spans}
    by_id.update({span[0]: span for span in changed})
    return list(by_id.values())


@pytest.mark.parametrize("text, argv, fragments", [
    ("{resourceSpans: [", [], ["not JSON", "line 1, column 2"]),
    (json.dumps({"data": [1, 2]}), [], ["neither OTLP JSON", "nor a LangSmith export"]),
    (_otlp([span for span in RAG if span[0] != "r"]), [], ["no root span"]),
    (_otlp(_with(RAG, ("m", "r", "answer", None, 150, 900))), [], ["no LLM span", "gen_ai.operation.name chat"]),
    (_otlp(_with(RAG, ("m2", "r", "again", "model", 800, 950))), [],
     ["the model calls span 'answer' (id 'm') and span 'again' (id 'm2') overlap", "one call after another"]),
    (_otlp(_with(RAG, ("m2", "r", "again", "model", 960, 990))), [],
     ["the prompt of span 'again' (id 'm2') (700 tokens) is shorter than the prompt and answer of span 'answer' "
      "(id 'm') (700 + 90)", "keeps its whole history"]),
    (_otlp(_with(RAG, ("m2", "r", "again", "model", 960, 990), ("t", "r", "lookup", "tool", 990, 995),
                 ("m3", "r", "last", "model", 995, 999))), [],
     ["trace 'abababababababababababababababab': the stages between its model calls differ from round to round",
      "round 2's stage 2 is a tool span 'lookup', round 1's a cpu span 'format'"]),
    (_otlp(_with(RAG, ("t", "r", "lookup", "tool", 800, 950))), [],
     ["cannot place span 'lookup' (id 't')", "beside the model call"]),
    (_otlp(_with(RAG, ("e", "r", "embed", "cpu", 10, 1200))), [],
     ["cannot place span 'embed' (id 'e')", "ends 0.2 ms after its request's root span"]),
    (_otlp(_with(RAG, ("x", "gone", "orphan", None, 10, 20))), [],
     ["cannot place span 'orphan' (id 'x')", "its parent 'gone' is not in the file"]),
    (_otlp(_with(RAG, ("q", "r", "retrieve", "retrieval", 140, 40))), [],
     ["span 'retrieve' (id 'q') ends 0.1 ms before it starts", "negative duration"]),
    (json.dumps(langsmith_runs(RAG)), ["--format", "otlp"], ["not an OTLP traces document"]),
    (json.dumps([{**langsmith_runs(RAG)[0], "run_type": "agent"}]), [], ["run_type 'agent' is not one of LangSmith's"]),
    (json.dumps([{**langsmith_runs(RAG)[0], "end_time": None}]), [], ["no end_time"]),
    (json.dumps([{**langsmith_runs(RAG)[0], "start_time": "yesterday"}]), [], ["start_time is 'yesterday'"]),
    (_otlp(RAG), ["--trace", "nope"], ["--trace: no trace 'nope'"]),
    (_otlp(_with(RAG, *[(f"x{k}", "r", f"x{k}", "tool", 960, 970) for k in range(64)])), [],
     ["65 spans are stages after the model call, more than the 64"]),
    (_otlp(RAG), ["--format", "xml"], ["--format: unknown 'xml'"]),
], ids=["not JSON", "neither format", "no root", "no LLM", "calls overlap", "a shorter prompt", "rounds differ",
        "beside the model", "outside the root",
        "missing parent", "negative duration", "wrong format", "unknown run_type", "no end_time", "bad time",
        "unknown trace", "too many stages", "unknown format"])
def test_bad_traces_are_one_line_exit_2(text, argv, fragments, tmp_path, monkeypatch, capsys):
    path = tmp_path / "trace.json"
    path.write_text(text, encoding="utf-8")
    assert_user_error(*run_cli(["application", "import", str(path), *argv], monkeypatch, capsys), *fragments)


def test_the_written_table_is_a_scenario_simulate_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "app.toml"
    code, printed, err = run_cli(["application", "import", str(OTLP_RAG), "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err
    assert "9 stages (3 of them gaps) from 1 trace" in printed
    summary = simulate_json([str(out), "--num-requests", "20"], monkeypatch, capsys)
    parts = summary["attribution_s"]
    assert parts["application"] == pytest.approx(0.162345678)  # 152 ms before the model call, 10.345678 after
    assert parts["application_detail"]["retrieval docs"] == pytest.approx(0.05685)
    assert len(parts["application_detail"]) == 8


def agent_critical_path_ns(imported, k=0):
    """Trace k's table laid out as the agent simulation lays a request out (sim/agent.py): the stages around
    the loop, and the stages between two calls once per round with that round's times; with the calls' own
    time, the request from the root span's start to its end."""
    from tokenpath.sim.agent import around_loop, between_calls

    stages = imported.traced[k]
    around = {stage.name: np.array([stage.duration_ns]) for stage in stages if stage.duration_ns is not None}
    outer = timeline(around_loop(imported.spec), around, 1)
    rounds = {stage.name: stage.rounds_ns for stage in stages if stage.rounds_ns is not None}
    between = 0
    for r in range(len(imported.requests[k].calls) - 1):
        times = {name: np.array([values[r]]) for name, values in rounds.items()}
        between += int(timeline(between_calls(imported.spec), times, 1).post_ns[0])
    return int(outer.pre_ns[0]) + imported.model_ns[k] + between + int(outer.post_ns[0])


def test_an_otlp_agent_trace_of_three_calls_is_a_loop_whose_rounds_give_back_the_root():
    imported, _ = import_file(str(OTLP_AGENT))
    chat, tool = "chat gpt-4o", "execute_tool"  # its tools, get_weather and search_flights, share one word
    assert [(stage.name, stage.kind, stage.after, stage.samples_ns) for stage in imported.traced[0]] == [
        ("start -> load_session", "cpu", (), (418_200,)),
        ("load_session", "cpu", ("start -> load_session",), (5_673_100,)),
        ("load_session -> chat gpt-4o", "cpu", ("load_session",), (1_012_400,)),
        (chat, "model", ("load_session -> chat gpt-4o",), (None,)),
        # each round: the tool call parsed (no span), the tool (its HTTP GET inside), its result sent back
        (f"{chat} -> {tool}", "cpu", (), (916_700, 1_108_800)),
        (tool, "tool", (f"{chat} -> {tool}",), (412_422_900, 671_262_300)),
        (f"{tool} -> {chat}", "cpu", (tool,), (1_293_900, 1_120_500)),
        (f"{chat} -> format_response", "cpu", (chat,), (688_500,)),
        ("format_response", "cpu", (f"{chat} -> format_response",), (7_375_800,)),
        ("format_response -> end", "cpu", ("format_response",), (2_425_800,)),
    ]
    # prompts 1520, 1773, 2198 tokens, answers 41, 37, 164: each later prompt is the one before, its answer and
    # the tool's result (212, 388 tokens)
    assert imported.spec.model.loop.model_dump(mode="json", exclude_none=True) == {
        "turns": 3, "between": [f"{chat} -> {tool}", tool, f"{tool} -> {chat}"],
        "result_tokens": {"kind": "lognormal", "mean": 300.0, "sd": 124.5, "min": 1},
        "call_output": {"kind": "lognormal", "mean": 39.0, "sd": 2.8, "min": 1}}
    assert imported.model_ns == [682_208_400 + 747_081_800 + 3_086_324_300]
    assert agent_critical_path_ns(imported) == imported.root_ns[0] == 5_621_333_400
    text = import_toml(imported)
    assert "# [workload.input]\n# kind = \"fixed\"\n# value = 1520" in text and "# value = 164" in text


def test_the_imported_agent_table_is_a_scenario_simulate_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "agent.toml"
    code, printed, err = run_cli(["application", "import", str(OTLP_AGENT), "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err
    summary = simulate_json([str(out), "--num-requests", "6"], monkeypatch, capsys)
    assert summary["requests"]["model_calls_mean"] == 3
    assert summary["attribution_s"]["application_detail"]["execute_tool"] > 0.8  # two rounds of ~0.54 s


def test_an_agent_trace_without_token_counts_takes_the_agent_scenarios_lengths():
    spans = [("r", None, "request", None, 0, 2000), ("m1", "r", "plan", "model", 0, 500),
             ("t", "r", "lookup", "tool", 500, 900), ("m2", "r", "answer", "model", 900, 2000)]
    imported, _ = import_documents([otlp_document(spans, tokens=None)], "t")
    agent = next(stage for stage in load_scenario_table("agent")["application"]["stages"] if stage["kind"] == "model")
    loop = imported.stages[0]["loop"]
    assert [loop[key] for key in ("result_tokens", "call_output")] == [agent["loop"][key] for key in
                                                                       ("result_tokens", "call_output")]
    assert loop["turns"] == 2 and loop["between"] == ["lookup"]
    assert "set them by hand" in import_toml(imported)
    assert agent_critical_path_ns(imported) == 2000 * 1000


def test_several_agent_traces_pool_their_rounds_and_calls():
    def trace(k, calls, tools, usage, end_ms):
        spans = [(f"r{k}", None, "request", None, 0, end_ms * 1000)]
        spans += [(f"m{k}{j}", f"r{k}", "answer", "model", a * 1000, b * 1000) for j, (a, b) in enumerate(calls)]
        spans += [(f"t{k}{j}", f"r{k}", "lookup", "tool", a * 1000, b * 1000) for j, (a, b) in enumerate(tools)]
        return langsmith_runs(spans, usage={f"m{k}{j}": counts for j, counts in enumerate(usage)})

    runs = trace(0, [(0, 100), (200, 300)], [(110, 200)], [(500, 20), (600, 30)], 300)
    runs += trace(1, [(0, 100), (160, 260), (310, 400)], [(105, 150), (265, 300)], [(500, 20), (560, 40), (700, 30)],
                  400)
    imported, _ = import_documents([{"runs": runs}], "t")
    loop = imported.stages[0]["loop"]
    assert loop["turns"] == {"kind": "lognormal", "mean": 2.5, "sd": 0.7}  # 2 and 3 calls
    assert loop["between"] == ["answer -> lookup", "lookup", "lookup -> answer"]
    # results 600 - 520, 560 - 520, 700 - 600 tokens; the tool calls' answers 20, 20, 40
    assert loop["result_tokens"] == {"kind": "lognormal", "mean": 73.3, "sd": 30.6}
    assert loop["call_output"] == {"kind": "lognormal", "mean": 26.7, "sd": 11.5}
    lookup = next(stage for stage in imported.spec.stages if stage.name == "lookup").latency
    assert (lookup.mean, round(lookup.sd, 9)) == (0.056666667, 0.029297326)  # 90, 45, 35 ms: sd sqrt(1716.67 / 2)
    # the first trace's tool ends as its next call starts: a gap of no time in one round of three
    assert [stage.samples_ns for stage in imported.traced[0] if stage.name == "lookup -> answer"] == [(0,)]
    assert [agent_critical_path_ns(imported, k) for k in (0, 1)] == imported.root_ns == [300 * MS, 400 * MS]


def load_scenario_table(name):
    from tokenpath.sim.scenario import read_scenario_table

    return read_scenario_table(name)[0]


@st.composite
def agent_requests(draw):
    """An agent's request: a span before the first call, then calls with the same stages between each two (a
    chain of spans, gaps between them; or, `tangled`, spans at any time in the round, whose rounds may then
    differ), a span after the last; times in us, each later prompt the one before, its answer and a result."""
    kinds = draw(st.lists(st.sampled_from(KINDS), max_size=3))
    tangled = draw(st.booleans())
    calls = draw(st.integers(2, 4))
    spans, now = [("p", "r", "prepare", "cpu", 0, draw(st.integers(0, 50)))], 0
    now = spans[0][5] + draw(st.integers(0, 20))
    usage, prompt = {}, draw(st.integers(100, 2000))
    for call in range(calls):
        end = now + draw(st.integers(1, 300))
        spans.append((f"m{call}", "r", "llm", "model", now, end))
        answer = draw(st.integers(1, 200))
        usage[f"m{call}"] = (prompt, answer)
        prompt += answer + draw(st.integers(0, 500))
        now = end
        if call == calls - 1:
            break
        begin = now
        for j, kind in enumerate(kinds):  # each span after a gap (maybe of no time); its name's last word the round's
            start = (begin if tangled else now) + draw(st.integers(0, 20))
            stop = start + draw(st.integers(0, 200))
            now = max(now, stop)
            spans.append((f"s{call}-{j}", "r", f"rerank {j} r{call}" if kind == "rerank" else f"step {j} r{call}",
                          kind, start, stop))
        now += draw(st.integers(0, 20))
    if draw(st.booleans()):
        spans.append(("f", "r", "format", None, now, now + draw(st.integers(0, 40))))
        now = spans[-1][5]
    end = now + draw(st.integers(0, 30))
    return [("r", None, "request", None, 0, end), *spans], usage, end, tangled


@settings(max_examples=30, deadline=None)
@given(agent_requests())
def test_both_formats_give_an_agents_loop_and_its_rounds_give_back_the_root(request):
    spans, usage, end_us, tangled = request
    try:
        otlp, _ = import_documents([json.loads(json.dumps(otlp_document(spans, usage=usage)))], "t")
    except UserError as error:  # only spans at any time in their round may run in another order in another
        assert tangled and "differ from round to round" in str(error) and "\n" not in str(error)
        return
    langsmith, _ = import_documents([json.loads(json.dumps(langsmith_runs(spans, usage=usage)))], "t")
    assert otlp.stages == langsmith.stages
    loop = otlp.spec.model.loop
    calls = sum(span[3] == "model" for span in spans)
    assert loop.turns == calls
    results = [usage[f"m{k + 1}"][0] - sum(usage[f"m{k}"]) for k in range(calls - 1)]
    assert (loop.result_tokens.value or loop.result_tokens.mean) == pytest.approx(
        max(results[0], 1) if len({max(r, 1) for r in results}) == 1 else round(np.mean(np.maximum(results, 1)), 1))
    assert agent_critical_path_ns(otlp) == end_us * 1000 == otlp.root_ns[0]


# Random requests: stages before the model call, after it, some grouped under a span of no kind, in us.
KINDS = [None, "cpu", "retrieval", "rerank", "tool"]


@st.composite
def requests(draw):
    model_start = draw(st.integers(0, 300))
    model_end = model_start + draw(st.integers(0, 200))
    spans, k = [], 0
    for low, high, count in ((0, model_start, draw(st.integers(0, 5))),
                             (model_end, model_end + 150, draw(st.integers(0, 4)))):
        for _ in range(count):
            start = draw(st.integers(low, high))
            kind = draw(st.sampled_from(KINDS))
            spans.append([f"s{k}", "r", f"rerank {k}" if kind == "rerank" else f"step {k}", kind, start,
                          draw(st.integers(start, high))])
            k += 1
    end = max([model_end, *(span[5] for span in spans)]) + draw(st.integers(0, 30))
    before = [span for span in spans if span[5] <= model_start]
    if before and draw(st.booleans()):  # the first ones grouped under a chain
        grouped = before[:draw(st.integers(1, len(before)))]
        spans.append(["g", "r", "group", None, min(s[4] for s in grouped), max(s[5] for s in grouped)])
        for span in grouped:
            span[1] = "g"
    spans.append(["m", "r", "answer", "model", model_start, model_end])
    if model_end > model_start and draw(st.booleans()):  # an HTTP call inside the model call's span
        spans.append(["h", "m", "POST", None, model_start, model_end])
    draw(st.randoms()).shuffle(spans)
    return [("r", None, "request", None, 0, end), *map(tuple, spans)], (model_start, model_end, end)


@settings(max_examples=60, deadline=None)
@given(requests())
def test_both_formats_give_the_same_stages_and_the_critical_path_gives_back_the_root(request):
    spans, (model_start_us, model_end_us, end_us) = request
    otlp, _ = import_documents([json.loads(json.dumps(otlp_document(spans)))], "t")
    langsmith, _ = import_documents([json.loads(json.dumps(langsmith_runs(spans)))], "t")
    assert stages_of(otlp) == stages_of(langsmith)
    stages = {name: (kind, ns) for name, kind, _, ns in stages_of(otlp)}
    for span_id, _, name, kind, start_us, stop_us in spans:
        if span_id not in ("r", "m", "g", "h"):  # each span a stage of its kind, at its duration
            assert stages[name] == (kind or "cpu", (stop_us - start_us) * 1000)
    laid = laid_out(otlp)
    assert laid.pre_ns.tolist() == [model_start_us * 1000]
    assert laid.post_ns.tolist() == [(end_us - model_end_us) * 1000]
    assert sum(int(ns[0]) for ns in laid.detail_ns.values()) == laid.pre_ns[0] + laid.post_ns[0]


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)


def _paths(value, path=()):
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, (*path, key))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["otlp", "langsmith"]), st.data())
def test_a_mangled_trace_is_a_user_error_never_a_traceback(trace_format, data):
    document = otlp_document(RAG) if trace_format == "otlp" else langsmith_runs(RAG)
    mangled = copy.deepcopy(document)
    path = data.draw(st.sampled_from(list(_paths(mangled))))
    value = data.draw(JSON)
    if not path:
        mangled = value
    else:
        parent = mangled
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    try:
        import_documents([mangled], "t")
    except UserError as error:
        assert "\n" not in str(error)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40))
def test_any_text_is_read_or_refused_in_one_line(tmp_path, text):
    path = tmp_path / "trace.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as error:
        import_file(str(path))
    assert "\n" not in str(error.value)

