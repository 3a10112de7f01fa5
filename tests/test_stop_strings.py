"""Stop strings: never leaked, text before them always released, at most max(len) - 1 characters held."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.config.errors import UserError
from tokenpath.delivery.stop import StopStrings

CHARS = st.sampled_from(list("ab\n:XY中🎉"))
STOPS = st.lists(st.text(CHARS, min_size=1, max_size=4), min_size=1, max_size=3)
PIECES = st.lists(st.text(CHARS, max_size=4), max_size=30)


def expected(pieces: list[str], stops: list[str]) -> str:
    """What the whole response shows: everything before the first occurrence of any stop string."""
    text = "".join(pieces)
    cut = min((text.find(s) for s in stops if s in text), default=len(text))
    return text[:cut]


@settings(max_examples=120, deadline=None)
@given(stops=STOPS, pieces=PIECES)
def test_the_stream_shows_exactly_the_text_before_the_first_stop(stops, pieces):
    checker = StopStrings(1)
    checker.set(0, stops)
    hold, shown = max(map(len, stops)) - 1, ""
    for k, piece in enumerate(pieces, 1):
        shown += checker.feed([piece])[0]
        so_far = "".join(pieces[:k])
        assert not any(s in shown for s in stops)                   # never leaks a stop string
        assert expected(pieces[:k], stops).startswith(shown)
        if not checker.stopped[0]:
            assert len(so_far) - len(shown) == min(hold, len(so_far))  # holds back exactly max(len) - 1
    assert shown + checker.finish(0) == expected(pieces, stops)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_sequences_with_different_stop_lists_do_not_mix(data):
    n = data.draw(st.integers(1, 5))
    stops = [data.draw(st.one_of(st.just([]), STOPS)) for _ in range(n)]
    steps = data.draw(st.lists(st.lists(st.text(CHARS, max_size=3), min_size=n, max_size=n), max_size=20))
    checker = StopStrings(n)
    for i, s in enumerate(stops):
        checker.set(i, s)
    shown = [""] * n
    for texts in steps:
        for i, text in enumerate(checker.feed(texts)):
            shown[i] += text
    for i in range(n):
        pieces = [row[i] for row in steps]
        final = shown[i] + checker.finish(i)
        assert final == (expected(pieces, stops[i]) if stops[i] else "".join(pieces))


def test_a_stop_split_across_tokens_is_caught_and_the_text_before_it_released():
    checker = StopStrings(1)
    checker.set(0, ["</answer>"])
    out = [checker.feed([t])[0] for t in ["The answer is 4.", "</ans", "wer> and more"]]
    assert "".join(out) == "The answer is 4." and checker.stopped == [True]
    assert checker.feed(["after"]) == [""]
    assert checker.finish(0) == ""


def test_a_slot_is_reused_with_new_stops():
    checker = StopStrings(2)
    checker.set(0, ["x"])
    assert checker.feed(["abx", "x"]) == ["ab", "x"]
    checker.set(0, [])
    assert checker.feed(["x!", "y"]) == ["x!", "y"]


def test_an_empty_stop_string_is_refused():
    with pytest.raises(UserError, match="empty stop string"):
        StopStrings(1).set(0, ["", "x"])
