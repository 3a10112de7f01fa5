"""An engine's release as a scenario states it (`[engine] version`), read as far as the model needs it:
its leading release number. "0.7.1" of "v0.7.1.post2 (vllm/vllm-openai image)", "0.5.9" of "0.5.9
(lmsysorg/sglang:v0.5.9-cu130)". Text with no leading number ("NIM 1.8.0", "not stated", a nightly
build) states no release the model can place, so it is simulated as the newest (`release_at_least`).
A pre-release ("0.5.3rc0", "0.8.0.dev1", "1.0.0a2") comes before the release it leads to: SGLang
0.5.3rc0 still has 0.5.2's memory rule, which 0.5.3 replaced (engine/memory_share.py).
"""

from __future__ import annotations

import re

_LEADING_RELEASE = re.compile(r"\s*[vV]?(\d+(?:\.\d+)*)")
# A pre-release right after the number, as PEP 440 and the engines' tags write it: a, b, rc or dev.
_PRE_RELEASE = re.compile(r"[.-]?(?:a|b|rc|dev)\d*(?![A-Za-z])")


def release_number(text: str | None) -> tuple[int, ...] | None:
    """The release number `text` begins with, trailing zeros dropped ("0.7.0" and "0.7" are one
    release), or None when it begins with none."""
    if text is None:
        return None
    match = _LEADING_RELEASE.match(text)
    if match is None:
        return None
    parts = [int(part) for part in match.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def written_release(text: str) -> str | None:
    """The release number `text` is, as written but for a tag's "v" ("0.8.3" of "v0.8.3"); None where the
    text is more than a release number (a pre-release, a note, no number)."""
    match = _LEADING_RELEASE.fullmatch(text)
    return match.group(1) if match else None


def release_at_least(text: str | None, since: str) -> bool:
    """Whether the release `text` states is `since` or later; True where it states none the model can
    read (unset, or no leading number): the newest release's behaviour."""
    stated, first = release_number(text), release_number(since)
    if first is None:
        raise ValueError(f"{since!r} is not a release number")
    if stated is None:
        return True
    return stated > first or (stated == first and not _is_pre_release(text))


def _is_pre_release(text: str) -> bool:
    """Whether `text`'s release number is followed by a pre-release tag ("rc0" of "0.5.3rc0")."""
    match = _LEADING_RELEASE.match(text)
    return match is not None and _PRE_RELEASE.match(text, match.end()) is not None
