"""Request bodies that do not parse are 400s with the reason, never 500s."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.serve.app import MAX_JSON_DEPTH, decode_body
from tokenpath.serve.openai import ApiError

from test_serve import serve


@pytest.mark.parametrize("payload, fragment", [
    (b"[" * 100_000 + b"]" * 100_000, f"more than {MAX_JSON_DEPTH} deep"),
    (b'{"model": "m", "prompt": ' + b"[" * 200 + b"]" * 200 + b"}", f"more than {MAX_JSON_DEPTH} deep"),
    (b'{"model": "m", "prompt": "\xff\xfe"}', "not valid JSON"),
    (b'{"model": "m", "temperature": NaN}', "not valid JSON"),
    (b'{"model": "m", "prompt": "\\ud800"}', "not valid JSON"),
    (b"", "not valid JSON"),
])
def test_a_body_that_does_not_parse_is_a_400_with_the_reason(payload, fragment):
    with pytest.raises(ApiError) as refused:
        decode_body(payload)
    assert refused.value.status == 400 and fragment in refused.value.message


def test_a_body_nested_100000_deep_is_a_400_over_http():
    async def body(url, session):
        async with session.post(f"{url}/v1/completions", data=b"[" * 100_000 + b"]" * 100_000) as response:
            return response.status, await response.json()

    status, reply = serve()(body)
    assert status == 400 and "deep" in reply["error"]["message"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_a_400(raw):
    try:
        decode_body(raw)
    except ApiError as error:
        assert error.status == 400 and error.message
