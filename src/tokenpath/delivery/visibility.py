"""How often a token shows nothing visible when it arrives: the share of a text's tokens after which the
streaming detokenizer has no new text (the token is not a whole UTF-8 character alone and waits for a
later one to complete it) or only white space, which TTFV does not count as visible (docs/design.md, as
bench reads a stream: `text.isspace()`). The delivery model draws each sequence's leading invisible
tokens with this share (lastmile.first_visible_index), which is what makes TTFV later than TTFT.

The text streams as an engine's output does, after a prompt (BatchStream.prime).
"""

from __future__ import annotations

from tokenpath.delivery.detokenizer import Detokenizer
from tokenpath.delivery.stream import CONTEXT_TOKENS

# What the measured text follows: the end of a chat prompt, as a chat template leaves it.
PROMPT_TAIL = "Assistant:"


def invisible_fraction(det: Detokenizer, text: str) -> float:
    """Share of `text`'s tokens (as `det` encodes it) that add no text, or white space only, when
    streamed one at a time after a prompt."""
    ids = det.encode(text)
    if not ids:
        raise ValueError("no tokens to measure: the text is empty")
    stream = det.batch(1)
    stream.prime(0, det.encode(PROMPT_TAIL)[-CONTEXT_TOKENS:])
    silent = sum(not shown or shown.isspace() for shown in (stream.step([token])[0] for token in ids))
    return silent / len(ids)
