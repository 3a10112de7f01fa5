"""The capacity search's rules on runs whose outcome is known in closed form: a rate is accepted only
when it meets the SLO and is not overloaded, and the search is repeated with twice the requests until
its answer is stable."""

import json

import pytest

from cli_helpers import assert_user_error, run_cli
from tokenpath.config.errors import UserError
from tokenpath.sim.scenario import read_scenario_table
from tokenpath.whatif import capacity
from tokenpath.whatif.capacity import Point, parse_slo, search
from tokenpath.whatif.run import Base, Outcome
from tokenpath.workload.spec import MAX_ARRIVAL_SPAN_S, MAX_RATE_PER_S


def _summary(ttft_p99_s: float, overloaded: bool) -> dict:
    return {"requests": {"failed": 0}, "latency_s": {"ttft": {"p99": ttft_p99_s}}, "attribution_s": {},
            "load": {"overloaded": overloaded, "signs": ["TTFT grew 3.0x"] if overloaded else [], "settled": True}}


def _fake_runs(monkeypatch, overload_at) -> list[tuple[int, float]]:
    """Replace the simulations: TTFT p99 is 0.1 s at every rate, and a run is overloaded above
    `overload_at(num_requests)` req/s. Returns the (num_requests, rate) of every run made."""
    made = []

    def simulate_many(base, override_sets, workers, progress):
        outcomes = []
        for overrides in override_sets:
            rate, requests = overrides["workload.arrival.rate"], overrides["workload.num_requests"]
            made.append((requests, rate))
            outcomes.append(Outcome(_summary(0.1, rate > overload_at(requests))))
        return outcomes

    monkeypatch.setattr(capacity, "simulate_many", simulate_many)
    return made


def _base(requests: int) -> Base:
    table, source, folder = read_scenario_table(None)
    table["workload"]["num_requests"] = requests
    return Base(table, source, folder)


def test_a_run_whose_requests_have_one_token_each_misses_no_tpot_or_itl_target():
    """None of them has a time between tokens (the summary's goodput counts them within a TPOT target); a run
    with nothing completed still misses every target, and a TTFT it has no value of misses."""
    slo = parse_slo("ttft_p99=2s,tpot_p99=30ms,itl_p50=20ms")
    undefined = {"mean": None, "p50": None, "p90": None, "p99": None, "p999": None}
    one_token = {"requests": {"completed": 5, "failed": 0},
                 "latency_s": {"ttft": {**undefined, "p99": 0.5}, "tpot": undefined, "itl": undefined}}
    assert capacity.misses(one_token, slo) == {}
    nothing = {"requests": {"completed": 0, "failed": 0},
               "latency_s": {"ttft": undefined, "tpot": undefined, "itl": undefined}}
    assert set(capacity.misses(nothing, slo)) == {"ttft_p99", "tpot_p99", "itl_p50"}


def test_a_run_that_meets_the_slo_but_is_overloaded_is_refused():
    slo = parse_slo("ttft_p99=1s")
    assert capacity.ok(Point(10.0, Outcome(_summary(0.5, False))), slo)
    assert not capacity.ok(Point(10.0, Outcome(_summary(0.5, True))), slo)
    assert not capacity.ok(Point(10.0, Outcome(_summary(1.5, False))), slo)


def test_the_search_lengthens_the_runs_until_the_answer_moves_by_at_most_the_stability(monkeypatch):
    # The sustainable rate a run of N requests appears to hold: 50 x (1 + 400 / N) req/s, so 116.7 at 300
    # requests, then 83.3, 66.7, 58.3 and 54.2 at 4,800: moves of 29%, 20%, 12.5% and 7.1%.
    made = _fake_runs(monkeypatch, lambda n: 50.0 * (1 + 400 / n))
    document = search(_base(300), parse_slo("ttft_p99=1s"), tolerance=0.01, workers=2, stability=0.1)
    steps = [step["num_requests"] for step in document["convergence"]]
    assert steps == [300, 600, 1200, 2400, 4800] and document["num_requests"] == 4800 and document["converged"]
    assert 54.17 * 0.99 <= document["request_rate"] <= 54.17
    assert document["above"]["request_rate"] > 54.16
    # The SLO was met at every rate: what bounds the answer is the overload test, and it says so.
    assert document["binding"] == {"metric": "overload", "signs": ["TTFT grew 3.0x"]}
    assert {requests for requests, _ in made} == set(steps)
    # Each longer search starts from the last answer.
    first_at = {}
    for requests, rate in made:
        first_at.setdefault(requests, rate)
    assert [first_at[n] for n in steps[1:]] == [step["request_rate"] for step in document["convergence"][:-1]]


