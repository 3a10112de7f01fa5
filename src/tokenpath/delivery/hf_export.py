"""The same vocabulary as a Hugging Face tokenizer, for running the library's decoders on our ids.

A Tekken file becomes a ByteLevel tokenizer, a SentencePiece model the Replace/ByteFallback/Fuse/Strip
chain that Hugging Face's Llama conversion uses. Only decoding is meaningful: the BPE model has no
merges, so encode with the original tokenizer.
"""

from __future__ import annotations

from tokenpath.config.errors import UserError
from tokenpath.delivery.bytestream import ByteTable
from tokenpath.delivery.detokenizer import Detokenizer
from tokenpath.delivery.hf_file import byte_level_alphabet
from tokenpath.delivery.spmstream import CONTROL, SpmTable


def to_hf_tokenizer(det: Detokenizer):
    """A `tokenizers.Tokenizer` whose decode of our ids spells the same tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    source = Detokenizer.load(det.path, skip_special_tokens=False).table
    if det.kind == "tekken":
        assert isinstance(source, ByteTable)
        spelling = {b: c for c, b in byte_level_alphabet().items()}
        specials = [i for i in range(source.size) if source.breaks[i]]
        tokens = [source.raw[i].decode() if source.breaks[i] else "".join(spelling[b] for b in source.raw[i])
                  for i in range(source.size)]
        decoder = decoders.ByteLevel()
        make_model = lambda vocab: models.BPE(vocab=vocab, merges=[])  # noqa: E731
    elif det.kind == "sentencepiece":
        assert isinstance(source, SpmTable)
        specials = [i for i in range(source.size) if source.kind[i] == CONTROL]
        tokens = [source.text[i + 1] if source.kind[i] == CONTROL else _piece(source, i) for i in range(source.size)]
        decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
        unknown = next((tokens[i] for i in range(source.size) if source.kind[i] == 3), None)
        make_model = lambda vocab: models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=unknown)  # noqa: E731
    else:
        raise UserError(f"tokenizer {det.path}: already a Hugging Face tokenizer; load it with tokenizers directly")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise UserError(f"tokenizer {det.path}: two ids spell the same token; it cannot become a tokenizer.json")
    tokenizer = Tokenizer(make_model(vocab))
    tokenizer.decoder = decoder
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in specials])
    return tokenizer


def _piece(table: SpmTable, i: int) -> str:
    """The piece as the model spells it (U+2581 for spaces, "<0xAB>" for bytes)."""
    if table.kind[i] == 1:
        return f"<0x{table.byte[i][0]:02X}>"
    return table.piece_text[i].replace(" ", "\u2581")
