"""The streaming detokenizer equals each tokenizer library's own full decode.

At every step where the library's text has no unfinished tail, the concatenated stream equals the
library's decode of the ids so far; elsewhere it shows a prefix of it; after finish() it equals it.
Whether a tail is unfinished is read from the library's token data and Python's UTF-8 decoder.

A Hugging Face piece chain (Replace or Metaspace, ByteFallback, Fuse, Strip) streams as the library's
DecodeStream does (what vLLM streams): each step shows what DecodeStream releases, which shows a byte
run's characters as they complete; the whole text is the full decode unless a byte run turns invalid
after part of it has shown (DecodeStream raises there: vLLM's issue 17448).
"""

from __future__ import annotations

import codecs
import functools
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tokenpath.delivery import Detokenizer
from tokenpath.delivery.sample_text import SAMPLES
from tokenpath.delivery.stream import CONTEXT_TOKENS, TokenIdError
from tokenpath.delivery.utf8 import REPLACEMENT
from tokenpath.delivery.visibility import PROMPT_TAIL

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def unfinished(data: bytes) -> bool:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data, final=False)
    return decoder.getstate()[0] != b""


def gpt2_bytes() -> dict[str, int]:
    """GPT-2's published byte-to-printable-character table, inverted."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


class Oracle:
    """Reads, from the library's own token data, whether a prefix of ids ends in an unfinished tail (for the
    piece chains: whether the library's DecodeStream has released the whole decode)."""

    piece_chain = False                      # the stream is checked against DecodeStream, step by step
    whole = staticmethod(lambda ids: True)   # whether the stream's whole text is the full decode

    def __init__(self, det: Detokenizer) -> None:
        self.det, lib = det, det.library
        if det.kind == "tekken":
            from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

            self.settled = lambda ids: not unfinished(
                self._runs(ids, lib.is_special, lambda t: lib.id_to_byte_piece(t, SpecialTokenPolicy.KEEP)))
        elif det.kind == "sentencepiece":
            self.settled = lambda ids: not unfinished(self._runs(ids, lambda t: not lib.is_byte(t),
                                                                 lambda t: bytes([int(lib.id_to_piece(t)[3:5], 16)])))
        else:
            import json

            decoder = json.loads(lib.to_str())["decoder"]
            specials = {a.content for a in lib.get_added_tokens_decoder().values() if a.special}
            visible = lambda ids: [lib.id_to_token(t) for t in ids  # noqa: E731
                                   if not (det.skip_special_tokens and lib.id_to_token(t) in specials)]
            if decoder["type"] == "ByteLevel":
                alphabet = gpt2_bytes()
                spell = lambda tok: bytes(alphabet[c] for c in tok) if all(c in alphabet for c in tok) else tok.encode()  # noqa: E731
                self.settled = lambda ids: not unfinished(b"".join(spell(tok) for tok in visible(ids)))
            else:  # the piece chains (Replace or Metaspace, ByteFallback, Fuse, Strip)
                self.piece_chain = True
                self.settled = lambda ids: first_break(det, ids) is None and released(det, ids)[0] == det.decode(ids)
                self.whole = lambda ids: first_break(det, ids) is None

    @staticmethod
    def _runs(ids, breaks, data_of) -> bytes:
        run = b""
        for t in ids:
            run = b"" if breaks(t) else run + data_of(t)
        return run


def decode_stream(det: Detokenizer, ids: list[int], prompt: list[int] = ()) -> tuple[list[str], bool]:
    """What the tokenizers library's DecodeStream (vLLM's FastIncrementalDetokenizer) releases at each id
    after stepping through `prompt`, up to an id where it raises "Invalid prefix" (vLLM then starts a new
    DecodeStream: its issue 17448); and whether it raised."""
    from tokenizers.decoders import DecodeStream

    stream, deltas = DecodeStream(skip_special_tokens=det.skip_special_tokens), []
    try:
        for token in prompt:
            stream.step(det.library, token)
        for token in ids:
            deltas.append(stream.step(det.library, token) or "")
    except Exception as error:
        if "Invalid prefix" not in str(error):
            raise
        return deltas, True
    return deltas, False


HEX = set(string.hexdigits)