def test_an_answer_still_moving_after_sixteen_times_the_requests_is_marked_unsettled(monkeypatch):
    _fake_runs(monkeypatch, lambda n: 50.0 * (1 + 4000 / n))
    document = search(_base(300), parse_slo("ttft_p99=1s"), tolerance=0.01, workers=2, stability=0.02)
    assert [step["num_requests"] for step in document["convergence"]] == [300, 600, 1200, 2400, 4800]
    assert not document["converged"]
    assert document["request_rate"] == pytest.approx(50.0 * (1 + 4000 / 4800), rel=0.01)


def _fake_filling_runs(monkeypatch, settles_at: int, overload_binds: bool = False, short: bool = False) -> None:
    """Replace the simulations: TTFT p99 misses 1 s above 50 req/s at any length (or, with
    `overload_binds`, the run is overloaded there instead), and a run of fewer than `settles_at` requests
    is still filling when its sends stop (its summary's load.settled false), or with `short` too short to
    watch (null)."""
    def simulate_many(base, override_sets, workers, progress):
        outcomes = []
        for overrides in override_sets:
            rate, requests = overrides["workload.arrival.rate"], overrides["workload.num_requests"]
            above = rate > 50.0
            summary = _summary(0.5 if overload_binds or not above else 1.5, overload_binds and above)
            summary["load"]["settled"] = True if requests >= settles_at else None if short else False
            summary.update(throughput={"output_tokens_per_s": 1000.0, "goodput_requests_per_s": 50.0},
                           bottleneck="compute", bottleneck_reason="engine compute")  # what the CLI prints
            outcomes.append(Outcome(summary))
        return outcomes

    monkeypatch.setattr(capacity, "simulate_many", simulate_many)


def test_answers_that_agree_while_their_runs_are_still_filling_are_not_converged(monkeypatch):
    # The answer is 50 req/s at every length, TTFT binding, but runs of fewer than 2,400 requests are
    # still filling: the search goes on until two answers in a row come from runs that settled (the first
    # settled answer agreeing with one still filling is no steady state).
    _fake_filling_runs(monkeypatch, 2400)
    document = search(_base(300), parse_slo("ttft_p99=1s"), tolerance=0.01, workers=2, stability=0.02)
    assert [step["num_requests"] for step in document["convergence"]] == [300, 600, 1200, 2400, 4800]
    assert [step["settled"] for step in document["convergence"]] == [False, False, False, True, True]
    assert document["converged"] and document["request_rate"] == pytest.approx(50.0, rel=0.01)
    _fake_filling_runs(monkeypatch, 10**9)  # never settles within sixteen times the requests
    document = search(_base(300), parse_slo("ttft_p99=1s"), tolerance=0.01, workers=2, stability=0.02)
    assert [step["num_requests"] for step in document["convergence"]] == [300, 600, 1200, 2400, 4800]
    assert not document["converged"]
    # Bounded by the overload test instead, the answer is judged by that test: stable at 600 requests.
    _fake_filling_runs(monkeypatch, 10**9, overload_binds=True)
    document = search(_base(300), parse_slo("ttft_p99=1s"), tolerance=0.01, workers=2, stability=0.02)
    assert [step["num_requests"] for step in document["convergence"]] == [300, 600] and document["converged"]
    assert document["binding"]["metric"] == "overload"


@pytest.mark.parametrize("overload_binds", [False, True])
def test_answers_whose_runs_were_too_short_to_watch_are_not_converged(monkeypatch, overload_binds):
    # Runs of fewer than 2,400 requests were sent over too short a time to watch a steady part (a high rate):
    # their answers agree but cannot tell a batch still filling from one growing without end, whichever
    # test binds; the search goes on until the answer's run is long enough.
    _fake_filling_runs(monkeypatch, 2400, overload_binds, short=True)
    document = search(_base(300), parse_slo("ttft_p99=1s"), tolerance=0.01, workers=2, stability=0.02)
    assert [step["settled"] for step in document["convergence"]] == [None, None, None, True, True]
    assert document["converged"] and document["num_requests"] == 4800


