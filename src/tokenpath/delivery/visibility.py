"""How often a token shows nothing when it arrives: the share of a text's tokens after which the
streaming detokenizer has no new text, because the token is not a whole UTF-8 character alone and waits
for a later one to complete it. The delivery model draws each sequence's leading invisible tokens with
this share (lastmile.first_visible_index), which is what makes TTFV later than TTFT.
"""

from __future__ import annotations

from tokenpath.delivery.detokenizer import Detokenizer


def invisible_fraction(det: Detokenizer, text: str) -> float:
    """Share of `text`'s tokens (as `det` encodes it) that add no text when streamed one at a time."""
    ids = det.encode(text)
    if not ids:
        raise ValueError("no tokens to measure: the text is empty")
    stream = det.batch(1)
    silent = sum(stream.step([token])[0] == "" for token in ids)
    return silent / len(ids)
