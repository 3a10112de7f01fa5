"""Replaying SGLang bench_serving's random dataset: each request's lengths as the client drew them."""

import numpy as np
import pytest

from tokenpath.config.errors import UserError
from tokenpath.validate.client_draws import sglang_random_lengths
from tokenpath.validate.latency import load_latency, row_prepared

ROW = {"source": "s", "id": "r", "num_requests": 10, "input_len": 1000, "output_len": 1000,
       "input_mean": 610.1, "output_mean": 421.0}


def test_the_draw_is_numpys_seed_1_prompts_then_outputs():
    prompts, outputs = sglang_random_lengths(ROW)
    draw = np.random.RandomState(1)
    assert prompts.tolist() == draw.randint(1, 1001, size=10).tolist()
    assert outputs.tolist() == draw.randint(0, 1001, size=10).tolist()
    # the totals SGLang's cookbook printed for `--random-input-len 1000 --random-output-len 1000 --num-prompts 10`
    assert prompts.sum() == 6101 and outputs.sum() == 4210


def test_a_server_counting_one_token_more_per_request_gets_it_simulated():
    prompts, outputs = sglang_random_lengths({**ROW, "output_mean": 422.0})
    assert outputs.sum() == 4220 and prompts.sum() == 6101


@pytest.mark.parametrize("changes, fragment", [
    ({"input_mean": 600.0}, "input_mean 600 is not bench_serving's seed-1 draw of 10 prompts up to 1000 tokens"),
    ({"output_mean": 421.5}, "output_mean 421.5 is not bench_serving's seed-1 draw of 10 outputs"),
    ({"output_mean": 420.0}, "output_mean 420 is not bench_serving's seed-1 draw"),
])
def test_a_row_whose_means_are_not_the_draw_is_refused_naming_it(changes, fragment):
    with pytest.raises(UserError, match="latency row from s \\(r\\): ") as error:
        sglang_random_lengths({**ROW, **changes})
    assert fragment in str(error.value)


def test_an_output_drawn_as_zero_is_simulated_as_one():
    # 3,200 draws from 0 to 1024 (DataCrunch's largest run) hold zeros; each is simulated as one token.
    row = {**ROW, "num_requests": 3200, "input_len": 1024, "output_len": 1024, "input_mean": 509.138125,
           "output_mean": 513.3240625}
    _, outputs = sglang_random_lengths(row)
    draw = np.random.RandomState(1)
    draw.randint(1, 1025, size=3200)
    raw = draw.randint(0, 1025, size=3200)
    assert (raw == 0).sum() > 0 and outputs.min() == 1
    assert np.array_equal(outputs, np.maximum(raw, 1))


def test_every_replayed_row_is_simulated_with_its_own_requests_in_order():
    data = load_latency()
    rows = [row for row in data["rows"] if row["lengths"] == "sglang_random"]
    assert len(rows) == 35
    for row in (rows[0], next(r for r in rows if r.get("concurrency") == 1)):
        requests = row_prepared(row, data["sharegpt"]).requests
        prompts, outputs = sglang_random_lengths(row)
        assert len(requests) == min(row["num_requests"], 2000)
        assert np.array_equal(requests.input_tokens, prompts[:len(requests)])
        assert np.array_equal(requests.output_tokens, outputs[:len(requests)])


def test_a_replayed_run_finds_its_warm_up_prompt_and_its_earlier_runs_prompts_cached():
    # bench_serving's warm-up sends the run's first prompt before it; a row's cached_prompts are the
    # first prompts of the runs its server served before (the same seed draws the same prompts). Each
    # is held but its last token (prefixes.cached_prompts).
    data = load_latency()
    row = next(r for r in data["rows"] if r.get("id", "").startswith("Qwen3.md 8000/1000 c16"))
    for cached, held in ((10, 10), (None, 1)):
        requests = row_prepared({**row, "cached_prompts": cached}, data["sharegpt"]).requests
        assert requests.prefixes.warm.tolist() == list(range(held))
        assert np.array_equal(requests.prefixes.warm_tokens()[:held], requests.input_tokens[:held] - 1)
        assert not requests.prefixes.warm_tokens()[held:].any()