@pytest.mark.parametrize("flags, fragment", [
    (["--stability", "0.001"], "--stability: 0.001 must be from the tolerance (0.01) to 1"),
    (["--stability", "2"], "--stability: 2 must be from the tolerance (0.01) to 1"),
])
def test_a_stability_outside_its_range_is_one_line(flags, fragment, monkeypatch, capsys):
    assert_user_error(*run_cli(["capacity", "--slo", "ttft_p99=2s", *flags], monkeypatch, capsys), fragment)


def test_repeated_slo_options_add_their_targets_and_a_target_given_twice_is_refused(monkeypatch, capsys):
    # Each --slo adds its targets (once only the last was kept, so a search ran against fewer targets).
    def simulate_many(base, override_sets, workers, progress):
        summaries = [_summary(0.1, overrides["workload.arrival.rate"] > 50.0) for overrides in override_sets]
        for summary in summaries:
            summary["latency_s"]["tpot"] = {"p99": 0.02}
        return [Outcome(summary) for summary in summaries]

    monkeypatch.setattr(capacity, "simulate_many", simulate_many)
    code, out, err = run_cli(["capacity", "--slo", "ttft_p99=2s", "--slo", "tpot_p99=100ms", "--workers", "2",
                              "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    assert list(json.loads(out)["slo"]) == ["ttft_p99", "tpot_p99"]
    for command in (["capacity"], ["search", "--chips", "8"]):
        assert_user_error(*run_cli([*command, "--slo", "ttft_p99=2s", "--slo", "ttft_p99=1s"], monkeypatch, capsys),
                          "--slo: ttft_p99 is given twice; give each target once")


def test_the_capacity_line_says_which_runs_were_still_filling(monkeypatch, capsys):
    _fake_filling_runs(monkeypatch, 10**9)
    code, out, err = run_cli(["capacity", "--slo", "ttft_p99=1s", "--workers", "2"], monkeypatch, capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "at 2,000 (still filling)" in text and "its run still filling: an upper bound" in text
    _fake_filling_runs(monkeypatch, 4000)
    code, out, err = run_cli(["capacity", "--slo", "ttft_p99=1s", "--workers", "2"], monkeypatch, capsys)
    text = " ".join(out.split())
    assert "at 2,000 (still filling)" in text and "at 4,000, 49.95 at 8,000;" in text and "stable within 2%" in text


def _fixed_runs(monkeypatch, ttft_p99_s: float) -> list[float]:
    """Replace the simulations: TTFT p99 is `ttft_p99_s` at every rate and no run is overloaded (a closed loop's,
    whose rate adds no load). Returns the rate of every run made."""
    made = []

    def simulate_many(base, override_sets, workers, progress):
        made.extend(overrides["workload.arrival.rate"] for overrides in override_sets)
        return [Outcome(_summary(ttft_p99_s, False)) for _ in override_sets]

    monkeypatch.setattr(capacity, "simulate_many", simulate_many)
    return made


def test_a_closed_loop_that_meets_the_slo_at_every_rate_says_its_concurrency_holds_the_load(monkeypatch):
    """Up to the highest rate a scenario may take, never past it (the rate's own error is not the answer)."""
    made = _fixed_runs(monkeypatch, 0.1)
    base = _base(100)
    base.table["workload"]["max_concurrency"] = 4
    with pytest.raises(UserError) as error:
        search(base, parse_slo("ttft_p99=1s"), workers=2)
    assert max(made) <= MAX_RATE_PER_S
    assert str(error.value).startswith("capacity: the SLO is met at every rate up to ")
    assert ("the scenario's workload.max_concurrency holds at most 4 requests in flight, so a higher rate adds no load "
            "and no rate binds; drop max_concurrency") in str(error.value)


def test_an_slo_missed_at_every_rate_stops_where_requests_are_hours_apart(monkeypatch):
    """Down to the lowest rate a run may take (its arrivals within a year), never past it."""
    made = _fixed_runs(monkeypatch, 5.0)
    with pytest.raises(UserError) as error:
        search(_base(100), parse_slo("ttft_p99=1s"), workers=2)
    assert min(made) >= 100 / MAX_ARRIVAL_SPAN_S
    assert str(error.value).startswith("capacity: the SLO is missed even at ")
    assert "(ttft_p99 off its target by 5x) with requests hours apart, so a request alone misses it" in str(error.value)
    assert error.value.simulations == len(made)  # what a search that finds no rate still ran (search counts it)