def first_break(det: Detokenizer, ids: list[int]) -> int | None:
    """Where a ByteFallback run that has completed a character first turns invalid: at a byte no character
    continues with, or at a token that ends it in the middle of a character (len(ids) if the ids end so).
    The full decode then shows the whole run as U+FFFD, the characters already streamed included;
    DecodeStream raises there (or, where Strip took a space byte it streamed, shows that byte again as
    U+FFFD). None if no run breaks. Read with Python's UTF-8 decoder."""
    lib = det.library
    specials = {a.content for a in lib.get_added_tokens_decoder().values() if a.special}
    run = b""
    for k, t in enumerate([*ids, None]):
        token = lib.id_to_token(t) if t is not None else ""
        if det.skip_special_tokens and token in specials:
            continue
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">") and set(token[3:5]) <= HEX:
            run += bytes([int(token[3:5], 16)])
            try:
                codecs.utf_8_decode(run, "strict", False)
            except UnicodeDecodeError as error:
                if error.start > 0:
                    return k
        else:
            try:
                used = codecs.utf_8_decode(run, "strict", False)[1]
            except UnicodeDecodeError:
                used = 0
            if 0 < used < len(run):
                return k
            run = b""
    return None


def released(det: Detokenizer, ids: list[int]) -> tuple[str, bool]:
    deltas, raised = decode_stream(det, ids)
    return "".join(deltas), raised


def check_stream(det: Detokenizer, oracle: Oracle, ids: list[int]) -> None:
    if oracle.piece_chain:
        check_against_decode_stream(det, ids)
        return
    stream, shown = det.batch(1), ""
    for k, token in enumerate(ids, 1):
        shown += stream.step(np.array([token]))[0]
        reference = det.decode(ids[:k])
        if oracle.settled(ids[:k]):
            assert shown == reference, (ids[:k], shown, reference)
        else:
            assert reference.startswith(shown), (ids[:k], shown, reference)
    assert shown + stream.finish()[0] == det.decode(ids)


def check_against_decode_stream(det: Detokenizer, ids: list[int], prompt: list[int] = ()) -> list[str]:
    """Each step shows what DecodeStream releases at it, up to a run that breaks; with none, the whole
    text (from the start) is the full decode. Returns the steps' texts."""
    stream = det.batch(1)
    if prompt:
        stream.prime(0, prompt)
    deltas = [stream.step(np.array([token]))[0] for token in ids]
    tail = stream.finish()[0]
    expected, raised = decode_stream(det, ids, prompt)
    cut = first_break(det, [*prompt, *ids])
    if cut is None:
        assert not raised and deltas == expected, (prompt, ids, deltas, expected)
        if not prompt:
            assert "".join(deltas) + tail == det.decode(ids), (ids, deltas, tail)
    else:
        cut = max(cut - len(prompt), 0)
        assert deltas[:cut] == expected[:cut], (prompt, ids, deltas, expected)
    return deltas


# Tokenizers under test -------------------------------------------------------------------------

