"""Stop strings: cut as vLLM cuts them (the first listed stop string found in the new text wins), the text
before them always released, at most max(len) - 1 characters held."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.config.errors import UserError
from tokenpath.delivery.stop import StopStrings

CHARS = st.sampled_from(list("ab\n:XY中🎉"))
STOPS = st.lists(st.text(CHARS, min_size=1, max_size=4), min_size=1, max_size=3)
PIECES = st.lists(st.text(CHARS, max_size=4), max_size=30)


def check_stop_strings(output_text: str, new_char_count: int, stop: list[str]) -> tuple[str, int] | None:
    """vLLM 0.14's check_stop_strings (vllm/v1/engine/detokenizer.py), include_in_output false."""
    if not new_char_count or not stop:
        return None
    for stop_str in stop:
        stop_index = output_text.find(stop_str, 1 - new_char_count - len(stop_str))
        if stop_index == -1:
            continue
        return stop_str, stop_index
    return None


def vllm_stream(pieces: list[str], stop: list[str], min_tokens: int = 0) -> tuple[list[str], bool]:
    """What vLLM streams for these pieces of text, one token's a step, and whether a stop string ended it:
    BaseIncrementalDetokenizer.update (min_tokens as it handles them) then get_next_output_text(finished,
    delta=True), each step."""
    output_text, last_offset, buffer_length, shown = "", 0, max(map(len, stop)) - 1, []
    for tokens, piece in enumerate(pieces, 1):
        stop_check_offset = len(output_text)
        output_text += piece
        if min_tokens and tokens <= min_tokens:
            stop_check_offset = len(output_text)
        found = None
        if tokens > min_tokens:
            found = check_stop_strings(output_text, len(output_text) - stop_check_offset, stop)
        if found is not None:
            output_text = output_text[:found[1]]
        length = len(output_text) - (0 if found else buffer_length)
        shown.append(output_text[last_offset:length] if last_offset < length else "")
        last_offset = max(last_offset, length)
        if found:
            return shown, True
    return [*shown, output_text[last_offset:]], False


def expected(pieces: list[str], stops: list[str]) -> str:
    """What the whole response shows, as vLLM shows it."""
    return "".join(vllm_stream(pieces, stops)[0])


# Few characters, so that two stop strings often complete in one step.
FEW = st.sampled_from(list("ab \n"))


@settings(max_examples=300, deadline=None)
@given(stops=st.lists(st.text(FEW, min_size=1, max_size=3), min_size=2, max_size=3),
       pieces=st.lists(st.text(FEW, max_size=4), max_size=12))
def test_each_step_shows_what_vllm_shows(stops, pieces):
    reference, stopped = vllm_stream(pieces, stops)
    checker = StopStrings(1)
    checker.set(0, stops)
    shown = []
    for piece in pieces:
        shown.append(checker.feed([piece])[0])
        if checker.stopped[0]:
            break
    else:
        shown.append(checker.finish(0))
    assert shown == reference and checker.stopped[0] == stopped


@settings(max_examples=300, deadline=None)
@given(stops=st.lists(st.text(FEW, min_size=1, max_size=3), min_size=1, max_size=3),
       pieces=st.lists(st.text(FEW, max_size=4), max_size=12), min_tokens=st.integers(0, 8))
def test_the_first_min_tokens_are_not_searched_as_vllm_does_it(stops, pieces, min_tokens):
    # Two sequences, the other stepping every other step: each counts only its own tokens.
    reference, stopped = vllm_stream(pieces, stops, min_tokens)
    checker = StopStrings(2)
    checker.set(0, stops, min_tokens)
    checker.set(1, stops, min_tokens)
    shown = []
    for k, piece in enumerate(pieces):
        shown.append(checker.feed([piece, "a"], [0, 1] if k % 2 else [0])[0])
        if checker.stopped[0]:
            break
    else:
        shown.append(checker.finish(0))
    assert shown == reference and checker.stopped[0] == stopped


def test_a_stop_string_in_the_first_min_tokens_does_not_end_the_text():
    checker = StopStrings(1)
    checker.set(0, [" the"], min_tokens=3)
    shown = "".join(checker.feed([piece])[0] for piece in ["a", " the", " b", " the", " c"])
    assert shown == "a the b" and checker.stopped == [True]
    # One that the first token after them completes is found, as vLLM's search starts before it.
    checker.set(0, [" the"], min_tokens=1)
    assert checker.feed(["a t"])[0] + checker.feed(["he z"])[0] == "a" and checker.stopped == [True]


@pytest.mark.parametrize(("stops", "pieces", "shown"), [
    # Both complete in one step: 'c' is listed first, so the text is cut before it, ' ' and all.
    (["c", " \nb", " "], ["  c", "c"], "  "),
    (["b", "a"], ["xab"], "xa"),
    (["a", "b"], ["xab"], "x"),
    # One listed first but not yet complete does not wait: the one found now ends the text.
    (["abc", "b"], ["ab", "c"], "a"),
])
def test_the_first_stop_string_in_the_request_s_order_wins(stops, pieces, shown):
    assert expected(pieces, stops) == shown
    checker = StopStrings(1)
    checker.set(0, stops)
    assert "".join(checker.feed([piece])[0] for piece in pieces) + checker.finish(0) == shown
    assert checker.stopped == [True]


@settings(max_examples=120, deadline=None)
@given(stops=STOPS, pieces=PIECES)
def test_the_stream_shows_exactly_the_text_before_the_stop(stops, pieces):
    checker = StopStrings(1)
    checker.set(0, stops)
    hold, shown = max(map(len, stops)) - 1, ""
    for k, piece in enumerate(pieces, 1):
        shown += checker.feed([piece])[0]
        so_far = "".join(pieces[:k])
        assert stops[0] not in shown                                 # never leaks the first stop string
        assert expected(pieces[:k], stops).startswith(shown)
        if not checker.stopped[0]:
            assert not any(s in so_far for s in stops)
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
