"""UTF-8 pieces of the last mile: unfinished characters and the two ways libraries replace bad bytes.

Python's decoder (and Rust's `from_utf8_lossy`, and tiktoken) replace each *maximal invalid
subpart* with one U+FFFD. SentencePiece replaces each invalid *byte* with one U+FFFD. Both keep a
trailing run of bytes that could still become a character; a stream holds it back until the next
token decides it.
"""

from __future__ import annotations

from codecs import utf_8_decode

REPLACEMENT = "\ufffd"


def unfinished_bytes(data: bytes) -> int:
    """How many trailing bytes of `data` are an unfinished character (0 to 3)."""
    _, used = utf_8_decode(data, "replace", False)
    return len(data) - used


def _char_size(lead: int) -> int:
    """Bytes of the character a lead byte announces, by its bit pattern alone (0: not a lead)."""
    if lead < 0x80:
        return 1
    if lead >> 5 == 0b110:
        return 2
    if lead >> 4 == 0b1110:
        return 3
    if lead >> 3 == 0b11110:
        return 4
    return 0


def _could_finish(prefix: bytes) -> bool:
    """True if `prefix` is the valid start of a longer character."""
    try:
        return utf_8_decode(prefix, "strict", False)[1] == 0
    except UnicodeDecodeError:
        return False


def decode_per_byte(data: bytes, final: bool) -> tuple[str, bytes]:
    """Decode as SentencePiece does: one U+FFFD per invalid byte.

    Returns (text, held): with `final` False, a trailing unfinished character is held, not replaced.
    """
    text, used = utf_8_decode(data, "replace", final)
    if REPLACEMENT not in text:          # nothing replaced: both rules agree
        return text, data[used:]
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        size = _char_size(data[i])
        if size:
            char = data[i:i + size]
            if len(char) == size:
                try:
                    out.append(char.decode("utf-8"))
                    i += size
                    continue
                except UnicodeDecodeError:
                    pass
            elif not final and _could_finish(char):
                break
        out.append(REPLACEMENT)
        i += 1
    return "".join(out), data[i:]