def _trained(tmp_path_factory, kind: str) -> str:
    """A small tokenizer.json trained here on the sample text (a real encoder, not only a decoder)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = list(SAMPLES.values())
    if kind == "bytelevel":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=["<|end|>", "<|user|>"], show_progress=False)
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<s>", "</s>", "<unk>"],
                                          unk_token="<unk>", show_progress=False)
    tokenizer.train_from_iterator(text, trainer)
    path = tmp_path_factory.mktemp("tok") / f"{kind}.json"
    tokenizer.save(str(path))
    return str(path)


def _exported(tmp_path_factory, source: str) -> str:
    from tokenpath.delivery.hf_export import to_hf_tokenizer

    path = tmp_path_factory.mktemp("tok") / f"{source}.tokenizer.json"
    to_hf_tokenizer(Detokenizer.load(source)).save(str(path))
    return str(path)


FILES = {
    "tekken": lambda f: None,
    "spm-v1": lambda f: "tokenizer.model.v1",
    "spm-v7": lambda f: "mistral_instruct_tokenizer_241114.model.v7",
    "hf-bytelevel-tekken": lambda f: _exported(f, "tekken_240911.json"),
    "hf-llama-spm": lambda f: _exported(f, "tokenizer.model.v1"),
    "hf-bytelevel-trained": lambda f: _trained(f, "bytelevel"),
    "hf-metaspace-trained": lambda f: _trained(f, "metaspace"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return functools.lru_cache(maxsize=None)(lambda key: FILES[key](tmp_path_factory))


@functools.cache
def _loaded(path, skip: bool) -> tuple[Detokenizer, Oracle]:
    det = Detokenizer.load(path, skip_special_tokens=skip)
    return det, Oracle(det)


@functools.cache
def interesting_ids(det: Detokenizer) -> list[int]:
    """Ids where the rules bite: bytes, specials, pieces with leading spaces (from the library's data)."""
    lib, n = det.library, det.vocab_size
    if det.kind == "tekken":
        return [i for i in range(n) if i < 40 or lib.is_byte(i)] + [i for i in range(n) if i % 997 == 0]
    if det.kind == "sentencepiece":
        return [i for i in range(300)] + [lib.piece_to_id("\u2581"), lib.piece_to_id("\u2581\u2581")]
    tokens = [lib.id_to_token(i) or "" for i in range(n)]
    return [i for i, t in enumerate(tokens) if len(t) <= 1 or t.startswith(("<0x", "\u2581", "<", "Ġ"))][:2000]


ALL = list(FILES)
TEXT = st.lists(st.one_of(st.sampled_from(sorted(set("".join(SAMPLES.values())))),
                          st.sampled_from([" ", "\n", "  ", "\t", "🎉", "👩‍💻", "🇫🇷", "中文", "é", "Ω"]),
                          st.text(max_size=3)), max_size=40).map("".join)


# The exported Tekken tokenizer.json (131k ids) is slow to build; its special tokens are covered by
# the trained ByteLevel tokenizer, so it runs with special tokens skipped only.
CASES = [(key, skip) for key in ALL for skip in (True, False) if (key, skip) != ("hf-bytelevel-tekken", False)]


@pytest.mark.parametrize("key, skip", CASES)
@SETTINGS
@given(data=st.data())
def test_random_id_streams_match_the_library(files, key, skip, data):
    det, oracle = _loaded(files(key), skip)
    special = interesting_ids(det)
    ids = data.draw(st.lists(st.one_of(st.integers(0, det.vocab_size - 1), st.sampled_from(special)), max_size=24))
    check_stream(det, oracle, ids)


@pytest.mark.parametrize("key", [k for k in ALL if not k.startswith("hf-") or "trained" in k])
@SETTINGS
@given(text=TEXT)
def test_real_text_matches_the_library(files, key, text):
    det, oracle = _loaded(files(key), True)
    ids = det.encode(text)
    check_stream(det, oracle, ids)
    assert det.detokenize(ids) == det.decode(ids)


@pytest.mark.parametrize("key", ["tekken", "spm-v1"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_sample_text_round_trips(files, key, name):
    det, oracle = _loaded(files(key), True)
    ids = det.encode(SAMPLES[name])
    assert det.detokenize(ids) == det.decode(ids) == SAMPLES[name]


@pytest.mark.parametrize("key", ["tekken", "spm-v1", "hf-llama-spm", "hf-metaspace-trained"])
@SETTINGS
@given(data=st.data())
def test_a_batch_of_interleaved_sequences_matches_each_one_alone(files, key, data):
    det, oracle = _loaded(files(key), True)
    pool = st.one_of(st.integers(0, det.vocab_size - 1), st.sampled_from(interesting_ids(det)))
    sequences = data.draw(st.lists(st.lists(pool, max_size=12), min_size=1, max_size=6))
    steps = data.draw(st.lists(st.lists(st.booleans(), min_size=len(sequences), max_size=len(sequences)), max_size=40))
    stream, shown, pos = det.batch(len(sequences)), [""] * len(sequences), [0] * len(sequences)
    for active in steps + [[True] * len(sequences)] * 12:
        ids = np.full(len(sequences), -1, np.int64)
        for i, seq in enumerate(sequences):
            if active[i] and pos[i] < len(seq):
                ids[i] = seq[pos[i]]
                pos[i] += 1
        for i, text in enumerate(stream.step(ids)):
            shown[i] += text
        for i, seq in enumerate(sequences):
            if oracle.settled(seq[:pos[i]]):
                assert shown[i] == det.decode(seq[:pos[i]])
    tails = stream.finish()
    assert [s + t for s, t in zip(shown, tails)] == [det.detokenize(seq) for seq in sequences]
    assert all(det.detokenize(seq) == det.decode(seq) for seq in sequences if oracle.whole(seq))


def test_the_default_is_the_tekken_file_shipped_with_mistral_common():
    det = Detokenizer.load()
    assert (det.name, det.kind, det.vocab_size) == ("tekken_240911.json", "tekken", 131072)


def test_utf8_split_across_tokens_is_held_then_completed():
    det = Detokenizer.load("tokenizer.model.v1")
    ids = det.encode("🎉")                      # byte pieces: ▁, <0xF0>, <0x9F>, <0x8E>, <0x89>
    stream = det.batch(1)
    parts = [stream.step([t])[0] for t in ids]
    assert parts[-1] == "🎉" and "".join(parts) == det.decode(ids) == "🎉"
    assert all(p == "" for p in parts[:-1])


def test_an_unfinished_tail_is_flushed_as_replacement_characters():
    tekken = Detokenizer.load()
    first_byte_of_emoji = 1000 + 0xF0            # Tekken: id 1000 + b is the single byte b
    stream = tekken.batch(1)
    assert stream.step([first_byte_of_emoji]) == [""]
    assert stream.finish() == ["\ufffd"] == [tekken.decode([first_byte_of_emoji])]
    spm = Detokenizer.load("tokenizer.model.v1")  # SentencePiece: one U+FFFD per byte
    stream = spm.batch(1)
    stream.step([3 + 0xF0])
    stream.step([3 + 0x9F])
    assert stream.finish() == ["\ufffd\ufffd"] == [spm.decode([3 + 0xF0, 3 + 0x9F])]


def test_special_tokens_are_skipped_or_shown():
    shown, skipped = Detokenizer.load(skip_special_tokens=False), Detokenizer.load()
    ids = [1] + skipped.encode("Hi") + [2]
    assert skipped.detokenize(ids) == "Hi" == skipped.decode(ids)
    assert shown.detokenize(ids) == "<s>Hi</s>" == shown.decode(ids)


def test_sentencepiece_strips_exactly_one_leading_space_from_the_first_piece():
    det = Detokenizer.load("tokenizer.model.v1")
    space = det.library.piece_to_id("\u2581")
    hi = det.library.piece_to_id("\u2581Hi")
    assert det.detokenize([1, hi, hi]) == "Hi Hi" == det.decode([1, hi, hi])
    assert det.detokenize([space, hi]) == " Hi" == det.decode([space, hi])


# Output after a prompt ----------------------------------------------------------------------------

def streamed_after(det: Detokenizer, prompt: list[int], output: list[int]) -> str:
    stream = det.batch(1)
    stream.prime(0, prompt)
    return "".join(stream.step([t])[0] for t in output) + stream.finish()[0]


@pytest.mark.parametrize("key, skip", [(k, s) for k in ("tekken", "spm-v1", "spm-v7", "hf-llama-spm",
                                                         "hf-metaspace-trained", "hf-bytelevel-trained")
                                       for s in (True, False)])
@SETTINGS
@given(data=st.data())
def test_an_output_primed_with_its_prompt_streams_what_the_prompt_s_decode_leaves(files, key, skip, data):
    """decode(prompt + output) past decode(prompt), for prompts whose decode ends settled (one that ends
    in an unfinished character or byte run shows it in the output, where the output completes it)."""
    det, oracle = _loaded(files(key), skip)
    pool = st.one_of(st.integers(0, det.vocab_size - 1), st.sampled_from(interesting_ids(det)))
    prompt = data.draw(st.lists(pool, max_size=6))
    output = data.draw(st.lists(pool, min_size=1, max_size=8))
    valid = [t for t in prompt + output if det.table.code[t + 1] != 2]
    assume(len(valid) == len(prompt + output) and oracle.settled(prompt) and oracle.whole(prompt + output))
    full, before = det.decode(prompt + output), det.decode(prompt)
    assume(full.startswith(before))
    assert streamed_after(det, prompt, output) == full[len(before):]


@pytest.mark.parametrize("key", ["hf-llama-spm", "hf-metaspace-trained", "hf-bytelevel-trained"])
@pytest.mark.parametrize("skip", [True, False])
@SETTINGS
@given(data=st.data())
def test_an_output_primed_with_its_prompt_streams_what_a_primed_decode_stream_releases(files, key, skip, data):
    """The tokenizers library's DecodeStream, stepped through the prompt first as vLLM primes it
    (FastIncrementalDetokenizer.__init__ in vllm/v1/engine/detokenizer.py: a prompt tail whose decode has
    no U+FFFD; here one whose whole decode it releases while priming), releases the same text, up to
    what it still holds: a tail that ends in U+FFFD. Where its text is not the full decode's (a byte run it released
    turns invalid later: vLLM's issue 17448, where vLLM starts a new DecodeStream), it is no reference."""
    from tokenizers.decoders import DecodeStream

    det, oracle = _loaded(files(key), skip)
    pool = st.one_of(st.integers(0, det.vocab_size - 1), st.sampled_from(interesting_ids(det)))
    prompt = data.draw(st.lists(pool, min_size=1, max_size=6))
    output = data.draw(st.lists(pool, min_size=1, max_size=8))
    assume(all(det.table.code[t + 1] != 2 for t in prompt + output) and oracle.settled(prompt)
           and "\ufffd" not in det.decode(prompt))
    full, before = det.decode(prompt + output), det.decode(prompt)
    assume(full.startswith(before))
    decoder = DecodeStream(skip_special_tokens=skip)
    try:
        for t in prompt:
            decoder.step(det.library, t)
        released = "".join(decoder.step(det.library, t) or "" for t in output)
    except Exception as error:
        assume("Invalid prefix" not in str(error))
        raise
    assume(full[len(before):].startswith(released))
    streamed = streamed_after(det, prompt, output)
    assert streamed.startswith(released)
    if not full.endswith("\ufffd"):
        assert streamed == released


def test_the_first_output_piece_keeps_its_leading_space_after_a_prompt():
    det = Detokenizer.load("mistral_instruct_tokenizer_240323.model.v3")
    prompt, output = det.encode("[INST] Say hi [/INST]"), det.encode("Hello world")
    stream = det.batch(1)
    stream.prime(0, prompt[-5:])
    assert [stream.step([t])[0] for t in output] + stream.finish() == [" Hello", " world", ""]
    assert det.decode(prompt + output) == det.decode(prompt) + " Hello world"
    assert det.detokenize(output) == "Hello world"   # a whole text, not primed: the dummy prefix is dropped


def test_a_bare_space_piece_after_a_prompt_shows_a_space():
    det = Detokenizer.load("tokenizer.model.v1")
    space, hi = det.library.piece_to_id("\u2581"), det.library.piece_to_id("\u2581Hi")
    stream = det.batch(2)
    stream.prime(1, [hi])
    assert stream.step([space, space]) == ["", " "]


def test_a_prompt_with_ids_outside_the_vocabulary_is_refused_and_the_stream_unchanged():
    det = Detokenizer.load("tokenizer.model.v1")
    stream = det.batch(2)
    with pytest.raises(TokenIdError, match="outside the vocabulary"):
        stream.prime(1, [5, det.vocab_size])
    hi = det.library.piece_to_id("\u2581Hi")
    assert stream.step([hi, hi]) == ["Hi", "Hi"]


# Hugging Face ByteFallback: text shows at the token where DecodeStream shows it -----------------------

BYTE_FALLBACK_PIECES = ["\u2581", "\u2581\u2581", "\u2581Hi", "Hi", "\u2581the", "\n", "中", "é", "\ufffd",
                        "\u2581\ufffd", "<0xZZ>", "x"]


def _byte_fallback_file(tmp_path_factory, decoder: str) -> str:
    """A SentencePiece-style tokenizer.json: <unk>, <s>, </s>, the 256 byte tokens, a few pieces, and the
    decoder chain of Llama 2's ("replace": Replace, ByteFallback, Fuse, Strip) or of Metaspace files."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in BYTE_FALLBACK_PIECES:
        vocab[piece] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    if decoder == "replace":
        tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                               decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        tokenizer.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<s>", "</s>")])
    path = tmp_path_factory.mktemp("tok") / f"byte-fallback-{decoder}.json"
    tokenizer.save(str(path))
    return str(path)


FILES["hf-byte-fallback-replace"] = lambda f: _byte_fallback_file(f, "replace")
FILES["hf-byte-fallback-metaspace"] = lambda f: _byte_fallback_file(f, "metaspace")


def byte_ids(text: str | bytes) -> list[int]:
    """The built files' byte tokens of `text`'s UTF-8 (<0xAB> is id 3 + 0xAB)."""
    return [3 + b for b in (text.encode() if isinstance(text, str) else text)]


def piece_id(piece: str) -> int:
    return 259 + BYTE_FALLBACK_PIECES.index(piece)


def byte_runs(det: Detokenizer) -> st.SearchStrategy[list[int]]:
    """Ids in chunks: a character's bytes, the first bytes of one, single bytes (newlines, spaces,
    continuation bytes, bytes no UTF-8 has), the pieces and the special tokens."""
    chars = st.one_of(st.characters(codec="utf-8"), st.sampled_from("\n 中é😀\ufffd"))
    single = st.one_of(st.sampled_from([0x0A, 0x20, 0x41, 0x80, 0xBF, 0xC0, 0xC2, 0xE4, 0xEF, 0xF0, 0xF5, 0xFF]),
                       st.integers(0, 255))
    chunk = st.one_of(chars.map(byte_ids), chars.map(lambda c: byte_ids(c)[:-1]), single.map(lambda b: [3 + b]),
                      st.integers(0, det.vocab_size - 1).map(lambda t: [t]))
    return st.lists(chunk, max_size=10).map(lambda chunks: [t for c in chunks for t in c])


@pytest.mark.parametrize("key", ["hf-byte-fallback-replace", "hf-byte-fallback-metaspace"])
@pytest.mark.parametrize("skip", [True, False])
@settings(SETTINGS, max_examples=200)
@given(data=st.data())
def test_byte_fallback_text_shows_at_the_token_where_decode_stream_shows_it(files, key, skip, data):
    """Each character first shows at the token where the library's DecodeStream (vLLM's detokenizer) first
    releases it, after a prompt or from the start: a byte run shows each character at its last byte and
    holds only an unfinished one or, once a byte has made it invalid, the rest of the run. Checked up to
    a run that turns invalid after part of it showed (`first_break`), where DecodeStream raises."""
    det, _ = _loaded(files(key), skip)
    prompt, output = data.draw(byte_runs(det)), data.draw(byte_runs(det).filter(bool))
    cut = first_break(det, prompt + output)
    assume(cut is None or cut >= len(prompt))
    check_against_decode_stream(det, output, prompt)


def streamed(det: Detokenizer, ids: list[int]) -> list[str]:
    """Each step's text, then what finish() flushes."""
    stream = det.batch(1)
    return [stream.step([t])[0] for t in ids] + stream.finish()


def test_a_byte_fallback_newline_or_character_shows_at_its_last_byte(files):
    det, _ = _loaded(files("hf-byte-fallback-replace"), True)
    hi = piece_id("\u2581Hi")
    ids = [hi, *byte_ids("\n"), hi, *byte_ids("中😀"), hi]
    assert streamed(det, ids) == ["Hi", "\n", " Hi", "", "", "中", "", "", "", "😀", " Hi", ""]
    assert "".join(streamed(det, ids)) == det.decode(ids) == "Hi\n Hi中😀 Hi"
    assert decode_stream(det, ids) == (streamed(det, ids)[:-1], False)


def test_a_byte_run_that_turns_invalid_after_part_of_it_showed_shows_its_held_bytes_as_replacement_characters(
        files):
    """The full decode turns the whole run to U+FFFD, "\n" included; what has shown stays, and the bytes
    held show one U+FFFD each when a token ends the run (where DecodeStream raises) or the stream ends."""
    det, _ = _loaded(files("hf-byte-fallback-replace"), True)
    hi = piece_id("\u2581Hi")
    ids = [hi, *byte_ids(b"\n\xff"), hi]
    assert streamed(det, ids) == ["Hi", "\n", "", "\ufffd Hi", ""]
    assert det.decode(ids) == "Hi\ufffd\ufffd Hi"
    assert decode_stream(det, ids) == (["Hi", "\n", ""], True)
    assert streamed(det, [hi, *byte_ids(b"\n\xe4\xb8")]) == ["Hi", "\n", "", "", "\ufffd\ufffd"]
    assert streamed(det, [hi, *byte_ids(b"\xff\n"), hi]) == ["Hi", "", "", "\ufffd\ufffd Hi", ""]


def test_text_that_ends_in_a_replacement_character_is_held_as_decode_stream_holds_it(files):
    det, _ = _loaded(files("hf-byte-fallback-replace"), True)
    hi, fffd = piece_id("\u2581Hi"), piece_id("\ufffd")
    assert streamed(det, [hi, fffd, hi]) == ["Hi", "", "\ufffd Hi", ""]
    assert streamed(det, [hi, *byte_ids("\ufffd"), hi]) == ["Hi", "", "", "", "\ufffd Hi", ""]
    # A leading space that Strip removes shows nothing, so the run is still whole when 0xFF breaks it.
    ids = [*byte_ids(b" \xff"), hi]
    assert streamed(det, ids) == ["", "", "\ufffd\ufffd Hi", ""] == [*decode_stream(det, ids)[0], ""]
    assert det.decode(ids) == "\ufffd\ufffd Hi"


def primed_deltas(det: Detokenizer, prompt: list[int], ids: list[int]) -> list[str]:
    stream = det.batch(1)
    stream.prime(0, prompt)
    return [stream.step([t])[0] for t in ids]


def held_as_decode_stream(deltas: list[str]) -> list[str]:
    """The same text as DecodeStream shows it: a text that ends in U+FFFD waits for one that does not,
    since DecodeStream cannot tell that character from one whose bytes have not all come (a literal U+FFFD
    the SentencePiece model shows at once)."""
    out, pending = [], ""
    for delta in deltas:
        pending += delta
        shown = pending if pending and not pending.endswith(REPLACEMENT) else ""
        out.append(shown)
        pending = pending[len(shown):]
    return out


@SETTINGS
@given(text=TEXT)
def test_llama_text_streams_through_its_tokenizer_json_as_through_decode_stream_and_its_sentencepiece_model(
        files, text):
    """Llama 2's vocabulary as a tokenizer.json (newlines, emoji and most CJK are byte tokens there) shows
    each character at the token where DecodeStream, primed with the prompt's tail as vLLM primes it, and
    the SentencePiece model show it. Encoded with the model: the exported file only decodes."""
    spm = Detokenizer.load("tokenizer.model.v1")
    hf, _ = _loaded(files("hf-llama-spm"), True)
    ids, prompt = spm.encode(text), spm.encode(PROMPT_TAIL)[-CONTEXT_TOKENS:]
    assert check_against_decode_stream(hf, ids, prompt) == held_as_decode_stream(primed_deltas(spm, prompt, ids))


def test_a_literal_replacement_character_waits_in_decode_stream_and_shows_at_once_in_sentencepiece(files):
    """U+FFFD itself (a piece of its own in this vocabulary): the SentencePiece model shows it at its token;
    DecodeStream, which cannot tell it from an unfinished character, holds it until a text that does not
    end in it."""
    spm = Detokenizer.load("tokenizer.model.v1")
    hf, _ = _loaded(files("hf-llama-spm"), True)
    ids, prompt = spm.encode(REPLACEMENT + "a"), spm.encode(PROMPT_TAIL)[-CONTEXT_TOKENS:]
    assert primed_deltas(spm, prompt, ids) == [" ", REPLACEMENT, "a"]
    assert check_against_decode_stream(hf, ids, prompt) == [" ", "", REPLACEMENT + "a"]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_sample_streams_through_llama_s_tokenizer_json_as_through_its_sentencepiece_model(files, name):
    """The same tokens silent, as DecodeStream shows them: none of the English sample's, whose newlines are
    byte tokens that show at once."""
    spm, (hf, _) = Detokenizer.load("tokenizer.model.v1"), _loaded(files("hf-llama-spm"), True)
    ids, prompt = spm.encode(SAMPLES[name]), spm.encode(PROMPT_TAIL)[-CONTEXT_TOKENS:]
    deltas = check_against_decode_stream(hf, ids, prompt)
    assert deltas == primed_deltas(spm, prompt, ids)
    if name == "english":
        assert "" not in deltas and "<0x0A>" in [hf.library.id_to_token(t) for t in ids]
